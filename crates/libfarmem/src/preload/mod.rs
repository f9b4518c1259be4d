//! Transparent mode: what `farmem run` preloads.
//!
//! With `FARMEM_PRELOAD=1` in its environment, `libfarmem.so` puts the heap of an unmodified
//! program in far memory. It is the program's `malloc` family (small objects by mimalloc,
//! whose only arena is far memory; large blocks page-granular) and its anonymous private
//! `mmap`/`munmap`/`mremap`/`madvise`, which is where other allocators (CPython's, jemalloc,
//! the JVM's) get memory. File, shared, fixed and stack mappings stay ordinary.
//!
//! Start-up order matters: `malloc` may be called before `main`, before our constructor,
//! from any thread, and re-entrantly while the runtime starts (thread creation allocates).
//! Until the runtime is ready every call goes to glibc; afterwards a pointer's address says
//! who owns it (`vspace::part_of`), so `free` of memory glibc handed out early still goes
//! back to glibc. Without `FARMEM_PRELOAD` (a program linked with the C API only) nothing is
//! redirected.

mod affinity;
mod exits;
mod fds;
mod fine;
mod fine_cache;
mod malloc;
mod mi;
mod mmap;
mod report;
mod spawn;
mod statics;
mod threads;
pub mod vspace;

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use parking_lot::lock_api::RawMutex as _;

use farmem_runtime::scope::{self, LocalScope};
use farmem_runtime::{Config, Runtime};

const UNINIT: u8 = 0;
const STARTING: u8 = 1;
const READY: u8 = 2;
const OFF: u8 = 3;
/// A child forked from the program: the heap stays where it is, as ordinary memory.
const CHILD: u8 = 4;

static STATE: AtomicU8 = AtomicU8::new(UNINIT);
static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// Whether new memory of this thread goes to far memory (the heap is redirected).
#[inline]
fn active() -> bool {
    matches!(STATE.load(Ordering::Acquire), READY | CHILD) && !inside_allocator()
}

/// The transparent mode's runtime, when this process runs under `farmem run`.
fn runtime() -> Option<&'static Runtime> {
    RUNTIME.get()
}

/// Run `f` with this thread's allocations kept local: mimalloc's own bookkeeping mappings
/// stay ordinary (its blocks come from the arena, not from mmap).
#[inline]
fn in_allocator<T>(f: impl FnOnce() -> T) -> T {
    let _local = LocalScope::enter();
    f()
}

/// Whether the calling thread's memory must stay local: inside mimalloc, on the runtime's
/// own threads, or while a program thread works inside the runtime (`farmem_runtime::scope`).
#[inline]
fn inside_allocator() -> bool {
    scope::keeps_local()
}

/// The next definition of `name` after ours (glibc's), looked up once and cached in `slot`;
/// 0 if there is none. dlsym may call malloc, which is fine: no lock of ours is held here.
pub(crate) fn next_symbol(slot: &std::sync::atomic::AtomicUsize, name: &std::ffi::CStr) -> usize {
    let f = slot.load(Ordering::Relaxed);
    if f != 0 {
        return f;
    }
    // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT searches the objects after ours.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
    slot.store(f, Ordering::Relaxed);
    f
}

pub(crate) fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

pub(crate) fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Options of the transparent mode read from the environment at start.
struct Options {
    /// Pre-fault allocations up to this size at allocation time (Eden's option; 0: off).
    prefault_max: usize,
}

static OPTIONS: OnceLock<Options> = OnceLock::new();

