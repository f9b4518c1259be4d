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

use super::vspace::{self, Holds, Part};
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

/// Anonymous private memory placed wherever the kernel likes, not a stack nor huge pages:
/// what an allocator maps.
fn allocator_like(flags: c_int) -> bool {
    const NOT: c_int = libc::MAP_SHARED
        | libc::MAP_FIXED
        | libc::MAP_FIXED_NOREPLACE
        | libc::MAP_STACK
        | libc::MAP_GROWSDOWN
        | libc::MAP_HUGETLB;
    flags & libc::MAP_ANONYMOUS != 0 && flags & libc::MAP_PRIVATE != 0 && flags & NOT == 0
}

/// A mapping that belongs in far memory.
fn is_heap_like(len: usize, prot: c_int, flags: c_int) -> bool {
    len > 0 && allocator_like(flags) && prot == libc::PROT_READ | libc::PROT_WRITE
}

/// The smallest inaccessible mapping taken for a reservation: smaller ones are guard pages,
/// left to the kernel. V8 reserves each 256 KiB page of its heap with 508 KiB.
const MIN_RESERVATION: usize = 64 << 10;

/// An allocator's reservation of address space, committed later (`mprotect`, or a fixed
/// mapping over it): V8 and the JVM make their heaps so. Taken into far memory, or their
/// heaps would escape the budget (node at a 160 MiB budget held 592 MiB resident).
fn is_reservation(len: usize, prot: c_int, flags: c_int) -> bool {
    len >= MIN_RESERVATION && allocator_like(flags) && prot == libc::PROT_NONE
}

/// Whether a reservation's address hint asks for that place, not merely some place: one
/// at a multiple of 1 TiB (ZGC puts its heap's views at 4, 8 and 16 TiB and gives up when
/// it cannot have them; it maps them from shared memory, which is not far memory anyway).
/// Other hints are taken as suggestions, as the kernel may: V8 passes random ones, and the
/// JVM's collectors try addresses below 32 GiB for compressed pointers, then take any.
fn placed_by_design(hint: usize) -> bool {
    hint != 0 && hint.is_multiple_of(1 << 40)
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
    if active() && is_reservation(len, prot, flags) && !placed_by_design(addr as usize) {
        let got = vspace::SPACE
            .lock()
            .as_mut()
            .and_then(|s| s.reserve(vspace::page_round(len)));
        if let Some(a) = got {
            return a as *mut c_void;
        }
    }
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
    if fixed && vspace::overlaps(addr as usize, len) && active() {
        if let Some(r) = fixed_over_far(addr as usize, len, prot, flags) {
            return r;
        }
        if in_direct(addr as usize, len)
            && flags & libc::MAP_FIXED_NOREPLACE == 0
            && vspace::SPACE
                .lock()
                .as_mut()
                .is_some_and(|s| s.make_foreign(addr as usize, vspace::page_round(len)))
        {
            // Inside a reservation no far memory shares: the kernel's to map.
            return match mem::sys_mmap(addr as usize, len, prot, flags, fd, off) {
                Ok(a) => a as *mut c_void,
                Err(e) => fail(e),
            };
        }
        if let Some(r) = private_file_over_far(addr as usize, len, prot, flags, fd, off) {
            return r;
        }
        if let Some(r) = lent_to_kernel(addr as usize, len, prot, flags, fd, off) {
            return r;
        }
    }
    if fixed && vspace::overlaps(addr as usize, len) {
        // Replacing part of the far address space would pull pages from under the runtime.
        {
            static ONCE: AtomicBool = AtomicBool::new(false);
            warn_once(
                &ONCE,
                &format!(
                    "a fixed mapping over far memory was refused ({len} bytes at {:#x}, \
                     prot {prot:#x}, flags {flags:#x}, fd {fd}): only anonymous private \
                     mappings can replace far memory",
                    addr as usize
                ),
            );
        }
        return fail(libc::ENOMEM);
    }
    match mem::sys_mmap(addr as usize, len, prot, flags, fd, off) {
        Ok(a) => a as *mut c_void,
        Err(e) => fail(e),
    }
}

/// The largest private file mapping copied into far memory (see `private_file_over_far`).
const MAX_FILE_COPY: usize = 64 << 20;

