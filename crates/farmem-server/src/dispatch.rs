//! What requests do, once their turn comes: read pages (sent straight from the store), write
//! them (within the server's capacity and the tenant's quota), free a range or a whole
//! session; and Stats and Goodbye, answered at once.

use std::sync::atomic::Ordering;
use std::time::Instant;

use farmem_proto::{self as p, ErrorCode, Frame, Header, Kind};

use crate::closing::Close;
use crate::state::{class_index, mib, Engine, Job};
use crate::store::SessionIdx;

impl Engine {
    /// Serve a job taken from the queue: answer `Late` past its deadline, `SessionUnknown`
    /// if its session was closed meanwhile, else do what it asks. A job whose connection
    /// closed after it left the queue (answering an earlier job of a batch taken out at once
    /// can close it) is dropped.
    pub(crate) fn execute(&mut self, tenant: usize, job: Job) {
        if job.expires.is_some() {
            self.deadlines_queued -= 1;
        }
        let Some(c) = self.conns.get_mut(&job.conn) else {
            // Its holdings went with the connection.
            self.pool.put(job.body);
            return;
        };
        self.held.sub(c, job.reserve);
        c.inflight.remove(&job.id);
        let ci = class_index(job.class);
        self.metrics.requests[ci].fetch_add(1, Ordering::Relaxed);
        self.tenants[tenant].metrics.requests[ci].fetch_add(1, Ordering::Relaxed);
        if job.expires.is_some_and(|e| e <= Instant::now()) {
            let waited = job.expires.map(|e| e.elapsed()).unwrap_or_default();
            let msg = format!(
                "prefetch of {} page(s) dropped: still queued {} us past its deadline",
                job.pages,
                waited.as_micros()
            );
            self.send_error(job.conn, job.id, job.class, ErrorCode::Late, &msg);
        } else if self.sessions.get(&job.session).is_none_or(|s| s.closed) {
            self.send_error(
                job.conn,
                job.id,
                job.class,
                ErrorCode::SessionUnknown,
                "the session was closed",
            );
        } else {
            match job.kind {
                Kind::Read => self.exec_read(tenant, &job),
                Kind::Write => self.exec_write(tenant, &job),
                Kind::Free | Kind::Close => self.exec_free(tenant, &job),
                other => unreachable!("{other:?} is not queued"),
            }
        }
        self.pool.put(job.body);
    }

    fn exec_read(&mut self, tenant: usize, job: &Job) {
        let h = Header::new(job.kind, job.class, job.id, job.body.len);
        let Ok(Frame::Read(r)) = p::decode(&h, job.body.bytes()) else {
            unreachable!("validated when queued")
        };
        let mut crcs = Vec::with_capacity(r.len());
        let mut pages: Vec<&[u8]> = Vec::with_capacity(r.len() + 1);
        let mut missing = None;
        for k in r.keys() {
            match self.store.get(job.session, k) {
                Some((crc, page)) => {
                    crcs.push(crc);
                    pages.push(page);
                }
                None => {
                    missing = Some(k);
                    break;
                }
            }
        }
        if let Some(k) = missing {
            let msg = format!(
                "page {} of region {} is not stored (never written, freed, or lost)",
                k.page, k.region
            );
            return self.send_error(job.conn, job.id, job.class, ErrorCode::NotFound, &msg);
        }
        let mut head = Vec::with_capacity(p::HEADER_LEN + 4 + 4 * crcs.len());
        p::encode_read_ok_head(&mut head, job.id, job.class, &crcs);
        pages.insert(0, &head);
        let n = crcs.len() as u64;
        // Borrowing: the pages point into the store, the connection is another field.
        let c = self.conns.get_mut(&job.conn).expect("checked by execute");
        match c.send(&pages) {
            Ok(queued) => self.held.add(c, queued),
            Err(e) => return self.close(job.conn, Close::Io(e.to_string())),
        }
        self.metrics.pages_read.fetch_add(n, Ordering::Relaxed);
        self.tenants[tenant]
            .metrics
            .pages_read
            .fetch_add(n, Ordering::Relaxed);
    }

