//! The runtime's own heap: glibc's allocator, called by its internal names.
//!
//! When `libfarmem.so` is preloaded it *is* `malloc` (see `preload/`), and the program's
//! heap lives in far memory. The runtime's own data (metadata, buffers, its threads' state)
//! must stay local: a fault thread that faulted on its own heap would wait for itself. So
//! Rust's global allocator here calls `__libc_malloc` and friends, which glibc exports for
//! exactly this purpose, instead of `malloc`, which may resolve to our own interposer.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

// glibc's allocator under its internal names (also what the transparent mode's `malloc`
// forwards to for memory it does not manage).
extern "C" {
    pub(crate) fn __libc_malloc(size: usize) -> *mut c_void;
    pub(crate) fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    pub(crate) fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    pub(crate) fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
    pub(crate) fn __libc_free(p: *mut c_void);
}

/// glibc's `malloc` returns 16-byte aligned memory on x86-64.
const MALLOC_ALIGN: usize = 16;

pub struct LocalAlloc;

// SAFETY: every method forwards to glibc's allocator, which satisfies GlobalAlloc's contract
// for the alignments it is asked for (memalign for anything above its natural alignment).
unsafe impl GlobalAlloc for LocalAlloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: plain calls into glibc's allocator.
        unsafe {
            if l.align() <= MALLOC_ALIGN && l.align() <= l.size() {
                __libc_malloc(l.size()).cast()
            } else {
                __libc_memalign(l.align(), l.size()).cast()
            }
        }
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if l.align() <= MALLOC_ALIGN && l.align() <= l.size() {
            // SAFETY: plain call into glibc's allocator.
            unsafe { __libc_calloc(1, l.size()).cast() }
        } else {
            // SAFETY: `alloc` returns a block of `l.size()` bytes or null.
            unsafe {
                let p = self.alloc(l);
                if !p.is_null() {
                    std::ptr::write_bytes(p, 0, l.size());
                }
                p
            }
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, _l: Layout) {
        // SAFETY: `p` came from this allocator, i.e. from glibc.
        unsafe { __libc_free(p.cast()) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        if l.align() <= MALLOC_ALIGN && l.align() <= new_size {
            // SAFETY: `p` came from glibc with at most its natural alignment.
            return unsafe { __libc_realloc(p.cast(), new_size).cast() };
        }
        // SAFETY: allocate, copy the smaller size, free the old block (all from glibc).
        unsafe {
            let n = self.alloc(Layout::from_size_align_unchecked(new_size, l.align()));
            if !n.is_null() {
                std::ptr::copy_nonoverlapping(p, n, l.size().min(new_size));
                self.dealloc(p, l);
            }
            n
        }
    }
}

#[global_allocator]
static GLOBAL: LocalAlloc = LocalAlloc;
