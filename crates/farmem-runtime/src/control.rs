//! The control thread: one per runtime, the one that keeps things moving in the background.
//!
//! Each round it completes read-ahead batches nobody came back for, drains the fetch paths'
//! queued bookkeeping into the policy (`book.rs`), steals faults from a fault thread that has
//! been busy too long (Eden's fault stealing: a large fetch or a direct reclaim must not
//! hold up every other fault), and reclaims ahead of demand: it keeps `free_target` pages of
//! budget free by evicting batches (Fastswap's offloaded reclaim), so that fetches rarely
//! have to reclaim for themselves. It does so only once the program has needed more than its
//! budget: a program that fits keeps every page. It sleeps on a condition variable when there is nothing
//! to do; fetches that take budget below the free target kick it awake.
//!
//! It may wait on: the policy lock, page locks held by evictions (its own), the backend (a
//! write-back, or a stolen fault's read). It never waits for a program thread.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::fault::FaultServer;
use crate::fetch::readahead;
use crate::reclaim;
use crate::state::State;
use crate::stats::add;
use crate::{demotion, gate, process_budget};

/// The control thread's loop.
pub(crate) fn run(st: Arc<State>) {
    crate::fetch::warm_thread_locals();
    let steal_after = st.cfg.steal_after_us * 1000;
    let tick = Duration::from_micros(st.cfg.steal_after_us.clamp(100, 10_000));
    let mut stealer = FaultServer::new();
    let mut pool = FreePool::default();
    let mut tidied_ns = 0;
    let mut faults_seen = 0;
    while !st.shutdown.load(Ordering::Acquire) {
        exit_report(&st);
        release_unused(&st);
        pool.adapt(&st);
        tidy(&st, &mut tidied_ns);
        if round(&st, &mut stealer, steal_after) {
            continue;
        }
        // The short tick is for stealing faults and completing read-ahead; while neither
        // can be needed the thread wakes only to measure the process's other memory.
        let faults = st.stats.c.unhinted_faults.load(Ordering::Relaxed);
        let quiet = faults == faults_seen
            && st.fault_busy_since.load(Ordering::Relaxed) == 0
            && st.inflight.is_empty();
        faults_seen = faults;
        let g = st.control_lock.lock().unwrap_or_else(|p| p.into_inner());
        st.control_sleeping.store(true, Ordering::SeqCst);
        if !st.wants_free_pages()
            && !st.shutdown.load(Ordering::Acquire)
            && st.exit_report.load(Ordering::Acquire) != 1
        {
            drop(
                st.control_cv
                    .wait_timeout(g, if quiet { tick.max(QUIET_TICK) } else { tick }),
            );
        }
        st.control_sleeping.store(false, Ordering::SeqCst);
    }
}

/// How long the control thread sleeps when no fault was served since its last round and no
/// read-ahead is in flight: the process budget's measuring interval. Ticking every 500 us
/// regardless took 3.5% of a CPU in 2,000 wake-ups a second while a program ran without
/// faulting, on a machine of 2 CPUs whose other one the program may want.
const QUIET_TICK: Duration = Duration::from_millis(10);

/// How often the control thread sizes the free pool.
const ADAPT_NS: u64 = 50_000_000;

/// The read-ahead asked for lately, for the size of the free pool. The pool is there for
/// read-ahead (it only takes budget that is free, so a short pool cuts windows short and
/// the pages cut off fault one by one); a program reading at random asks for none, and a
/// pool of two full windows (512 pages) kept 2.5 MiB of a 32 MiB budget empty for nothing:
/// the suite's csrbuild at 25%, whose counters are all of its budget, held 6,500-6,800 of
/// their 8,200 pages and refaulted the rest.
#[derive(Default)]
struct FreePool {
    /// The largest read-ahead seen, decaying by a quarter per look.
    recent: usize,
    last_ns: u64,
}

