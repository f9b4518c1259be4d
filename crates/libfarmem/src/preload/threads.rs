//! `pthread_create`, wrapped so that glibc's own record of the new thread stays local, and so
//! that the runtime's threads keep their memory local from their very first instruction.
//!
//! glibc allocates a thread's TLS vector (DTV) with `calloc` while creating it. Were that in
//! far memory, any thread-local access through `__tls_get_addr` (the runtime's own, made on a
//! program thread that holds page locks or a backend completion) could fault on it, and the
//! runtime threads that would serve the fault could be waiting for that very thread. The
//! creation therefore runs with the thread's allocations kept local; the new thread's own
//! allocations are the program's as usual.
//!
//! Except when the creator is working for the runtime (`scope::keeps_local`: the runtime
//! starts its fault, control and TCP receiver threads that way). Such a thread allocates
//! before its own code runs: Rust's thread start registers thread-local destructors, and
//! glibc `calloc`s a record for that. Were that the far heap's allocator, the thread could
//! fault before it ever ran, and the fault could need the very thread it stopped (a TCP
//! receiver delivering the write-back the fault thread waits for: a hang, seen under load).
//! So the new thread starts in a trampoline that marks it keep-local before anything else.

use std::ffi::{c_int, c_void};
use std::sync::atomic::AtomicUsize;

use farmem_runtime::scope::{self, LocalScope};

type StartFn = extern "C" fn(*mut c_void) -> *mut c_void;
type CreateFn = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    StartFn,
    *mut c_void,
) -> c_int;

static REAL: AtomicUsize = AtomicUsize::new(0);

fn real() -> usize {
    super::next_symbol(&REAL, c"pthread_create")
}

/// # Safety
/// As C `pthread_create`.
#[no_mangle]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    start: StartFn,
    arg: *mut c_void,
) -> c_int {
    let f = real();
    if f == 0 {
        return libc::EAGAIN;
    }
    // SAFETY: `f` is glibc's pthread_create, which has exactly this signature.
    let create: CreateFn = unsafe { std::mem::transmute::<usize, CreateFn>(f) };
    let for_runtime = scope::keeps_local();
    if !for_runtime {
        // A program thread the runtime pinned beside its fault thread gets its own affinity
        // back before its new thread inherits it.
        super::spawn::before_spawn(true);
    }
    let _local = LocalScope::enter();
    if !for_runtime {
        // SAFETY: the caller's arguments, passed through.
        return unsafe { create(thread, attr, start, arg) };
    }
    // Allocated while this thread keeps local (glibc's heap); freed by the new thread.
    let boxed = Box::into_raw(Box::new(Start { start, arg }));
    // SAFETY: the caller's thread and attributes; `local_start` takes ownership of `boxed`.
    let rc = unsafe { create(thread, attr, local_start, boxed.cast()) };
    if rc != 0 {
        // SAFETY: the thread was not created, so `boxed` is still ours.
        drop(unsafe { Box::from_raw(boxed) });
    }
    rc
}

/// What a runtime thread was asked to run.
struct Start {
    start: StartFn,
    arg: *mut c_void,
}

/// The first code a runtime thread runs: keep its memory local, then run what it was given.
extern "C" fn local_start(p: *mut c_void) -> *mut c_void {
    scope::keep_local_on_this_thread();
    // SAFETY: `p` is the `Start` boxed by `pthread_create` above, handed to this thread only.
    let s = unsafe { Box::from_raw(p.cast::<Start>()) };
    (s.start)(s.arg)
}
