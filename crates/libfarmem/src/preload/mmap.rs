//! Anonymous private mappings of the transparent mode: `mmap`, `munmap`, `mremap`,
//! `madvise`, `mprotect`.
//!
//! A readable and writable private anonymous mapping at an address of the kernel's choosing
//! is what allocators ask for, and it is served from the direct part of the far address
//! space. Everything else (files, shared memory, stacks, huge pages, fixed addresses,
//! `PROT_NONE` reservations) goes to the kernel unchanged. Calls on ranges of the far
//! address space act on far memory: `munmap` and `MADV_DONTNEED`/`MADV_FREE` discard,
//! `MADV_WILLNEED` fetches, `mremap` resizes or moves within it.

use std::ffi::{c_int, c_void};
use std::sync::atomic::AtomicBool;

use super::vspace::{self, Part};
use super::{active, set_errno};
use farmem_sys::mem::{self, PAGE_SIZE};

const FAILED: *mut c_void = !0usize as *mut c_void;

fn fail(e: i32) -> *mut c_void {
    set_errno(e);
    FAILED
}

fn rc(r: Result<usize, i32>) -> c_int {
    match r {
        Ok(_) => 0,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// Print `what` once per process (each call site has its own flag, so one warning does not
/// silence another).
fn warn_once(flag: &std::sync::atomic::AtomicBool, what: &str) {
    if !flag.swap(true, std::sync::atomic::Ordering::Relaxed) {
        eprintln!("farmem: warning: {what}");
    }
}

/// A mapping that belongs in far memory.
fn is_heap_like(len: usize, prot: c_int, flags: c_int) -> bool {
    const NOT: c_int = libc::MAP_SHARED
        | libc::MAP_FIXED
        | libc::MAP_FIXED_NOREPLACE
        | libc::MAP_STACK
        | libc::MAP_GROWSDOWN
        | libc::MAP_HUGETLB;
    len > 0
        && flags & libc::MAP_ANONYMOUS != 0
        && flags & libc::MAP_PRIVATE != 0
        && flags & NOT == 0
        && prot == libc::PROT_READ | libc::PROT_WRITE
}

/// Hand out a fresh (all-zero) range of the direct part.
fn far_map(len: usize) -> Option<usize> {
    let len = vspace::page_round(len);
    vspace::SPACE.lock().as_mut()?.alloc(len, PAGE_SIZE)
}

/// Discard and give back `[a, a+len)` of the direct part.
fn far_unmap(a: usize, len: usize) {
    let rt = vspace::runtime();
    vspace::discard(rt.as_ref(), a, len);
    if let Some(s) = vspace::SPACE.lock().as_mut() {
        s.release(a, len);
    }
}

/// # Safety
/// As C `mmap`.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    if active() && is_heap_like(len, prot, flags) {
        if let Some(a) = far_map(len) {
            return a as *mut c_void;
        }
        // Out of far address space: an ordinary mapping is better than a failure.
        {
            static ONCE: AtomicBool = AtomicBool::new(false);
            warn_once(
                &ONCE,
                "far address space exhausted; new mappings are ordinary memory",
            );
        }
    }
    let fixed = flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) != 0;
    if fixed && vspace::overlaps(addr as usize, len) {
        // Replacing part of the far address space would pull pages from under the runtime.
        {
            static ONCE: AtomicBool = AtomicBool::new(false);
            warn_once(&ONCE, "a fixed mapping over far memory was refused");
        }
        return fail(libc::ENOMEM);
    }
    match mem::sys_mmap(addr as usize, len, prot, flags, fd, off) {
        Ok(a) => a as *mut c_void,
        Err(e) => fail(e),
    }
}

/// # Safety
/// As C `mmap64` (the same as `mmap` on 64-bit).
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    // SAFETY: the same contract.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

/// Split `[a, a+len)` into the part before the reservation, inside it, and after it.
fn split(a: usize, len: usize) -> [(usize, usize); 3] {
    let (base, _, end) = vspace::bounds();
    let e = a.saturating_add(len);
    let lo = (a, e.min(base).saturating_sub(a));
    let mid_s = a.max(base);
    let mid = (mid_s, e.min(end).saturating_sub(mid_s));
    let hi_s = a.max(end);
    let hi = (hi_s, e.saturating_sub(hi_s));
    [lo, mid, hi]
}

