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
//!
//! The library interposes nothing: a Rust program that uses it keeps its own allocator.
//! `libfarmem.so` (crate `libfarmem`) puts a C API and the transparent mode of `farmem run`
//! on top of it. How the modules fit together: `ARCHITECTURE.md` at the repository's root.

// The public surface.
pub mod backend;
pub mod cache_trim;
pub mod cgroup_charge;
pub mod config;
pub mod ctl;
pub mod disjoint;
pub mod error;
pub mod fault_log;
mod hint;
mod inherited;
mod lend;
mod runtime;
pub mod scope;
mod stats;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tree_budget;

// The machinery (ARCHITECTURE.md lists it in dependency order; tests/layering.rs keeps it
// free of cycles).
mod book;
mod control;
mod deferred;
mod demotion;
mod discard;
mod env;
mod extents;
mod fault;
mod fetch;
mod fork;
mod fork_window;
mod gate;
mod neighbour;
mod page;
mod placement;
mod policy;
mod predict;
mod process_budget;
mod protect_handoff;
mod reclaim;
mod region;
mod regions;
mod registry;
mod state;
mod thread;
mod unreadable;
mod watchdog;
mod workers;
mod workingset;
mod write_guess;

pub use backend::{
    check_far_dir, compressed_max, default_far_dir, far_file_max, BackendSpec, TcpSpec,
};
pub use config::{BudgetScope, Config, FarCopies, PolicyKind};
pub use error::{Error, Result};
pub use farmem_sys::mem::PAGE_SIZE;
pub use hint::{hint, hint_ex, hint_slow, hint_write, FM_SEQ, FM_WRITE};
pub use runtime::{Region, Runtime};
pub use stats::{StatsSnapshot, STATS_FILE};

// The wire's page is the machine's page.
const _: () = assert!(farmem_proto::PAGE_SIZE == farmem_sys::mem::PAGE_SIZE);

/// Whether this process is a child forked from a far-memory process whose far pages were
/// brought back for the fork (a memory server's): its memory is all local and it has no
/// runtime. A child of an in-process store keeps its far memory and runtime: false there.
pub fn forked_child_is_local() -> bool {
    registry::in_child()
}
