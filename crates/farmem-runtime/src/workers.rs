//! Starting a runtime's threads: its fault thread(s), the control thread and the watchdog.
//! At its start, and in a forked child that takes the runtime over (`fork.rs`).

use std::sync::Arc;
use std::thread::JoinHandle;

use crate::error::{Error, Result};
use crate::state::State;
use crate::{control, fault, thread, watchdog};

/// Start the threads, whose handles the state keeps (joined at shutdown).
pub(crate) fn start(st: &Arc<State>) -> Result<()> {
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
    let s = st.clone();
    threads.push(
        thread::spawn("farmem-control".into(), move || control::run(s))
            .map_err(|e| Error::sys("starting control thread", e))?,
    );
    if watchdog::bound(st).is_some() {
        let s = st.clone();
        threads.push(
            thread::spawn("farmem-watchdog".into(), move || watchdog::run(s))
                .map_err(|e| Error::sys("starting the watchdog thread", e))?,
        );
    }
    *st.threads.lock() = threads;
    Ok(())
}
