//! The fair-queued service: requests join their tenant's queue in the weighted fair queue
//! (holding their body and the reply they announce until served), and each turn of the event
//! loop serves a short batch of them in fair order, within the bandwidth cap.

use std::time::{Duration, Instant};

use farmem_proto::{self as p, Frame, Header, IoClass, Kind};

use crate::closing::Close;
use crate::conn::Body;
use crate::state::{class_index, Engine, Job};
use crate::store::SessionIdx;

/// A turn serves jobs for about this long (or `JOBS_PER_TURN` jobs) before the loop reads
/// the sockets again. Short turns matter for fairness: requests that arrive meanwhile must
/// join the queue before the next choice, or a turn would just serve everything queued (each
/// client's window of requests) and the order the weights give would change nothing.
const TURN_BUDGET: Duration = Duration::from_micros(100);
const JOBS_PER_TURN: usize = 64;

impl Engine {
    /// A request of an authenticated connection: checked, then queued for its turn (Stats
    /// and Goodbye are answered at once).
    pub(crate) fn on_request(
        &mut self,
        id: u64,
        tenant: usize,
        session: SessionIdx,
        h: Header,
        body: Body,
    ) -> Result<(), Close> {
        debug_assert!(h.kind.is_request(), "admitted by the connection");
        let (pages, goodbye) = match p::decode(&h, body.bytes()) {
            Ok(Frame::Read(r)) => (r.len(), None),
            Ok(Frame::Write(w)) => (w.len(), None),
            Ok(Frame::Goodbye(g)) => (0, Some(g.free_at_close)),
            Ok(_) => (0, None),
            Err(e) => {
                self.release(id, body);
                return Err(Close::BadInput("malformed frame", e.to_string()));
            }
        };
        let c = self.conns.get_mut(&id).expect("live connection");
        if goodbye.is_some() && c.version < p::VERSION_GOODBYE {
            let v = c.version;
            self.release(id, body);
            return Err(Close::BadInput(
                "out-of-order frame",
                format!(
                    "Goodbye on a protocol version {v} connection (it needs version {})",
                    p::VERSION_GOODBYE
                ),
            ));
        }
        if !c.inflight.insert(h.id) {
            self.release(id, body);
            return Err(Close::BadInput(
                "reused request id",
                format!("request id {} reused while in flight", h.id),
            ));
        }
        if h.kind == Kind::Stats || goodbye.is_some() {
            c.inflight.remove(&h.id);
            self.release(id, body);
            match goodbye {
                Some(free) => self.answer_goodbye(id, h.id, session, free),
                None => self.stats(id, h.id, tenant, session),
            }
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
    pub(crate) fn serve(&mut self) {
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
}
