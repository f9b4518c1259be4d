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

use std::collections::HashMap;
use std::io::Read;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use farmem_proto::auth::{Secret, Transcript};
use farmem_proto::tokens::TokenFile;
use farmem_proto::IoClass;
use farmem_proto::PAGE_SIZE;
use farmem_proto::{self as p, ErrorCode, Frame, Header, Kind, SessionId};
use farmem_sys::random::random_bytes;
use mio::net::{TcpListener, UnixStream};
use mio::{Events, Interest, Poll, Token};

use super::conn::{Body, BufPool, Conn, ConnError, Next, State};
use super::metrics::{Metrics, TenantMetrics};
use super::store::{SessionIdx, Store};
use super::wfq::Wfq;

const LISTENER: Token = Token(0);
const SIGNALS: Token = Token(1);
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A turn serves jobs for about this long (or `JOBS_PER_TURN` jobs) before the loop reads
/// the sockets again. Short turns matter for fairness: requests that arrive meanwhile must
/// join the queue before the next choice, or a turn would just serve everything queued (each
/// client's window of requests) and the order the weights give would change nothing.
const TURN_BUDGET: Duration = Duration::from_micros(100);
const JOBS_PER_TURN: usize = 64;
const MAX_SESSIONS: usize = 65536;
const MAX_TENANTS: usize = 4096;

pub struct Config {
    pub capacity_pages: usize,
    pub tokens: TokenFile,
    pub default_quota_pages: u64,
    pub default_weight: u32,
    pub session_timeout: Duration,
    pub max_conns: usize,
    /// Pages of requests and replies one connection may have in flight.
    pub window_pages: u32,
    /// Bytes all connections together may hold before reading pauses (a tenant: a quarter).
    pub global_limit: usize,
    /// A connection that stops in the middle of a frame this long is closed.
    pub frame_timeout: Duration,
    /// Keep polling without sleeping this long after the last request.
    pub spin: Duration,
    /// Most pages served per second (a link's capacity); `None`: as fast as possible.
    pub max_pages_per_s: Option<f64>,
}

/// A token bucket in front of the fair queue: it caps the pages served per second, as a
/// network link would. What the cap holds back waits in the fair queue, where the tenants'
/// weights decide who goes next.
struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn new(rate: f64) -> Bucket {
        // Two milliseconds of service, at least one full batch.
        let burst = (rate / 500.0).max(p::MAX_BATCH_PAGES as f64);
        Bucket {
            rate,
            burst,
            tokens: burst,
            last: Instant::now(),
        }
    }

    fn refill(&mut self) {
        let now = Instant::now();
        let dt = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
    }

    /// How long until the bucket allows service again (zero if it does now).
    fn wait(&self) -> Duration {
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }
}

struct Tenant {
    name: String,
    quota_pages: u64,
    used_pages: u64,
    metrics: Arc<TenantMetrics>,
}

struct Session {
    tenant: usize,
    id: SessionId,
    conns: u32,
    detached_since: Option<Instant>,
    pages: u64,
    /// Closed by its client: pages freed, only waiting for its connections to go.
    closed: bool,
}

struct Job {
    conn: u64,
    id: u64,
    class: IoClass,
    kind: Kind,
    body: Body,
    session: SessionIdx,
    /// Pages read or written (what the bandwidth cap counts).
    pages: usize,
    /// Bytes counted in the connection's `held` for this job.
    reserve: usize,
    /// A prefetch read's deadline: past it the pages would reach the client after the
    /// program needed them, so the request is answered `Late` unserved.
    expires: Option<Instant>,
}

/// Why a connection is closed (decides the log level and the metrics).
enum Close {
    Eof,
    Io(String),
    BadInput(String),
    Refused(String),
    Timeout,
}

/// Bytes held for queued requests, the replies they announce, and unsent output: per
/// connection (`Conn::held`), per tenant (the sum over its authenticated connections) and in
/// total. Reading a connection pauses when any of the three is at its limit, so a tenant that
/// stalls large frames can exhaust only its own share.
#[derive(Default)]
struct Holdings {
    total: usize,
    tenants: Vec<usize>,
}

impl Holdings {
    fn add(&mut self, c: &mut Conn, n: usize) {
        c.held += n;
        self.total += n;
        if let Some(t) = c.tenant() {
            self.tenants[t] += n;
        }
    }