impl FreePool {
    fn adapt(&mut self, st: &State) {
        let now = st.now_ns();
        if now.saturating_sub(self.last_ns) < ADAPT_NS {
            return;
        }
        self.last_ns = now;
        let seen = st.readahead_seen.swap(0, Ordering::Relaxed);
        self.recent = seen.max(self.recent - self.recent / 4);
        let most = st.free_target.load(Ordering::Relaxed);
        let floor = st.free_floor.load(Ordering::Relaxed);
        let now_target = (2 * self.recent).clamp(floor.min(most), most);
        st.free_target_now.store(now_target, Ordering::Relaxed);
    }
}

/// Write the exit report if a thread ending the process asked for it, and tell it.
fn exit_report(st: &State) {
    if st.exit_report.load(Ordering::Acquire) != 1 {
        return;
    }
    if let Some(report) = st.exit_report_hook.get() {
        let _ = std::panic::catch_unwind(report);
    }
    st.exit_report.store(2, Ordering::Release);
    farmem_sys::mem::futex_wake_all(&st.exit_report);
}

/// How often the embedding's release hook runs: when the budget is short, before pages in
/// use are evicted; otherwise now and then, so that memory freed long ago goes back.
const RELEASE_SHORT_NS: u64 = 10_000_000;
const RELEASE_IDLE_NS: u64 = 100_000_000;

/// Call the embedding's release hook if it is time (outside the fork gate: the hook may
/// discard pages, which enters it).
fn release_unused(st: &State) {
    let Some(release) = st.release_hook.get() else {
        return;
    };
    let short = st.wants_free_pages();
    let every = if short {
        RELEASE_SHORT_NS
    } else {
        RELEASE_IDLE_NS
    };
    let now = st.now_ns();
    if now.saturating_sub(st.release_called_ns.load(Ordering::Relaxed)) >= every {
        st.release_called_ns.store(now, Ordering::Relaxed);
        release(short);
    }
}

/// How often the control thread lets the backend tidy its memory (`Backend::tidy`: the
/// in-process store's compaction, a look at two counters when there is nothing to do).
const TIDY_NS: u64 = 50_000_000;

/// Let the backend tidy its memory if it is time (inside the fork gate: a fork must not
/// find blocks half moved).
fn tidy(st: &State, last_ns: &mut u64) {
    let now = st.now_ns();
    if now.saturating_sub(*last_ns) < TIDY_NS {
        return;
    }
    *last_ns = now;
    let _pass = gate::enter();
    let moved = st.backend.tidy();
    if moved > 0 {
        add(&st.stats.c.blocks_compacted, moved as u64);
    }
}

/// One round of work, inside the fork gate. Whether to go on at once (rather than sleep).
fn round(st: &Arc<State>, stealer: &mut FaultServer, steal_after: u64) -> bool {
    let _pass = gate::enter();
    readahead::sweep(st, Duration::from_millis(50));
    process_budget::refresh(st);
    // The fetch paths' queued bookkeeping, in one batch.
    drop(st.policy());
    crate::inherited::rejoin_inherited(st);
    let busy = st.fault_busy_since.load(Ordering::Acquire);
    if busy != 0 && st.now_ns().saturating_sub(busy) > steal_after {
        stealer.steal(st);
    }
    if st.reclaim_paused.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(1));
        return true;
    }
    if st.wants_free_pages() {
        let goal = (st.free_target() + st.cfg.evict_batch).min(st.budget());
        while st.free_pages() < goal && !st.shutdown.load(Ordering::Acquire) {
            // Under steady pressure a round lasts: the budget follows the other memory.
            process_budget::refresh(st);
            if reclaim::evict_batch_if(st, st.cfg.evict_batch, || st.free_pages() < goal) == 0 {
                std::thread::yield_now();
                break;
            }
        }
        return true;
    }
    // Nothing to evict: move cold far pages to a slower tier if the backend wants to.
    demotion::round(st)
}
