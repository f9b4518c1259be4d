//! The engine's state: what the event loop works on (connections, tenants, sessions, the page
//! store, the fair queue, the memory held), the records it keeps, and its construction. The
//! engine's work is in `impl Engine` blocks in the modules above this one (see `lib.rs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use farmem_proto::auth::SessionKey;
use farmem_proto::tokens::TokenFile;
use farmem_proto::{IoClass, Kind, SessionId, PAGE_SIZE};
use farmem_sys::random::random_bytes;
use mio::net::{TcpListener, UnixStream};
use mio::{Interest, Poll, Token};

use crate::admission::Admission;
use crate::bucket::Bucket;
use crate::conn::{Body, BufPool, Conn};
use crate::events::EventLog;
use crate::holdings::Holdings;
use crate::metrics::{Metrics, TenantMetrics};
use crate::slab::Slab;
use crate::store::{SessionIdx, Store};
use crate::wfq::Wfq;

/// Poll tokens of the listener and of the signal pipe; connections have the tokens after.
pub(crate) const LISTENER: Token = Token(0);
pub(crate) const SIGNALS: Token = Token(1);
/// The target of the engine's log lines: the one they had when the engine was a single
/// module, so that `FARMEM_LOG` filters and the log's look stay as they were.
pub(crate) const LOG_TARGET: &str = "farmem_server::engine";
/// How often the periodic work runs (deadlines, expiry, gauges, log summaries).
pub(crate) const TICK: Duration = Duration::from_millis(250);

pub(crate) struct Config {
    pub capacity_pages: usize,
    pub tokens: TokenFile,
    pub default_quota_pages: u64,
    pub default_weight: u32,
    pub session_timeout: Duration,
    /// Most authenticated connections.
    pub max_conns: usize,
    /// Most connections in their handshake, in all and per source address.
    pub max_unauth: usize,
    pub max_unauth_per_addr: usize,
    /// A connection must finish its handshake this soon after it is accepted.
    pub handshake_timeout: Duration,
    /// Pages of requests and replies one connection may have in flight.
    pub window_pages: u32,
    /// Bytes the connections may hold, shared among the tenants connected (each may hold
    /// its share, at least one connection's window; see `Engine::allowance`).
    pub global_limit: usize,
    /// A connection that stops in the middle of a frame, or stops taking its replies, this
    /// long is closed.
    pub frame_timeout: Duration,
    /// Keep polling without sleeping this long after the last request.
    pub spin: Duration,
    /// Most pages served per second (a link's capacity); `None`: as fast as possible.
    pub max_pages_per_s: Option<f64>,
}

pub(crate) struct Tenant {
    pub name: String,
    pub quota_pages: u64,
    pub used_pages: u64,
    /// Its sessions (kept or attached); with no pages either, the tenant is forgotten.
    pub sessions: u32,
    /// Its authenticated connections (tenants with some share the buffer limit).
    pub conns: u32,
    pub metrics: Arc<TenantMetrics>,
}

pub(crate) struct Session {
    pub tenant: usize,
    pub id: SessionId,
    pub conns: u32,
    pub detached_since: Option<Instant>,
    pub pages: u64,
    /// Closed by its client: pages freed, only waiting for its connections to go.
    pub closed: bool,
    /// Its client said Goodbye: free it as soon as its last connection goes.
    pub free_at_close: bool,
    /// Derived by the connection that created it: every other connection proves it.
    pub key: SessionKey,
}

/// A request waiting in the fair queue.
pub(crate) struct Job {
    pub conn: u64,
    pub id: u64,
    pub class: IoClass,
    pub kind: Kind,
    pub body: Body,
    pub session: SessionIdx,
    /// Pages read or written (what the bandwidth cap counts).
    pub pages: usize,
    /// Bytes counted in the connection's `held` for this job.
    pub reserve: usize,
    /// A prefetch read's deadline: past it the pages would reach the client after the
    /// program needed them, so the request is answered `Late` unserved.
    pub expires: Option<Instant>,
}

pub(crate) struct Engine {
    pub cfg: Config,
    pub poll: Poll,
    pub listener: TcpListener,
    pub signals: UnixStream,
    pub conns: HashMap<u64, Conn>,
    pub next_conn: u64,
    /// Of `conns`, the authenticated ones (the others are in `admission`'s pool).
    pub authed: usize,
    pub admission: Admission,
    pub events: EventLog,
    pub tenants: Slab<Tenant>,
    /// Tenants with authenticated connections (they share `global_limit`).
    pub tenants_connected: usize,
    pub tenant_index: HashMap<String, usize>,
    pub sessions: HashMap<SessionIdx, Session>,
    pub session_index: HashMap<(usize, SessionId), SessionIdx>,
    pub next_session: SessionIdx,
    pub store: Store,
    pub sched: Wfq<Job>,
    pub pool: BufPool,
    pub metrics: Arc<Metrics>,
    pub instance: u64,
    pub held: Holdings,
    pub paused: Vec<u64>,
    pub bucket: Option<Bucket>,
    pub stop: bool,
    /// Queued jobs that carry a deadline (prefetch reads): none, no scan for expired ones.
    pub deadlines_queued: usize,
}

pub(crate) fn class_index(c: IoClass) -> usize {
    match c {
        IoClass::Demand => 0,
        IoClass::Prefetch => 1,
        IoClass::WriteBack => 2,
    }
}

pub(crate) fn mib(pages: u64) -> String {
    format!(
        "{:.1} MiB",
        (pages * PAGE_SIZE as u64) as f64 / (1u64 << 20) as f64
    )
}

impl Engine {
    pub(crate) fn new(
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
        let admission = Admission::new(cfg.max_unauth, cfg.max_unauth_per_addr);
        Ok(Engine {
            cfg,
            poll,
            listener,
            signals,
            conns: HashMap::new(),
            next_conn: 2,
            authed: 0,
            admission,
            events: EventLog::new(Instant::now()),
            tenants: Slab::default(),
            tenants_connected: 0,
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
}