    fn sub(&mut self, c: &mut Conn, n: usize) {
        c.held -= n;
        self.total -= n;
        if let Some(t) = c.tenant() {
            self.tenants[t] -= n;
        }
    }

    /// A connection became its tenant's: what it holds now counts for the tenant too.
    fn attribute(&mut self, c: &Conn) {
        if let Some(t) = c.tenant() {
            self.tenants[t] += c.held;
        }
    }

    /// A connection goes: nothing it held is held any more.
    fn forget(&mut self, c: &mut Conn) {
        let n = c.held;
        self.sub(c, n);
    }
}

pub struct Engine {
    cfg: Config,
    poll: Poll,
    listener: TcpListener,
    signals: UnixStream,
    conns: HashMap<u64, Conn>,
    next_conn: u64,
    tenants: Vec<Tenant>,
    tenant_index: HashMap<String, usize>,
    sessions: HashMap<SessionIdx, Session>,
    session_index: HashMap<(usize, SessionId), SessionIdx>,
    next_session: SessionIdx,
    store: Store,
    sched: Wfq<Job>,
    pool: BufPool,
    metrics: Arc<Metrics>,
    instance: u64,
    held: Holdings,
    paused: Vec<u64>,
    bucket: Option<Bucket>,
    stop: bool,
    /// Queued jobs that carry a deadline (prefetch reads): none, no scan for expired ones.
    deadlines_queued: usize,
}

fn class_index(c: IoClass) -> usize {
    match c {
        IoClass::Demand => 0,
        IoClass::Prefetch => 1,
        IoClass::WriteBack => 2,
    }
}

fn mib(pages: u64) -> String {
    format!(
        "{:.1} MiB",
        (pages * PAGE_SIZE as u64) as f64 / (1u64 << 20) as f64
    )
}

