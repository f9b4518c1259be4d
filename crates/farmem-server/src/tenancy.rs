//! Tenants and sessions: a tenant is created on its first authenticated connection (with its
//! weight and quota from the token file) and forgotten once it has neither pages nor sessions,
//! so churn of tenant names cannot fill the table. A session is one program's namespace of
//! pages inside its tenant, attached to by each of its connections and kept a while after the
//! last one goes so that the program can reconnect; not kept if it holds no pages (a client
//! that finds its empty session gone starts it afresh) or if its client said Goodbye.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use farmem_proto::auth::SessionKey;
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
        let t = self.tenants.insert(Tenant {
            name: name.to_string(),
            quota_pages,
            used_pages: 0,
            sessions: 0,
            conns: 0,
            metrics,
        });
        self.sched.set_flow(t, weight);
        self.held.new_tenant(t);
        self.tenant_index.insert(name.to_string(), t);
        self.metrics
            .tenants_known
            .store(self.tenants.len() as u64, Ordering::Relaxed);
        // Names under a shared secret are any client's to make up, as many as it likes: one
        // line each would be a log anyone can fill. Tenants of the token file are few.
        if entry.is_some() {
            tracing::info!(
                target: LOG_TARGET,
                "tenant '{name}': weight {weight}, quota {}",
                mib(quota_pages)
            );
        } else {
            tracing::debug!(
                target: LOG_TARGET,
                "tenant '{name}': weight {weight}, quota {}",
                mib(quota_pages)
            );
        }
        Ok(t)
    }

    /// Forget a tenant that has no pages, no sessions and no connections: its slot, its
    /// place in the fair queue and its metrics go.
    pub(crate) fn forget_if_unused(&mut self, t: usize) {
        let tn = &self.tenants[t];
        if tn.sessions > 0 || tn.conns > 0 || tn.used_pages > 0 {
            return;
        }
        let tn = self.tenants.remove(t);
        debug_assert_eq!(
            self.held.tenants[t], 0,
            "a tenant without connections holds nothing"
        );
        self.tenant_index.remove(&tn.name);
        self.metrics.forget_tenant(&tn.metrics);
        self.metrics
            .tenants_known
            .store(self.tenants.len() as u64, Ordering::Relaxed);
        tracing::debug!(target: LOG_TARGET, "tenant '{}' forgotten", tn.name);
    }

    /// An authenticated connection of tenant `t` begins.
    pub(crate) fn tenant_connected(&mut self, t: usize) {
        let tn = &mut self.tenants[t];
        tn.conns += 1;
        if tn.conns == 1 {
            self.tenants_connected += 1;
        }
    }

    /// An authenticated connection of tenant `t` ends (its session is detached after).
    pub(crate) fn tenant_disconnected(&mut self, t: usize) {
        let tn = &mut self.tenants[t];
        tn.conns -= 1;
        if tn.conns == 0 {
            self.tenants_connected -= 1;
        }
    }

    /// Attach a connection to its session: `(index, existed, pages)`.
    /// The key of the session `id` of `tenant`, if it exists.
    pub(crate) fn session_key(&self, tenant: usize, id: &SessionId) -> Option<&SessionKey> {
        let s = self.session_index.get(&(tenant, *id))?;
        self.sessions.get(s).map(|s| &s.key)
    }

    /// Attach a connection to its session (its key proven by the caller if it exists), or
    /// create it with `new_key` unless `resume` says it must exist.
    pub(crate) fn attach(
        &mut self,
        tenant: usize,
        id: SessionId,
        resume: bool,
        new_key: &SessionKey,
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
                free_at_close: false,
                key: new_key.clone(),
            },
        );
        self.session_index.insert((tenant, id), s);
        self.tenants[tenant].sessions += 1;
        self.metrics
            .sessions
            .store(self.sessions.len() as u64, Ordering::Relaxed);
        Ok((s, false, 0))
    }

    /// A connection of session `s` ends. The last one leaves the session kept for the
    /// session timeout, unless there is nothing to keep: no pages, closed, or a Goodbye.
    pub(crate) fn detach(&mut self, s: SessionIdx) {
        let Some(sess) = self.sessions.get_mut(&s) else {
            return;
        };
        sess.conns -= 1;
        if sess.conns > 0 {
            return;
        }
        if sess.closed || sess.free_at_close || sess.pages == 0 {
            let goodbye = (sess.free_at_close && !sess.closed && sess.pages > 0)
                .then(|| self.tenants[sess.tenant].name.clone());
            let freed = self.remove_session(s);
            if let Some(name) = goodbye {
                tracing::info!(
                    target: LOG_TARGET,
                    "a session of tenant '{name}' said goodbye and closed: its {freed} pages \
                     are freed"
                );
            }
        } else {
            sess.detached_since = Some(Instant::now());
        }
    }

    /// The client's Goodbye: free the session as soon as its last connection goes (or,
    /// `false`, keep it for the session timeout as usual).
    pub(crate) fn goodbye(&mut self, s: SessionIdx, free_at_close: bool) {
        if let Some(sess) = self.sessions.get_mut(&s) {
            sess.free_at_close = free_at_close;
        }
    }

    /// Free the sessions that have had no connection for the session timeout.
    pub(crate) fn expire_sessions(&mut self, now: Instant) {
        let expired: Vec<(SessionIdx, usize)> = self
            .sessions
            .iter()
            .filter(|(_, s)| {
                s.detached_since
                    .is_some_and(|d| now.duration_since(d) > self.cfg.session_timeout)
            })
            .map(|(&i, s)| (i, s.tenant))
            .collect();
        for (s, t) in expired {
            let name = self.tenants[t].name.clone();
            let freed = self.remove_session(s);
            tracing::info!(
                target: LOG_TARGET,
                "a session of tenant '{name}' had no connection for {} s: its {freed} pages \
                 are freed",
                self.cfg.session_timeout.as_secs()
            );
        }
    }

    /// Remove a session and free its pages (its tenant goes too if that was all it had).
    /// Returns the pages freed.
    fn remove_session(&mut self, s: SessionIdx) -> u64 {
        let sess = self.sessions.remove(&s).expect("a live session");
        // A closed session left the index already, and its id may name a newer one now.
        if self.session_index.get(&(sess.tenant, sess.id)) == Some(&s) {
            self.session_index.remove(&(sess.tenant, sess.id));
        }
        let freed = self.store.free_session(s) as u64;
        self.account(sess.tenant, -(freed as i64));
        self.metrics.pages_freed.fetch_add(freed, Ordering::Relaxed);
        self.metrics
            .sessions
            .store(self.sessions.len() as u64, Ordering::Relaxed);
        self.tenants[sess.tenant].sessions -= 1;
        self.forget_if_unused(sess.tenant);
        freed
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
