//! Closing connections: one at a time (what it held, queued and attached to goes with it, and
//! why it closed is counted and logged), or all of them when the server stops. What anyone
//! can provoke without the secret (refusals, failed authentications, bad input) is logged
//! through `events`: a few lines in full, then a summary per interval.

use std::sync::atomic::Ordering;

use crate::conn::State;
use crate::events::Event;
use crate::metrics::Refusal;
use crate::state::{Engine, LOG_TARGET};

/// Why a connection is closed (decides the log level and the metrics).
pub(crate) enum Close {
    Eof,
    Io(String),
    /// Malformed, out-of-order or stalled: (the kind of fault, for summaries; the detail).
    BadInput(&'static str, String),
    /// A limit on connections.
    Refused(Refusal, String),
    /// A wrong proof, or one not examined because the address is in its back-off.
    AuthFailed {
        examined: bool,
        detail: String,
    },
    /// The handshake cannot go on: no common version, an unknown session, a full table.
    Declined(String),
}

impl Engine {
    pub(crate) fn close(&mut self, id: u64, why: Close) {
        let Some(mut c) = self.conns.remove(&id) else {
            return;
        };
        let _ = self.poll.registry().deregister(&mut c.sock);
        // Its queued requests go now: a client that fills its window and reconnects again
        // and again must not pile up request bodies.
        let dropped = self.sched.take_all_where(|j| j.conn == id);
        self.deadlines_queued -= dropped.iter().filter(|(_, j)| j.expires.is_some()).count();
        for (_, j) in dropped {
            self.pool.put(j.body);
        }
        self.held.forget(&mut c);
        self.metrics.connections.fetch_sub(1, Ordering::Relaxed);
        let authed = match c.state {
            State::Ready { tenant, session } => {
                self.authed -= 1;
                self.tenant_disconnected(tenant);
                self.detach(session);
                true
            }
            _ => {
                self.admission.leave(c.source, id);
                self.metrics
                    .unauth_connections
                    .fetch_sub(1, Ordering::Relaxed);
                false
            }
        };
        let peer = c.peer;
        match why {
            Close::Eof => {
                tracing::debug!(target: LOG_TARGET, "connection {id} from {peer} closed")
            }
            // Anyone can reset a connection in its handshake: only an authenticated one's
            // failure is news.
            Close::Io(e) if authed => {
                tracing::info!(target: LOG_TARGET, "connection {id} from {peer}: {e}; closed")
            }
            Close::Io(e) => {
                tracing::debug!(target: LOG_TARGET, "connection {id} from {peer}: {e}; closed")
            }
            Close::BadInput(kind, e) => {
                self.metrics.bad_input.fetch_add(1, Ordering::Relaxed);
                if self.events.note(Event::BadInput, Some(c.source), kind) {
                    tracing::warn!(
                        target: LOG_TARGET,
                        "connection {id} from {peer} sent bad input ({e}); closed"
                    );
                }
            }
            Close::Refused(r, e) => {
                self.metrics.refused(r);
                if self
                    .events
                    .note(Event::Refused, Some(c.source), r.describe())
                {
                    tracing::warn!(target: LOG_TARGET, "connection {id} from {peer}: {e}; closed");
                }
            }
            Close::AuthFailed { examined, detail } => {
                let reason = if examined {
                    "wrong proof"
                } else {
                    "refused unexamined during the address's back-off"
                };
                if self.events.note(Event::AuthFailed, Some(c.source), reason) {
                    tracing::warn!(
                        target: LOG_TARGET,
                        "connection {id} from {peer}: {detail}; closed"
                    );
                }
            }
            Close::Declined(e) => {
                if self
                    .events
                    .note(Event::Refused, Some(c.source), "handshake declined")
                {
                    tracing::warn!(target: LOG_TARGET, "connection {id} from {peer}: {e}; closed");
                }
            }
        }
    }

    /// The server stops: every connection is closed, and the pages stored go with the process.
    pub(crate) fn shutdown(&mut self) {
        tracing::info!(
            target: LOG_TARGET,
            "shutting down: closing {} connection(s); {} pages of {} session(s) are dropped",
            self.conns.len(),
            self.store.used(),
            self.sessions.len()
        );
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for id in ids {
            self.close(id, Close::Eof);
        }
    }
}
