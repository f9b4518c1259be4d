//! The TCP backend itself: connecting (secret, handshake, one connection per class) and the
//! [`Backend`] requests, split into frames the server accepts.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use farmem_proto::auth::Secret;
use farmem_proto::tokens::TokenFile;
use farmem_proto::{ErrorCode, FreeReq, IoClass, PageKey, StatsOk};
use farmem_sys::mem::PAGE_SIZE;
use parking_lot::Mutex;

use super::conn::{Conn, Done, Op};
use super::handshake::ConnectError;
use super::join::{Join, Oneshot, Reply};
use super::shared::{Counters, Peer, Shared};
use crate::backend::error::BackendError;
use crate::backend::io::{Backend, Completion, IoDone, PageBuf};
use crate::backend::spec::TcpSpec;

/// A backend storing pages in a `farmem server`.
pub struct TcpBackend {
    sh: Arc<Shared>,
    /// Demand, prefetch and write-back connections.
    conns: [Arc<Conn>; 3],
    receivers: Mutex<Vec<JoinHandle<()>>>,
}

/// The secret of `spec`: given, else `FARMEM_TOKEN`, else `FARMEM_TOKEN_FILE`.
fn resolve_secret(spec: &TcpSpec) -> Result<Secret, BackendError> {
    if let Some(s) = &spec.token {
        return Ok(s.clone());
    }
    if let Some(s) = std::env::var("FARMEM_TOKEN")
        .ok()
        .and_then(|t| Secret::from_text(&t))
    {
        return Ok(s);
    }
    if let Ok(path) = std::env::var("FARMEM_TOKEN_FILE") {
        let text = farmem_sys::secret_file::read(std::path::Path::new(&path))
            .map_err(BackendError::Failed)?;
        let f = TokenFile::parse(&text)
            .map_err(|e| BackendError::Failed(format!("token file {path}: {e}")))?;
        return f.secret_for(&spec.tenant).cloned().ok_or_else(|| {
            BackendError::Failed(format!(
                "token file {path} has no secret for tenant '{}' (and no bare secret)",
                spec.tenant
            ))
        });
    }
    Err(BackendError::Failed(
        "the tcp backend needs the server's token: set FARMEM_TOKEN to it, or \
         FARMEM_TOKEN_FILE to a file holding it"
            .into(),
    ))
}

fn connect_error(spec: &TcpSpec, e: ConnectError) -> BackendError {
    BackendError::Failed(match e {
        ConnectError::Io(m) => format!(
            "cannot reach far-memory server {}: {m} (is `farmem server` running there?)",
            spec.addr
        ),
        ConnectError::Rejected(ErrorCode::AuthFailed, m) => format!(
            "far-memory server {} rejected tenant '{}': {m}; check FARMEM_TOKEN or \
             FARMEM_TOKEN_FILE against the server's token file",
            spec.addr, spec.tenant
        ),
        ConnectError::Rejected(code, m) => format!(
            "far-memory server {} refused the connection: {m} ({})",
            spec.addr,
            code.name()
        ),
        ConnectError::Protocol(m) => format!("far-memory server {}: {m}", spec.addr),
    })
}

