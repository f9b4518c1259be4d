//! What goes back to a connection: replies and error replies (sent at once; what the socket
//! does not take is queued and counted as held), queued output flushed when the socket is
//! writable again, and frame bodies given back once done with. A connection whose socket
//! fails is closed.

use farmem_proto::{self as p, ErrorCode, IoClass};

use crate::closing::Close;
use crate::conn::Body;
use crate::state::Engine;

impl Engine {
    pub(crate) fn flush(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        match c.flush() {
            Ok(n) => self.held.sub(c, n),
            Err(e) => self.close(id, Close::Io(e.to_string())),
        }
    }

    /// Send a message on a connection, accounting what had to be queued.
    pub(crate) fn send(&mut self, id: u64, parts: &[&[u8]]) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        match c.send(parts) {
            Ok(queued) => self.held.add(c, queued),
            Err(e) => self.close(id, Close::Io(e.to_string())),
        }
    }

    /// A frame body is done with: back to the pool, out of the connection's holdings.
    pub(crate) fn release(&mut self, id: u64, body: Body) {
        if let Some(c) = self.conns.get_mut(&id) {
            self.held.sub(c, body.len);
        }
        self.pool.put(body);
    }

    /// A last word to a connection about to be closed for a limit: an error frame if the
    /// socket takes it, nothing else (it must not close the connection itself).
    pub(crate) fn farewell(&mut self, id: u64, code: ErrorCode, msg: &str) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        self.metrics.error(code);
        let mut out = Vec::new();
        p::encode_error(&mut out, 0, IoClass::Demand, code, msg);
        if let Ok(queued) = c.send(&[&out]) {
            self.held.add(c, queued);
        }
    }

    pub(crate) fn send_error(
        &mut self,
        id: u64,
        req: u64,
        class: IoClass,
        code: ErrorCode,
        msg: &str,
    ) {
        self.metrics.error(code);
        let mut out = Vec::new();
        p::encode_error(&mut out, req, class, code, msg);
        self.send(id, &[&out]);
    }
}
