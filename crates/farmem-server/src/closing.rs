//! Closing connections: one at a time (what it held, queued and attached to goes with it, and
//! why it closed is logged and counted), or all of them when the server stops.

use std::sync::atomic::Ordering;

use crate::conn::State;
use crate::state::{Engine, HANDSHAKE_TIMEOUT, LOG_TARGET};

/// Why a connection is closed (decides the log level and the metrics).
pub(crate) enum Close {
    Eof,
    Io(String),
    BadInput(String),
    Refused(String),
    Timeout,
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
        self.held.forget(&mut c);
        self.metrics.connections.fetch_sub(1, Ordering::Relaxed);
        if let State::Ready { session, .. } = c.state {
            self.detach(session);
        }
        match why {
            Close::Eof => {
                tracing::debug!(
                    target: LOG_TARGET,
                    "connection {id} from {} closed",
                    c.peer
                )
            }
            Close::Io(e) => {
                tracing::info!(
                    target: LOG_TARGET,
                    "connection {id} from {}: {e}; closed",
                    c.peer
                )
            }
            Close::BadInput(e) => {
                self.metrics.bad_input.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    target: LOG_TARGET,
                    "connection {id} from {} sent bad input ({e}); closed",
                    c.peer
                );
            }
            Close::Refused(e) => {
                tracing::warn!(
                    target: LOG_TARGET,
                    "connection {id} from {}: {e}; closed",
                    c.peer
                )
            }
            Close::Timeout => {
                self.metrics.bad_input.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    target: LOG_TARGET,
                    "connection {id} from {} did not finish its handshake in {} s; closed",
                    c.peer,
                    HANDSHAKE_TIMEOUT.as_secs()
                )
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
