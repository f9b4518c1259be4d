//! userfaultfd: constants, structs and thin ioctl wrappers.
//!
//! Debian 12's headers predate the kernel we run on (6.18), so the UAPI values are defined here
//! (from `include/uapi/linux/userfaultfd.h`) and features are detected at run time.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::mem::PAGE_SIZE;

const UFFDIO: u64 = 0xAA;
pub const UFFD_API: u64 = 0xAA;

const fn ioc(dir: u64, nr: u64, size: u64) -> u64 {
    (dir << 30) | (size << 16) | (UFFDIO << 8) | nr
}
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;

pub const UFFDIO_API: u64 = ioc(IOC_READ | IOC_WRITE, 0x3F, 24);
pub const UFFDIO_REGISTER: u64 = ioc(IOC_READ | IOC_WRITE, 0x00, 32);
pub const UFFDIO_UNREGISTER: u64 = ioc(IOC_READ, 0x01, 16);
pub const UFFDIO_WAKE: u64 = ioc(IOC_READ, 0x02, 16);
pub const UFFDIO_COPY: u64 = ioc(IOC_READ | IOC_WRITE, 0x03, 40);
pub const UFFDIO_WRITEPROTECT: u64 = ioc(IOC_READ | IOC_WRITE, 0x06, 24);
/// `USERFAULTFD_IOC_NEW` on `/dev/userfaultfd` (`_IO(0xAA, 0x00)`).
const USERFAULTFD_IOC_NEW: u64 = 0xAA00;

pub const REGISTER_MODE_MISSING: u64 = 1 << 0;
pub const REGISTER_MODE_WP: u64 = 1 << 1;

pub const COPY_MODE_DONTWAKE: u64 = 1 << 0;
pub const COPY_MODE_WP: u64 = 1 << 1;
pub const WRITEPROTECT_MODE_WP: u64 = 1 << 0;
pub const WRITEPROTECT_MODE_DONTWAKE: u64 = 1 << 1;

thread_local! {
    /// Installs on this thread leave the faulting threads asleep ([`without_wake`]).
    static NO_WAKE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Run `f` with every install of the calling thread (a copy, a lifted write protection)
/// leaving the threads that fault on the page asleep: the caller wakes them with
/// [`Uffd::wake`] once everything it does for them is finished. (A fork's thread faulting
/// between the fork handlers must not fork before the thread serving it has let go of
/// every lock: the child would inherit them held.)
pub fn without_wake<R>(f: impl FnOnce() -> R) -> R {
    let was = NO_WAKE.with(|c| c.replace(true));
    let r = f();
    NO_WAKE.with(|c| c.set(was));
    r
}

fn no_wake() -> bool {
    NO_WAKE.with(|c| c.get())
}

pub const EVENT_PAGEFAULT: u8 = 0x12;
pub const PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;
pub const PAGEFAULT_FLAG_WP: u64 = 1 << 1;

pub const FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
pub const FEATURE_THREAD_ID: u64 = 1 << 8;
pub const FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
pub const FEATURE_WP_ASYNC: u64 = 1 << 15;
pub const FEATURE_MOVE: u64 = 1 << 16;

/// Bits of `uffdio_register.ioctls` (1 << _UFFDIO_*), checked after registering a range.
pub const IOCTL_BIT_WAKE: u64 = 1 << 0x02;
pub const IOCTL_BIT_COPY: u64 = 1 << 0x03;
pub const IOCTL_BIT_WRITEPROTECT: u64 = 1 << 0x06;

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct UffdioRange {
    pub start: u64,
    pub len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

/// One `struct uffd_msg` (32 bytes); only the page-fault member of the union is decoded.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct UffdMsg {
    pub event: u8,
    _reserved1: u8,
    _reserved2: u16,
    _reserved3: u32,
    pub flags: u64,
    pub address: u64,
    pub ptid: u32,
    _pad: u32,
}
const _: () = assert!(std::mem::size_of::<UffdMsg>() == 32);

/// A userfaultfd event, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A thread touched a registered page that is missing, or wrote one that is
    /// write-protected (`wp`). `addr` is the faulting address (not page-aligned); `tid` the
    /// faulting thread (with `FEATURE_THREAD_ID`, else 0).
    PageFault {
        addr: usize,
        write: bool,
        wp: bool,
        tid: u32,
    },
    /// An event farmem does not ask for (fork, remap, remove, unmap), by its code.
    Other(u8),
}

