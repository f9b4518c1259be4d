//! What the connections of one TCP backend share: the session, its secret and counters,
//! and whether the backend is dead.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Weak;

use farmem_proto::auth::{Secret, SessionKey};
use farmem_proto::{ErrorCode, SessionId, Welcome};
use parking_lot::Mutex;

use crate::backend::error::BackendError;
use crate::backend::spec::TcpSpec;

/// Largest batch this client sends in one frame (the server may ask for smaller ones):
/// large enough to amortize the per-frame cost, small enough that fair queuing on the
/// server stays fine-grained.
const CLIENT_MAX_BATCH: usize = 256;

/// A connection, as the shared state sees it: what dying does to it.
pub(crate) trait Peer: Send + Sync {
    /// Fail every request waiting on it.
    fn fail_all(&self, msg: &str);
    /// Close it; its receiver ends.
    fn shutdown(&self);
}

#[derive(Default)]
pub(crate) struct Counters {
    pub requests: AtomicU64,
    pub pages_read: AtomicU64,
    pub pages_written: AtomicU64,
    pub reconnects: AtomicU64,
    pub resent: AtomicU64,
    pub checksum_errors: AtomicU64,
}

/// State shared by the connections of one backend.
pub(crate) struct Shared {
    pub spec: TcpSpec,
    pub secret: Secret,
    pub session: SessionId,
    /// Pages the server holds for this session, as of its last reply.
    pub(crate) session_pages: AtomicU64,
    /// A write has added pages to the session: losing it would lose data.
    pub(crate) ever_stored: AtomicBool,
    /// Server process instance first seen (0: none yet).
    pub(crate) instance: AtomicU64,
    pub(crate) max_batch: AtomicUsize,
    pub(crate) dead: Mutex<Option<String>>,
    pub(crate) is_dead: AtomicBool,
    pub(crate) closing: AtomicBool,
    pub(crate) conns: Mutex<Vec<Weak<dyn Peer>>>,
    pub counters: Counters,
    /// The session's key, once a connection created the session: every other connection
    /// proves it to join (protocol v4).
    pub(crate) session_key: Mutex<Option<SessionKey>>,
    /// Held across each handshake, so that a connection that (re)creates the session and one
    /// that joins it see the same key.
    pub(crate) handshakes: Mutex<()>,
}

impl Shared {
    pub fn dead_msg(&self) -> Option<String> {
        if !self.is_dead.load(Ordering::Acquire) {
            return None;
        }
        self.dead.lock().clone()
    }

    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// The server is gone for good: fail everything pending and everything to come.
    pub fn die(&self, msg: String) {
        {
            let mut d = self.dead.lock();
            if d.is_some() {
                return;
            }
            tracing::error!("{msg}");
            *d = Some(msg.clone());
            self.is_dead.store(true, Ordering::Release);
        }
        for c in self.conns.lock().iter().filter_map(Weak::upgrade) {
            c.fail_all(&msg);
            c.shutdown();
        }
    }

    pub fn note_welcome(&self, w: &Welcome, instance: u64) {
        self.max_batch.store(
            (w.max_batch as usize).clamp(1, CLIENT_MAX_BATCH),
            Ordering::Relaxed,
        );
        let _ = self
            .instance
            .compare_exchange(0, instance, Ordering::AcqRel, Ordering::Acquire);
        if w.resumed {
            self.session_pages.store(w.session_pages, Ordering::Relaxed);
        }
    }

    pub fn instance_changed(&self, instance: u64) -> bool {
        let seen = self.instance.load(Ordering::Acquire);
        seen != 0 && seen != instance
    }

    pub fn note_stored(&self, session_pages: u64, added: bool) {
        self.session_pages.store(session_pages, Ordering::Relaxed);
        if added {
            self.ever_stored.store(true, Ordering::Release);
        }
    }

    /// The session may hold pages this program still needs.
    pub fn holds_pages(&self) -> bool {
        self.ever_stored.load(Ordering::Acquire) && self.session_pages.load(Ordering::Relaxed) > 0
    }

    pub fn lost_pages_msg(&self, why: &str) -> String {
        format!(
            "far-memory server {} lost this program's pages ({why}); {} page(s) held there \
             cannot be recovered",
            self.spec.addr,
            self.session_pages.load(Ordering::Relaxed)
        )
    }

    /// The backend error for a server's Error reply.
    pub fn error_from(&self, code: ErrorCode, msg: &str) -> BackendError {
        let m = format!("server {}: {msg}", self.spec.addr);
        match code {
            ErrorCode::QuotaExceeded | ErrorCode::CapacityExceeded => BackendError::Full(m),
            ErrorCode::Late => BackendError::Late(m),
            _ => BackendError::Failed(m),
        }
    }
}
