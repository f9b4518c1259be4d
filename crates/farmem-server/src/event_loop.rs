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
//! unsent output before the server stops reading it, and each tenant its share of the
//! server's buffer limit; a connection that stops mid-frame or stops taking its replies is
//! closed after the frame timeout; connections (authenticated, and in their handshake, per
//! address too), sessions and tenants are capped.

use std::io::Read;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mio::{Events, Token};

use crate::closing::Close;
use crate::metrics::Refusal;
use crate::state::{Engine, LISTENER, LOG_TARGET, SIGNALS, TICK};

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
                TICK
            };
            // However long the bandwidth cap makes the queue wait, deadlines (handshakes,
            // stalls, prefetches answered Late) keep being checked.
            let timeout = timeout.min(TICK.saturating_sub(last_tick.elapsed()));
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
            if last_tick.elapsed() >= TICK {
                last_tick = Instant::now();
                self.tick();
            }
        }
        self.shutdown();
        Ok(())
    }

    /// Periodic work: deadlines of handshakes, frames and replies; abandoned sessions;
    /// strikes of addresses; gauges; summaries of what was not logged line by line.
    fn tick(&mut self) {
        let now = Instant::now();
        // An accept that failed for want of descriptors is not signalled again.
        self.accept();
        let frame_s = self.cfg.frame_timeout.as_secs();
        let late: Vec<(u64, Close)> = self
            .conns
            .iter()
            .filter_map(|(&id, c)| {
                let why = if c.deadline.is_some_and(|d| now > d) {
                    Close::Refused(
                        Refusal::HandshakeTimeout,
                        format!(
                            "did not finish its handshake in {} s",
                            self.cfg.handshake_timeout.as_secs()
                        ),
                    )
                } else if c.stalled_mid_frame(now, self.cfg.frame_timeout) {
                    Close::BadInput(
                        "stalled mid-frame",
                        format!("stopped in the middle of a frame for {frame_s} s"),
                    )
                } else if c.stalled_replies(now, self.cfg.frame_timeout) {
                    Close::BadInput(
                        "stopped taking replies",
                        format!("took none of its replies for {frame_s} s"),
                    )
                } else {
                    return None;
                };
                Some((id, why))
            })
            .collect();
        for (id, why) in late {
            self.close(id, why);
        }
        debug_assert_eq!(
            self.admission.waiting() + self.authed,
            self.conns.len(),
            "every connection is in the handshake pool or authenticated"
        );
        self.expire_sessions(now);
        self.admission.backoff.prune(now);
        self.metrics
            .sessions
            .store(self.sessions.len() as u64, Ordering::Relaxed);
        self.metrics
            .held_bytes
            .store(self.held.total as u64, Ordering::Relaxed);
        for line in self.events.summaries(now) {
            tracing::warn!(target: LOG_TARGET, "{line}");
        }
    }
}
