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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};

use parking_lot::lock_api::RawRwLock as _;
use parking_lot::Mutex;

use crate::fetch::{self, Mode, Request};
use crate::page_table::{self as pt, ABSENT, EVER_WRITTEN, REMOTE};
use crate::runtime::{self, Inner};
use crate::stats::add;

static IN_CHILD: AtomicBool = AtomicBool::new(false);

/// Runtimes paused by the prepare handler, resumed by the parent handler.
static PAUSED: Mutex<Vec<Arc<Inner>>> = Mutex::new(Vec::new());

/// Whether this process is a child forked from a process that had far memory.
pub fn in_child() -> bool {
    IN_CHILD.load(Ordering::Relaxed)
}

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
    let _scope = crate::scope::RuntimeScope::enter();
    no_unwind("prepare", || {
        if in_child() {
            return; // a child of a child: nothing is far here
        }
        let runtimes = runtime::live_runtimes();
        for inner in &runtimes {
            pause(inner);
        }
        *PAUSED.lock() = runtimes;
    })
}

extern "C" fn parent() {
    no_unwind("parent", || {
        for inner in PAUSED.lock().drain(..) {
            resume(&inner);
        }
    })
}

extern "C" fn child() {
    IN_CHILD.store(true, Ordering::Relaxed);
    // The paused runtimes stay paused (their threads do not exist here); their locks are
    // never taken again in this process.
    std::mem::forget(std::mem::take(&mut *PAUSED.lock()));
}

/// Stop reclaim, wait for the batch in flight, and bring every far page back.
fn pause(inner: &Arc<Inner>) {
    inner.reclaim_paused.store(true, Ordering::SeqCst);
    // Waits for the eviction batches in progress (they hold the gate shared).
    // SAFETY: taking the raw lock without a guard; `resume` (parent) releases it on this
    // same thread, and in the child it is never touched again.
    unsafe { inner.evict_gate.raw() }.lock_exclusive();
    crate::prefetch::complete_range(inner, 0, usize::MAX);
    let regions: Vec<_> = inner.regions.read().values().copied().collect();
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
            let req = Request {
                first: start,
                count: vpn - start,
                write: false,
                rdahead: 0,
                ra_write: false,
                prio: 0,
                mode: Mode::Hint,
                ahead_useful_for: None,
            };
            match fetch::ensure(inner, &reg, &req) {
                Ok(o) => fetched += o.installed as u64,
                Err(e) => farmem_sys::process::fatal(&format!(
                    "fork: bringing far pages back for the child failed: {e}"
                )),
            }
        }
    }
    add(&inner.stats.c.fork_fetched_pages, fetched);
}

/// A page whose contents exist only in far memory.
fn is_far(vpn: usize) -> bool {
    let w = pt::entry(vpn).load(Ordering::Acquire);
    w & ABSENT != 0 && w & (REMOTE | EVER_WRITTEN) != 0
}

fn resume(inner: &Arc<Inner>) {
    inner.reclaim_paused.store(false, Ordering::SeqCst);
    // SAFETY: `pause` took the gate exclusively on this thread (the one that forked) and
    // nothing released it since.
    unsafe { inner.evict_gate.raw().unlock_exclusive() };
    inner.kick_control();
}
