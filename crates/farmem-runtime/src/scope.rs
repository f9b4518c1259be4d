//! Which threads' memory must stay local.
//!
//! The runtime's own threads, and a program thread while it works inside the runtime (a
//! hint's fetch, a discard, a fork's preparation), may hold page locks or wait for the
//! backend. Memory they allocate must never be far memory: a fault on it would wait for the
//! very thread that has to serve it. This module only keeps the per-thread flag; whoever
//! puts a program's heap in far memory (the transparent mode of `libfarmem.so`) reads it
//! with [`keeps_local`] and leaves such allocations to ordinary memory. Without such an
//! allocator the flag costs a thread-local store and nothing reads it.

use std::cell::Cell;

use farmem_sys::signals::BlockAll;

thread_local! {
    static KEEP_LOCAL: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread's allocations and mappings must stay in local memory now.
#[inline]
pub fn keeps_local() -> bool {
    KEEP_LOCAL.with(|c| c.get())
}

/// Keep every allocation and mapping of the calling thread local from now on (the
/// runtime's own threads, for their whole life).
#[inline]
pub fn keep_local_on_this_thread() {
    KEEP_LOCAL.with(|c| c.set(true));
}

/// While alive, the calling thread's allocations stay local; the previous state comes back
/// when it is dropped (scopes nest).
pub struct LocalScope {
    was: bool,
}

impl LocalScope {
    #[inline]
    pub fn enter() -> LocalScope {
        LocalScope {
            was: KEEP_LOCAL.with(|c| c.replace(true)),
        }
    }
}

impl Drop for LocalScope {
    #[inline]
    fn drop(&mut self) {
        let was = self.was;
        KEEP_LOCAL.with(|c| c.set(was));
    }
}

/// A program thread inside the runtime (a hint's fetch, a discard, a fork's preparation):
/// allocations stay local, asynchronous signals wait until it leaves, and a fork waits for
/// it (`gate.rs`). The thread may
/// hold page locks and a backend connection; a handler of the program that touched one of
/// those pages would wait for the very thread it interrupted.
pub(crate) struct RuntimeScope {
    // Dropped in this order: out of the fork gate, then allocations are the program's
    // again, then signals come back.
    _gate: crate::gate::Pass,
    _lock: LockScope,
}

impl RuntimeScope {
    pub(crate) fn enter() -> RuntimeScope {
        let lock = LockScope::enter();
        RuntimeScope {
            _gate: crate::gate::enter(),
            _lock: lock,
        }
    }
}

/// A program thread taking, for a moment, a lock that the fault thread also takes (the
/// allocation map of `extents.rs`): allocations stay local and asynchronous signals wait
/// until it lets go. Its first wait on such a lock allocates the thread's parking record
/// (through `__cxa_thread_atexit_impl`, with `calloc`): in far memory, that allocation
/// faulted while the thread already barred readers, and the fault thread, reading the map
/// for the fault's read-ahead, waited for it for ever (`exit_busy` under load, about 1 run
/// in 20). A signal handler touching far memory there would do the same.
pub(crate) struct LockScope {
    _local: LocalScope,
    _signals: BlockAll,
}

impl LockScope {
    pub(crate) fn enter() -> LockScope {
        let signals = BlockAll::enter();
        LockScope {
            _local: LocalScope::enter(),
            _signals: signals,
        }
    }
}
