//! The kernel touching region memory on the program's behalf: `read()` into evicted pages
//! (pipe, file, socket; the kernel takes the fault and the runtime must serve it) and
//! `write()` from evicted pages. Bytes must be exact, and bytes of the partially covered
//! pages outside the buffer must keep their old contents (fetched, not zero-filled).

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use farmem_runtime::testing::*;
use farmem_runtime::{Region, Runtime, PAGE_SIZE};

const SALT: u64 = 0x4B45_524E;

struct Fixture {
    rt: Runtime,
    r: Region,
    pressure: Pressure,
}

fn fixture() -> Fixture {
    fixture_with(runtime(2 << 20, 16, 16)) // 512 pages
}

/// Far copies kept: pages fetched for reading are installed write-protected, and the
/// kernel's writes into them trap.
fn fixture_keeping_far_copies() -> Fixture {
    fixture_with(runtime_keeping_far_copies(2 << 20, 16, 16))
}

fn fixture_with(rt: Runtime) -> Fixture {
    let r = rt.create_region(8 << 20).unwrap();
    let pressure = Pressure::new(&rt, 2048);
    Fixture { rt, r, pressure }
}

fn pages_of(off: usize, len: usize) -> std::ops::Range<usize> {
    off / PAGE_SIZE..(off + len).div_ceil(PAGE_SIZE)
}

/// The "old" contents of byte `i` of the region (before the kernel overwrites a range).
fn old_byte(i: usize) -> u8 {
    pattern(SALT, i / PAGE_SIZE, (i % PAGE_SIZE) / 8).to_ne_bytes()[i % 8]
}

/// The bytes the kernel delivers into the region.
fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = XorShift::new(seed);
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

impl Fixture {
    /// Fill the pages covering `[off, off+len)` with the old pattern and evict them.
    fn prepare_evicted(&mut self, off: usize, len: usize) {
        for p in pages_of(off, len) {
            fill_page(&self.r, p, |w| pattern(SALT, p, w));
        }
        self.pressure.evict(&self.r, pages_of(off, len));
        for p in pages_of(off, len) {
            assert!(
                !self.r.is_resident(p * PAGE_SIZE),
                "page {p} should be evicted"
            );
        }
    }

    /// As `prepare_evicted`, then read the pages back so they are resident but clean and
    /// write-protected: the kernel's write must take a write-protect fault. (Pages written
    /// during their last stay come back writable and unverified; one round trip unwritten,
    /// found unchanged at eviction, makes them come back write-protected.)
    fn prepare_write_protected(&mut self, off: usize, len: usize) {
        self.prepare_evicted(off, len);
        for p in pages_of(off, len) {
            farmem_runtime::hint(at(&self.r, p * PAGE_SIZE));
        }
        self.pressure.evict(&self.r, pages_of(off, len));
        let fetched = self.rt.stats().pages_fetched;
        for p in pages_of(off, len) {
            farmem_runtime::hint(at(&self.r, p * PAGE_SIZE));
            assert!(self.r.is_resident(p * PAGE_SIZE));
        }
        assert_eq!(
            self.rt.stats().pages_fetched - fetched,
            pages_of(off, len).len() as u64
        );
    }

