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
use crate::{demotion, gate, process_budget};

/// The control thread's loop.
pub(crate) fn run(st: Arc<State>) {
    let steal_after = st.cfg.steal_after_us * 1000;
    let tick = Duration::from_micros(st.cfg.steal_after_us.clamp(100, 10_000));
    let mut stealer = FaultServer::new();
    while !st.shutdown.load(Ordering::Acquire) {
        release_unused(&st);
        if round(&st, &mut stealer, steal_after) {
            continue;
        }
        let g = st.control_lock.lock().unwrap_or_else(|p| p.into_inner());
        st.control_sleeping.store(true, Ordering::SeqCst);
        if !st.wants_free_pages() && !st.shutdown.load(Ordering::Acquire) {
            drop(st.control_cv.wait_timeout(g, tick));
        }
        st.control_sleeping.store(false, Ordering::SeqCst);
    }
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

/// One round of work, inside the fork gate. Whether to go on at once (rather than sleep).
fn round(st: &Arc<State>, stealer: &mut FaultServer, steal_after: u64) -> bool {
    let _pass = gate::enter();
    readahead::sweep(st, Duration::from_millis(50));
    process_budget::refresh(st);
    // The fetch paths' queued bookkeeping, in one batch.
    drop(st.policy());
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
            if reclaim::evict_batch(st, st.cfg.evict_batch) == 0 {
                std::thread::yield_now();
                break;
            }
        }
        return true;
    }
    // Nothing to evict: move cold far pages to a slower tier if the backend wants to.
    demotion::round(st)
}
