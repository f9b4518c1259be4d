//! farmem-runtime: the far-memory runtime for Linux.
//!
//! A [`Runtime`] owns a local-memory budget, a backend that holds pages when they are not
//! local, and the threads that move pages. [`Region`]s are plain memory to the program;
//! pages that are not local are fetched on access (a page fault delivered through
//! userfaultfd) or, faster, before the access when the program [`hint`]s it.
//!
//! ```no_run
//! use farmem_runtime::{Config, Runtime};
//! let rt = Runtime::new(Config { local_mem: 64 << 20, ..Config::default() }).unwrap();
//! let region = rt.create_region(1 << 30).unwrap(); // 1 GiB, 64 MiB of it local at most
//! let p = region.as_mut_ptr();
//! farmem_runtime::hint_write(p);
//! unsafe { p.write(42) };
//! ```

pub mod backend;
mod book;
pub mod config;
mod discard;
pub mod error;
mod fault;
pub mod fault_log;
mod fetch;
pub mod fork;
mod hint;
pub mod page_table;
pub mod policy;
mod predict;
mod prefetch;
mod reclaim;
mod region;
mod runtime;
pub mod scope;
pub mod stats;
#[cfg(feature = "testing")]
pub mod testing;

pub use config::{BackendSpec, Config, PolicyKind, TcpSpec};
pub use error::{Error, Result};
pub use farmem_sys::mem::PAGE_SIZE;
pub use hint::{hint, hint_ex, hint_slow, hint_write, FM_SEQ, FM_WRITE};
pub use region::Region;
pub use runtime::Runtime;
pub use stats::StatsSnapshot;

/// Start one of the runtime's own threads. Its allocations stay in local memory even when
/// the program's heap is far (a fault thread must never fault on its own data), and it
/// blocks every asynchronous signal: a handler of the program that touched far memory on
/// the fault thread would wait for itself.
pub(crate) fn spawn_runtime_thread<F>(
    name: String,
    f: F,
) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    // Every signal is blocked in this thread while spawning, so that the new thread starts
    // with them blocked (it inherits the mask): a process-directed signal must never land on
    // a runtime thread, not even in its first instructions.
    let _blocked = farmem_sys::signals::BlockAll::enter();
    std::thread::Builder::new().name(name).spawn(move || {
        scope::keep_local_on_this_thread();
        f()
    })
}
