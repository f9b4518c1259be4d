//! `fork()` and far memory.
//!
//! A child made by `fork()` gets a copy of the address space but not the userfaultfd
//! registration (the kernel drops it unless `UFFD_FEATURE_EVENT_FORK` is asked for) and not
//! the runtime's threads. A page that is far at the moment of the fork would read as zeros
//! in the child. So before every fork (a `pthread_atfork` prepare handler) each runtime
//! pauses reclaim, waits for the eviction batch in progress, and brings every far page back
//! into local memory, beyond the budget if need be; the child then inherits all of its
//! memory as ordinary copy-on-write pages, exactly as under plain Linux. After the fork the
//! parent resumes reclaim and evicts back down to its budget.
//!
//! Cost: a fork takes time proportional to the far part of the heap (a fetch of every far
//! page, ~1 GiB/s with the local backend here) and the parent holds its whole heap locally
//! for a moment. The child runs without far memory: its runtime threads did not survive the
//! fork, so it keeps everything local (hints become no-ops, new regions are refused).
//! `posix_spawn` and `vfork` (what `system()` and most `subprocess` calls use) do not run
//! fork handlers and cost nothing.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Once};

use parking_lot::lock_api::RawRwLock as _;
use parking_lot::Mutex;

use crate::fetch::demand;
use crate::fetch::readahead;
use crate::fetch::request::{Mode, Request};
use crate::page::table;
use crate::registry::{self, in_child};
use crate::scope::RuntimeScope;
use crate::state::State;
use crate::stats::add;

/// Runtimes paused by the prepare handler, resumed by the parent handler.
static PAUSED: Mutex<Vec<Arc<State>>> = Mutex::new(Vec::new());

/// Install the fork handlers (once per process).
pub(crate) fn install_handlers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registering three plain extern "C" functions that never unwind.
        let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
        if rc != 0 {
            tracing::warn!("pthread_atfork failed ({rc}): a forked child may see zeros");
        }
    });
}

fn no_unwind(what: &str, f: impl FnOnce()) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
        farmem_sys::process::fatal(&format!(
            "internal error (panic) in the fork {what} handler"
        ));
    }
}

extern "C" fn prepare() {
    let _scope = RuntimeScope::enter();
    no_unwind("prepare", || {
        if in_child() {
            return; // a child of a child: nothing is far here
        }
        let runtimes = registry::live_runtimes();
        for st in &runtimes {
            pause(st);
        }
        *PAUSED.lock() = runtimes;
    })
}

extern "C" fn parent() {
    no_unwind("parent", || {
        for st in PAUSED.lock().drain(..) {
            resume(&st);
        }
    })
}

extern "C" fn child() {
    registry::enter_child();
    // The paused runtimes stay paused (their threads do not exist here); their locks are
    // never taken again in this process.
    std::mem::forget(std::mem::take(&mut *PAUSED.lock()));
}

/// Stop reclaim, wait for the batch in flight, and bring every far page back.
fn pause(st: &Arc<State>) {
    st.reclaim_paused.store(true, Ordering::SeqCst);
    // Waits for the eviction batches in progress (they hold the gate shared).
    // SAFETY: taking the raw lock without a guard; `resume` (parent) releases it on this
    // same thread, and in the child it is never touched again.
    unsafe { st.evict_gate.raw() }.lock_exclusive();
    readahead::complete_range(st, 0, usize::MAX);
    let regions = st.regions.all();
    let mut fetched = 0u64;
    for reg in regions {
        let mut vpn = reg.first_vpn();
        while vpn < reg.end_vpn() {
            if !is_far(vpn) {
                vpn += 1;
                continue;
            }
            let start = vpn;
            while vpn < reg.end_vpn() && vpn - start < 256 && is_far(vpn) {
                vpn += 1;
            }
            let req = Request::demand(start, vpn - start, false, Mode::Hint);
            match demand::ensure(st, &reg, &req) {
                Ok(o) => fetched += o.installed as u64,
                Err(e) => farmem_sys::process::fatal(&format!(
                    "fork: bringing far pages back for the child failed: {e}"
                )),
            }
        }
    }
    add(&st.stats.c.fork_fetched_pages, fetched);
}

/// A page whose contents exist only in far memory.
fn is_far(vpn: usize) -> bool {
    table::slot(vpn).load().is_far()
}

fn resume(st: &Arc<State>) {
    st.reclaim_paused.store(false, Ordering::SeqCst);
    // SAFETY: `pause` took the gate exclusively on this thread (the one that forked) and
    // nothing released it since.
    unsafe { st.evict_gate.raw().unlock_exclusive() };
    st.kick_control();
}
