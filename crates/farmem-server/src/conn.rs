//! One client connection on the server: non-blocking reads split into frames, and an output
//! queue for what the socket did not take at once.
//!
//! Small frames are cut out of a 64 KiB read buffer (1 KiB until the connection
//! authenticates: handshake frames are small, and unauthenticated connections are many and
//! cheap to open); a large one (a batched write) is read straight into a pooled buffer of its
//! size. Replies are written with `writev` as soon as they are ready; only what the socket
//! does not accept right away is copied into the output queue.
//!
//! After the Welcome every frame is sealed (`farmem_proto::channel`): a body read is opened
//! in place before anything looks at it, and a reply's body (its pages copied from the
//! store) is sealed before it is sent.

use std::collections::{HashSet, VecDeque};
use std::io::{self, IoSlice, Read, Write};
use std::net::SocketAddr;
use std::time::Instant;

use farmem_proto::channel::{ChannelError, ChannelKeys, EphemeralKey, Opener, Sealer, TAG_LEN};
use farmem_proto::{Header, KeyShare, Kind, Nonce, ProtoError, SessionId, HEADER_LEN};
use mio::net::TcpStream;

use crate::source::Source;
use crate::store::SessionIdx;

const RBUF: usize = 64 << 10;
/// Read buffer of a connection in its handshake: twice its largest frame (a Hello), so a
/// partial frame always leaves room to read the rest.
const HANDSHAKE_RBUF: usize = 1024;

/// Reusable frame buffers by power-of-two size class, so a stream of batched writes does not
/// allocate (and fault in) megabytes per request.
#[derive(Default)]
pub(crate) struct BufPool {
    classes: Vec<Vec<Vec<u8>>>,
}

/// A frame body in a pooled buffer (`buf[..len]` is the body).
pub(crate) struct Body {
    pub(crate) buf: Vec<u8>,
    pub(crate) len: usize,
}

