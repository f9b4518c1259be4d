//! The runtime's descriptors are not the program's to close or replace (`farmem_sys::fds`):
//! `close`, `close_range`, `closefrom`, `dup2` and `dup3`.
//!
//! A program's `close` of one of them succeeds without closing it (the program closes
//! numbers it did not open: it has no use for them either way); ranges are closed around
//! them; `dup2`/`dup3` onto one fails with `EBUSY`. The runtime itself (its threads, or a
//! program thread inside it) closes its own descriptors as usual.

use std::ffi::{c_int, c_uint};
use std::sync::atomic::AtomicBool;

use farmem_runtime::scope;
use farmem_sys::fds;

use super::set_errno;

/// `close_range`'s flag that only marks descriptors close-on-exec (the runtime's already are).
const CLOSE_RANGE_CLOEXEC: c_uint = 1 << 2;

fn syscall_rc(r: libc::c_long) -> c_int {
    r as c_int
}

/// Whether `fd` is the runtime's and the caller is the program.
fn guarded(fd: c_int) -> bool {
    fds::is_kept(fd) && !scope::keeps_local()
}

/// # Safety
/// As C `close`.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if fds::is_kept(fd) {
        if !scope::keeps_local() {
            return 0;
        }
        fds::forget(fd);
    }
    // SAFETY: the caller's descriptor.
    syscall_rc(unsafe { libc::syscall(libc::SYS_close, fd) })
}

/// # Safety
/// As C `close_range`.
#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    let raw = |a: c_uint, b: c_uint| {
        // SAFETY: the caller's descriptors.
        syscall_rc(unsafe { libc::syscall(libc::SYS_close_range, a, b, flags) })
    };
    if flags as c_uint & CLOSE_RANGE_CLOEXEC != 0 || scope::keeps_local() || first > last {
        return raw(first, last);
    }
    let lo = first.min(i32::MAX as c_uint) as c_int;
    let hi = last.min(i32::MAX as c_uint) as c_int;
    let mut from = first;
    for k in fds::kept_in(lo, hi) {
        let k = k as c_uint;
        if k > from && raw(from, k - 1) != 0 {
            return -1;
        }
        from = k + 1;
    }
    if from <= last {
        return raw(from, last);
    }
    0
}

/// # Safety
/// As glibc's `closefrom`.
#[no_mangle]
pub unsafe extern "C" fn closefrom(lowfd: c_int) {
    // SAFETY: forwarded; glibc's closefrom cannot fail either (the kernel has close_range).
    unsafe { close_range(lowfd.max(0) as c_uint, c_uint::MAX, 0) };
}

fn refuse_replace(newfd: c_int) -> c_int {
    static ONCE: AtomicBool = AtomicBool::new(false);
    if !ONCE.swap(true, std::sync::atomic::Ordering::Relaxed) {
        eprintln!(
            "farmem: warning: the program asked to replace descriptor {newfd}, which farmem \
             uses for its far memory; refused (EBUSY)"
        );
    }
    set_errno(libc::EBUSY);
    -1
}

/// # Safety
/// As C `dup2`.
#[no_mangle]
pub unsafe extern "C" fn dup2(oldfd: c_int, newfd: c_int) -> c_int {
    if oldfd != newfd && guarded(newfd) {
        return refuse_replace(newfd);
    }
    // SAFETY: the caller's descriptors.
    syscall_rc(unsafe { libc::syscall(libc::SYS_dup2, oldfd, newfd) })
}

/// # Safety
/// As C `dup3`.
#[no_mangle]
pub unsafe extern "C" fn dup3(oldfd: c_int, newfd: c_int, flags: c_int) -> c_int {
    if oldfd != newfd && guarded(newfd) {
        return refuse_replace(newfd);
    }
    // SAFETY: the caller's descriptors.
    syscall_rc(unsafe { libc::syscall(libc::SYS_dup3, oldfd, newfd, flags) })
}