impl Engine {
    pub fn new(
        cfg: Config,
        listener: std::net::TcpListener,
        signals: std::os::unix::net::UnixStream,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Engine> {
        let poll = Poll::new()?;
        listener.set_nonblocking(true)?;
        signals.set_nonblocking(true)?;
        let mut listener = TcpListener::from_std(listener);
        let mut signals = UnixStream::from_std(signals);
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        poll.registry()
            .register(&mut signals, SIGNALS, Interest::READABLE)?;
        let store = Store::new(cfg.capacity_pages)?;
        let bucket = cfg.max_pages_per_s.map(Bucket::new);
        Ok(Engine {
            cfg,
            poll,
            listener,
            signals,
            conns: HashMap::new(),
            next_conn: 2,
            tenants: Vec::new(),
            tenant_index: HashMap::new(),
            sessions: HashMap::new(),
            session_index: HashMap::new(),
            next_session: 1,
            store,
            sched: Wfq::default(),
            pool: BufPool::default(),
            metrics,
            instance: u64::from_le_bytes(random_bytes::<8>()),
            held: Holdings::default(),
            paused: Vec::new(),
            bucket,
            stop: false,
            deadlines_queued: 0,
        })
    }

    /// Serve until SIGINT or SIGTERM.
    pub fn run(&mut self) -> std::io::Result<()> {
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
        tracing::info!(
            "shutting down: closing {} connection(s); {} pages of {} session(s) are dropped",
            self.conns.len(),
            self.store.used(),
            self.sessions.len()
        );
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for id in ids {
            self.close(id, Close::Eof);
        }
        Ok(())
    }

    fn accept(&mut self) {
        loop {
            let (mut sock, peer) = match self.listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!("accepting a connection failed: {e}");
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
                tracing::warn!("refused a connection from {peer}: connection limit reached");
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
                tracing::warn!("registering a connection failed: {e}");
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
            tracing::debug!("connection {id} from {peer}");
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

    fn flush(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        match c.flush() {
            Ok(n) => self.held.sub(c, n),
            Err(e) => self.close(id, Close::Io(e.to_string())),
        }
    }

    /// Send a message on a connection, accounting what had to be queued.
    fn send(&mut self, id: u64, parts: &[&[u8]]) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        match c.send(parts) {
            Ok(queued) => self.held.add(c, queued),
            Err(e) => self.close(id, Close::Io(e.to_string())),
        }
    }

    /// A frame body is done with: back to the pool, out of the connection's holdings.
    fn release(&mut self, id: u64, body: Body) {
        if let Some(c) = self.conns.get_mut(&id) {
            self.held.sub(c, body.len);
        }
        self.pool.put(body);
    }

    fn send_error(&mut self, id: u64, req: u64, class: IoClass, code: ErrorCode, msg: &str) {
        self.metrics.error(code);
        let mut out = Vec::new();
        p::encode_error(&mut out, req, class, code, msg);
        self.send(id, &[&out]);
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

    /// Decode a frame whose kind the connection admitted for its state (see
    /// `Conn::admissible`); a malformed body closes the connection.
    fn decode<'a>(h: &Header, body: &'a [u8]) -> Result<Frame<'a>, Close> {
        p::decode(h, body).map_err(|e| Close::BadInput(e.to_string()))
    }

    fn on_hello(&mut self, id: u64, h: &Header, body: &[u8]) -> Result<(), Close> {
        let Frame::Hello(hello) = Self::decode(h, body)? else {
            unreachable!("only a Hello is admitted before the handshake")
        };
        let version = hello.max_version.min(p::VERSION_MAX);
        if version < hello.min_version.max(p::VERSION_MIN) {
            let msg = format!(
                "no common protocol version: client speaks {}..={}, server {}..={}",
                hello.min_version,
                hello.max_version,
                p::VERSION_MIN,
                p::VERSION_MAX
            );
            self.send_error(id, 0, IoClass::Demand, ErrorCode::Version, &msg);
            return Err(Close::Refused(msg));
        }
        let server_nonce = random_bytes::<32>();
        let mut out = Vec::new();
        p::encode_challenge(
            &mut out,
            &p::Challenge {
                version,
                nonce: server_nonce,
                instance: self.instance,
            },
        );
        let c = self.conns.get_mut(&id).expect("live connection");
        c.state = State::Auth {
            tenant: hello.tenant.to_string(),
            session: hello.session,
            resume: hello.resume,
            client_nonce: hello.nonce,
            server_nonce,
        };
        self.send(id, &[&out]);
        Ok(())
    }

    fn on_auth(&mut self, id: u64, h: &Header, body: &[u8]) -> Result<(), Close> {
        let Frame::Auth(auth) = Self::decode(h, body)? else {
            unreachable!("only an Auth is admitted after the Hello")
        };
        let c = self.conns.get(&id).expect("live connection");
        let State::Auth {
            tenant,
            session,
            resume,
            client_nonce,
            server_nonce,
        } = &c.state
        else {
            unreachable!("in the Auth state")
        };
        let (tenant, session, resume) = (tenant.clone(), *session, *resume);
        let (client_nonce, server_nonce) = (*client_nonce, *server_nonce);
        let peer = c.peer;
        let transcript = Transcript {
            tenant: &tenant,
            session: &session,
            client_nonce: &client_nonce,
            server_nonce: &server_nonce,
        };
        // An unknown tenant is checked against a random secret, so that the reply and its
        // timing do not tell which tenant names exist.
        let unknown = Secret::from_text(&format!("{:x}", u128::from_le_bytes(random_bytes())))
            .expect("non-empty");
        let secret = self
            .cfg
            .tokens
            .secret_for(&tenant)
            .unwrap_or(&unknown)
            .clone();
        if !transcript.verify_client(&secret, &auth.proof) {
            self.send_error(
                id,
                0,
                IoClass::Demand,
                ErrorCode::AuthFailed,
                "authentication failed",
            );
            return Err(Close::Refused(format!(
                "authentication of tenant '{tenant}' from {peer} failed"
            )));
        }
        let attached = self
            .tenant_for(&tenant)
            .and_then(|t| self.attach(t, session, resume).map(|s| (t, s)));
        let (t, (sidx, resumed, pages)) = match attached {
            Ok(x) => x,
            Err((code, msg)) => {
                self.send_error(id, 0, IoClass::Demand, code, &msg);
                return Err(Close::Refused(msg));
            }
        };
        let mut out = Vec::new();
        p::encode_welcome(
            &mut out,
            &p::Welcome {
                proof: transcript.server_proof(&secret),
                resumed,
                session_pages: pages,
                quota_pages: self.tenants[t].quota_pages,
                capacity_pages: self.store.capacity() as u64,
                max_batch: p::MAX_BATCH_PAGES as u32,
                window_pages: self.cfg.window_pages,
            },
        );
        let c = self.conns.get_mut(&id).expect("live connection");
        c.state = State::Ready {
            tenant: t,
            session: sidx,
        };
        c.deadline = None;
        self.held.attribute(c);
        tracing::debug!(
            "connection {id} from {peer}: tenant '{tenant}', session {sidx} ({})",
            if resumed { "resumed" } else { "new" }
        );
        self.send(id, &[&out]);
        Ok(())
    }

    /// The tenant of this name, created on its first connection.
    fn tenant_for(&mut self, name: &str) -> Result<usize, (ErrorCode, String)> {
        if let Some(&t) = self.tenant_index.get(name) {
            return Ok(t);
        }
        if self.tenants.len() >= MAX_TENANTS {
            return Err((ErrorCode::TooBusy, "the server has too many tenants".into()));
        }
        let entry = self.cfg.tokens.tenant(name);
        let weight = entry
            .and_then(|e| e.weight)
            .unwrap_or(self.cfg.default_weight);
        let quota_pages = entry
            .and_then(|e| e.quota_bytes)
            .map_or(self.cfg.default_quota_pages, |b| b / PAGE_SIZE as u64);
        let metrics = Arc::new(TenantMetrics {
            name: name.to_string(),
            weight,
            quota_pages,
            ..TenantMetrics::default()
        });
        self.metrics.tenants.lock().push(metrics.clone());
        let t = self.sched.add_flow(weight);
        debug_assert_eq!(t, self.tenants.len());
        self.held.tenants.push(0);
        self.tenants.push(Tenant {
            name: name.to_string(),
            quota_pages,
            used_pages: 0,
            metrics,
        });
        self.tenant_index.insert(name.to_string(), t);
        tracing::info!(
            "tenant '{name}': weight {weight}, quota {}",
            mib(quota_pages)
        );
        Ok(t)
    }

    /// Attach a connection to its session: `(index, existed, pages)`.
    fn attach(
        &mut self,
        tenant: usize,
        id: SessionId,
        resume: bool,
    ) -> Result<(SessionIdx, bool, u64), (ErrorCode, String)> {
        if let Some(&s) = self.session_index.get(&(tenant, id)) {
            let sess = self.sessions.get_mut(&s).expect("indexed session");
            sess.conns += 1;
            sess.detached_since = None;
            return Ok((s, true, sess.pages));
        }
        if resume {
            return Err((
                ErrorCode::SessionUnknown,
                format!(
                    "session unknown to this server: it restarted, or the session expired \
                     (sessions are kept {} s after their last connection)",
                    self.cfg.session_timeout.as_secs()
                ),
            ));
        }
        if self.sessions.len() >= MAX_SESSIONS {
            return Err((
                ErrorCode::TooBusy,
                "the server has too many sessions".into(),
            ));
        }
        let s = self.next_session;
        self.next_session = self.next_session.wrapping_add(1).max(1);
        self.sessions.insert(
            s,
            Session {
                tenant,
                id,
                conns: 1,
                detached_since: None,
                pages: 0,
                closed: false,
            },
        );
        self.session_index.insert((tenant, id), s);
        self.metrics
            .sessions
            .store(self.sessions.len() as u64, Ordering::Relaxed);
        Ok((s, false, 0))
    }

    fn detach(&mut self, s: SessionIdx) {
        let Some(sess) = self.sessions.get_mut(&s) else {
            return;
        };
        sess.conns -= 1;
        if sess.conns == 0 {
            if sess.closed {
                self.sessions.remove(&s);
            } else {
                sess.detached_since = Some(Instant::now());
            }
        }
        self.metrics
            .sessions
            .store(self.sessions.len() as u64, Ordering::Relaxed);
    }

    fn on_request(
        &mut self,
        id: u64,
        tenant: usize,
        session: SessionIdx,
        h: Header,
        body: Body,
    ) -> Result<(), Close> {
        debug_assert!(h.kind.is_request(), "admitted by the connection");
        let pages = match p::decode(&h, body.bytes()) {
            Ok(Frame::Read(r)) => r.len(),
            Ok(Frame::Write(w)) => w.len(),
            Ok(_) => 0,
            Err(e) => {
                self.release(id, body);
                return Err(Close::BadInput(e.to_string()));
            }
        };
        let c = self.conns.get_mut(&id).expect("live connection");
        if !c.inflight.insert(h.id) {
            self.release(id, body);
            return Err(Close::BadInput(format!(
                "request id {} reused while in flight",
                h.id
            )));
        }
        if h.kind == Kind::Stats {
            c.inflight.remove(&h.id);
            self.release(id, body);
            let s = &self.sessions[&session];
            let t = &self.tenants[tenant];
            let mut out = Vec::new();
            p::encode_stats_ok(
                &mut out,
                h.id,
                &p::StatsOk {
                    session_pages: s.pages,
                    tenant_pages: t.used_pages,
                    quota_pages: t.quota_pages,
                    server_pages: self.store.used() as u64,
                    capacity_pages: self.store.capacity() as u64,
                },
            );
            self.send(id, &[&out]);
            return Ok(());
        }
        // What this request holds until served: its body (counted since it was read) and
        // the reply it announces.
        let reply = match h.kind {
            Kind::Read => 64 + pages * p::READ_OK_PAGE_LEN,
            _ => 64,
        };
        self.held.add(c, reply);
        let reserve = body.len + reply;
        self.sched.push(
            tenant,
            class_index(h.class),
            Job {
                conn: id,
                id: h.id,
                class: h.class,
                kind: h.kind,
                body,
                session,
                pages,
                reserve,
                expires: h.useful_for().map(|d| Instant::now() + d),
            },
            pages.max(1) as u64,
        );
        if h.useful_for != 0 {
            self.deadlines_queued += 1;
        }
        Ok(())
    }

    /// Answer `Late` to the queued prefetch reads whose deadline has passed: demand reads
    /// ahead of them kept them waiting until their pages are no use any more. Done before
    /// each turn, so a prefetch stuck behind a stream of demand is answered in time instead
    /// of holding its pages (and the threads that reach them) until the demand stops.
    fn drop_expired(&mut self) {
        if self.deadlines_queued == 0 {
            return;
        }
        let now = Instant::now();
        let expired = self.sched.take_where(class_index(IoClass::Prefetch), |j| {
            j.expires.is_some_and(|e| e <= now)
        });
        for (tenant, job) in expired {
            self.execute(tenant, job);
        }
    }

    /// Serve a turn's worth of queued requests in fair order (within the bandwidth cap).
    fn serve(&mut self) {
        self.drop_expired();
        let start = Instant::now();
        for _ in 0..JOBS_PER_TURN {
            if start.elapsed() > TURN_BUDGET {
                return;
            }
            if let Some(b) = &mut self.bucket {
                b.refill();
                if b.tokens < 0.0 {
                    return;
                }
            }
            let Some((tenant, job)) = self.sched.pop() else {
                return;
            };
            if let Some(b) = &mut self.bucket {
                b.tokens -= job.pages as f64;
            }
            self.execute(tenant, job);
        }
    }

    fn execute(&mut self, tenant: usize, job: Job) {
        let c = self
            .conns
            .get_mut(&job.conn)
            .expect("jobs of closed connections are dropped");
        self.held.sub(c, job.reserve);
        c.inflight.remove(&job.id);
        let ci = class_index(job.class);
        self.metrics.requests[ci].fetch_add(1, Ordering::Relaxed);
        self.tenants[tenant].metrics.requests[ci].fetch_add(1, Ordering::Relaxed);
        if job.expires.is_some() {
            self.deadlines_queued -= 1;
        }
        if job.expires.is_some_and(|e| e <= Instant::now()) {
            let waited = job.expires.map(|e| e.elapsed()).unwrap_or_default();
            let msg = format!(
                "prefetch of {} page(s) dropped: still queued {} us past its deadline",
                job.pages,
                waited.as_micros()
            );
            self.send_error(job.conn, job.id, job.class, ErrorCode::Late, &msg);
        } else if self.sessions.get(&job.session).is_none_or(|s| s.closed) {
            self.send_error(
                job.conn,
                job.id,
                job.class,
                ErrorCode::SessionUnknown,
                "the session was closed",
            );
        } else {
            match job.kind {
                Kind::Read => self.exec_read(tenant, &job),
                Kind::Write => self.exec_write(tenant, &job),
                Kind::Free | Kind::Close => self.exec_free(tenant, &job),
                other => unreachable!("{other:?} is not queued"),
            }
        }
        self.pool.put(job.body);
    }

    fn exec_read(&mut self, tenant: usize, job: &Job) {
        let h = Header::new(job.kind, job.class, job.id, job.body.len);
        let Ok(Frame::Read(r)) = p::decode(&h, job.body.bytes()) else {
            unreachable!("validated when queued")
        };
        let mut crcs = Vec::with_capacity(r.len());
        let mut pages: Vec<&[u8]> = Vec::with_capacity(r.len() + 1);
        let mut missing = None;
        for k in r.keys() {
            match self.store.get(job.session, k) {
                Some((crc, page)) => {
                    crcs.push(crc);
                    pages.push(page);
                }
                None => {
                    missing = Some(k);
                    break;
                }
            }
        }
        if let Some(k) = missing {
            let msg = format!(
                "page {} of region {} is not stored (never written, freed, or lost)",
                k.page, k.region
            );
            return self.send_error(job.conn, job.id, job.class, ErrorCode::NotFound, &msg);
        }
        let mut head = Vec::with_capacity(p::HEADER_LEN + 4 + 4 * crcs.len());
        p::encode_read_ok_head(&mut head, job.id, job.class, &crcs);
        pages.insert(0, &head);
        let n = crcs.len() as u64;
        // Borrowing: the pages point into the store, the connection is another field.
        let c = self.conns.get_mut(&job.conn).expect("checked by execute");
        match c.send(&pages) {
            Ok(queued) => self.held.add(c, queued),
            Err(e) => return self.close(job.conn, Close::Io(e.to_string())),
        }
        self.metrics.pages_read.fetch_add(n, Ordering::Relaxed);
        self.tenants[tenant]
            .metrics
            .pages_read
            .fetch_add(n, Ordering::Relaxed);
    }

    fn exec_write(&mut self, tenant: usize, job: &Job) {
        let h = Header::new(job.kind, job.class, job.id, job.body.len);
        let Ok(Frame::Write(w)) = p::decode(&h, job.body.bytes()) else {
            unreachable!("validated when queued")
        };
        if let Some(i) = w.first_bad_page() {
            let k = w.key(i);
            let msg = format!(
                "page {} of region {} arrived with a bad checksum; nothing of this write was \
                 stored",
                k.page, k.region
            );
            return self.send_error(job.conn, job.id, job.class, ErrorCode::Checksum, &msg);
        }
        let new = self
            .store
            .count_new(job.session, (0..w.len()).map(|i| w.key(i))) as u64;
        let t = &self.tenants[tenant];
        let refusal = if self.store.used() as u64 + new > self.store.capacity() as u64 {
            Some((
                ErrorCode::CapacityExceeded,
                format!(
                    "the server is full: {} of {} stored, this write adds {} pages",
                    mib(self.store.used() as u64),
                    mib(self.store.capacity() as u64),
                    new
                ),
            ))
        } else if t.used_pages + new > t.quota_pages {
            Some((
                ErrorCode::QuotaExceeded,
                format!(
                    "tenant '{}' would exceed its quota of {}: it holds {} and this write adds \
                     {} pages",
                    t.name,
                    mib(t.quota_pages),
                    mib(t.used_pages),
                    new
                ),
            ))
        } else {
            None
        };
        if let Some((code, msg)) = refusal {
            t.metrics.refused_writes.fetch_add(1, Ordering::Relaxed);
            return self.send_error(job.conn, job.id, job.class, code, &msg);
        }
        let mut added = 0u64;
        for i in 0..w.len() {
            if self.store.put(job.session, w.key(i), w.crc(i), w.page(i)) {
                added += 1;
            }
        }
        let n = w.len() as u64;
        let sess = self.sessions.get_mut(&job.session).expect("live session");
        sess.pages += added;
        let session_pages = sess.pages;
        self.account(tenant, added as i64);
        self.metrics.pages_written.fetch_add(n, Ordering::Relaxed);
        self.tenants[tenant]
            .metrics
            .pages_written
            .fetch_add(n, Ordering::Relaxed);
        let mut out = Vec::new();
        p::encode_write_ok(
            &mut out,
            job.id,
            job.class,
            &p::WriteOk {
                new_pages: added as u32,
                session_pages,
            },
        );
        self.send(job.conn, &[&out]);
    }

    /// Free a range (Free) or the whole session (Close).
    fn exec_free(&mut self, tenant: usize, job: &Job) {
        let freed = if job.kind == Kind::Close {
            let freed = self.store.free_session(job.session);
            let sess = self.sessions.get_mut(&job.session).expect("live session");
            sess.closed = true;
            let key = (sess.tenant, sess.id);
            self.session_index.remove(&key);
            freed
        } else {
            let h = Header::new(job.kind, job.class, job.id, job.body.len);
            let Ok(Frame::Free(f)) = p::decode(&h, job.body.bytes()) else {
                unreachable!("validated when queued")
            };
            self.store
                .free_range(job.session, f.region, f.first, f.count)
        } as u64;
        let sess = self.sessions.get_mut(&job.session).expect("live session");
        sess.pages -= freed;
        let session_pages = sess.pages;
        self.account(tenant, -(freed as i64));
        self.metrics.pages_freed.fetch_add(freed, Ordering::Relaxed);
        let mut out = Vec::new();
        p::encode_free_ok(
            &mut out,
            job.id,
            &p::FreeOk {
                freed,
                session_pages,
            },
        );
        self.send(job.conn, &[&out]);
    }

    /// Pages added to (or removed from) a tenant: usage and gauges.
    fn account(&mut self, tenant: usize, delta: i64) {
        let t = &mut self.tenants[tenant];
        t.used_pages = t.used_pages.saturating_add_signed(delta);
        t.metrics
            .stored_pages
            .store(t.used_pages, Ordering::Relaxed);
        self.metrics
            .stored_pages
            .store(self.store.used() as u64, Ordering::Relaxed);
    }

    fn close(&mut self, id: u64, why: Close) {
        let Some(mut c) = self.conns.remove(&id) else {
            return;
        };
        let _ = self.poll.registry().deregister(&mut c.sock);
        // Its queued requests go now: a client that fills its window and reconnects again
        // and again must not pile up request bodies.
        let dropped = self.sched.take_all_where(|j| j.conn == id);
        self.deadlines_queued -= dropped.iter().filter(|(_, j)| j.expires.is_some()).count();
        self.held.forget(&mut c);
        self.metrics.connections.fetch_sub(1, Ordering::Relaxed);
        if let State::Ready { session, .. } = c.state {
            self.detach(session);
        }
        match why {
            Close::Eof => tracing::debug!("connection {id} from {} closed", c.peer),
            Close::Io(e) => tracing::info!("connection {id} from {}: {e}; closed", c.peer),
            Close::BadInput(e) => {
                self.metrics.bad_input.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    "connection {id} from {} sent bad input ({e}); closed",
                    c.peer
                );
            }
            Close::Refused(e) => tracing::warn!("connection {id} from {}: {e}; closed", c.peer),
            Close::Timeout => {
                self.metrics.bad_input.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    "connection {id} from {} did not finish its handshake in {} s; closed",
                    c.peer,
                    HANDSHAKE_TIMEOUT.as_secs()
                )
            }
        }
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
        let expired: Vec<SessionIdx> = self
            .sessions
            .iter()
            .filter(|(_, s)| {
                s.detached_since
                    .is_some_and(|d| now.duration_since(d) > self.cfg.session_timeout)
            })
            .map(|(&i, _)| i)
            .collect();
        for s in expired {
            let sess = self.sessions.remove(&s).expect("listed");
            self.session_index.remove(&(sess.tenant, sess.id));
            let freed = self.store.free_session(s) as u64;
            self.account(sess.tenant, -(freed as i64));
            self.metrics.pages_freed.fetch_add(freed, Ordering::Relaxed);
            tracing::info!(
                "a session of tenant '{}' had no connection for {} s: its {} pages are freed",
                self.tenants[sess.tenant].name,
                self.cfg.session_timeout.as_secs(),
                freed
            );
        }
        self.metrics
            .sessions
            .store(self.sessions.len() as u64, Ordering::Relaxed);
        self.metrics
            .held_bytes
            .store(self.held.total as u64, Ordering::Relaxed);
    }
}
