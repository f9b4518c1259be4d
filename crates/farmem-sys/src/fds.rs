//! The runtime's own file descriptors, kept out of the program's way.
//!
//! Programs close descriptors they did not open: daemons and process helpers close every
//! descriptor above 2 or 3 (`close_range`, `closefrom`, a loop of `close` over
//! `/proc/self/fd`), and shells `dup2` onto numbers of their choosing. A runtime descriptor
//! closed under the runtime breaks far memory: with its userfaultfd gone, the kernel serves
//! missing faults with zeros, and the runtime's threads read whatever file took the number
//! (Erlang's `erl_child_setup` closed it at start, and its next `fork` waited for ever).
//!
//! So the runtime's long-lived descriptors are moved to high numbers, out of the range that
//! programs pick, and listed here ([`keep`]); the transparent mode's `close`, `close_range`,
//! `closefrom`, `dup2` and `dup3` leave listed descriptors alone.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

/// Most descriptors listed at once (the runtime keeps a handful per process).
const SLOTS: usize = 64;
const EMPTY: i32 = -1;

static KEPT: [AtomicI32; SLOTS] = [const { AtomicI32::new(EMPTY) }; SLOTS];
/// Listed descriptors: lets the common case (none listed) skip the scan.
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// The lowest number a kept descriptor moves to: 128 below the soft limit on open files or
/// below 1024, whichever is lower (a higher one would grow the kernel's descriptor table,
/// and programs that `select()` stay under 1024). None where the limit leaves no such room.
fn high_base() -> Option<RawFd> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    let top = lim.rlim_cur.min(1024) as RawFd;
    (top >= 256).then_some(top - 128)
}

/// Move `fd` (a descriptor, or what owns one: a `File`, a socket) to a high number
/// (close-on-exec) and list it as the runtime's. Where no high number is free it keeps its
/// number, listed all the same.
pub fn keep<T: From<OwnedFd> + Into<OwnedFd>>(fd: T) -> T {
    let fd: OwnedFd = fd.into();
    let fd = match high_copy(fd.as_fd()) {
        // The old number is closed as `fd` drops (it is not listed).
        Some(high) => high,
        None => fd,
    };
    list(fd.as_raw_fd());
    T::from(fd)
}

/// A listed copy of `fd`, at a high number where one is free: for a descriptor something
/// else owns (a ring, a stream's other half), made without a passing low number.
pub fn keep_copy(fd: BorrowedFd<'_>) -> std::io::Result<OwnedFd> {
    let copy = match high_copy(fd) {
        Some(high) => high,
        None => fd.try_clone_to_owned()?,
    };
    list(copy.as_raw_fd());
    Ok(copy)
}

/// A close-on-exec copy of `fd` at a high number, if there is room for one.
fn high_copy(fd: BorrowedFd<'_>) -> Option<OwnedFd> {
    let base = high_base()?;
    // SAFETY: F_DUPFD_CLOEXEC on an open descriptor returns a new one or -1.
    let n = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, base) };
    // SAFETY: a fresh descriptor from the kernel, owned by the caller.
    (n >= 0).then(|| unsafe { OwnedFd::from_raw_fd(n) })
}

fn list(fd: RawFd) {
    for s in &KEPT {
        if s.compare_exchange(EMPTY, fd, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            COUNT.fetch_add(1, Ordering::AcqRel);
            return;
        }
    }
    tracing::warn!("descriptor {fd} of the runtime not protected: {SLOTS} listed already");
}

/// Take `fd` off the list (it is being closed by the runtime).
pub fn forget(fd: RawFd) {
    for s in &KEPT {
        if s.compare_exchange(fd, EMPTY, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            COUNT.fetch_sub(1, Ordering::AcqRel);
            return;
        }
    }
}

/// Whether `fd` is one of the runtime's listed descriptors.
#[inline]
pub fn is_kept(fd: RawFd) -> bool {
    COUNT.load(Ordering::Acquire) != 0 && KEPT.iter().any(|s| s.load(Ordering::Acquire) == fd)
}

/// The listed descriptors in `[first, last]`, ascending.
pub fn kept_in(first: RawFd, last: RawFd) -> Vec<RawFd> {
    if COUNT.load(Ordering::Acquire) == 0 {
        return Vec::new();
    }
    let mut v: Vec<RawFd> = KEPT
        .iter()
        .map(|s| s.load(Ordering::Acquire))
        .filter(|&fd| fd != EMPTY && fd >= first && fd <= last)
        .collect();
    v.sort_unstable();
    v
}

/// Forget and close a listed descriptor (with the system call itself: `close` may be the
/// transparent mode's, which leaves listed descriptors open).
pub fn close_kept(fd: RawFd) {
    forget(fd);
    // SAFETY: closing a descriptor the caller owns and no longer uses.
    unsafe { libc::syscall(libc::SYS_close, fd) };
}

/// Held by the tests of this crate that list descriptors: the list is the process's, and a
/// number closed by one test may be listed again at once by another running beside it.
#[cfg(test)]
pub(crate) fn serial_for_tests() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_descriptors_move_high_and_are_listed_until_forgotten() {
        let _serial = serial_for_tests();
        // SAFETY: eventfd has no memory-safety preconditions.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: fresh descriptor, owned here.
        let fd = keep(unsafe { OwnedFd::from_raw_fd(raw) });
        let n = fd.as_raw_fd();
        if let Some(base) = high_base() {
            assert!(n >= base, "{n} below {base}");
        }
        assert!(is_kept(n) && !is_kept(raw));
        assert_eq!(kept_in(n, n), vec![n]);
        // SAFETY: fcntl F_GETFD on a number: -1 when it names nothing.
        assert_eq!(
            unsafe { libc::fcntl(raw, libc::F_GETFD) },
            -1,
            "the old one closed"
        );
        close_kept(std::os::fd::IntoRawFd::into_raw_fd(fd));
        assert!(!is_kept(n));
    }
}