impl Body {
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl BufPool {
    const MIN_SHIFT: u32 = 12;
    const KEEP: usize = 16;

    fn class(len: usize) -> usize {
        (len.max(1)
            .next_power_of_two()
            .trailing_zeros()
            .max(Self::MIN_SHIFT)
            - Self::MIN_SHIFT) as usize
    }

    pub(crate) fn get(&mut self, len: usize) -> Body {
        let c = Self::class(len);
        let buf = self
            .classes
            .get_mut(c)
            .and_then(|v| v.pop())
            .unwrap_or_else(|| vec![0u8; 1 << (c as u32 + Self::MIN_SHIFT)]);
        Body { buf, len }
    }

    pub(crate) fn put(&mut self, b: Body) {
        let c = Self::class(b.buf.len());
        if self.classes.len() <= c {
            self.classes.resize_with(c + 1, Vec::new);
        }
        if self.classes[c].len() < Self::KEEP && b.buf.len() == 1 << (c as u32 + Self::MIN_SHIFT) {
            self.classes[c].push(b.buf);
        }
    }
}

pub(crate) enum State {
    /// Waiting for the client's Hello.
    Hello,
    /// Challenge sent; waiting for the proof.
    Auth {
        tenant: String,
        session: SessionId,
        resume: bool,
        client_nonce: Nonce,
        server_nonce: Nonce,
        client_share: KeyShare,
        /// This side of the key exchange, used once the proof is checked.
        key: Box<EphemeralKey>,
    },
    /// Authenticated: requests flow.
    Ready { tenant: usize, session: SessionIdx },
}

pub(crate) enum Next {
    Frame(Header, Body),
    /// Nothing more to read now.
    Drained,
    /// The next frame's body does not fit the allowance: read it later.
    Blocked,
    /// The client closed the connection.
    Eof,
}

pub(crate) struct Conn {
    pub(crate) sock: TcpStream,
    pub(crate) peer: SocketAddr,
    pub(crate) source: Source,
    pub(crate) state: State,
    /// The protocol version agreed on (0 before the Hello is answered).
    pub(crate) version: u16,
    /// The handshake must finish by then.
    pub(crate) deadline: Option<Instant>,
    rbuf: Box<[u8]>,
    rstart: usize,
    rend: usize,
    /// A large frame being read: its header as received, the header, its body (with its tag
    /// once sealed) and the bytes of it read so far.
    big: Option<([u8; HEADER_LEN], Header, Body, usize)>,
    /// The channel's halves once the handshake is over (frames before are in clear).
    sealer: Option<Sealer>,
    opener: Option<Opener>,
    /// A reply's body being sealed (reused).
    seal_buf: Vec<u8>,
    out: VecDeque<Vec<u8>>,
    out_off: usize,
    pub(crate) out_bytes: usize,
    /// Bytes held for this connection: bodies of queued requests, replies announced by
    /// them, and unsent output. Reading pauses while this exceeds the window.
    pub(crate) held: usize,
    /// Ids of requests queued or being served (a reused id is a protocol violation).
    pub(crate) inflight: HashSet<u64>,
    /// Reading stopped for the budget while the socket may still have data.
    pub(crate) paused: bool,
    /// Frame bodies allocated since the engine last looked (it adds them to `held`).
    pub(crate) allocated: usize,
    /// When bytes last arrived.
    last_read: Instant,
    /// Since when output has waited without the socket taking any of it.
    unsent_since: Option<Instant>,
}

impl Conn {
    pub(crate) fn new(sock: TcpStream, peer: SocketAddr, deadline: Instant) -> Conn {
        Conn {
            sock,
            peer,
            source: Source::of(peer.ip()),
            state: State::Hello,
            version: 0,
            deadline: Some(deadline),
            rbuf: vec![0u8; HANDSHAKE_RBUF].into_boxed_slice(),
            rstart: 0,
            rend: 0,
            big: None,
            sealer: None,
            opener: None,
            seal_buf: Vec::new(),
            out: VecDeque::new(),
            out_off: 0,
            out_bytes: 0,
            held: 0,
            inflight: HashSet::new(),
            paused: false,
            allocated: 0,
            last_read: Instant::now(),
            unsent_since: None,
        }
    }

    /// The connection authenticated: requests may be large and pipelined from now on.
    pub(crate) fn grow_read_buffer(&mut self) {
        if self.rbuf.len() < RBUF {
            let mut b = vec![0u8; RBUF].into_boxed_slice();
            b[..self.rend - self.rstart].copy_from_slice(&self.rbuf[self.rstart..self.rend]);
            self.rend -= self.rstart;
            self.rstart = 0;
            self.rbuf = b;
        }
    }

    /// Seal every frame from now on (sent after the Welcome, which goes in clear).
    pub(crate) fn secure(&mut self, keys: ChannelKeys) {
        self.sealer = Some(keys.sealer);
        self.opener = Some(keys.opener);
    }

    /// Bytes after a frame's body on the wire: its tag, once the channel is sealed.
    fn trailer(&self) -> usize {
        if self.opener.is_some() {
            TAG_LEN
        } else {
            0
        }
    }

    /// Turn a frame read in full (body and tag) into its body: opened in place if sealed.
    fn opened(
        &mut self,
        raw: &[u8; HEADER_LEN],
        h: Header,
        mut body: Body,
    ) -> Result<Next, ConnError> {
        if let Some(o) = self.opener.as_mut() {
            o.open(raw, &mut body.buf[..body.len])
                .map_err(ConnError::Channel)?;
            body.len = h.len as usize;
        }
        Ok(Next::Frame(h, body))
    }

    /// The tenant, once authenticated.
    pub(crate) fn tenant(&self) -> Option<usize> {
        match self.state {
            State::Ready { tenant, .. } => Some(tenant),
            _ => None,
        }
    }

