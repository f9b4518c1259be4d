//! The runs of one read request in flight together (io_uring), instead of one after another.
//!
//! A fault that reads ahead reads its page and the predicted ones, which seldom sit in
//! neighbouring slots of the far file: several reads. This machine's disk serves random
//! 4 KiB direct reads at ~105 µs each at queue depth 1, and two at once in ~135 µs
//! (`probes/disk_read_wait.c` and the queue-depth sweep in probes/README.md), so a fault
//! with one page of read-ahead waited ~210 µs one read after the other and waits ~135 µs with
//! both in flight. Each thread that reads gets a ring of its own on its first request of
//! several runs (no lock, no thread to hand completions over); a request of one run is a plain
//! `pread`, which costs less than a ring's submission and wait.
//!
//! Where io_uring is refused (an old kernel, `kernel.io_uring_disabled`, a seccomp filter) or
//! `FARMEM_IO_URING=0`, the runs are read one after another, as before.

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicU8, Ordering};

use io_uring::{opcode, types, IoUring};

/// Reads one ring keeps in flight at once (a request of more runs waits for free entries).
const RING_ENTRIES: u32 = 32;

/// One contiguous read: `len` bytes at `offset` of `fd` into `buf`.
pub(crate) struct ReadRun {
    pub fd: RawFd,
    pub offset: u64,
    pub buf: *mut u8,
    pub len: usize,
}

/// Whether rings may be used: unknown, yes, or no (refused once, or turned off).
static USABLE: AtomicU8 = AtomicU8::new(UNKNOWN);
const UNKNOWN: u8 = 0;
const YES: u8 = 1;
const NO: u8 = 2;

struct Ring {
    /// The process that made it: a child made by fork() inherits the forking thread's
    /// thread-locals, and must not share its parent's ring.
    pid: u32,
    ring: IoUring,
}

