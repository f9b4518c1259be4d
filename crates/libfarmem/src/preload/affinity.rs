//! The program's view of its CPU affinity. The runtime may pin a program thread that faults
//! alone to the CPU of its fault thread (`farmem_runtime::placement`); the program must not
//! see that pin (it would start fewer threads: GNU `sort`, `nproc`, thread pools sized by
//! `sched_getaffinity`) nor lose its own settings to it. So the pinned thread's affinity is
//! reported as what it was before the pin, and a program that sets it takes it back: the
//! runtime forgets its pin and leaves the thread alone for a while.

use std::ffi::c_int;
use std::sync::atomic::AtomicUsize;

use farmem_runtime::Runtime;

type GetFn = unsafe extern "C" fn(libc::pid_t, libc::size_t, *mut libc::cpu_set_t) -> c_int;
type SetFn = unsafe extern "C" fn(libc::pid_t, libc::size_t, *const libc::cpu_set_t) -> c_int;
type PthreadGetFn =
    unsafe extern "C" fn(libc::pthread_t, libc::size_t, *mut libc::cpu_set_t) -> c_int;

static REAL_GET: AtomicUsize = AtomicUsize::new(0);
static REAL_SET: AtomicUsize = AtomicUsize::new(0);
static REAL_PTHREAD_GET: AtomicUsize = AtomicUsize::new(0);
static REAL_PTHREAD_SET: AtomicUsize = AtomicUsize::new(0);

/// The affinity thread `tid` (0: the caller) had before the runtime pinned it, if it did.
fn own_affinity(tid: u32) -> Option<libc::cpu_set_t> {
    std::panic::catch_unwind(|| Runtime::global_if_started()?.own_affinity(tid))
        .ok()
        .flatten()
}

fn program_sets_affinity(tid: u32) {
    let _ = std::panic::catch_unwind(|| {
        if let Some(rt) = Runtime::global_if_started() {
            rt.program_sets_affinity(tid);
        }
    });
}

/// Copy `own` into the caller's buffer of `size` bytes as the kernel would: the bytes that
/// fit (the rest of a larger buffer zeroed), or EINVAL if a CPU of the set does not fit.
///
/// # Safety
/// `out` must be writable for `size` bytes.
unsafe fn report(own: &libc::cpu_set_t, size: libc::size_t, out: *mut libc::cpu_set_t) -> c_int {
    let bytes = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `own` is a plain cpu_set_t of `bytes` bytes.
    let src =
        unsafe { std::slice::from_raw_parts((own as *const libc::cpu_set_t).cast::<u8>(), bytes) };
    let fits = size.min(bytes);
    if src[fits..].iter().any(|&b| b != 0) {
        return libc::EINVAL;
    }
    // SAFETY: the caller gave `size` writable bytes at `out`; we write at most that many.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), out.cast::<u8>(), fits);
        std::ptr::write_bytes(out.cast::<u8>().add(fits), 0, size - fits);
    }
    0
}

/// # Safety
/// As C `sched_getaffinity`.
#[no_mangle]
pub unsafe extern "C" fn sched_getaffinity(
    pid: libc::pid_t,
    size: libc::size_t,
    mask: *mut libc::cpu_set_t,
) -> c_int {
    if !mask.is_null() && pid >= 0 {
        if let Some(own) = own_affinity(pid as u32) {
            // SAFETY: as the caller promised for `mask`.
            return match unsafe { report(&own, size, mask) } {
                0 => 0,
                e => {
                    super::set_errno(e);
                    -1
                }
            };
        }
    }
    let f = super::next_symbol(&REAL_GET, c"sched_getaffinity");
    if f == 0 {
        super::set_errno(libc::ENOSYS);
        return -1;
    }
    // SAFETY: glibc's function, with the caller's arguments.
    unsafe { std::mem::transmute::<usize, GetFn>(f)(pid, size, mask) }
}

/// # Safety
/// As C `sched_setaffinity`.
#[no_mangle]
pub unsafe extern "C" fn sched_setaffinity(
    pid: libc::pid_t,
    size: libc::size_t,
    mask: *const libc::cpu_set_t,
) -> c_int {
    if pid >= 0 {
        program_sets_affinity(pid as u32);
    }
    let f = super::next_symbol(&REAL_SET, c"sched_setaffinity");
    if f == 0 {
        super::set_errno(libc::ENOSYS);
        return -1;
    }
    // SAFETY: glibc's function, with the caller's arguments.
    unsafe { std::mem::transmute::<usize, SetFn>(f)(pid, size, mask) }
}

/// The kernel thread id of a thread of this process given as a `pthread_t`, for the calling
/// thread only (others: 0, unknown; glibc offers no public way to ask).
fn tid_of(thread: libc::pthread_t) -> u32 {
    // SAFETY: pthread_self has no preconditions.
    if unsafe { libc::pthread_self() } == thread {
        // SAFETY: gettid has no preconditions.
        unsafe { libc::gettid() as u32 }
    } else {
        0
    }
}

/// # Safety
/// As C `pthread_getaffinity_np`.
#[no_mangle]
pub unsafe extern "C" fn pthread_getaffinity_np(
    thread: libc::pthread_t,
    size: libc::size_t,
    mask: *mut libc::cpu_set_t,
) -> c_int {
    let tid = tid_of(thread);
    if tid != 0 && !mask.is_null() {
        if let Some(own) = own_affinity(tid) {
            // SAFETY: as the caller promised for `mask`.
            return unsafe { report(&own, size, mask) };
        }
    }
    let f = super::next_symbol(&REAL_PTHREAD_GET, c"pthread_getaffinity_np");
    if f == 0 {
        return libc::ENOSYS;
    }
    // SAFETY: glibc's function, with the caller's arguments.
    unsafe { std::mem::transmute::<usize, PthreadGetFn>(f)(thread, size, mask) }
}

/// # Safety
/// As C `pthread_setaffinity_np`.
#[no_mangle]
pub unsafe extern "C" fn pthread_setaffinity_np(
    thread: libc::pthread_t,
    size: libc::size_t,
    mask: *const libc::cpu_set_t,
) -> c_int {
    let tid = tid_of(thread);
    if tid != 0 {
        program_sets_affinity(tid);
    }
    type PthreadSetFn =
        unsafe extern "C" fn(libc::pthread_t, libc::size_t, *const libc::cpu_set_t) -> c_int;
    let f = super::next_symbol(&REAL_PTHREAD_SET, c"pthread_setaffinity_np");
    if f == 0 {
        return libc::ENOSYS;
    }
    // SAFETY: glibc's function, with the caller's arguments.
    unsafe { std::mem::transmute::<usize, PthreadSetFn>(f)(thread, size, mask) }
}
