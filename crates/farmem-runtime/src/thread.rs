//! The runtime's own threads (fault threads, the control thread, the TCP backend's
//! receivers).

use farmem_sys::signals::BlockAll;

use crate::scope;

/// Start one of the runtime's own threads. Its allocations stay in local memory even when
/// the program's heap is far (a fault thread must never fault on its own data), and it
/// blocks every asynchronous signal: a handler of the program that touched far memory on
/// the fault thread would wait for itself.
pub(crate) fn spawn<F>(name: String, f: F) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    // Every signal is blocked in this thread while spawning, so that the new thread starts
    // with them blocked (it inherits the mask): a process-directed signal must never land on
    // a runtime thread, not even in its first instructions.
    let _blocked = BlockAll::enter();
    std::thread::Builder::new().name(name).spawn(move || {
        scope::keep_local_on_this_thread();
        f()
    })
}
