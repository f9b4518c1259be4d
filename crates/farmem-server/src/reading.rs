//! Reading connections into frames, within what each may hold: a connection its window of
//! request bodies, announced replies and unsent output; an authenticated one also its
//! tenant's share of the server's buffer limit. A connection that may not take its next
//! frame pauses until what it (or its tenant) holds is served; other tenants read on.

use farmem_proto::{Header, PAGE_SIZE};

use crate::closing::Close;
use crate::conn::{Body, Conn, ConnError, Next, State};
use crate::state::Engine;

impl Engine {
    fn per_conn_limit(&self) -> usize {
        self.cfg.window_pages as usize * (PAGE_SIZE + 64) + (1 << 20)
    }

    /// What each connected tenant may hold: the buffer limit divided among the tenants with
    /// authenticated connections, and at least one connection's window. Only a tenant over
    /// its own share pauses: stalled frames of some tenants cannot slow another one. A
    /// tenant that took more while fewer tenants were connected keeps it (until its frames
    /// are served, or time out) but reads no more, so the total may pass the limit by what
    /// earlier shares were larger; it stays within one window per authenticated connection.
    pub(crate) fn tenant_share(&self) -> usize {
        (self.cfg.global_limit / self.tenants_connected.max(1)).max(self.per_conn_limit())
    }

    /// Largest frame body `c` may take now.
    fn allowance(&self, c: &Conn) -> usize {
        let own = self.per_conn_limit().saturating_sub(c.held);
        // A connection in its handshake sends a few hundred bytes at most (its frames are
        // checked from their headers): nothing to share.
        match c.tenant() {
            Some(t) => own.min(self.tenant_share().saturating_sub(self.held.tenants[t])),
            None => own,
        }
    }

    /// Read frames from a connection until its socket is drained or its budget is full.
    pub(crate) fn pump(&mut self, id: u64) {
        loop {
            let Some(c) = self.conns.get(&id) else {
                return;
            };
            let allowance = self.allowance(c);
            let c = self.conns.get_mut(&id).expect("looked up above");
            let next = c.next_frame(&mut self.pool, allowance);
            // Bodies allocated are held from now until their request is served.
            let allocated = std::mem::take(&mut c.allocated);
            self.held.add(c, allocated);
            match next {
                Ok(Next::Frame(h, body)) => {
                    c.paused = false;
                    if let Err(why) = self.on_frame(id, h, body) {
                        self.close(id, why);
                        return;
                    }
                }
                Ok(Next::Blocked) => {
                    if !c.paused {
                        c.paused = true;
                        self.paused.push(id);
                    }
                    return;
                }
                Ok(Next::Drained) => return,
                Ok(Next::Eof) => return self.close(id, Close::Eof),
                Err(ConnError::Io(e)) => return self.close(id, Close::Io(e.to_string())),
                Err(ConnError::Proto(e)) => {
                    return self.close(id, Close::BadInput("malformed frame", e.to_string()))
                }
                Err(ConnError::OutOfOrder(e)) => {
                    return self.close(id, Close::BadInput("out-of-order frame", e))
                }
                Err(ConnError::Channel(e)) => {
                    return self.close(id, Close::BadInput("forged frame", e.to_string()))
                }
            }
        }
    }

    /// Try again the connections paused for memory (what they waited for may be free now).
    pub(crate) fn resume_paused(&mut self) {
        if self.paused.is_empty() {
            return;
        }
        for id in std::mem::take(&mut self.paused) {
            if let Some(c) = self.conns.get_mut(&id) {
                c.paused = false;
                self.pump(id);
            }
        }
    }

    /// Handle one frame; an error closes the connection.
    fn on_frame(&mut self, id: u64, h: Header, body: Body) -> Result<(), Close> {
        let c = self.conns.get_mut(&id).expect("live connection");
        let r = match &c.state {
            State::Hello => self.on_hello(id, &h, body.bytes()),
            State::Auth { .. } => self.on_auth(id, &h, body.bytes()),
            State::Ready { tenant, session } => {
                let (tenant, session) = (*tenant, *session);
                return self.on_request(id, tenant, session, h, body);
            }
        };
        self.release(id, body);
        r
    }
}