impl TcpBackend {
    /// Connect and authenticate (three connections), creating a new session.
    pub fn connect(spec: TcpSpec) -> Result<TcpBackend, BackendError> {
        let secret = resolve_secret(&spec)?;
        let sh = Arc::new(Shared {
            spec,
            secret,
            session: farmem_sys::random::random_bytes::<16>(),
            session_pages: AtomicU64::new(0),
            ever_stored: AtomicBool::new(false),
            instance: AtomicU64::new(0),
            max_batch: AtomicUsize::new(1),
            dead: Mutex::new(None),
            is_dead: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
            counters: Counters::default(),
            session_key: Mutex::new(None),
            handshakes: Mutex::new(()),
        });
        let conns = [IoClass::Demand, IoClass::Prefetch, IoClass::WriteBack]
            .map(|role| Arc::new(Conn::new(role, sh.clone())));
        let mut receivers = Vec::new();
        let fail = |receivers: Vec<JoinHandle<()>>, e: BackendError| {
            sh.closing.store(true, Ordering::Release);
            for c in &conns {
                c.shutdown();
            }
            for r in receivers {
                let _ = r.join();
            }
            e
        };
        for c in &conns {
            sh.conns.lock().push(Arc::downgrade(c) as Weak<dyn Peer>);
            let opened = match c.open(false) {
                Ok(o) => o,
                Err(e) => return Err(fail(receivers, connect_error(&sh.spec, e))),
            };
            let (reader, opener) = match c.install(opened) {
                Ok(r) => r,
                Err(e) => {
                    return Err(fail(
                        receivers,
                        BackendError::Failed(format!("socket set-up: {e}")),
                    ))
                }
            };
            let conn = c.clone();
            let name = format!("farmem-tcp-{:?}", c.role).to_lowercase();
            match crate::thread::spawn(name, move || conn.receive_loop(reader, opener)) {
                Ok(h) => receivers.push(h),
                Err(e) => {
                    return Err(fail(
                        receivers,
                        BackendError::Failed(format!("starting a receiver thread: {e}")),
                    ))
                }
            }
        }
        tracing::debug!(server = %sh.spec.addr, tenant = %sh.spec.tenant, "tcp backend connected");
        Ok(TcpBackend {
            sh,
            conns,
            receivers: Mutex::new(receivers),
        })
    }

    fn conn(&self, class: IoClass) -> &Conn {
        match class {
            IoClass::Demand => &self.conns[0],
            IoClass::Prefetch => &self.conns[1],
            IoClass::WriteBack => &self.conns[2],
        }
    }

    /// Send a control request and wait for its reply.
    fn control(&self, op: Op, timeout: Duration) -> Result<Reply, BackendError> {
        let o = Arc::new(Oneshot::default());
        self.conn(IoClass::WriteBack)
            .submit(IoClass::WriteBack, op, Done::Reply(o.clone()));
        o.wait(timeout).unwrap_or_else(|| {
            Err(BackendError::Failed(format!(
                "no reply from {} within {} s",
                self.sh.spec.addr,
                timeout.as_secs()
            )))
        })
    }

    /// The server's view of this session, tenant and itself.
    pub fn server_stats(&self) -> Result<StatsOk, BackendError> {
        match self.control(Op::Stats, self.sh.spec.longest_wait())? {
            Reply::Stats(s) => Ok(s),
            other => Err(BackendError::Failed(format!("unexpected reply {other:?}"))),
        }
    }

    /// Split `keys` into the server's batches and submit each part.
    fn submit(
        &self,
        class: IoClass,
        keys: Vec<PageKey>,
        mut buf: PageBuf,
        write: bool,
        useful_for: u16,
    ) -> Completion {
        let n = keys.len();
        if write && buf.len() < n {
            return Completion::ready(Err(BackendError::Failed(format!(
                "write of {n} pages with a buffer of {}",
                buf.len()
            ))));
        }
        buf.set_len(n);
        if n == 0 {
            return Completion::ready(Ok(IoDone { keys, buf }));
        }
        if let Some(msg) = self.sh.dead_msg() {
            return Completion::ready(Err(BackendError::Unavailable(msg)));
        }
        let batch = self.sh.max_batch.load(Ordering::Relaxed);
        let parts = n.div_ceil(batch);
        let wire_keys = keys.clone();
        let (completion, completer) = Completion::pending();
        let join = Arc::new(Join::new(keys, buf, completer, parts));
        let conn = self.conn(class);
        for part in 0..parts {
            let start = part * batch;
            let end = n.min(start + batch);
            let keys = &wire_keys[start..end];
            if write {
                // SAFETY: this thread handles the part until it is submitted (see `Join`).
                let pages = unsafe { join.pages(start, end - start) };
                conn.submit(
                    class,
                    Op::Write(keys, pages),
                    Done::Write { join: join.clone() },
                );
            } else {
                conn.submit(
                    class,
                    Op::Read(keys, useful_for),
                    Done::Read {
                        join: join.clone(),
                        start,
                        n: end - start,
                    },
                );
            }
        }
        completion
    }
}

