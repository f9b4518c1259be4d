//! `pthread_create`, wrapped so that glibc's own record of the new thread stays local.
//!
//! glibc allocates a thread's TLS vector (DTV) with `calloc` while creating it. Were that in
//! far memory, any thread-local access through `__tls_get_addr` (the runtime's own, made on a
//! program thread that holds page locks or a backend completion) could fault on it, and the
//! runtime threads that would serve the fault could be waiting for that very thread. The
//! creation therefore runs with the thread's allocations kept local; the new thread's own
//! allocations are the program's as usual.

use std::ffi::{c_int, c_void};
use std::sync::atomic::AtomicUsize;

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
    let _local = super::LocalScope::enter();
    // SAFETY: the caller's arguments, passed through.
    unsafe { create(thread, attr, start, arg) }
}
