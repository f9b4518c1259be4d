//! Accepting connections: each new one is admitted into the pool of connections in their
//! handshake (`admission`), which may first drop an older handshake to make room, or refused
//! at once if its address is in its back-off after failed authentications.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::time::Instant;

use farmem_proto::{self as p, ErrorCode, IoClass};
use mio::{Interest, Token};

use crate::admission::{Room, Verdict};
use crate::closing::Close;
use crate::conn::Conn;
use crate::events::Event;
use crate::metrics::Refusal;
use crate::source::Source;
use crate::state::{Engine, LOG_TARGET};

impl Engine {
    /// Accept every connection waiting.
    pub(crate) fn accept(&mut self) {
        loop {
            let (mut sock, peer) = match self.listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors, typically: the tick tries again.
                    if self.events.note(Event::Refused, None, "accept failed") {
                        tracing::warn!(target: LOG_TARGET, "accepting a connection failed: {e}");
                    }
                    return;
                }
            };
            let now = Instant::now();
            let source = Source::of(peer.ip());
            let victim = match self.admission.admit(source, now) {
                Verdict::Refuse(left) => {
                    let msg = format!(
                        "too many failed authentications from {source} lately: try again in \
                         {:.1} s",
                        left.as_secs_f64()
                    );
                    let mut out = Vec::new();
                    p::encode_error(&mut out, 0, IoClass::Demand, ErrorCode::TooBusy, &msg);
                    let _ = sock.write(&out);
                    self.metrics.error(ErrorCode::TooBusy);
                    self.metrics.refused(Refusal::AuthBackoff);
                    let why = Refusal::AuthBackoff.describe();
                    if self.events.note(Event::Refused, Some(source), why) {
                        tracing::warn!(
                            target: LOG_TARGET,
                            "refused a connection from {peer}: {msg}"
                        );
                    }
                    continue;
                }
                Verdict::Admit(victim) => victim,
            };
            if let Some((old, room)) = victim {
                let (why, msg) = match room {
                    Room::PerSource => (
                        Refusal::UnauthPerAddr,
                        format!(
                            "dropped to make room: {} connections from {source} in their \
                             handshake (--max-unauth-per-addr)",
                            self.cfg.max_unauth_per_addr
                        ),
                    ),
                    Room::Pool => (
                        Refusal::UnauthFull,
                        format!(
                            "dropped to make room: all {} handshake slots taken \
                             (--max-unauth-conns)",
                            self.cfg.max_unauth
                        ),
                    ),
                };
                self.farewell(old, ErrorCode::TooBusy, &msg);
                self.close(old, Close::Refused(why, msg));
            }
            let _ = sock.set_nodelay(true);
            let id = self.next_conn;
            self.next_conn += 1;
            if let Err(e) = self.poll.registry().register(
                &mut sock,
                Token(id as usize),
                Interest::READABLE | Interest::WRITABLE,
            ) {
                tracing::warn!(target: LOG_TARGET, "registering a connection failed: {e}");
                continue;
            }
            self.conns
                .insert(id, Conn::new(sock, peer, now + self.cfg.handshake_timeout));
            self.admission.enter(source, id);
            self.metrics.connections.fetch_add(1, Ordering::Relaxed);
            self.metrics
                .unauth_connections
                .fetch_add(1, Ordering::Relaxed);
            self.metrics
                .connections_total
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(target: LOG_TARGET, "connection {id} from {peer}");
        }
    }
}