impl Backend for TcpBackend {
    fn memory_in_process(&self) -> u64 {
        // The pages are on the server; its share is not this process's memory.
        0
    }

    fn describe(&self) -> String {
        self.sh.spec.url()
    }

    fn open_region(&self, _region: u32, _npages: u64) -> Result<(), BackendError> {
        // Regions exist on the server from their first page on.
        match self.sh.dead_msg() {
            Some(m) => Err(BackendError::Unavailable(m)),
            None => Ok(()),
        }
    }

    fn close_region(&self, region: u32) {
        if self.sh.dead_msg().is_some() {
            return;
        }
        let free = Op::Free(FreeReq {
            region,
            first: 0,
            count: u64::MAX,
        });
        match self.control(free, self.sh.spec.longest_wait()) {
            Ok(Reply::Freed(f)) => tracing::debug!("region {region}: {} pages freed", f.freed),
            Ok(other) => tracing::warn!("freeing region {region}: unexpected reply {other:?}"),
            Err(e) => tracing::warn!("freeing region {region} on the server failed: {e}"),
        }
    }

    fn submit_read(&self, class: IoClass, keys: Vec<PageKey>, buf: PageBuf) -> Completion {
        self.submit(class, keys, buf, false, 0)
    }

    fn submit_prefetch(
        &self,
        keys: Vec<PageKey>,
        buf: PageBuf,
        useful_for: Duration,
    ) -> Completion {
        let units = useful_for.as_micros() as u64 / farmem_proto::USEFUL_FOR_UNIT_US;
        // At least one unit (0 means no deadline), at most what the field holds.
        let units = units.clamp(1, u16::MAX as u64) as u16;
        self.submit(IoClass::Prefetch, keys, buf, false, units)
    }

    fn submit_write(&self, class: IoClass, keys: Vec<PageKey>, buf: PageBuf) -> Completion {
        self.submit(class, keys, buf, true, 0)
    }

    fn longest_wait(&self) -> Duration {
        self.sh.spec.longest_wait()
    }

    fn release_at_exit(&self, release: bool) {
        if self.sh.dead_msg().is_some() {
            return;
        }
        // Bounded and brief: it runs while the program exits (or is about to exec).
        if let Err(e) = self.control(Op::Goodbye(release), Duration::from_secs(2)) {
            tracing::debug!("goodbye to the server: {e}");
        }
    }

    fn stored_bytes(&self) -> u64 {
        self.sh.session_pages.load(Ordering::Relaxed) * PAGE_SIZE as u64
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let c = &self.sh.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            ("tcp_requests", l(&c.requests)),
            ("tcp_pages_read", l(&c.pages_read)),
            ("tcp_pages_written", l(&c.pages_written)),
            ("tcp_reconnects", l(&c.reconnects)),
            ("tcp_resent_requests", l(&c.resent)),
            ("tcp_checksum_errors", l(&c.checksum_errors)),
        ]
    }
}

impl Drop for TcpBackend {
    fn drop(&mut self) {
        // Free the session's pages now rather than when the server's session timeout
        // expires. Best effort: the server reaps abandoned sessions anyway.
        if self.sh.dead_msg().is_none() {
            if let Err(e) = self.control(Op::Close, Duration::from_secs(5)) {
                tracing::debug!("closing the session: {e}");
            }
        }
        self.sh.closing.store(true, Ordering::Release);
        for c in &self.conns {
            c.shutdown();
            c.fail_all("the backend was closed");
        }
        for r in self.receivers.lock().drain(..) {
            let _ = r.join();
        }
    }
}