    fn exec_write(&mut self, tenant: usize, job: &Job) {
        let h = Header::new(job.kind, job.class, job.id, job.body.len);
        let Ok(Frame::Write(w)) = p::decode(&h, job.body.bytes()) else {
            unreachable!("validated when queued")
        };
        if let Some(i) = w.first_bad_page() {
            let k = w.key(i);
            let msg = format!(
                "page {} of region {} arrived with a bad checksum; nothing of this write was \
                 stored",
                k.page, k.region
            );
            return self.send_error(job.conn, job.id, job.class, ErrorCode::Checksum, &msg);
        }
        let new = self
            .store
            .count_new(job.session, (0..w.len()).map(|i| w.key(i))) as u64;
        let t = &self.tenants[tenant];
        let refusal = if self.store.used() as u64 + new > self.store.capacity() as u64 {
            Some((
                ErrorCode::CapacityExceeded,
                format!(
                    "the server is full: {} of {} stored, this write adds {} pages",
                    mib(self.store.used() as u64),
                    mib(self.store.capacity() as u64),
                    new
                ),
            ))
        } else if t.used_pages + new > t.quota_pages {
            Some((
                ErrorCode::QuotaExceeded,
                format!(
                    "tenant '{}' would exceed its quota of {}: it holds {} and this write adds \
                     {} pages",
                    t.name,
                    mib(t.quota_pages),
                    mib(t.used_pages),
                    new
                ),
            ))
        } else {
            None
        };
        if let Some((code, msg)) = refusal {
            t.metrics.refused_writes.fetch_add(1, Ordering::Relaxed);
            return self.send_error(job.conn, job.id, job.class, code, &msg);
        }
        let mut added = 0u64;
        for i in 0..w.len() {
            if self.store.put(job.session, w.key(i), w.crc(i), w.page(i)) {
                added += 1;
            }
        }
        let n = w.len() as u64;
        let sess = self.sessions.get_mut(&job.session).expect("live session");
        sess.pages += added;
        let session_pages = sess.pages;
        self.account(tenant, added as i64);
        self.metrics.pages_written.fetch_add(n, Ordering::Relaxed);
        self.tenants[tenant]
            .metrics
            .pages_written
            .fetch_add(n, Ordering::Relaxed);
        let mut out = Vec::new();
        p::encode_write_ok(
            &mut out,
            job.id,
            job.class,
            &p::WriteOk {
                new_pages: added as u32,
                session_pages,
            },
        );
        self.send(job.conn, &[&out]);
    }

    /// Free a range (Free) or the whole session (Close).
    fn exec_free(&mut self, tenant: usize, job: &Job) {
        let freed = if job.kind == Kind::Close {
            let freed = self.store.free_session(job.session);
            let sess = self.sessions.get_mut(&job.session).expect("live session");
            sess.closed = true;
            let key = (sess.tenant, sess.id);
            self.session_index.remove(&key);
            freed
        } else {
            let h = Header::new(job.kind, job.class, job.id, job.body.len);
            let Ok(Frame::Free(f)) = p::decode(&h, job.body.bytes()) else {
                unreachable!("validated when queued")
            };
            self.store
                .free_range(job.session, f.region, f.first, f.count)
        } as u64;
        let sess = self.sessions.get_mut(&job.session).expect("live session");
        sess.pages -= freed;
        let session_pages = sess.pages;
        self.account(tenant, -(freed as i64));
        self.metrics.pages_freed.fetch_add(freed, Ordering::Relaxed);
        let mut out = Vec::new();
        p::encode_free_ok(
            &mut out,
            job.id,
            &p::FreeOk {
                freed,
                session_pages,
            },
        );
        self.send(job.conn, &[&out]);
    }

    /// Answer a Goodbye (not queued: it only marks the session).
    pub(crate) fn answer_goodbye(&mut self, id: u64, req: u64, session: SessionIdx, free: bool) {
        self.goodbye(session, free);
        let mut out = Vec::new();
        p::encode_empty(&mut out, Kind::GoodbyeOk, req);
        self.send(id, &[&out]);
    }

    /// Answer a Stats request (not queued: it only reads counters).
    pub(crate) fn stats(&mut self, id: u64, req: u64, tenant: usize, session: SessionIdx) {
        let s = &self.sessions[&session];
        let t = &self.tenants[tenant];
        let mut out = Vec::new();
        p::encode_stats_ok(
            &mut out,
            req,
            &p::StatsOk {
                session_pages: s.pages,
                tenant_pages: t.used_pages,
                quota_pages: t.quota_pages,
                server_pages: self.store.used() as u64,
                capacity_pages: self.store.capacity() as u64,
            },
        );
        self.send(id, &[&out]);
    }
}