/// # Safety
/// As C `munmap`.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    let a = addr as usize;
    if !a.is_multiple_of(PAGE_SIZE) || len == 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    if !vspace::overlaps(a, len) {
        // SAFETY: the caller's own mapping.
        return rc(unsafe { mem::sys_munmap(a, len) });
    }
    let [lo, mid, hi] = split(a, vspace::page_round(len));
    for (s, l) in [lo, hi] {
        if l > 0 {
            // SAFETY: the caller's own mapping.
            if let Err(e) = unsafe { mem::sys_munmap(s, l) } {
                return rc(Err(e));
            }
        }
    }
    if mid.1 > 0 {
        // The direct part is released; in the allocators' parts (which they never unmap
        // themselves) the pages are only discarded.
        let (_, heaps_end, _) = vspace::bounds();
        let m_end = mid.0 + mid.1;
        if mid.0 < heaps_end {
            let l = m_end.min(heaps_end) - mid.0;
            vspace::discard(vspace::runtime().as_ref(), mid.0, l);
        }
        if m_end > heaps_end {
            let s = mid.0.max(heaps_end);
            far_unmap(s, m_end - s);
        }
    }
    0
}

/// # Safety
/// As C `mremap` (the new address is read only with `MREMAP_FIXED`).
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let a = old as usize;
    if vspace::part_of(a) != Part::Direct {
        if flags & libc::MREMAP_FIXED != 0 && vspace::overlaps(new_addr as usize, new_len) {
            return fail(libc::EINVAL);
        }
        // SAFETY: the caller's own mapping.
        return match unsafe { mem::sys_mremap(a, old_len, new_len, flags, new_addr as usize) } {
            Ok(p) => p as *mut c_void,
            Err(e) => fail(e),
        };
    }
    if !a.is_multiple_of(PAGE_SIZE) || new_len == 0 || flags & !(libc::MREMAP_MAYMOVE) != 0 {
        // MREMAP_FIXED / MREMAP_DONTUNMAP into or out of far memory are not supported.
        return fail(libc::EINVAL);
    }
    let (old_l, new_l) = (vspace::page_round(old_len), vspace::page_round(new_len));
    if new_l <= old_l {
        if new_l < old_l {
            far_unmap(a + new_l, old_l - new_l);
        }
        return old;
    }
    if let Some(s) = vspace::SPACE.lock().as_mut() {
        if s.grow_in_place(a, old_l, new_l) {
            return old;
        }
    }
    if flags & libc::MREMAP_MAYMOVE == 0 {
        return fail(libc::ENOMEM);
    }
    let Some(n) = far_map(new_l) else {
        return fail(libc::ENOMEM);
    };
    // SAFETY: both ranges are ours and at least old_l bytes long; the copy faults in any
    // far pages of the old range through the normal path.
    unsafe { std::ptr::copy_nonoverlapping(a as *const u8, n as *mut u8, old_l) };
    far_unmap(a, old_l);
    n as *mut c_void
}

/// # Safety
/// As C `madvise`.
#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    let a = addr as usize;
    if !vspace::overlaps(a, len) || !a.is_multiple_of(PAGE_SIZE) {
        // SAFETY: advice on the caller's own mapping.
        return rc(unsafe { mem::sys_madvise(a, len, advice) });
    }
    let [lo, mid, hi] = split(a, vspace::page_round(len));
    for (s, l) in [lo, hi] {
        if l > 0 {
            // SAFETY: advice on the caller's own mapping.
            if let Err(e) = unsafe { mem::sys_madvise(s, l, advice) } {
                return rc(Err(e));
            }
        }
    }
    match advice {
        libc::MADV_DONTNEED | libc::MADV_FREE | libc::MADV_REMOVE => {
            vspace::discard(vspace::runtime().as_ref(), mid.0, mid.1);
        }
        libc::MADV_WILLNEED => {
            farmem_runtime::hint_slow(mid.0, mid.1, 0, 0, 0);
        }
        // Placement advice (huge pages, merging, dumping, fork behaviour, access
        // patterns) means nothing for pages the runtime moves itself.
        _ => {}
    }
    0
}

/// # Safety
/// As C `mprotect`.
#[no_mangle]
pub unsafe extern "C" fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    let a = addr as usize;
    if vspace::overlaps(a, len) && prot & libc::PROT_READ == 0 && active() {
        // The runtime copies dirty pages out by reading them: an unreadable page of far
        // memory could not be evicted. Allowed (it is the program's memory), but said.
        {
            static ONCE: AtomicBool = AtomicBool::new(false);
            warn_once(
                &ONCE,
                "mprotect without PROT_READ on far memory; such pages must not be dirty",
            );
        }
    }
    // SAFETY: the caller's own mapping.
    rc(unsafe { mem::sys_mprotect(a, len, prot) })
}
