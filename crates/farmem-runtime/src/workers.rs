//! Starting a runtime's threads: its fault thread(s), the control thread and the watchdog.
//! At its start, and in a forked child that takes the runtime over (`fork.rs`).
//!
//! A forked child starts its fault thread at once (it may fault on far memory from its
//! first instruction) and leaves the rest for later (`deferred.rs`): the control and
//! watchdog threads, and the control socket's (`ctl.rs`), start once the child has lived
//! [`deferred::DEFER_NS`], from its fault thread. Most forked children are short-lived (a
//! shell's `$(...)`, a fork before `exec`), and starting three threads took ~350 us of every
//! fork's child handler. Until then nothing is missing: the child's first budget measurement
//! comes later anyway (`fork.rs`), a reservation with nothing to evict measures the budget
//! itself (`reclaim::reserve`), and a stall is reported once the watchdog runs.

use std::sync::Arc;
use std::thread::JoinHandle;

use crate::error::{Error, Result};
use crate::state::State;
use crate::{control, deferred, fault, thread, watchdog};

/// Start the threads, whose handles the state keeps (joined at shutdown).
pub(crate) fn start(st: &Arc<State>) -> Result<()> {
    start_fault_threads(st)?;
    start_rest(st, None)
}

/// In a forked child: the fault thread(s) now, the rest deferred. The deferred threads get
/// the affinity of the calling thread (the program's, unpinned before the fork) rather than
/// that of the fault thread that starts them, which may be pinned beside the program.
pub(crate) fn start_in_child(st: &Arc<State>) -> Result<()> {
    start_fault_threads(st)?;
    let mask = farmem_sys::sched::allowed_cpus().ok();
    deferred::defer(
        st,
        Box::new(move |st| {
            if let Err(e) = start_rest(st, mask) {
                tracing::warn!("a forked child could not start its control thread: {e}");
            }
        }),
    );
    Ok(())
}

fn start_fault_threads(st: &Arc<State>) -> Result<()> {
    // The `/proc` files they read over and over, opened here on the program's thread: a
    // runtime thread opening one would take a number the program counts on for a moment
    // (`farmem_sys::proc_file`).
    farmem_sys::proc_file::prepare();
    let mut threads: Vec<JoinHandle<()>> = Vec::new();
    for i in 0..st.cfg.fault_threads {
        let s = st.clone();
        threads.push(
            thread::spawn(format!("farmem-fault-{i}"), move || fault::run(s))
                .map_err(|e| Error::sys("starting fault thread", e))?,
        );
    }
    *st.threads.lock() = threads;
    Ok(())
}

/// The control thread and the watchdog, with affinity `mask` if given.
fn start_rest(st: &Arc<State>, mask: Option<libc::cpu_set_t>) -> Result<()> {
    let placed = move |f: Box<dyn FnOnce() + Send>| {
        move || {
            if let Some(m) = mask {
                let _ = farmem_sys::sched::set_affinity(0, &m);
            }
            f()
        }
    };
    let mut threads: Vec<JoinHandle<()>> = Vec::new();
    let s = st.clone();
    threads.push(
        thread::spawn(
            "farmem-control".into(),
            placed(Box::new(move || control::run(s))),
        )
        .map_err(|e| Error::sys("starting control thread", e))?,
    );
    if watchdog::bound(st).is_some() {
        let s = st.clone();
        threads.push(
            thread::spawn(
                "farmem-watchdog".into(),
                placed(Box::new(move || watchdog::run(s))),
            )
            .map_err(|e| Error::sys("starting the watchdog thread", e))?,
        );
    }
    st.threads.lock().extend(threads);
    Ok(())
}
