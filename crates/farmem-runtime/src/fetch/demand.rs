//! Demand fetches: make the pages a hint or a fault needs present (and writable if asked),
//! with the read-ahead that goes with them.

use std::cell::RefCell;
use std::time::Instant;

use farmem_proto::{IoClass, PageKey};
use farmem_sys::mem::PAGE_SIZE;

use super::phases::{self, give_buf, prefetch_deadline, take_buf, DEMAND_CHUNK};
use super::readahead;
use super::request::{Locked, Mode, Outcome, Request};
use crate::backend::io::PageBuf;
use crate::config::FarCopies;
use crate::error::{Error, Result};
use crate::page::table;
use crate::page::word::PageWord;
use crate::reclaim;
use crate::regions::RegionInfo;
use crate::scope::LocalScope;
use crate::state::State;
use crate::stats::add;

thread_local! {
    /// Per-thread receive buffers handed to the backend (returned with the completion), one
    /// for demanded pages and one for read-ahead, which are in flight together.
    static RECV: RefCell<Option<PageBuf>> = const { RefCell::new(None) };
    static RECV_AHEAD: RefCell<Option<PageBuf>> = const { RefCell::new(None) };
}

/// Set up this thread's receive buffers' slots now (see `fetch::warm_thread_locals`).
pub(crate) fn warm_thread_locals() {
    RECV.with(|_| ());
    RECV_AHEAD.with(|_| ());
}

/// Make `[first, first+count)` present (and writable if asked), plus best-effort read-ahead.
pub(crate) fn ensure(st: &State, reg: &RegionInfo, req: &Request) -> Result<Outcome> {
    let _local = LocalScope::enter();
    let mut out = Outcome::default();
    let end = req.first + req.count;
    let mut vpn = req.first;
    let me = table::owner_id();
    while vpn < end {
        let slot = table::slot(vpn);
        let cur = slot.load();
        if cur.is_idle() {
            // Used again since the policy's hand passed it (a lost race with a lock holder
            // storing its word only leaves the page looking idle one more pass). A hint
            // reports its priority with the use, as the inline path's `mark_used` does.
            if req.mode == Mode::Hint {
                slot.mark_used_by_hint(cur, req.prio);
            } else {
                slot.mark_used();
            }
        }
        if !cur.needs_fetch_for(req.write) {
            if req.mode == Mode::Fault && cur.is_locked() && cur.owner() != me {
                // Looks resolved but another thread holds it: most often an eviction, which
                // write-protects the page before its word changes, so this is a write during
                // eviction. Waking the thread now would only make it fault again, a round
                // trip per retry for as long as the eviction lasts (a CSR build at 25% local:
                // 10.9 M of 22 M faults); the fault is parked and retried once unlocked.
                out.busy = true;
                return Ok(out);
            }
            vpn += 1;
            continue;
        }
        let old = match slot.try_lock(me) {
            Ok(old) => old,
            Err(cur) if !cur.is_registered() => {
                vpn += 1;
                continue;
            }
            // Held by read-ahead in flight: complete it here (this thread holds no page
            // lock at this point), then look at the page again.
            Err(_) if readahead::complete_covering(st, vpn)? => continue,
            Err(_) if req.mode == Mode::Fault => {
                out.busy = true;
                return Ok(out);
            }
            Err(_) => {
                slot.wait_unlocked(1000);
                continue;
            }
        };
        if !phases::still_in_region(st, reg, vpn) {
            // The region is gone (its faulting threads were woken when it was unregistered).
            slot.unlock(old);
            return Ok(out);
        }
        if old.is_present() {
            // Present: either someone fetched it meanwhile, or a write needs the protection
            // lifted (the first write to a page installed read-only).
            let mut new = old;
            if req.write && !old.is_writable() {
                if let Err(e) = st.uffd.writeprotect(vpn * PAGE_SIZE, PAGE_SIZE, false) {
                    slot.unlock(old);
                    return Err(Error::sys("lifting write protection", e));
                }
                new = old.unprotected();
                st.write_guess.written(vpn);
                if old.has_far_copy() && st.far_copies != FarCopies::Keep {
                    // Its far copy is outdated from this write on: free it now.
                    st.backend.forget(&[PageKey {
                        region: reg.id,
                        page: reg.index_of(vpn),
                    }]);
                    new = new.far_copy_taken();
                }
                out.unprotected += 1;
            }
            slot.unlock(new);
            vpn += 1;
            continue;
        }

        // Absent: lock the following demanded pages that are absent too, up to a chunk.
        let mut batch = vec![Locked {
            vpn,
            old,
            writable: req.write,
        }];
        let mut next = vpn + 1;
        while next < end && batch.len() < DEMAND_CHUNK {
            match table::slot(next).lock_if_absent(me) {
                Some(o) => batch.push(Locked {
                    vpn: next,
                    old: o,
                    writable: req.write,
                }),
                None => break,
            }
            next += 1;
        }
        let n_demand = batch.len();
        if next == end && req.readahead != 0 {
            lock_readahead(st, reg, req, me, &mut batch);
        }
        vpn = next;
        out.installed += fetch_locked(st, reg, req, &mut batch, n_demand)?;
    }
    Ok(out)
}

/// Pages of the aligned block of memory a fault may zero-fill beyond the page it needs,
/// outside an allocation its allocator told the runtime about (`extents.rs`). 64 left 11
/// MiB more resident in the C program below (slot tails of mimalloc's and the fine slabs'
/// blocks), for no time saved.
pub(crate) const FRESH_BLOCK: usize = 16;