    /// Part of a frame arrived and nothing more for `limit` (a client that holds server
    /// memory with frames it never finishes).
    pub(crate) fn stalled_mid_frame(&self, now: Instant, limit: std::time::Duration) -> bool {
        (self.big.is_some() || self.rend > self.rstart)
            && now.duration_since(self.last_read) > limit
    }

    /// Replies have waited for `limit` without the client taking a byte of them (a client
    /// that stops reading would keep what they hold for as long as it likes).
    pub(crate) fn stalled_replies(&self, now: Instant, limit: std::time::Duration) -> bool {
        self.unsent_since
            .is_some_and(|t| now.duration_since(t) > limit)
    }

    /// Whether a frame of this kind may come now. Checked on the header, so that a client
    /// cannot make the server allocate a large body before it has authenticated.
    fn admissible(&self, h: &Header) -> Result<(), ConnError> {
        let ok = match self.state {
            State::Hello => h.kind == Kind::Hello,
            State::Auth { .. } => h.kind == Kind::Auth,
            State::Ready { .. } => h.kind.is_request(),
        };
        if ok {
            Ok(())
        } else {
            let when = match self.state {
                State::Ready { .. } => "after the handshake",
                _ => "during the handshake",
            };
            Err(ConnError::OutOfOrder(format!("{:?} frame {when}", h.kind)))
        }
    }

    /// The next complete frame, or why there is none. A body is allocated only if it fits
    /// in `allowance` bytes (what the connection and the server may still hold).
    pub(crate) fn next_frame(
        &mut self,
        pool: &mut BufPool,
        allowance: usize,
    ) -> Result<Next, ConnError> {
        loop {
            if let Some((raw, h, mut body, filled)) = self.big.take() {
                if filled == body.len {
                    return self.opened(&raw, h, body);
                }
                match self.sock.read(&mut body.buf[filled..body.len]) {
                    Ok(0) => return Ok(Next::Eof),
                    Ok(n) => {
                        self.last_read = Instant::now();
                        self.big = Some((raw, h, body, filled + n));
                    }
                    Err(e) => {
                        self.big = Some((raw, h, body, filled));
                        match e.kind() {
                            io::ErrorKind::WouldBlock => return Ok(Next::Drained),
                            io::ErrorKind::Interrupted => {}
                            _ => return Err(ConnError::Io(e)),
                        }
                    }
                }
                continue;
            }
            let avail = self.rend - self.rstart;
            if avail >= HEADER_LEN {
                let raw: [u8; HEADER_LEN] = self.rbuf[self.rstart..self.rstart + HEADER_LEN]
                    .try_into()
                    .expect("header length");
                let h = Header::decode(&raw).map_err(ConnError::Proto)?;
                self.admissible(&h)?;
                // On the wire: the body, then its tag once sealed.
                let wire = h.len as usize + self.trailer();
                let total = HEADER_LEN + wire;
                let body_at = self.rstart + HEADER_LEN;
                if wire > allowance {
                    return Ok(Next::Blocked);
                }
                if avail >= total {
                    self.allocated += h.len as usize;
                    let mut body = pool.get(wire);
                    body.buf[..wire].copy_from_slice(&self.rbuf[body_at..body_at + wire]);
                    self.rstart += total;
                    return self.opened(&raw, h, body);
                }
                if total > self.rbuf.len() / 2 {
                    // A large frame: take what arrived, read the rest straight into its body.
                    self.allocated += h.len as usize;
                    let mut body = pool.get(wire);
                    let have = avail - HEADER_LEN;
                    body.buf[..have].copy_from_slice(&self.rbuf[body_at..self.rend]);
                    self.rstart = 0;
                    self.rend = 0;
                    self.big = Some((raw, h, body, have));
                    continue;
                }
            }
            if self.rstart > 0 {
                self.rbuf.copy_within(self.rstart..self.rend, 0);
                self.rend -= self.rstart;
                self.rstart = 0;
            }
            match self.sock.read(&mut self.rbuf[self.rend..]) {
                Ok(0) => return Ok(Next::Eof),
                Ok(n) => {
                    self.last_read = Instant::now();
                    self.rend += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Next::Drained),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ConnError::Io(e)),
            }
        }
    }