    /// Check that `[off, off+len)` holds `want` and the rest of its pages the old pattern.
    fn verify(&self, off: usize, want: &[u8], what: &str) {
        // SAFETY: no other thread writes the region during the check.
        let mem = unsafe { self.r.as_slice() };
        let len = want.len();
        if let Some(i) = (0..len).find(|&i| mem[off + i] != want[i]) {
            panic!(
                "{what}: byte {i} of the buffer (region offset {:#x}): got {:#04x}, want {:#04x}",
                off + i,
                mem[off + i],
                want[i]
            );
        }
        let pages = pages_of(off, len);
        let outside = (pages.start * PAGE_SIZE..off).chain(off + len..pages.end * PAGE_SIZE);
        for i in outside {
            assert_eq!(
                mem[i],
                old_byte(i),
                "{what}: byte at region offset {i:#x}, outside the buffer, lost its old contents"
            );
        }
    }
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe() writes two descriptors into the array.
    assert_eq!(
        unsafe { libc::pipe(fds.as_mut_ptr()) },
        0,
        "pipe: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: fresh descriptors owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// `read()` until `len` bytes arrived at `dst` (or EOF); returns the count.
fn read_full(fd: RawFd, dst: *mut u8, len: usize) -> usize {
    let mut done = 0;
    while done < len {
        // SAFETY: `dst[done..len]` is writable region memory.
        let n = unsafe { libc::read(fd, dst.add(done).cast(), len - done) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            panic!("read() into region memory failed after {done} bytes: {e}");
        }
        if n == 0 {
            break;
        }
        done += n as usize;
    }
    done
}

/// `write()` all `len` bytes from `src`; returns the count.
fn write_full(fd: RawFd, src: *const u8, len: usize) -> usize {
    let mut done = 0;
    while done < len {
        // SAFETY: `src[done..len]` is readable region memory.
        let n = unsafe { libc::write(fd, src.add(done).cast(), len - done) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            panic!("write() from region memory failed after {done} bytes: {e}");
        }
        done += n as usize;
    }
    done
}

fn temp_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("farmem-test-{}-{name}", std::process::id()))
}

fn pipe_into(f: &mut Fixture, off: usize, len: usize, seed: u64, what: &str) {
    let want = data(len, seed);
    let (rd, wr) = pipe();
    let fetched = f.rt.stats().pages_fetched;
    std::thread::scope(|s| {
        let w = &want;
        s.spawn(move || {
            let mut file = std::fs::File::from(wr);
            // Odd-sized chunks, so reads end mid-page.
            for chunk in w.chunks(3001) {
                file.write_all(chunk).unwrap();
            }
        });
        let got = read_full(rd.as_raw_fd(), at(&f.r, off), len);
        assert_eq!(got, len, "{what}: short read from the pipe");
    });
    f.verify(off, &want, what);
    assert!(
        f.rt.stats().pages_fetched > fetched,
        "{what}: old contents were fetched"
    );
}

#[test]
fn pipe_read_into_evicted_pages() {
    let mut f = fixture();
    let (off, len) = (10 * PAGE_SIZE + 100, 64 * 1024 + 333);
    f.prepare_evicted(off, len);
    pipe_into(&mut f, off, len, 1, "pipe read into evicted pages");
}

#[test]
fn pipe_read_into_write_protected_pages() {
    let mut f = fixture_keeping_far_copies();
    let (off, len) = (200 * PAGE_SIZE + 4000, 20 * PAGE_SIZE);
    f.prepare_write_protected(off, len);
    let wp = f.rt.stats().wp_faults;
    let want = data(len, 2);
    let (rd, wr) = pipe();
    std::thread::scope(|s| {
        let w = &want;
        s.spawn(move || std::fs::File::from(wr).write_all(w).unwrap());
        assert_eq!(read_full(rd.as_raw_fd(), at(&f.r, off), len), len);
    });
    f.verify(off, &want, "pipe read into write-protected pages");
    assert!(
        f.rt.stats().wp_faults > wp,
        "the kernel's writes took write-protect faults"
    );
}