/// A private file mapping at a fixed address in far memory (the JVM maps its archived heap
/// objects over heap it committed): a private mapping's pages are copies of the file, and
/// whether later changes to the file show through is unspecified (POSIX), so a copy read
/// into fresh far memory is such a mapping. Up to [`MAX_FILE_COPY`] bytes; None: not one.
fn private_file_over_far(
    a: usize,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> Option<*mut c_void> {
    if flags & libc::MAP_PRIVATE == 0
        || flags & (libc::MAP_ANONYMOUS | libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE) != 0
        || len > MAX_FILE_COPY
        || !in_direct(a, len)
    {
        return None;
    }
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED;
    match fixed_over_far(a, len, rw, anon) {
        Some(r) if r == a as *mut c_void => {}
        other => return other,
    }
    let mut done = 0;
    while done < len {
        // SAFETY: `[a, a+len)` is ours, readable and writable; the kernel fills it through
        // the fault path like any read into far memory.
        let n = unsafe {
            libc::pread(
                fd,
                (a + done) as *mut c_void,
                len - done,
                off + done as libc::off_t,
            )
        };
        match n {
            0 => break, // past the end of the file: zeros, as the rest of its last page
            n if n > 0 => done += n as usize,
            _ if super::errno() == libc::EINTR => {}
            _ => return Some(fail(super::errno())),
        }
    }
    let r = vspace::SPACE.lock().as_ref().map_or(Ok(()), |s| {
        s.set_protection(a, vspace::page_round(len), prot)
    });
    Some(match r {
        Ok(()) => a as *mut c_void,
        Err(e) => fail(e),
    })
}

/// Any other mapping at a fixed address in the direct part (a file, shared memory: a ring
/// buffer's two views of one memfd, a code heap's writable and executable views): the
/// range is lent to the kernel, which maps it (`Space::lend`). None: not in the direct part,
/// or a chunk it touches is foreign.
fn lent_to_kernel(
    a: usize,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> Option<*mut c_void> {
    if !in_direct(a, len) || flags & libc::MAP_FIXED_NOREPLACE != 0 {
        return None;
    }
    let l = vspace::page_round(len);
    let mut space = vspace::SPACE.lock();
    let s = space.as_mut()?;
    if s.pieces(a, l).iter().any(|p| p.2 == Holds::Foreign) {
        return None;
    }
    if let Err(e) = s.lend(a, l) {
        tracing::error!("{e}");
        return Some(fail(libc::ENOMEM));
    }
    Some(match mem::sys_mmap(a, len, prot, flags, fd, off) {
        Ok(r) => r as *mut c_void,
        Err(e) => {
            // The old contents are gone either way; the range is a reservation again.
            if let Err(m) = s.take_back_lent(a, l) {
                tracing::error!("{m}");
            }
            fail(e)
        }
    })
}

/// Whether `[a, a+len)` is page-aligned and inside the direct part of the far space.
fn in_direct(a: usize, len: usize) -> bool {
    let (_, direct, end) = vspace::bounds();
    a.is_multiple_of(PAGE_SIZE) && a >= direct && a.saturating_add(len) <= end
}

/// A fixed anonymous private mapping inside the direct part: a fresh mapping replacing what
/// was there, as allocators commit (the JVM: readable and writable) and decommit (V8 and
/// the JVM: `PROT_NONE`) parts of their reservations. The range's contents are discarded
/// and its protection set; it stays far memory. None: not such a mapping.
fn fixed_over_far(a: usize, len: usize, prot: c_int, flags: c_int) -> Option<*mut c_void> {
    let anon_private = flags & libc::MAP_ANONYMOUS != 0
        && flags & libc::MAP_PRIVATE != 0
        && flags & (libc::MAP_SHARED | libc::MAP_HUGETLB | libc::MAP_GROWSDOWN) == 0;
    if !anon_private || !in_direct(a, len) {
        return None;
    }
    if flags & libc::MAP_FIXED_NOREPLACE != 0 {
        return Some(fail(libc::EEXIST));
    }
    let len = vspace::page_round(len);
    // Fresh memory reads as zeros: the old contents go first (nothing to drop for the
    // runtime where the range is ordinary memory, in foreign chunks).
    vspace::discard(vspace::runtime().as_ref(), a, len);
    let mut space = vspace::SPACE.lock();
    let s = space.as_mut()?;
    if s.pieces(a, len).iter().any(|p| p.2 == Holds::Foreign) {
        return None; // ordinary memory there: the kernel's (see `make_foreign`)
    }
    // Lent to the kernel before (a shared mapping replaced by an anonymous one): far
    // memory again.
    if let Err(e) = s.take_back_lent(a, len) {
        tracing::error!("{e}");
        return Some(fail(libc::ENOMEM));
    }
    if prot != libc::PROT_NONE {
        if let Err(e) = s.ensure_usable(a, len) {
            tracing::error!("{e}");
            return Some(fail(libc::ENOMEM));
        }
    }
    s.note_allocated(a, len, prot != libc::PROT_NONE);
    Some(match s.set_protection(a, len, prot) {
        Ok(()) => a as *mut c_void,
        Err(e) => fail(e),
    })
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

/// Apply `op` (the system call itself) to the parts of `[a, a+len)` (page-rounded) outside
/// the far space; returns the part inside it, `(start, len)`.
fn outside_then_inside(
    a: usize,
    len: usize,
    op: impl Fn(usize, usize) -> Result<usize, i32>,
) -> Result<(usize, usize), i32> {
    let [lo, mid, hi] = split(a, vspace::page_round(len));
    for (s, l) in [lo, hi] {
        if l > 0 {
            op(s, l)?;
        }
    }
    Ok(mid)
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
    let mid = match outside_then_inside(a, len, |s, l| {
        // SAFETY: the caller's own mapping.
        unsafe { mem::sys_munmap(s, l) }
    }) {
        Ok(mid) => mid,
        Err(e) => return rc(Err(e)),
    };
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
            let pieces = vspace::SPACE
                .lock()
                .as_ref()
                .map(|sp| sp.pieces(s, m_end - s))
                .unwrap_or_default();
            for (p, l, holds) in pieces {
                // Lent ranges are taken back by the release (`far_unmap`).
                if holds == Holds::Foreign {
                    // The kernel's mapping goes; the reservation stays, never handed out.
                    let flags = libc::MAP_PRIVATE
                        | libc::MAP_ANONYMOUS
                        | libc::MAP_NORESERVE
                        | libc::MAP_FIXED;
                    if let Err(e) = mem::sys_mmap(p, l, libc::PROT_NONE, flags, -1, 0) {
                        return rc(Err(e));
                    }
                } else {
                    far_unmap(p, l);
                }
            }
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
    if !kernels_pieces(a, old_len).is_empty() {
        // The kernel's mapping in far address space (a file, shared memory): moving or
        // growing it there is not supported.
        static ONCE: AtomicBool = AtomicBool::new(false);
        warn_once(
            &ONCE,
            "mremap of a file or shared mapping inside far memory was refused",
        );
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
    let mid = match outside_then_inside(a, len, |s, l| {
        // SAFETY: advice on the caller's own mapping.
        unsafe { mem::sys_madvise(s, l, advice) }
    }) {
        Ok(mid) => mid,
        Err(e) => return rc(Err(e)),
    };
    // The kernel's mappings there (see `make_foreign`, `Space::lend`) take the advice
    // themselves; the runtime's discards below are no-ops for their pages.
    for (p, l) in kernels_pieces(mid.0, mid.1) {
        // SAFETY: advice on the caller's own mapping.
        if let Err(e) = unsafe { mem::sys_madvise(p, l, advice) } {
            return rc(Err(e));
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
    if !vspace::overlaps(a, len) || !a.is_multiple_of(PAGE_SIZE) || !active() {
        // SAFETY: the caller's own mapping.
        return rc(unsafe { mem::sys_mprotect(a, len, prot) });
    }
    let mid = match outside_then_inside(a, len, |s, l| {
        // SAFETY: the caller's own mapping.
        unsafe { mem::sys_mprotect(s, l, prot) }
    }) {
        Ok(mid) => mid,
        Err(e) => return rc(Err(e)),
    };
    if mid.1 == 0 {
        return 0;
    }
    let (_, direct, _) = vspace::bounds();
    let mut space = vspace::SPACE.lock();
    let Some(s) = space.as_mut() else {
        // SAFETY: the caller's own mapping.
        return rc(unsafe { mem::sys_mprotect(mid.0, mid.1, prot) });
    };
    let pieces = if mid.0 >= direct {
        s.pieces(mid.0, mid.1)
    } else {
        vec![(mid.0, mid.1, Holds::Far)]
    };
    for (p, l, holds) in pieces {
        let r = if holds.kernels() {
            // SAFETY: the kernel's mapping, the caller's (see `make_foreign`, `Space::lend`).
            unsafe { mem::sys_mprotect(p, l, prot) }.map(|_| ())
        } else {
            if p >= direct && prot != libc::PROT_NONE {
                // A reservation committed: its chunks become far memory now.
                if let Err(e) = s.ensure_usable(p, l) {
                    tracing::error!("{e}");
                    return rc(Err(libc::ENOMEM));
                }
                s.note_allocated(p, l, true);
            }
            // Through the runtime: pages the program cannot read must not be evicted.
            s.set_protection(p, l, prot)
        };
        if let Err(e) = r {
            return rc(Err(e));
        }
    }
    0
}

/// The pieces of `[a, a+len)` that are the kernel's mappings in the direct part (foreign
/// chunks, lent ranges).
fn kernels_pieces(a: usize, len: usize) -> Vec<(usize, usize)> {
    let (_, direct, _) = vspace::bounds();
    let (s, l) = (a.max(direct), (a + len).saturating_sub(a.max(direct)));
    if l == 0 {
        return Vec::new();
    }
    vspace::SPACE.lock().as_ref().map_or_else(Vec::new, |sp| {
        sp.pieces(s, l)
            .into_iter()
            .filter(|p| p.2.kernels())
            .map(|(p, l, _)| (p, l))
            .collect()
    })
}
