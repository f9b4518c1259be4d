//! The watchdog: a page fault is never left waiting silently.
//!
//! A thread that faults on far memory waits until the runtime serves the fault. If that
//! never happens (the fault thread stuck, a page lock never released), the program hangs
//! with no word of why. The watchdog, a thread of its own that takes no lock the paths take,
//! reports on stderr when a fault has waited longer than `FARMEM_WATCHDOG_S`:
//!
//! - the fault thread has been busy with one batch of faults that long (it waits for the
//!   backend or for budget);
//! - fault events have been waiting that long to be read (nobody reads the userfaultfd);
//! - a fault parked on a locked page has been retried that long (`fault.rs` reports it,
//!   through [`report`]).
//!
//! Each stall is reported once. With `FARMEM_WATCHDOG_ABORT=1` (tests) a report stops the
//! program: a stall is then a failure with its cause, not a hang until a timeout.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::state::State;
use crate::stats::add;

/// Report a stall: counted, said on stderr (the program's runtime has no log subscriber), and
/// fatal if the configuration asks for it.
pub(crate) fn report(st: &State, what: &str) {
    add(&st.stats.c.watchdog_reports, 1);
    let msg = format!("a page fault has waited too long: {what}\n{}", describe(st));
    if st.cfg.watchdog_abort {
        farmem_sys::process::fatal(&format!("watchdog: {msg}"));
    }
    eprintln!("farmem: watchdog: {msg}");
}

/// What the runtime and each thread of the process were doing when the stall was found, so
/// that a stall seen once (in CI, on a user's machine) says where it is: the budget, the
/// fork gate, the fault thread, and each thread's kernel state, wait channel, system call
/// and (readable as root) kernel stack.
fn describe(st: &State) -> String {
    let (closed, inside) = crate::gate::describe();
    let busy = st.fault_busy_since.load(Ordering::Acquire);
    let busy_ms = if busy == 0 {
        0.0
    } else {
        st.now_ns().saturating_sub(busy) as f64 / 1e6
    };
    let mut out = format!(
        "farmem: watchdog: pid {} resident {} budget {} free target {} reclaim paused {} \
         fault thread up {} busy {busy_ms:.1} ms, fork gate closed {closed} with {inside} \
         inside",
        std::process::id(),
        st.resident.load(Ordering::Relaxed),
        st.budget(),
        st.free_target(),
        st.reclaim_paused.load(Ordering::Relaxed),
        st.fault_thread_up.load(Ordering::Relaxed),
    );
    for line in farmem_sys::threads::describe(std::path::Path::new("/proc/self")) {
        out.push_str("\nfarmem: watchdog:   ");
        out.push_str(&line);
    }
    out
}

/// The bound, if the watchdog is on.
pub(crate) fn bound(st: &State) -> Option<Duration> {
    (st.cfg.watchdog_s > 0.0).then(|| Duration::from_secs_f64(st.cfg.watchdog_s))
}

/// The watchdog thread's loop.
pub(crate) fn run(st: Arc<State>) {
    let Some(bound) = bound(&st) else { return };
    let tick = (bound / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let bound_ns = bound.as_nanos() as u64;
    // The stall last reported, so that each is reported once.
    let mut reported_busy = 0u64;
    let mut unread_since: Option<Instant> = None;
    let mut reported_unread = false;
    loop {
        {
            let g = st.watchdog_lock.lock().unwrap_or_else(|p| p.into_inner());
            if st.shutdown.load(Ordering::Acquire) {
                return;
            }
            drop(st.watchdog_cv.wait_timeout(g, tick));
            if st.shutdown.load(Ordering::Acquire) {
                return;
            }
        }
        let busy = st.fault_busy_since.load(Ordering::Acquire);
        if busy != 0 && busy != reported_busy && st.now_ns().saturating_sub(busy) > bound_ns {
            reported_busy = busy;
            report(
                &st,
                &format!(
                    "the fault thread has been serving one batch of faults for over {} s \
                     (waiting for far memory or for local budget)",
                    bound.as_secs_f64()
                ),
            );
        }
        if st.uffd.has_events() {
            let since = *unread_since.get_or_insert_with(Instant::now);
            if since.elapsed() > bound && !reported_unread {
                reported_unread = true;
                report(
                    &st,
                    &format!(
                        "fault events have waited over {} s to be read (no fault thread reads \
                         them)",
                        bound.as_secs_f64()
                    ),
                );
            }
        } else {
            unread_since = None;
            reported_unread = false;
        }
    }
}