#[test]
fn file_read_into_evicted_pages() {
    let mut f = fixture();
    let path = temp_path("file-read");
    let file_data = data(300 * 1024 + 17, 3);
    std::fs::write(&path, &file_data).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let fd = file.as_raw_fd();

    // read(): the whole file into evicted pages at an unaligned offset.
    let (off, len) = (300 * PAGE_SIZE + 7, file_data.len());
    f.prepare_evicted(off, len);
    assert_eq!(read_full(fd, at(&f.r, off), len), len);
    f.verify(off, &file_data, "read() from a file");

    // pread(): a slice from the middle into other evicted pages.
    let (off2, from, len2) = (500 * PAGE_SIZE + 2049, 12_345usize, 50_000usize);
    f.prepare_evicted(off2, len2);
    // SAFETY: region memory, len2 bytes writable.
    let n = unsafe { libc::pread(fd, at(&f.r, off2).cast(), len2, from as libc::off_t) };
    assert_eq!(
        n,
        len2 as isize,
        "pread: {}",
        std::io::Error::last_os_error()
    );
    f.verify(off2, &file_data[from..from + len2], "pread() from a file");

    // readv(): two evicted destinations in one call.
    let (a, alen, b, blen) = (
        700 * PAGE_SIZE + 11,
        9_000usize,
        900 * PAGE_SIZE + 3_000,
        20_000usize,
    );
    f.prepare_evicted(a, alen);
    f.prepare_evicted(b, blen);
    // SAFETY: seek on our own descriptor.
    assert_eq!(unsafe { libc::lseek(fd, 0, libc::SEEK_SET) }, 0);
    let iov = [
        libc::iovec {
            iov_base: at(&f.r, a).cast(),
            iov_len: alen,
        },
        libc::iovec {
            iov_base: at(&f.r, b).cast(),
            iov_len: blen,
        },
    ];
    // SAFETY: both iovecs describe writable region memory.
    let n = unsafe { libc::readv(fd, iov.as_ptr(), 2) };
    assert_eq!(
        n,
        (alen + blen) as isize,
        "readv: {}",
        std::io::Error::last_os_error()
    );
    f.verify(a, &file_data[..alen], "readv() first iovec");
    f.verify(b, &file_data[alen..alen + blen], "readv() second iovec");
    drop(file);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn socket_recv_into_evicted_pages() {
    let mut f = fixture();
    let (off, len) = (1200 * PAGE_SIZE + 1234, 40_000);
    f.prepare_evicted(off, len);
    let want = data(len, 4);
    let (mut tx, rx) = UnixStream::pair().unwrap();
    std::thread::scope(|s| {
        let w = &want;
        s.spawn(move || tx.write_all(w).unwrap());
        let mut done = 0;
        while done < len {
            // SAFETY: region memory, writable.
            let n =
                unsafe { libc::recv(rx.as_raw_fd(), at(&f.r, off + done).cast(), len - done, 0) };
            assert!(n > 0, "recv: {}", std::io::Error::last_os_error());
            done += n as usize;
        }
    });
    f.verify(off, &want, "recv() from a socket");
}

fn expected_old(off: usize, len: usize) -> Vec<u8> {
    (off..off + len).map(old_byte).collect()
}

#[test]
fn write_from_evicted_pages_to_pipe_and_file() {
    let mut f = fixture();
    // To a pipe, drained by another thread.
    let (off, len) = (50 * PAGE_SIZE + 50, 20 * PAGE_SIZE - 100);
    f.prepare_evicted(off, len);
    let fetched = f.rt.stats().pages_fetched;
    let (rd, wr) = pipe();
    let got = std::thread::scope(|s| {
        let reader = s.spawn(move || {
            let mut v = Vec::new();
            std::fs::File::from(rd).read_to_end(&mut v).unwrap();
            v
        });
        assert_eq!(write_full(wr.as_raw_fd(), at(&f.r, off), len), len);
        drop(wr);
        reader.join().unwrap()
    });
    assert_eq!(got.len(), len);
    assert!(
        got == expected_old(off, len),
        "write() to a pipe sent wrong bytes"
    );
    assert!(
        f.rt.stats().pages_fetched - fetched >= pages_of(off, len).len() as u64,
        "the kernel's reads fetched the evicted pages"
    );

    // To a file, then read back through the file system.
    let (off, len) = (800 * PAGE_SIZE + 4095, 33 * PAGE_SIZE + 2);
    f.prepare_evicted(off, len);
    let path = temp_path("file-write");
    let file = std::fs::File::create(&path).unwrap();
    assert_eq!(write_full(file.as_raw_fd(), at(&f.r, off), len), len);
    drop(file);
    let back = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(
        back == expected_old(off, len),
        "write() to a file stored wrong bytes"
    );

    // The region itself is unchanged by being read by the kernel.
    f.verify(off, &expected_old(off, len), "region after write()");
}
