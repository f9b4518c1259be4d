//! Memory syscalls: anonymous mappings, vectored unmap with `process_madvise`, futexes.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub const PAGE_SIZE: usize = 4096;
pub const PAGE_SHIFT: u32 = 12;

// Every memory syscall of the runtime goes straight to the kernel, not through libc's
// `mmap`/`munmap`/`madvise`/`mprotect`: when `libfarmem.so` is preloaded it *is* those
// symbols (see `preload/`), and the runtime's own mappings must never be taken for the
// program's.

/// Raw `mmap(2)`: the address, or the negated errno.
pub fn sys_mmap(
    addr: usize,
    len: usize,
    prot: i32,
    flags: i32,
    fd: i32,
    off: i64,
) -> Result<usize, i32> {
    // SAFETY: a raw syscall with integer arguments; what it maps or replaces is the caller's
    // responsibility (the safe wrappers below only create fresh mappings).
    let r = unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as usize)
    }
}

/// Raw syscall with up to five integer arguments returning 0 or -1/errno.
fn sys_check(r: libc::c_long) -> Result<usize, i32> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as usize)
    }
}

pub fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EINVAL)
}

/// Raw `munmap(2)`.
///
/// # Safety
/// The range must not be in use by anything that still expects it mapped.
pub unsafe fn sys_munmap(addr: usize, len: usize) -> Result<usize, i32> {
    // SAFETY: guaranteed by the caller.
    sys_check(unsafe { libc::syscall(libc::SYS_munmap, addr, len) })
}

/// Raw `madvise(2)`.
///
/// # Safety
/// Destructive advice (`MADV_DONTNEED`, `MADV_FREE`, ...) drops contents: the caller must own
/// them.
pub unsafe fn sys_madvise(addr: usize, len: usize, advice: i32) -> Result<usize, i32> {
    // SAFETY: guaranteed by the caller.
    sys_check(unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) })
}

/// Raw `mprotect(2)`.
///
/// # Safety
/// Removing access from memory others still use makes their next access fault.
pub unsafe fn sys_mprotect(addr: usize, len: usize, prot: i32) -> Result<usize, i32> {
    // SAFETY: guaranteed by the caller.
    sys_check(unsafe { libc::syscall(libc::SYS_mprotect, addr, len, prot) })
}

/// Raw `mremap(2)`.
///
/// # Safety
/// Moves or resizes a mapping: the caller must own it.
pub unsafe fn sys_mremap(
    old: usize,
    old_len: usize,
    new_len: usize,
    flags: i32,
    new_addr: usize,
) -> Result<usize, i32> {
    // SAFETY: guaranteed by the caller.
    sys_check(unsafe { libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new_addr) })
}

fn io_err(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

/// Map `len` bytes of private anonymous memory that is not charged against overcommit.
pub fn map_anon(len: usize, prot: i32) -> io::Result<*mut u8> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    sys_mmap(0, len, prot, flags, -1, 0)
        .map(|p| p as *mut u8)
        .map_err(io_err)
}

/// Replace `[addr, addr+len)`, which must lie in a reservation of the caller's (the
/// transparent mode's address space), with fresh private anonymous memory.
///
/// # Safety
/// Whatever was mapped there is discarded: the caller must own the range.
pub unsafe fn map_anon_fixed(addr: usize, len: usize, prot: i32) -> io::Result<*mut u8> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED;
    sys_mmap(addr, len, prot, flags, -1, 0)
        .map(|p| p as *mut u8)
        .map_err(io_err)
}

/// Unmap a mapping made by [`map_anon`].
///
/// # Safety
/// `[p, p+len)` must be a mapping owned by the caller that nothing references any more.
pub unsafe fn unmap(p: *mut u8, len: usize) {
    // SAFETY: guaranteed by the caller.
    let _ = unsafe { sys_munmap(p as usize, len) };
}

pub fn mprotect(p: *mut u8, len: usize, prot: i32) -> io::Result<()> {
    // SAFETY: changes protection of memory we mapped ourselves; callers pass page-aligned ranges.
    unsafe { sys_mprotect(p as usize, len, prot) }
        .map(|_| ())
        .map_err(io_err)
}