    /// Send one frame made of `parts` (its header first): sealed once the channel is up,
    /// then as [`Conn::send_raw`] does. Returns the bytes queued.
    pub(crate) fn send(&mut self, parts: &[&[u8]]) -> io::Result<usize> {
        let Some(sealer) = self.sealer.as_mut() else {
            return self.send_raw(parts);
        };
        let mut header = [0u8; HEADER_LEN];
        let mut body = std::mem::take(&mut self.seal_buf);
        body.clear();
        let mut need = HEADER_LEN;
        for p in parts {
            let h = need.min(p.len());
            header[HEADER_LEN - need..HEADER_LEN - need + h].copy_from_slice(&p[..h]);
            need -= h;
            body.extend_from_slice(&p[h..]);
        }
        assert_eq!(need, 0, "a frame starts with its header");
        let tag = sealer.seal(&header, &mut body).map_err(io::Error::other)?;
        let r = self.send_raw(&[&header, &body, &tag]);
        self.seal_buf = body;
        r
    }

    /// Send `parts` as one message: straight to the socket if nothing is queued before it,
    /// the rest copied into the output queue. Returns the bytes queued.
    fn send_raw(&mut self, parts: &[&[u8]]) -> io::Result<usize> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut sent = 0;
        if self.out.is_empty() {
            let mut slices: Vec<IoSlice> = parts.iter().map(|p| IoSlice::new(p)).collect();
            let mut rest = &mut slices[..];
            while !rest.is_empty() {
                // IOV_MAX is 1024; writev takes what it can and the loop continues.
                let n = rest.len().min(1024);
                match self.sock.write_vectored(&rest[..n]) {
                    Ok(0) => break,
                    Ok(k) => {
                        sent += k;
                        IoSlice::advance_slices(&mut rest, k);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
        if sent == total {
            return Ok(0);
        }
        let mut rest = Vec::with_capacity(total - sent);
        let mut skip = sent;
        for p in parts {
            if skip >= p.len() {
                skip -= p.len();
                continue;
            }
            rest.extend_from_slice(&p[skip..]);
            skip = 0;
        }
        let queued = rest.len();
        if self.out.is_empty() {
            self.unsent_since = Some(Instant::now());
        }
        self.out_bytes += queued;
        self.out.push_back(rest);
        Ok(queued)
    }

    /// Write queued output. Returns the bytes written.
    pub(crate) fn flush(&mut self) -> io::Result<usize> {
        let mut written = 0;
        while let Some(front) = self.out.front() {
            match self.sock.write(&front[self.out_off..]) {
                Ok(0) => break,
                Ok(n) => {
                    written += n;
                    self.out_off += n;
                    if self.out_off == front.len() {
                        self.out.pop_front();
                        self.out_off = 0;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.out_bytes -= written;
        if self.out.is_empty() {
            self.unsent_since = None;
        } else if written > 0 {
            self.unsent_since = Some(Instant::now());
        }
        Ok(written)
    }
}

/// Why a connection must close.
pub(crate) enum ConnError {
    Io(io::Error),
    Proto(ProtoError),
    OutOfOrder(String),
    /// A sealed frame failed to open: altered or forged on the way.
    Channel(ChannelError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_reuses_by_size_class() {
        let mut p = BufPool::default();
        let b = p.get(5000);
        assert_eq!((b.len, b.buf.len()), (5000, 8192));
        let ptr = b.buf.as_ptr();
        p.put(b);
        let again = p.get(8000);
        assert_eq!(again.buf.as_ptr(), ptr);
        assert_eq!(p.get(1).buf.len(), 4096);
    }
}
