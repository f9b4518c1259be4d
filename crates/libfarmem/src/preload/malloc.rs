//! The `malloc` family of the transparent mode.
//!
//! Who owns a pointer is decided by its address alone: mimalloc's arena, the fine slabs
//! (blocks over 256 bytes and up to 32 KiB, in classes 16 bytes apart up to 2 KiB and 64 per
//! doubling above, against mimalloc's four per doubling: `fine.rs`), the direct part of the
//! reservation (blocks of [`LARGE`] bytes or more, page-granular), or anything else, which
//! glibc handed out (before the runtime was ready, or in a process where the transparent
//! mode is off) and goes back to glibc.
//!
//! Large blocks get twice their size (rounded to a power of two) of *address space*, so
//! that `realloc` can usually grow them in place: the room beyond the block is never
//! touched and costs nothing. A freed large block is discarded at once, so dead data is
//! never written back to far memory.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::vspace::{self, LargeBlock, Part};
use super::{active, in_allocator, set_errno, OPTIONS};
use super::{fine, mi};
use farmem_sys::mem::PAGE_SIZE;

/// Blocks at least this large are served page-granular from the direct part.
const LARGE: usize = 1 << 20;
/// mimalloc aligns blocks in its arenas up to its slice size; larger alignments (which it
/// would serve from the OS, and may not here) are served page-granular.
const MI_MAX_ALIGN: usize = 64 << 10;
/// Blocks this large (16 GiB) get no extra address space to grow into.
const MAX_ROOM: usize = 1 << 34;

/// Large blocks start at one of this many page offsets ("colours") into their address space.
/// Their rooms are powers of two, so without it the blocks a program allocates one after the
/// other start at addresses equal modulo their room: the suite's dataframe, which scans
/// five such columns side by side, ran 8% slower with its columns placed so natively too
/// (0.90 s against 0.80-0.84 s with glibc's placement or with colours, medians of 6).
const COLOURS: usize = 128;
/// Pages between the colours of consecutive blocks (coprime with `COLOURS`, so that they
/// go through every colour).
const COLOUR_STEP: usize = 9;
static NEXT_COLOUR: AtomicUsize = AtomicUsize::new(0);

/// Address space to leave before the next large block (page-aligned blocks only: a larger
/// alignment would be broken by the offset).
fn colour_lead(align: usize) -> usize {
    if align > PAGE_SIZE {
        return 0;
    }
    let n = NEXT_COLOUR.fetch_add(1, Ordering::Relaxed);
    (n * COLOUR_STEP % COLOURS) * PAGE_SIZE
}

use crate::local_alloc::{
    __libc_calloc, __libc_free, __libc_malloc, __libc_memalign, __libc_realloc,
};

/// glibc's `malloc_usable_size` (found with dlsym, since ours shadows it).
static LIBC_USABLE_SIZE: AtomicUsize = AtomicUsize::new(0);

pub fn init() {
    libc_usable_size_fn();
}

fn libc_usable_size_fn() -> usize {
    super::next_symbol(&LIBC_USABLE_SIZE, c"malloc_usable_size")
}

fn prefault(p: *mut c_void, size: usize) {
    if let Some(o) = OPTIONS.get() {
        if size <= o.prefault_max && !p.is_null() {
            farmem_runtime::hint_ex(p as *const u8, size.max(1), farmem_runtime::FM_WRITE, 0, 0);
        }
    }
}

/// Address space reserved for a large block of `len` bytes.
fn room_for(len: usize) -> usize {
    if len >= MAX_ROOM {
        len
    } else {
        (len * 2).next_power_of_two()
    }
}

fn large_alloc(size: usize, align: usize) -> *mut c_void {
    let len = vspace::page_round(size.max(1));
    let room = room_for(len);
    let lead = colour_lead(align);
    let mut g = vspace::SPACE.lock();
    let Some(s) = g.as_mut() else {
        return std::ptr::null_mut();
    };
    // The lead is made usable with the block (it is never touched: registering it only
    // writes its pages' metadata).
    match s.alloc_usable(lead + room, align.max(PAGE_SIZE), lead + len) {
        Some(a) => {
            s.large.insert(a + lead, LargeBlock { len, room, lead });
            (a + lead) as *mut c_void
        }
        None => std::ptr::null_mut(),
    }
}