/// A ring whose descriptor is out of the program's way (`farmem_sys::fds`: a program may
/// close every descriptor it did not open, or `dup2` onto a low number): made, then mapped
/// again through a high duplicate of its descriptor, and the first mapping let go.
fn new_ring() -> io::Result<IoUring> {
    let first = IoUring::new(RING_ENTRIES)?;
    // SAFETY: `first` holds its descriptor open while it is borrowed here.
    let high = farmem_sys::fds::keep_copy(unsafe { BorrowedFd::borrow_raw(first.as_raw_fd()) })?;
    let fd = std::os::fd::IntoRawFd::into_raw_fd(high);
    // SAFETY: `fd` names the same ring as `first`, whose parameters these are.
    match unsafe { IoUring::from_fd(fd, first.params().clone()) } {
        Ok(ring) => Ok(ring),
        Err(e) => {
            farmem_sys::fds::close_kept(fd);
            Err(e)
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // Its descriptor is closed as the ring drops next: no longer the runtime's to keep.
        farmem_sys::fds::forget(self.ring.as_raw_fd());
    }
}

thread_local! {
    static RING: RefCell<Option<Ring>> = const { RefCell::new(None) };
}

/// Whether a request's reads go in flight together (io_uring allowed and not turned off).
pub(crate) fn usable() -> bool {
    match USABLE.load(Ordering::Relaxed) {
        YES => true,
        NO => false,
        _ => {
            let on = std::env::var("FARMEM_IO_URING").map_or(true, |v| v != "0");
            USABLE.store(if on { YES } else { NO }, Ordering::Relaxed);
            on
        }
    }
}

/// Read every run in full, all in flight at once where io_uring allows.
///
/// # Safety
/// Each run's `buf` must be valid for writes of `len` bytes, and not touched by anything else
/// until this returns (it returns only once no read is in flight into any of them).
pub(crate) unsafe fn read_all(runs: &[ReadRun]) -> io::Result<()> {
    if runs.len() > 1 && usable() {
        let pid = std::process::id();
        let done = RING.with(|cell| {
            let mut slot = cell.borrow_mut();
            if slot.as_ref().is_none_or(|r| r.pid != pid) {
                match new_ring() {
                    Ok(ring) => *slot = Some(Ring { pid, ring }),
                    Err(e) => {
                        tracing::debug!("io_uring refused ({e}): far-file reads go one by one");
                        USABLE.store(NO, Ordering::Relaxed);
                        *slot = None;
                        return None;
                    }
                }
            }
            let ring = &mut slot.as_mut().expect("a ring").ring;
            // SAFETY: the caller's guarantee on the buffers.
            Some(unsafe { read_on_ring(ring, runs) })
        });
        if let Some(r) = done {
            return r;
        }
    }
    for r in runs {
        // SAFETY: the caller's guarantee on the buffers.
        unsafe { pread_full(r, 0)? };
    }
    Ok(())
}

/// Read run `r` from byte `from` of it to its end with `pread` (a short read goes on).
unsafe fn pread_full(r: &ReadRun, from: usize) -> io::Result<()> {
    // SAFETY: the caller's guarantee: `buf` holds `len` bytes, `from` of them read.
    unsafe {
        farmem_sys::mem::pread_full(r.fd, r.buf.add(from), r.len - from, r.offset + from as u64)
    }
}

/// The runs through `ring`; returns once every submitted read has completed.
unsafe fn read_on_ring(ring: &mut IoUring, runs: &[ReadRun]) -> io::Result<()> {
    let mut next = 0;
    let mut in_flight = 0usize;
    let mut first_err: Option<io::Error> = None;
    // Runs a completion left short (rare: direct reads of whole blocks), finished after.
    let mut short: Vec<(usize, usize)> = Vec::new();
    while next < runs.len() || in_flight > 0 {
        {
            let mut sq = ring.submission();
            while next < runs.len() && first_err.is_none() && !sq.is_full() {
                let r = &runs[next];
                let e = opcode::Read::new(types::Fd(r.fd), r.buf, r.len as u32)
                    .offset(r.offset)
                    .build()
                    .user_data(next as u64);
                // SAFETY: the entry's buffer stays valid until its completion is reaped below
                // (the caller's guarantee, and this function reaps every completion).
                if unsafe { sq.push(&e) }.is_err() {
                    break;
                }
                next += 1;
                in_flight += 1;
            }
        }
        if first_err.is_some() {
            // Nothing more is submitted; the rest are not read.
            next = runs.len();
        }
        if in_flight == 0 {
            break;
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                ) => {}
            Err(e) => {
                // The ring itself failed with reads in flight into the caller's buffers:
                // returning would let them be reused under a running read.
                farmem_sys::process::fatal(&format!("io_uring wait failed: {e}"));
            }
        }
        for c in ring.completion() {
            in_flight -= 1;
            let i = c.user_data() as usize;
            let res = c.result();
            if res < 0 {
                let e = io::Error::from_raw_os_error(-res);
                if e.kind() == io::ErrorKind::Interrupted || res == -libc::EAGAIN {
                    short.push((i, 0));
                } else if first_err.is_none() {
                    first_err = Some(e);
                }
            } else if (res as usize) < runs[i].len {
                short.push((i, res as usize));
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    for (i, from) in short {
        // SAFETY: the caller's guarantee on the buffers.
        unsafe { pread_full(&runs[i], from)? };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    fn file_of(bytes: &[u8]) -> std::fs::File {
        let mut f = tempfile_in_tmp();
        f.write_all(bytes).unwrap();
        f
    }

    fn tempfile_in_tmp() -> std::fs::File {
        let p = std::env::temp_dir().join(format!(
            "farmem-uring-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&p)
            .unwrap();
        std::fs::remove_file(&p).unwrap();
        f
    }

    #[test]
    fn many_runs_read_into_their_buffers_more_than_a_ring_holds() {
        let data: Vec<u8> = (0..(1 << 20)).map(|i| (i * 7 + i / 4096) as u8).collect();
        let f = file_of(&data);
        // 100 runs of varied length at scattered offsets, more than RING_ENTRIES.
        let mut bufs: Vec<Vec<u8>> = Vec::new();
        let mut spec = Vec::new();
        for i in 0..100u64 {
            let off = (i * 7919 * 13) % ((1 << 20) - 20_000);
            let len = 1 + (i as usize * 131) % 12_000;
            spec.push((off, len));
            bufs.push(vec![0u8; len]);
        }
        let runs: Vec<ReadRun> = spec
            .iter()
            .zip(bufs.iter_mut())
            .map(|(&(offset, len), b)| ReadRun {
                fd: f.as_raw_fd(),
                offset,
                buf: b.as_mut_ptr(),
                len,
            })
            .collect();
        // SAFETY: each buffer holds its run's length and is not touched until this returns.
        unsafe { read_all(&runs) }.unwrap();
        for (&(off, len), b) in spec.iter().zip(&bufs) {
            assert_eq!(&b[..], &data[off as usize..off as usize + len]);
        }
    }

    #[test]
    fn a_read_past_the_end_is_an_error_not_silence() {
        let f = file_of(&[1u8; 8192]);
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 4096];
        let runs = [
            ReadRun {
                fd: f.as_raw_fd(),
                offset: 0,
                buf: a.as_mut_ptr(),
                len: 4096,
            },
            ReadRun {
                fd: f.as_raw_fd(),
                offset: 6144,
                buf: b.as_mut_ptr(),
                len: 4096,
            },
        ];
        // SAFETY: as above.
        let r = unsafe { read_all(&runs) };
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(a, vec![1u8; 4096]);
    }

    #[test]
    fn a_bad_descriptor_is_reported() {
        let mut a = vec![0u8; 16];
        let mut b = vec![0u8; 16];
        let runs = [
            ReadRun {
                fd: -1,
                offset: 0,
                buf: a.as_mut_ptr(),
                len: 16,
            },
            ReadRun {
                fd: -1,
                offset: 0,
                buf: b.as_mut_ptr(),
                len: 16,
            },
        ];
        // SAFETY: as above.
        assert!(unsafe { read_all(&runs) }.is_err());
    }
}
