//! Files of `/proc/self` that the runtime's threads read again and again, opened once.
//!
//! A file a runtime thread opens takes the lowest free descriptor number, if only for the
//! moment of a read, and that number is the program's to count on: a single-threaded program
//! (or a child between `fork` and `exec`) that closes 0 and opens a file expects to get 0,
//! and the kernel fails a `dup2` onto a number another thread is opening (EBUSY). BEAM's
//! forker child lost the socket it talks to its parent through that way: its `dup2` onto 3
//! met the control thread opening `/proc/self/statm`, and BEAM stopped with "Failed to write
//! to erl_child_setup: 32".
//!
//! So these files are opened on the program's thread before the runtime's threads start
//! ([`prepare`]; again in a forked child, whose `/proc/self` files named the parent), kept
//! out of the program's way ([`crate::fds::keep`]), and read from offset 0 each time.

use std::fs::File;
use std::io;
use std::os::fd::{FromRawFd, IntoRawFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

/// One `/proc/self` file, open in the process that prepared it.
pub struct ProcFile {
    path: &'static str,
    fd: AtomicI32,
    /// The process whose file `fd` is (a forked child inherits its parent's).
    pid: AtomicU32,
}

/// Resident, shared, text... pages of this process.
pub static STATM: ProcFile = ProcFile::new("/proc/self/statm");
/// This process's memory summed over its mappings.
pub static SMAPS_ROLLUP: ProcFile = ProcFile::new("/proc/self/smaps_rollup");
/// This process's memory per mapping.
pub static SMAPS: ProcFile = ProcFile::new("/proc/self/smaps");

/// Open every file of this module for this process, on the calling thread (the program's,
/// before the runtime's threads start).
pub fn prepare() {
    for f in [&STATM, &SMAPS_ROLLUP, &SMAPS] {
        f.prepare();
    }
}

impl ProcFile {
    const fn new(path: &'static str) -> ProcFile {
        ProcFile {
            path,
            fd: AtomicI32::new(-1),
            pid: AtomicU32::new(0),
        }
    }

    fn prepare(&self) {
        let fd = File::open(self.path)
            .map(|f| crate::fds::keep(f).into_raw_fd())
            .unwrap_or(-1);
        self.pid.store(std::process::id(), Ordering::Relaxed);
        let old = self.fd.swap(fd, Ordering::AcqRel);
        if old >= 0 {
            crate::fds::close_kept(old);
        }
    }

    /// The file's whole text now. Where it was not prepared in this process it is opened
    /// for the read (taking a low number for that moment).
    pub fn read(&self) -> io::Result<String> {
        let fd = self.fd.load(Ordering::Acquire);
        if fd < 0 || self.pid.load(Ordering::Relaxed) != std::process::id() {
            return std::fs::read_to_string(self.path);
        }
        read_from_start(fd)
    }
}

/// All of `fd` from offset 0 (`pread`, so that no offset is shared with other readers; a
/// `/proc` file generates its text anew from offset 0).
fn read_from_start(fd: RawFd) -> io::Result<String> {
    use std::os::unix::fs::FileExt;
    // SAFETY: `fd` is open (kept by this module, closed only when replaced); the File is
    // turned back into a number below, so it never closes it.
    let f = unsafe { File::from_raw_fd(fd) };
    let mut out = Vec::new();
    // On the stack: `statm` comes in one read every 10 ms, with nothing to allocate for it.
    let mut chunk = [0u8; 16 << 10];
    let r = loop {
        match f.read_at(&mut chunk, out.len() as u64) {
            Ok(0) => break Ok(()),
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    let _ = f.into_raw_fd();
    r?;
    String::from_utf8(out).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prepared_file_reads_fresh_text_each_time_from_a_kept_descriptor() {
        let _serial = crate::fds::serial_for_tests();
        let f = ProcFile::new("/proc/self/statm");
        // Not prepared: read all the same.
        assert!(f.read().unwrap().split_whitespace().count() >= 7);
        f.prepare();
        let fd = f.fd.load(Ordering::Relaxed);
        assert!(crate::fds::is_kept(fd));
        let resident =
            |t: String| -> usize { t.split_whitespace().nth(1).unwrap().parse().unwrap() };
        let before = resident(f.read().unwrap());
        // 16 MiB touched: the resident count read again from the same descriptor grows.
        let v = vec![1u8; 16 << 20];
        std::hint::black_box(&v);
        let after = resident(f.read().unwrap());
        assert!(after >= before + 3000, "{before} then {after} pages");
        assert_eq!(f.fd.load(Ordering::Relaxed), fd, "no new descriptor");
        // Prepared again (as in a forked child): the old descriptor is let go.
        f.prepare();
        let now = f.fd.load(Ordering::Relaxed);
        assert!(now != fd && crate::fds::is_kept(now) && !crate::fds::is_kept(fd));
        crate::fds::close_kept(f.fd.swap(-1, Ordering::Relaxed));
    }

    #[test]
    fn a_file_longer_than_one_read_comes_whole() {
        let _serial = crate::fds::serial_for_tests();
        // smaps of a process with a few hundred mappings is longer than one 16 KiB read.
        let maps: Vec<*mut libc::c_void> = (0..400)
            .map(|i| {
                // SAFETY: fresh anonymous mappings; alternating protections keep them apart.
                unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        4096,
                        if i % 2 == 0 {
                            libc::PROT_READ
                        } else {
                            libc::PROT_NONE
                        },
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                        -1,
                        0,
                    )
                }
            })
            .collect();
        let f = ProcFile::new("/proc/self/smaps");
        f.prepare();
        let text = f.read().unwrap();
        assert!(text.len() > 64 << 10, "{} bytes", text.len());
        for &m in &maps {
            let start = format!("{:x}-", m as usize);
            assert!(
                text.lines().any(|l| l.starts_with(&start)),
                "{start} missing"
            );
        }
        for m in maps {
            // SAFETY: mapped above.
            unsafe { libc::munmap(m, 4096) };
        }
        crate::fds::close_kept(f.fd.swap(-1, Ordering::Relaxed));
    }
}