/// Free a large block; false if `p` is not the start of one.
fn large_free(p: usize) -> bool {
    let (rt, b) = {
        let mut g = vspace::SPACE.lock();
        let Some(s) = g.as_mut() else { return false };
        let Some(b) = s.large.remove(&p) else {
            return false;
        };
        (s.runtime().cloned(), b)
    };
    // Discard outside the lock (it may wait for pages in transition); the range is still
    // ours until released.
    vspace::discard(rt.as_ref(), p, b.len);
    if let Some(s) = vspace::SPACE.lock().as_mut() {
        s.release(p - b.lead, b.lead + b.room);
    }
    true
}

fn large_len(p: usize) -> Option<usize> {
    vspace::SPACE
        .lock()
        .as_ref()
        .and_then(|s| s.large.get(&p).map(|b| b.len))
}

/// Resize a large block in place if its reserved room allows; returns whether it did.
fn large_resize_in_place(p: usize, new_size: usize) -> bool {
    let new_len = vspace::page_round(new_size.max(1));
    let (rt, tail) = {
        let mut g = vspace::SPACE.lock();
        let Some(s) = g.as_mut() else { return false };
        let Some(&LargeBlock { len, room, lead }) = s.large.get(&p) else {
            return false;
        };
        if new_len <= room {
            if s.ensure_usable(p, new_len).is_err() {
                return false;
            }
            s.large.insert(
                p,
                LargeBlock {
                    len: new_len,
                    room,
                    lead,
                },
            );
            // Shrinking: the dropped tail must read as zeros when the block grows again.
            let tail = (new_len < len).then(|| (p + new_len, len - new_len));
            match tail {
                Some((a, l)) => s.note_allocated(a, l, false),
                None => s.note_allocated(p, new_len, true),
            }
            (s.runtime().cloned(), tail)
        } else if s.grow_in_place(p, room, new_len) {
            s.large.insert(
                p,
                LargeBlock {
                    len: new_len,
                    room: new_len,
                    lead,
                },
            );
            (None, None)
        } else {
            return false;
        }
    };
    if let Some((a, l)) = tail {
        vspace::discard(rt.as_ref(), a, l);
    }
    true
}

/// A block from mimalloc, giving it another arena when the ones it has are full (once: a
/// request that fails in a fresh arena would fail in any).
fn mi_alloc(f: impl Fn() -> *mut c_void) -> *mut c_void {
    let p = in_allocator(&f);
    if !p.is_null() || !mi::add_arena() {
        return p;
    }
    in_allocator(&f)
}

fn far_alloc(size: usize, align: usize) -> *mut c_void {
    let p = if size >= LARGE || align > MI_MAX_ALIGN {
        large_alloc(size, align)
    } else if let Some(p) = fine_alloc(size, align) {
        p
    } else if align <= 16 {
        // SAFETY: plain call into mimalloc.
        mi_alloc(|| unsafe { mi::mi_malloc(size) })
    } else {
        // SAFETY: plain call into mimalloc; `align` is a power of two (checked by callers).
        mi_alloc(|| unsafe { mi::mi_malloc_aligned(size, align) })
    };
    if p.is_null() {
        set_errno(libc::ENOMEM);
    } else {
        prefault(p, size);
    }
    p
}

/// A mid-size block from the fine classes, if `size` is theirs and they have room.
fn fine_alloc(size: usize, align: usize) -> Option<*mut c_void> {
    if align > 16 || size <= fine::MIN || size > fine::MAX {
        return None;
    }
    let p = fine::alloc(size);
    (!p.is_null()).then_some(p as *mut c_void)
}

fn usable_size(p: *mut c_void) -> usize {
    match vspace::part_of(p as usize) {
        Part::Fine => fine::usable_size(p as usize),
        // SAFETY: `p` is a block of mimalloc's arena.
        Part::Mimalloc => in_allocator(|| unsafe { mi::mi_usable_size(p) }),
        Part::Direct => large_len(p as usize).unwrap_or(0),
        Part::Outside => {
            let f = libc_usable_size_fn();
            if f == 0 {
                return 0;
            }
            // SAFETY: `f` is glibc's malloc_usable_size and `p` one of glibc's blocks.
            let f: extern "C" fn(*mut c_void) -> usize = unsafe { std::mem::transmute(f) };
            f(p)
        }
    }
}

#[no_mangle]
pub extern "C" fn malloc(size: usize) -> *mut c_void {
    if active() {
        far_alloc(size, 16)
    } else {
        // SAFETY: forwarding to glibc.
        unsafe { __libc_malloc(size) }
    }
}