impl UffdMsg {
    /// What the message says.
    pub fn event(&self) -> Event {
        if self.event != EVENT_PAGEFAULT {
            return Event::Other(self.event);
        }
        Event::PageFault {
            addr: self.address as usize,
            write: self.flags & PAGEFAULT_FLAG_WRITE != 0,
            wp: self.flags & PAGEFAULT_FLAG_WP != 0,
            tid: self.ptid,
        }
    }
}

/// An open userfaultfd with its negotiated feature set.
pub struct Uffd {
    fd: OwnedFd,
    pub features: u64,
}

fn ioctl<T>(fd: RawFd, req: u64, arg: &mut T) -> io::Result<()> {
    // SAFETY: `arg` is a live, exclusively borrowed struct whose layout matches what `req`
    // expects (sizes are encoded in the request numbers above and checked by the kernel).
    let rc = unsafe { libc::ioctl(fd, req as _, arg as *mut T) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn open_raw() -> io::Result<OwnedFd> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    // SAFETY: plain syscall with integer flags; no UFFD_USER_MODE_ONLY, so kernel-mode
    // accesses (read() into a region) are delivered to us as well (DESIGN.md invariants).
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) } as RawFd;
    if fd >= 0 {
        // SAFETY: the kernel just returned this descriptor to us; nobody else owns it.
        return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    let syscall_err = io::Error::last_os_error();
    // Unprivileged syscall use may be disabled (vm.unprivileged_userfaultfd=0); the device
    // node grants the same capability through file permissions.
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/userfaultfd")
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "userfaultfd unavailable (syscall: {syscall_err}; /dev/userfaultfd: {e}); \
                     run as root, grant access to /dev/userfaultfd, or set \
                     sysctl vm.unprivileged_userfaultfd=1"
                ),
            )
        })?;
    // SAFETY: USERFAULTFD_IOC_NEW takes the flags as its integer argument.
    let fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor returned by the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Uffd {
    /// Open a userfaultfd and negotiate `wanted` features (those the kernel lacks are dropped).
    pub fn open(wanted: u64) -> io::Result<Uffd> {
        // The API handshake can be done once per descriptor, so probe the supported set on a
        // throw-away descriptor first.
        let probe = open_raw()?;
        let mut api = UffdioApi {
            api: UFFD_API,
            ..Default::default()
        };
        ioctl(probe.as_raw_fd(), UFFDIO_API, &mut api)?;
        let features = api.features & wanted;
        drop(probe);

        let fd = open_raw()?;
        let mut api = UffdioApi {
            api: UFFD_API,
            features,
            ioctls: 0,
        };
        ioctl(fd.as_raw_fd(), UFFDIO_API, &mut api)?;
        Ok(Uffd {
            fd: crate::fds::keep(fd),
            features,
        })
    }

    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// In a child made by `fork()`: the inherited descriptor is the parent's userfaultfd
    /// (whose registrations the child's mappings lost). Open a new one with the same
    /// features under the same number; ranges must be registered again.
    pub fn reopen_in_child(&self) -> io::Result<()> {
        let fd = open_raw()?;
        let mut api = UffdioApi {
            api: UFFD_API,
            features: self.features,
            ioctls: 0,
        };
        ioctl(fd.as_raw_fd(), UFFDIO_API, &mut api)?;
        crate::mem::replace_fd(self.raw(), fd)
    }

    /// Register `[start, start+len)` for missing and write-protect faults; returns the ioctl
    /// bit set the kernel allows on the range.
    pub fn register(&self, start: usize, len: usize, mode: u64) -> io::Result<u64> {
        let mut reg = UffdioRegister {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode,
            ioctls: 0,
        };
        ioctl(self.raw(), UFFDIO_REGISTER, &mut reg)?;
        Ok(reg.ioctls)
    }

    pub fn unregister(&self, start: usize, len: usize) -> io::Result<()> {
        let mut r = UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        ioctl(self.raw(), UFFDIO_UNREGISTER, &mut r)
    }

    /// Atomically map a copy of `len` bytes at `src` to `dst` (both page aligned). Retries on
    /// EAGAIN and partial copies; returns EEXIST if part of the range is already mapped.
    pub fn copy(&self, dst: usize, src: *const u8, len: usize, mode: u64) -> io::Result<()> {
        let mode = if no_wake() {
            mode | COPY_MODE_DONTWAKE
        } else {
            mode
        };
        let mut done = 0usize;
        while done < len {
            let mut c = UffdioCopy {
                dst: (dst + done) as u64,
                src: src as u64 + done as u64,
                len: (len - done) as u64,
                mode,
                copy: 0,
            };
            match ioctl(self.raw(), UFFDIO_COPY, &mut c) {
                Ok(()) => done += c.copy as usize,
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                    if c.copy > 0 {
                        done += c.copy as usize;
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) && len - done > PAGE_SIZE => {
                    // One copy must stay within one mapping: the range crosses mappings
                    // split by protection (a program that commits parts of a reservation
                    // with `mprotect`: V8, the JVM). Page by page, each in one mapping.
                    for off in (done..len).step_by(PAGE_SIZE) {
                        self.copy(dst + off, src.wrapping_add(off), PAGE_SIZE, mode)?;
                    }
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Set (`protect`) or clear write protection on a range. Clearing also wakes faulters.
    pub fn writeprotect(&self, start: usize, len: usize, protect: bool) -> io::Result<()> {
        let mut wp = UffdioWriteprotect {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode: match (protect, no_wake()) {
                (true, _) => WRITEPROTECT_MODE_WP,
                (false, true) => WRITEPROTECT_MODE_DONTWAKE,
                (false, false) => 0,
            },
        };
        loop {
            match ioctl(self.raw(), UFFDIO_WRITEPROTECT, &mut wp) {
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => continue,
                r => return r,
            }
        }
    }

    /// Wake threads waiting on faults in the range (after someone else resolved them).
    pub fn wake(&self, start: usize, len: usize) -> io::Result<()> {
        let mut r = UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        ioctl(self.raw(), UFFDIO_WAKE, &mut r)
    }

    /// Non-blocking read of pending events into `buf`; returns how many were read.
    pub fn read_events(&self, buf: &mut [UffdMsg]) -> io::Result<usize> {
        let bytes = std::mem::size_of_val(buf);
        // SAFETY: `buf` is a valid writable buffer of `bytes` bytes of plain-old-data structs.
        let n = unsafe { libc::read(self.raw(), buf.as_mut_ptr().cast(), bytes) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                return Ok(0);
            }
            return Err(e);
        }
        Ok(n as usize / std::mem::size_of::<UffdMsg>())
    }

    /// Whether events wait to be read (a poll that does not wait).
    pub fn has_events(&self) -> bool {
        let mut fd = libc::pollfd {
            fd: self.raw(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        let n = unsafe { libc::poll(&mut fd, 1, 0) };
        n > 0 && fd.revents & libc::POLLIN != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_faults_decode() {
        let m = UffdMsg {
            event: EVENT_PAGEFAULT,
            flags: PAGEFAULT_FLAG_WRITE | PAGEFAULT_FLAG_WP,
            address: 0x7f00_1234,
            ptid: 42,
            ..UffdMsg::default()
        };
        assert_eq!(
            m.event(),
            Event::PageFault {
                addr: 0x7f00_1234,
                write: true,
                wp: true,
                tid: 42
            }
        );
        let other = UffdMsg {
            event: 0x13,
            ..UffdMsg::default()
        };
        assert_eq!(other.event(), Event::Other(0x13));
    }
}