/// Lock read-ahead candidates: absent, unlocked pages of the window inside the region. A
/// fault's window ends at the first page with nothing far outside the faulting page's
/// allocation (if known) or [`FRESH_BLOCK`]: zero-filling is speculation on memory the
/// program may never touch (the room left after a large block to grow into, the tail of an
/// allocator's slot), and such pages cost the budget as much as real ones. A C program
/// mixing block sizes (`bench programs`' c-fork, 128 MiB of data, 131 MiB resident
/// natively) made 160 MiB resident under farmem with read-ahead over fresh memory, 136 MiB
/// now; at its native peak it evicted 50,000 pages and took 2x native (local+lz4), now
/// 1.0x. Hints name their range: theirs is taken whole.
fn lock_readahead(st: &State, reg: &RegionInfo, req: &Request, me: u16, batch: &mut Vec<Locked>) {
    let r = req
        .readahead
        .unsigned_abs()
        .min(st.cfg.max_readahead.max(st.cfg.fault_readahead));
    // Hints name their range: only a fault's window is bounded (no lookup for hints).
    // A fault at the front of memory filled in order may go further (`Request::fresh_end`).
    let block = (req.mode == Mode::Fault).then(|| {
        let b = match st.extents.around(req.first) {
            Some(allocation) => allocation,
            None => (req.first & !(FRESH_BLOCK - 1))..((req.first | (FRESH_BLOCK - 1)) + 1),
        };
        b.start..b.end.max(req.fresh_end)
    });
    let speculative =
        |v: usize, old: PageWord| block.as_ref().is_some_and(|b| !b.contains(&v)) && !old.is_far();
    let start = batch.len();
    let mut take = |v: usize| {
        let w = table::slot(v);
        if speculative(v, w.load()) {
            return false;
        }
        if let Some(o) = w.lock_if_absent(me) {
            if speculative(v, o) {
                w.unlock(o);
                return false;
            }
            batch.push(Locked {
                vpn: v,
                old: o,
                writable: req.readahead_writable,
            });
        }
        true
    };
    if req.readahead > 0 {
        let lo = req.first + req.count;
        for v in lo..(lo + r).min(reg.end_vpn()) {
            if !take(v) {
                break;
            }
        }
    } else {
        // Nearest first, so that the window ends where fresh memory begins; then in address
        // order, as the batch is installed.
        for v in (req.first.saturating_sub(r).max(reg.first_vpn())..req.first).rev() {
            if !take(v) {
                break;
            }
        }
        batch[start..].reverse();
    }
}

/// Fetch and install a batch of locked absent pages (the first `n_demand` demanded).
/// Returns the number installed; read-ahead pages that find no free budget are released.
fn fetch_locked(
    st: &State,
    reg: &RegionInfo,
    req: &Request,
    batch: &mut Vec<Locked>,
    n_demand: usize,
) -> Result<usize> {
    let t0 = Instant::now();
    reclaim::reserve(st, n_demand);
    let extra = batch.len() - n_demand;
    if extra > 0 {
        let got = reclaim::try_reserve(st, extra);
        for l in batch.drain(n_demand + got..) {
            table::slot(l.vpn).unlock(l.old);
        }
    }
    let recv = |n| take_buf(&RECV, n);
    let recv_back = |b| give_buf(&RECV, b);
    if req.mode == Mode::Hint || st.backend.reads_in_parallel() {
        // A hint returns only once its read-ahead is installed too: one request for all the
        // pages (one reply, one wake-up) is all the thread can use. A disk backend reads one
        // request's pages in parallel, and two requests one after the other: there the
        // faulting page waits less in a request with its read-ahead than before it.
        let read = phases::submit_phase(st, reg, batch, IoClass::Demand, None, recv)?;
        phases::install_phase(st, reg, req, batch, read, recv_back)?;
    } else {
        // The faulting thread resumes as soon as its page is in, so the read-ahead goes as a
        // separate, lower-priority request. Both are sent before either is waited for: over
        // a network the read-ahead then costs no extra round trip.
        let (demand, ahead) = batch.split_at(n_demand);
        let demand_read = phases::submit_phase(st, reg, demand, IoClass::Demand, None, recv)?;
        let useful_for = prefetch_deadline(st, req.readahead_useful_for);
        let ahead_read =
            phases::submit_phase(st, reg, ahead, IoClass::Prefetch, Some(useful_for), |n| {
                take_buf(&RECV_AHEAD, n)
            })?;
        phases::install_phase(st, reg, req, demand, demand_read, recv_back)?;
        match phases::arrived_in_time(st, ahead_read) {
            Ok(read) => {
                phases::install_phase(st, reg, req, ahead, read, |b| give_buf(&RECV_AHEAD, b))?
            }
            Err(msg) => {
                tracing::trace!("fault read-ahead dropped: {msg}");
                phases::release_unread(st, ahead);
                batch.truncate(n_demand);
            }
        }
    }
    add(&st.stats.c.readahead_pages, (batch.len() - n_demand) as u64);
    // Bookkeeping is queued, not done here: the policy and the histogram are shared with
    // every other fetching thread and the reclaimer (PFA's minimal fault path).
    let ns = t0.elapsed().as_nanos() as u64;
    // The first `n_demand` pages were demanded; the rest were read ahead.
    let pages = batch
        .iter()
        .enumerate()
        .map(|(i, l)| (l.vpn, i < n_demand || req.readahead_trusted));
    if st.book.note_fetched(pages, req.prio, Some(ns)) {
        st.kick_control();
    }
    Ok(batch.len())
}
