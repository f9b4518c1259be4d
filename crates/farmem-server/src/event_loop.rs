//! The server's event loop: one thread, no locks on the data path.
//!
//! Each turn: accept connections, read every readable connection into frames (handshake
//! frames are answered at once; requests go into the fair queue), serve a batch of requests
//! in weighted-fair order, flush what the sockets did not take, and resume connections whose
//! reading was paused for memory. A single thread is deliberate on these 2-core machines:
//! the clients need the other core, and a hand-off between server threads would cost a
//! cross-thread wake-up (~20 µs here) per request.
//!
//! Memory stays bounded: a frame's size is checked from its header before its body is read;
//! each connection may hold at most its window of request bodies, announced replies and
//! unsent output before the server stops reading it; the same holds for all connections
//! together; connections, sessions and tenants are capped.

use std::io::Read;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use farmem_proto::{self as p, ErrorCode, Header, IoClass, PAGE_SIZE};
use mio::{Events, Interest, Token};

use crate::closing::Close;
use crate::conn::{Body, Conn, ConnError, Next, State};
use crate::state::{Engine, HANDSHAKE_TIMEOUT, LISTENER, LOG_TARGET, SIGNALS};

impl Engine {
    /// Serve until SIGINT or SIGTERM.
    pub(crate) fn run(&mut self) -> std::io::Result<()> {
        let mut events = Events::with_capacity(1024);
        let mut last_tick = Instant::now();
        let mut last_work = Instant::now();
        while !self.stop {
            let capped = match &mut self.bucket {
                Some(b) => {
                    b.refill();
                    b.wait()
                }
                None => Duration::ZERO,
            };
            let timeout = if !self.sched.is_empty() {
                capped
            } else if last_work.elapsed() < self.cfg.spin {
                Duration::ZERO
            } else {
                Duration::from_millis(200)
            };
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept(),
                    SIGNALS => {
                        let mut b = [0u8; 64];
                        while matches!(self.signals.read(&mut b), Ok(n) if n > 0) {}
                        self.stop = true;
                    }
                    Token(t) => {
                        let id = t as u64;
                        if ev.is_writable() {
                            self.flush(id);
                        }
                        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                            self.pump(id);
                        }
                    }
                }
            }
            if !self.sched.is_empty() {
                last_work = Instant::now();
            }
            self.serve();
            self.resume_paused();
            if last_tick.elapsed() >= Duration::from_millis(250) {
                last_tick = Instant::now();
                self.tick();
            }
        }
        self.shutdown();
        Ok(())
    }

    fn accept(&mut self) {
        loop {
            let (mut sock, peer) = match self.listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!(
                        target: LOG_TARGET,
                        "accepting a connection failed: {e}"
                    );
                    return;
                }
            };
            if self.conns.len() >= self.cfg.max_conns {
                let mut out = Vec::new();
                p::encode_error(
                    &mut out,
                    0,
                    IoClass::Demand,
                    ErrorCode::TooBusy,
                    "the server has too many connections",
                );
                let _ = std::io::Write::write(&mut sock, &out);
                self.metrics.error(ErrorCode::TooBusy);
                tracing::warn!(
                    target: LOG_TARGET,
                    "refused a connection from {peer}: connection limit reached"
                );
                continue;
            }
            let _ = sock.set_nodelay(true);
            let id = self.next_conn;
            self.next_conn += 1;
            if let Err(e) = self.poll.registry().register(
                &mut sock,
                Token(id as usize),
                Interest::READABLE | Interest::WRITABLE,
            ) {
                tracing::warn!(
                    target: LOG_TARGET,
                    "registering a connection failed: {e}"
                );
                continue;
            }
            self.conns.insert(
                id,
                Conn::new(sock, peer, Instant::now() + HANDSHAKE_TIMEOUT),
            );
            self.metrics.connections.fetch_add(1, Ordering::Relaxed);
            self.metrics
                .connections_total
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                target: LOG_TARGET,
                "connection {id} from {peer}"
            );
        }
    }

    fn per_conn_limit(&self) -> usize {
        self.cfg.window_pages as usize * (PAGE_SIZE + 64) + (1 << 20)
    }

    /// Read frames from a connection until its socket is drained or its budget is full.
    fn pump(&mut self, id: u64) {
        loop {
            let limit = self.per_conn_limit();
            let Some(c) = self.conns.get_mut(&id) else {
                return;
            };
            let tenant_room = c.tenant().map_or(usize::MAX, |t| {
                (self.cfg.global_limit / 4)
                    .max(limit)
                    .saturating_sub(self.held.tenants[t])
            });
            let allowance = limit
                .saturating_sub(c.held)
                .min(self.cfg.global_limit.saturating_sub(self.held.total))
                .min(tenant_room);
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
                Err(ConnError::Proto(e)) => return self.close(id, Close::BadInput(e.to_string())),
                Err(ConnError::OutOfOrder(e)) => return self.close(id, Close::BadInput(e)),
            }
        }
    }

    fn resume_paused(&mut self) {
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

    /// Periodic work: handshake deadlines and abandoned sessions.
    fn tick(&mut self) {
        let now = Instant::now();
        let late: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| now > d))
            .map(|(&id, _)| id)
            .collect();
        for id in late {
            self.close(id, Close::Timeout);
        }
        let stalled: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| c.stalled_mid_frame(now, self.cfg.frame_timeout))
            .map(|(&id, _)| id)
            .collect();
        for id in stalled {
            self.close(
                id,
                Close::BadInput(format!(
                    "stopped in the middle of a frame for {} s",
                    self.cfg.frame_timeout.as_secs()
                )),
            );
        }
        self.expire_sessions(now);
        self.metrics
            .sessions
            .store(self.sessions.len() as u64, Ordering::Relaxed);
        self.metrics
            .held_bytes
            .store(self.held.total as u64, Ordering::Relaxed);
    }
}
