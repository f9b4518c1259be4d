//! Work a process leaves for later: what a forked child needs only if it lives on (its
//! control, watchdog and control-socket threads, `workers.rs`, `ctl.rs`), run by a fault
//! thread once the process has lived [`DEFER_NS`].

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::state::{Deferred, State};

/// How long a forked child lives before its deferred work runs.
pub(crate) const DEFER_NS: u64 = 5_000_000;

/// Leave `f` for the fault thread to run once the process has lived [`DEFER_NS`] (from
/// now, if nothing waits yet).
pub(crate) fn defer(st: &State, f: Deferred) {
    st.deferred.lock().push(f);
    let at = st.now_ns() + DEFER_NS;
    let _ = st
        .deferred_at_ns
        .compare_exchange(0, at, Ordering::AcqRel, Ordering::Relaxed);
}

/// Run the deferred work if its time has come (on a fault thread, outside the fork gate).
pub(crate) fn run_deferred(st: &Arc<State>) {
    let at = st.deferred_at_ns.load(Ordering::Acquire);
    if at == 0 || st.now_ns() < at {
        return;
    }
    if st
        .deferred_at_ns
        .compare_exchange(at, 0, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    let work = std::mem::take(&mut *st.deferred.lock());
    for f in work {
        f(st);
    }
}

/// How long a fault thread may sleep (in ms, at most `ms`) before deferred work is due.
pub(crate) fn sleep_ms(st: &State, ms: i32) -> i32 {
    match st.deferred_at_ns.load(Ordering::Acquire) {
        0 => ms,
        at => {
            let left_ms = at.saturating_sub(st.now_ns()).div_ceil(1_000_000);
            ms.min(left_ms.min(i32::MAX as u64) as i32)
        }
    }
}