/// Which pages of `[p, p+len)` (page-aligned, mapped) are resident (`mincore`).
pub fn resident_pages(p: usize, len: usize) -> io::Result<Vec<bool>> {
    let n = len.div_ceil(PAGE_SIZE);
    let mut vec = vec![0u8; n];
    // SAFETY: `vec` has one byte per page of the range, as mincore requires.
    let rc = unsafe { libc::mincore(p as *mut libc::c_void, len, vec.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(vec.iter().map(|b| b & 1 != 0).collect())
}

/// Read `len` bytes at `offset` of `fd` into `buf`, going on after short reads and
/// interruptions; an end of file before `len` bytes is an error.
///
/// # Safety
/// `buf` must be valid for writes of `len` bytes.
pub unsafe fn pread_full(fd: RawFd, buf: *mut u8, len: usize, offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        // SAFETY: the caller's guarantee: `buf` holds `len` bytes, `done` of them read.
        let n = unsafe {
            libc::pread(
                fd,
                buf.add(done).cast(),
                len - done,
                (offset + done as u64) as libc::off_t,
            )
        };
        match n {
            n if n > 0 => done += n as usize,
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

pub fn madvise(p: usize, len: usize, advice: i32) -> io::Result<()> {
    // SAFETY: advice on a range of our own mappings; DONTNEED on a region is how pages leave
    // local memory, after their contents are safe in the backend.
    unsafe { sys_madvise(p, len, advice) }
        .map(|_| ())
        .map_err(io_err)
}

/// Make descriptor number `old` refer to what `new` refers to (close-on-exec), and close
/// `new`: after a fork, a descriptor that names the parent's object is made to name the
/// child's own while everything that holds the number keeps working.
pub fn replace_fd(old: RawFd, new: OwnedFd) -> io::Result<()> {
    // The system call itself: `dup3` may be the transparent mode's, which refuses to
    // replace the runtime's descriptors (`fds.rs`). `new` is closed on drop.
    // SAFETY: dup3 onto a descriptor this process holds open.
    let rc = unsafe { libc::syscall(libc::SYS_dup3, new.as_raw_fd(), old, libc::O_CLOEXEC) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

const SYS_PIDFD_OPEN: libc::c_long = 434;
const SYS_PROCESS_MADVISE: libc::c_long = 440;
/// `UIO_MAXIOV`: the most iovecs one call takes.
const MAX_IOV: usize = 1024;

/// Drops many scattered ranges with as few syscalls (and TLB shootdowns) as possible:
/// `process_madvise(pidfd_self, iov, n, MADV_DONTNEED)` when the kernel allows it on self,
/// otherwise one `madvise` per range.
pub struct Unmapper {
    pidfd: Option<OwnedFd>,
    vectored: AtomicBool,
}

impl Unmapper {
    pub fn new() -> Unmapper {
        // SAFETY: pidfd_open(getpid(), 0) only creates a descriptor for our own process.
        let fd = unsafe { libc::syscall(SYS_PIDFD_OPEN, libc::getpid(), 0) };
        let pidfd = if fd >= 0 {
            // SAFETY: fresh descriptor from the kernel. Out of the program's way: closed
            // under us, every eviction would fail to unmap its pages.
            Some(crate::fds::keep(unsafe { OwnedFd::from_raw_fd(fd as i32) }))
        } else {
            None
        };
        let vectored = AtomicBool::new(pidfd.is_some());
        Unmapper { pidfd, vectored }
    }

    /// In a child made by `fork()`: the inherited descriptor names the parent, whose pages a
    /// vectored discard would drop. Point it at this process instead (same number), or stop
    /// using it if that fails.
    pub fn reopen_in_child(&self) {
        let Some(old) = &self.pidfd else { return };
        // SAFETY: pidfd_open(getpid(), 0) only creates a descriptor for our own process.
        let fd = unsafe { libc::syscall(SYS_PIDFD_OPEN, libc::getpid(), 0) };
        let ok = fd >= 0 && {
            // SAFETY: fresh descriptor from the kernel, owned here.
            let new = unsafe { OwnedFd::from_raw_fd(fd as i32) };
            replace_fd(old.as_raw_fd(), new).is_ok()
        };
        if !ok {
            self.vectored.store(false, Ordering::Relaxed);
        }
    }

    /// Whether the vectored path is (still) in use.
    pub fn is_vectored(&self) -> bool {
        self.vectored.load(Ordering::Relaxed)
    }

    /// Discard the given `(start, len)` ranges. Returns the number of syscalls made.
    pub fn dontneed(&self, ranges: &[(usize, usize)]) -> io::Result<usize> {
        if let (true, Some(fd)) = (self.is_vectored(), &self.pidfd) {
            match self.dontneed_vectored(fd.as_raw_fd(), ranges) {
                Ok(calls) => return Ok(calls),
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINVAL)
                            | Some(libc::ENOSYS)
                            | Some(libc::EPERM)
                            | Some(libc::EBADF)
                    ) =>
                {
                    tracing::info!(
                        "process_madvise(MADV_DONTNEED) on self refused ({e}); \
                         falling back to madvise per range"
                    );
                    self.vectored.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        for &(start, len) in ranges {
            madvise(start, len, libc::MADV_DONTNEED)?;
        }
        Ok(ranges.len())
    }

    fn dontneed_vectored(&self, pidfd: i32, ranges: &[(usize, usize)]) -> io::Result<usize> {
        let mut iov: Vec<libc::iovec> = ranges
            .iter()
            .map(|&(s, l)| libc::iovec {
                iov_base: s as *mut libc::c_void,
                iov_len: l,
            })
            .collect();
        let mut calls = 0;
        let mut i = 0;
        while i < iov.len() {
            let n = (iov.len() - i).min(MAX_IOV);
            // SAFETY: `iov[i..i+n]` is a valid array of iovecs describing our own mappings.
            let rc = unsafe {
                libc::syscall(
                    SYS_PROCESS_MADVISE,
                    pidfd,
                    iov[i..].as_ptr(),
                    n,
                    libc::MADV_DONTNEED,
                    0,
                )
            };
            calls += 1;
            if rc < 0 {
                return Err(io::Error::last_os_error());
            }
            // The call may stop early; skip what it covered and continue.
            let mut advised = rc as usize;
            while advised > 0 && i < iov.len() {
                if advised >= iov[i].iov_len {
                    advised -= iov[i].iov_len;
                    i += 1;
                } else {
                    iov[i].iov_base = (iov[i].iov_base as usize + advised) as *mut libc::c_void;
                    iov[i].iov_len -= advised;
                    advised = 0;
                }
            }
            if rc == 0 && n > 0 {
                // No progress: avoid spinning; finish the rest one by one.
                for v in &iov[i..] {
                    madvise(v.iov_base as usize, v.iov_len, libc::MADV_DONTNEED)?;
                    calls += 1;
                }
                break;
            }
        }
        Ok(calls)
    }
}

impl Default for Unmapper {
    fn default() -> Self {
        Self::new()
    }
}

/// Wait until the low 32 bits of `word` differ from `expected`, or `timeout_us` passes.
/// The page-metadata words are 64-bit; x86-64 is little-endian, so the flag bits (including
/// LOCKED and WAITERS) live in the low half, which is what the futex watches.
pub fn futex_wait(word: &AtomicU64, expected: u64, timeout_us: u64) {
    let ts = libc::timespec {
        tv_sec: (timeout_us / 1_000_000) as libc::time_t,
        tv_nsec: ((timeout_us % 1_000_000) * 1000) as libc::c_long,
    };
    // SAFETY: the address is an aligned, live 64-bit atomic; FUTEX_WAIT only reads its first
    // 32 bits and compares them with `expected`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word as *const AtomicU64 as *const u32,
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected as u32,
            &ts as *const libc::timespec,
        );
    }
}

/// Wake every thread in [`futex_wait`] on `word`.
pub fn futex_wake_all(word: &AtomicU64) {
    // SAFETY: FUTEX_WAKE does not access memory beyond using the address as a key.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word as *const AtomicU64 as *const u32,
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        );
    }
}

/// Physical memory of this machine in bytes (for percentage defaults).
pub fn physical_memory() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages.max(0) as u64) * (size.max(0) as u64)
}

/// A sealed in-memory file (`memfd_create`) holding `contents`, which nothing can change or
/// resize any more (`F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK`): its pages can be mapped
/// privately, copy-on-write, as a template.
pub fn sealed_memfd(name: &std::ffi::CStr, contents: &[u8]) -> io::Result<OwnedFd> {
    // SAFETY: memfd_create with a valid C string; the descriptor is owned from here on.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_memfd_create,
            name.as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just returned to us and owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let mut done = 0;
    while done < contents.len() {
        let rest = &contents[done..];
        // SAFETY: writing from a live slice to our own descriptor.
        let n = unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                rest.as_ptr().cast(),
                rest.len(),
                done as libc::off_t,
            )
        };
        if n <= 0 {
            return Err(io::Error::last_os_error());
        }
        done += n as usize;
    }
    let seals = libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on our own descriptor with integer arguments.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// The identity (device, inode) of what descriptor `fd` names, if it is open.
pub fn fd_identity(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: stat is plain old data, filled by the kernel.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat with a valid out-pointer; a closed descriptor only fails.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some((st.st_dev, st.st_ino))
}

/// Map `len` bytes of file `fd` from offset 0 privately (copy-on-write) over
/// `[addr, addr+len)`, replacing what was there.
///
/// # Safety
/// Whatever was mapped there is discarded: the caller must own the range.
pub unsafe fn map_file_private_fixed(
    addr: usize,
    len: usize,
    prot: i32,
    fd: RawFd,
) -> io::Result<()> {
    let flags = libc::MAP_PRIVATE | libc::MAP_NORESERVE | libc::MAP_FIXED;
    sys_mmap(addr, len, prot, flags, fd, 0)
        .map(|_| ())
        .map_err(io_err)
}