fn env_flag(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The library constructor: start the transparent mode if asked to.
#[used]
#[link_section = ".init_array"]
static START_AT_LOAD: extern "C" fn() = {
    extern "C" fn start_at_load() {
        let on = env_flag("FARMEM_PRELOAD").is_some_and(|v| v.trim() == "1");
        if !on {
            STATE.store(OFF, Ordering::Release);
            return;
        }
        if STATE
            .compare_exchange(UNINIT, STARTING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        if std::panic::catch_unwind(start).is_err() {
            die("internal error (panic) while starting");
        }
    }
    start_at_load
};

fn die(msg: &str) -> ! {
    eprintln!("farmem: cannot run this program on far memory: {msg}");
    // SAFETY: _exit has no preconditions; exit handlers of a half-started program must not run.
    unsafe { libc::_exit(127) }
}

fn start() {
    let prefault_max = match env_flag("FARMEM_PREFAULT") {
        None => 0,
        Some(v) if v.trim() == "0" => 0,
        Some(v) if v.trim() == "1" => 64 << 10,
        Some(v) => farmem_proto::size::parse_size(&v)
            .unwrap_or_else(|e| die(&format!("FARMEM_PREFAULT: {e}"))) as usize,
    };
    let _ = OPTIONS.set(Options { prefault_max });
    let mut cfg = Config::from_env().unwrap_or_else(|e| die(&e.to_string()));
    // A program's budget is its memory, as a cgroup's limit is (process_budget.rs).
    if std::env::var_os("FARMEM_BUDGET_SCOPE").is_none() {
        cfg.budget_scope = farmem_runtime::BudgetScope::Process;
    }
    // The report at exit is written here (report.rs), not by the runtime.
    let stats_at_exit = std::mem::replace(&mut cfg.stats_at_exit, false);
    let rt = Runtime::new(cfg).unwrap_or_else(|e| die(&e.to_string()));
    let _ = RUNTIME.set(rt.clone());
    // Hints and regions of the C API share the transparent mode's runtime and budget.
    Runtime::install_global(rt.clone());
    let (mi_base, mi_len) = vspace::init(rt).unwrap_or_else(|e| die(&e));
    mi::init(mi_base, mi_len).unwrap_or_else(|e| die(&e));
    malloc::init();
    // Emptied slabs go back when idle, or at once when the budget is short.
    if let Some(rt) = RUNTIME.get() {
        rt.set_release_hook(fine::release);
    }
    // SAFETY: registering plain extern "C" functions that never unwind.
    unsafe {
        libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
    }
    report::install(stats_at_exit);
    if let Some(rt) = RUNTIME.get() {
        if let Err(e) = farmem_runtime::ctl::start(rt) {
            // Resizing from outside is a convenience: the program runs without it.
            tracing::warn!("no control socket (farmem ctl will not reach this program): {e}");
        }
    }
    if env_flag("FARMEM_STATIC").is_none_or(|v| v.trim() != "0") {
        if let Some(rt) = RUNTIME.get() {
            statics::adopt(rt);
        }
    }
    STATE.store(READY, Ordering::Release);
    tracing::debug!("farmem transparent mode started");
}

// Fork handlers: the address-space lock must not be held by another thread at the moment
// of the fork (the child would inherit it locked). The runtime's own handlers (fork.rs,
// registered earlier, so they run after this prepare and before these parent/child
// handlers) quiesce the runtime, or bring far pages back, while we hold it.

extern "C" fn fork_prepare() {
    // The fine classes' locks come before SPACE (the order they are taken in).
    fine::lock_all();
    // SAFETY: taking the raw lock without a guard; released by the parent or child handler
    // on this same thread.
    unsafe { vspace::SPACE.raw() }.lock();
}

extern "C" fn fork_parent() {
    // SAFETY: taken by fork_prepare on this thread.
    unsafe { vspace::SPACE.raw().unlock() };
    fine::unlock_all();
}

extern "C" fn fork_child() {
    // The runtime's child handler ran first: unless it kept the far memory (and itself)
    // for the child, the heap becomes ordinary memory here.
    let local = farmem_runtime::forked_child_is_local();
    // SAFETY: taken by fork_prepare on this thread, which is the child's only thread.
    unsafe {
        if local {
            if let Some(s) = (*vspace::SPACE.data_ptr()).as_mut() {
                s.enter_child();
            }
        }
        vspace::SPACE.raw().unlock();
    }
    fine::unlock_all();
    if local && STATE.load(Ordering::Acquire) == READY {
        STATE.store(CHILD, Ordering::Release);
    }
    if !local && STATE.load(Ordering::Acquire) == READY {
        // The child kept its far memory and the runtime: it answers `farmem ctl` itself.
        if let Some(rt) = RUNTIME.get() {
            farmem_runtime::ctl::restart_in_child(rt);
        }
    }
}
