//! Tenants and sessions: a tenant is created on its first authenticated connection (with its
//! weight and quota from the token file); a session is one program's namespace of pages inside
//! its tenant, attached to by each of its connections and kept a while after the last one goes
//! so that the program can reconnect.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use farmem_proto::{ErrorCode, SessionId, PAGE_SIZE};

use crate::metrics::TenantMetrics;
use crate::state::{mib, Engine, Session, Tenant, LOG_TARGET};
use crate::store::SessionIdx;

const MAX_SESSIONS: usize = 65536;
const MAX_TENANTS: usize = 4096;

impl Engine {
    /// The tenant of this name, created on its first connection.
    pub(crate) fn tenant_for(&mut self, name: &str) -> Result<usize, (ErrorCode, String)> {
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
            target: LOG_TARGET,
            "tenant '{name}': weight {weight}, quota {}",
            mib(quota_pages)
        );
        Ok(t)
    }

    /// Attach a connection to its session: `(index, existed, pages)`.
    pub(crate) fn attach(
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

    pub(crate) fn detach(&mut self, s: SessionIdx) {
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

    /// Free the sessions that have had no connection for the session timeout.
    pub(crate) fn expire_sessions(&mut self, now: Instant) {
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
                target: LOG_TARGET,
                "a session of tenant '{}' had no connection for {} s: its {} pages are freed",
                self.tenants[sess.tenant].name,
                self.cfg.session_timeout.as_secs(),
                freed
            );
        }
    }

    /// Pages added to (or removed from) a tenant: usage and gauges.
    pub(crate) fn account(&mut self, tenant: usize, delta: i64) {
        let t = &mut self.tenants[tenant];
        t.used_pages = t.used_pages.saturating_add_signed(delta);
        t.metrics
            .stored_pages
            .store(t.used_pages, Ordering::Relaxed);
        self.metrics
            .stored_pages
            .store(self.store.used() as u64, Ordering::Relaxed);
    }
}
