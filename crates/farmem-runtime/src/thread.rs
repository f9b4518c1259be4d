//! The runtime's own threads (fault threads, the control thread, the TCP backend's
//! receivers).

use farmem_sys::signals::BlockAll;

use crate::scope;

/// Start one of the runtime's own threads. Its allocations stay in local memory even when
/// the program's heap is far (a fault thread must never fault on its own data), from its
/// first instruction, and it blocks every asynchronous signal: a handler of the program that
/// touched far memory on the fault thread would wait for itself.
pub(crate) fn spawn<F>(name: String, f: F) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    // Every signal is blocked in this thread while spawning, so that the new thread starts
    // with them blocked (it inherits the mask): a process-directed signal must never land on
    // a runtime thread, not even in its first instructions.
    let _blocked = BlockAll::enter();
    // Spawned from a keep-local scope: what the spawn allocates here stays local, and an
    // allocator that puts the heap in far memory (libfarmem's `pthread_create`) starts the
    // new thread keep-local before Rust's thread start allocates anything there. The closure
    // marks it again for programs without such an allocator (where it costs nothing).
    let _local = scope::LocalScope::enter();
    std::thread::Builder::new().name(name).spawn(move || {
        scope::keep_local_on_this_thread();
        warm_lock_parking();
        f()
    })
}

/// Make parking_lot's per-thread parking record now, with a wait that times out at once: a
/// runtime thread's first contended lock would otherwise register its destructor then, under
/// the dynamic loader's lock, which a program thread faulting inside `dlopen` may hold while
/// it waits for this thread (`fetch::warm_thread_locals` says more).
fn warm_lock_parking() {
    let m = parking_lot::Mutex::new(());
    let cv = parking_lot::Condvar::new();
    let mut g = m.lock();
    let _ = cv.wait_for(&mut g, std::time::Duration::ZERO);
}