#[no_mangle]
pub extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    if !active() {
        // SAFETY: forwarding to glibc.
        return unsafe { __libc_calloc(n, size) };
    }
    let Some(total) = n.checked_mul(size) else {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    if total >= LARGE {
        // Large blocks come from discarded or never-used ranges: already zero.
        return far_alloc(total, 16);
    }
    if let Some(p) = fine_alloc(total, 16) {
        // SAFETY: a fresh block of at least `total` bytes (it may be a reused one).
        unsafe { std::ptr::write_bytes(p as *mut u8, 0, total) };
        prefault(p, total);
        return p;
    }
    // SAFETY: plain call into mimalloc.
    let p = mi_alloc(|| unsafe { mi::mi_calloc(n, size) });
    if p.is_null() {
        set_errno(libc::ENOMEM);
    } else {
        prefault(p, total);
    }
    p
}

/// # Safety
/// `p` must be null or a live block from this allocator family (the C contract of `free`).
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    match vspace::part_of(p as usize) {
        // SAFETY: a block of mimalloc's arena.
        Part::Mimalloc => in_allocator(|| unsafe { mi::mi_free(p) }),
        Part::Fine => fine::free(p as usize),
        Part::Direct => {
            if !large_free(p as usize) {
                farmem_sys::process::fatal(&format!("free({p:p}): not a block returned by malloc"));
            }
        }
        // SAFETY: glibc's block (the caller's contract).
        Part::Outside => unsafe { __libc_free(p) },
    }
}

/// # Safety
/// As C `realloc`.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if p.is_null() {
        return malloc(size);
    }
    if size == 0 {
        // SAFETY: as C realloc(p, 0) in glibc: free and return NULL.
        unsafe { free(p) };
        return std::ptr::null_mut();
    }
    match vspace::part_of(p as usize) {
        // SAFETY: glibc's block; it stays with glibc.
        Part::Outside => unsafe { __libc_realloc(p, size) },
        // (Moved when growing into the fine classes' sizes, so that it is held as tightly.)
        Part::Mimalloc if size < LARGE && (size <= fine::MIN || size > fine::MAX) => {
            // SAFETY: a block of mimalloc's arena.
            let n = mi_alloc(|| unsafe { mi::mi_realloc(p, size) });
            if n.is_null() {
                set_errno(libc::ENOMEM);
            }
            n
        }
        Part::Direct if size >= LARGE && large_resize_in_place(p as usize, size) => p,
        // Still its class (or not worth moving for less than half of it).
        Part::Fine if size <= fine::usable_size(p as usize) && size > fine::MIN / 2 => p,
        _ => {
            let old = usable_size(p);
            let n = far_alloc(size, 16);
            if !n.is_null() {
                // SAFETY: both blocks are live and at least min(old, size) bytes long.
                unsafe {
                    std::ptr::copy_nonoverlapping(p as *const u8, n as *mut u8, old.min(size));
                    free(p);
                }
            }
            n
        }
    }
}

/// # Safety
/// As C `reallocarray`.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: as realloc.
        Some(total) => unsafe { realloc(p, total) },
        None => {
            set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

fn aligned(align: usize, size: usize) -> *mut c_void {
    if active() {
        far_alloc(size, align)
    } else {
        // SAFETY: forwarding to glibc.
        unsafe { __libc_memalign(align, size) }
    }
}

/// # Safety
/// `out` must be valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<usize>()) {
        return libc::EINVAL;
    }
    let p = aligned(align, size);
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: the caller's contract.
    unsafe { *out = p };
    0
}

#[no_mangle]
pub extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    aligned(align, size)
}

#[no_mangle]
pub extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    // glibc rounds a non-power-of-two alignment up.
    aligned(align.max(1).next_power_of_two(), size)
}

#[no_mangle]
pub extern "C" fn valloc(size: usize) -> *mut c_void {
    aligned(PAGE_SIZE, size)
}

#[no_mangle]
pub extern "C" fn pvalloc(size: usize) -> *mut c_void {
    aligned(PAGE_SIZE, vspace::page_round(size.max(1)))
}

#[no_mangle]
pub extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    if p.is_null() {
        return 0;
    }
    usable_size(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Consecutive large blocks of one size start at different offsets into their rooms,
    /// through every colour before one repeats; aligned blocks keep their alignment.
    #[test]
    fn consecutive_large_blocks_get_every_colour() {
        let leads: std::collections::BTreeSet<usize> =
            (0..COLOURS).map(|_| colour_lead(16)).collect();
        assert_eq!(leads.len(), COLOURS);
        assert!(leads
            .iter()
            .all(|l| l % PAGE_SIZE == 0 && *l < COLOURS * PAGE_SIZE));
        assert_eq!(colour_lead(2 << 20), 0);
    }
}
