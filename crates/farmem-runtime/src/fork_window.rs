//! Faults of a forking thread between the fork handlers.
//!
//! A fork that keeps far pages far closes the fork gate in its prepare handler (`gate.rs`,
//! `fork.rs`): no runtime work may be under way at the fork. But the forking thread goes on
//! running the C library's own fork code after that handler, and it can touch far memory
//! there: glibc copies the NSS configuration (`__nss_database_fork_prepare_parent`, a
//! structure on the heap once the program has looked up a user, as bash does at start when
//! `SHELL` is unset) and other libraries' prepare handlers, which run after ours, lock
//! mutexes in heap objects. The thread then waits in a fault that the fault thread, waiting
//! at the closed gate, never served: the program hung with "fault events have waited over
//! 20 s to be read" (bash under `farmem run` at 25% of its peak, every run without `SHELL`).
//!
//! So while the gate is closed the fault thread serves the faults of the thread that closed
//! it, and only those: one page each (no read-ahead, nothing left in flight, nothing evicted:
//! the pages go beyond the budget, as during the rest of the fork), installed without waking
//! the thread, which is woken once the serving has let go of every lock. The forking thread
//! is the only one running runtime code meanwhile (the others wait at the gate or in their
//! faults), and it forks only after it is woken, with nothing held. Serving the parent's
//! fault also keeps the child whole: the C library's child side writes the same structure
//! before the child's handler registers its memory again, and a page still far then would
//! have read as zeros there.

use std::sync::atomic::{AtomicBool, Ordering};

use farmem_sys::mem::{PAGE_SHIFT, PAGE_SIZE};

use crate::fetch::demand;
use crate::fetch::request::{Mode, Request};
use crate::state::State;

/// Set while a fault of the forking thread is being served.
static SERVING: AtomicBool = AtomicBool::new(false);

/// Serve the forking thread's fault at `addr`; false if its page is locked (retry later).
pub(crate) fn serve(st: &State, addr: usize, write: bool) -> bool {
    let Some(reg) = st.region_of(addr) else {
        // The region went meanwhile (unregistering woke the thread already).
        return true;
    };
    let req = Request::demand(addr >> PAGE_SHIFT, 1, write, Mode::Fault);
    SERVING.store(true, Ordering::SeqCst);
    let r = farmem_sys::uffd::without_wake(|| demand::ensure(st, &reg, &req));
    SERVING.store(false, Ordering::SeqCst);
    match r {
        Ok(o) if o.busy => false,
        Ok(_) => {
            let _ = st.uffd.wake(addr, PAGE_SIZE);
            true
        }
        Err(e) => farmem_sys::process::fatal(&format!(
            "cannot resolve a page fault of a forking thread at {addr:#x}: {e}"
        )),
    }
}

/// In a forked child: whether the fork happened while a fault of the forking thread was
/// being served. Only a signal could let that thread go on before it was woken (its fault
/// retried after the handler finds the page installed): the child would then have inherited
/// the runtime in the middle of a fetch.
pub(crate) fn forked_while_serving() -> bool {
    SERVING.load(Ordering::SeqCst)
}
