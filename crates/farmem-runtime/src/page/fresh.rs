//! Page words that cost memory only where a region is used.
//!
//! A new region's pages are all `FRESH`, a non-zero word. Writing it into each word made the
//! table's slice of a region resident whole: 8 bytes per page of the region's *size*, used
//! or not. GNU sort, which mallocs a 1.4 GiB buffer and fills 150 MiB of it, had 2.75 MiB of
//! table resident, counted against its budget. Instead the table pages a region has alone
//! are mapped copy-on-write from a small sealed file full of `FRESH` words: they read as
//! `FRESH` at the cost of the file's page cache, shared by all of them, and a table page
//! becomes memory of the process only when one of its 512 words is first written (a page
//! of that 2 MiB of the region installed or locked).

use std::io;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};

use parking_lot::Mutex;

use farmem_sys::mem::{self, PAGE_SIZE};

use super::word::PageWord;

/// The template file's size: 64 table pages, the words of 128 MiB of memory. A region's
/// slice is mapped in pieces of this size (one mapping per 64 MiB chunk of the transparent
/// mode's address space), and the file's pages are memory once, for the whole process.
const FILE_BYTES: usize = 64 * PAGE_SIZE;

struct Template {
    fd: OwnedFd,
    /// (device, inode) of the file: the descriptor number is checked to still name it
    /// before each use, since the program may have closed it and opened something else.
    id: (u64, u64),
}

static TEMPLATE: Mutex<Option<Template>> = Mutex::new(None);

/// The template's descriptor, made (again) if need be.
fn template(t: &mut Option<Template>) -> io::Result<i32> {
    if let Some(cur) = t.as_ref() {
        if mem::fd_identity(cur.fd.as_raw_fd()) == Some(cur.id) {
            return Ok(cur.fd.as_raw_fd());
        }
        // The number no longer names our file: it is the program's now (or nothing), and
        // must not be closed by us.
        if let Some(old) = t.take() {
            let _ = old.fd.into_raw_fd();
        }
    }
    let words = vec![PageWord::FRESH.raw(); FILE_BYTES / 8];
    // SAFETY: u64 words viewed as their bytes, within the vector's allocation.
    let bytes = unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), FILE_BYTES) };
    let name = c"farmem-fresh-page-words";
    let fd = farmem_sys::fds::keep(mem::sealed_memfd(name, bytes)?);
    let id = mem::fd_identity(fd.as_raw_fd())
        .ok_or_else(|| io::Error::other("fstat of a new memfd failed"))?;
    let raw = fd.as_raw_fd();
    *t = Some(Template { fd, id });
    Ok(raw)
}

/// Make the whole table pages `[start, end)` (page-aligned) read as `FRESH` words, writable,
/// copy-on-write. On failure (no descriptor, no mapping left) nothing is promised about the
/// range's contents: the caller writes the words itself.
pub(crate) fn map_fresh(start: usize, end: usize) -> io::Result<()> {
    let mut t = TEMPLATE.lock();
    let fd = template(&mut t)?;
    let mut a = start;
    while a < end {
        let len = (end - a).min(FILE_BYTES);
        // SAFETY: the range is a slice of the page table's own reservation that only the
        // region being registered uses (the caller's whole pages).
        unsafe {
            mem::map_file_private_fixed(a, len, libc::PROT_READ | libc::PROT_WRITE, fd)?;
        }
        a += len;
    }
    Ok(())
}

/// Give back the whole table pages `[start, end)` of a destroyed region: anonymous again,
/// reading as 0 (unregistered), read-only as the rest of the reservation. Whether it
/// succeeded; on failure the caller zeroes the words itself.
pub(crate) fn map_unregistered(start: usize, end: usize) -> bool {
    // SAFETY: the region's own whole table pages, which nothing refers to any more.
    unsafe { mem::map_anon_fixed(start, end - start, libc::PROT_READ) }.is_ok()
}
