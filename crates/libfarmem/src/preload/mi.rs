//! mimalloc, pointed at far memory.
//!
//! mimalloc (a proven allocator for small objects: thread-local free lists, no global lock)
//! gets one arena, the mimalloc part of the reservation, handed over uncommitted. Before it
//! uses a range it calls [`commit`], which turns the chunks of the range into far-memory
//! regions; when it purges free memory it calls [`commit`] with `commit == false`, which
//! discards those pages (local and far copies). It may not take memory from the OS for
//! blocks (`mi_setup.c`), so every block it hands out is far memory.

use std::ffi::c_void;

use parking_lot::Mutex;

use super::vspace;

extern "C" {
    fn fm_mi_configure();
    fn fm_mi_add_arena(
        start: *mut c_void,
        size: usize,
        commit: extern "C" fn(bool, *mut c_void, usize, *mut bool, *mut c_void) -> bool,
    ) -> i32;
}

/// Arenas are added as mimalloc fills them: 1, 2, 4, then 8 GiB at a time (mimalloc keeps
/// 2.3 MiB of bookkeeping per GiB of arena, committed up front).
const FIRST_ARENA: usize = 1 << 30;
const MAX_ARENA: usize = 8 << 30;

/// `(next arena start, end of mimalloc's part, size of the last arena)`.
static ARENAS: Mutex<(usize, usize, usize)> = Mutex::new((0, 0, 0));

pub use libmimalloc_sys::{
    mi_calloc, mi_free, mi_malloc, mi_malloc_aligned, mi_realloc, mi_usable_size,
};

pub fn init(base: usize, len: usize) -> Result<(), String> {
    // SAFETY: sets mimalloc options; no memory is involved.
    unsafe { fm_mi_configure() };
    *ARENAS.lock() = (base, base + len, 0);
    prefill_bookkeeping(base);
    if !add_arena() {
        return Err("mimalloc refused the far-memory arena".into());
    }
    Ok(())
}

/// The part of the first arena's bookkeeping (at its start) that mimalloc writes while it
/// sets the arena up: its bitmaps, written in order in 6 faults of 16 pages (`farmem trace`
/// of `/bin/true`: `mi_bitmap_init`, `mi_arena_initialize`).
const BOOKKEEPING_WRITTEN: usize = 96 * farmem_runtime::PAGE_SIZE;

/// Make that part present (zeros) with one hint from this thread before mimalloc writes it:
/// each of those faults was a round trip to the fault thread, just started and asleep, in
/// every process's start (the start of an executed `/bin/true`: 1.3 ms, mimalloc's set-up
/// 580 us of it).
fn prefill_bookkeeping(base: usize) {
    if usable(base, BOOKKEEPING_WRITTEN).is_ok() {
        farmem_runtime::hint_ex(
            base as *const u8,
            BOOKKEEPING_WRITTEN,
            farmem_runtime::FM_WRITE,
            0,
            0,
        );
    }
}

/// Make `[a, a+len)` of the arena far memory the program may use (idempotent per chunk).
fn usable(a: usize, len: usize) -> Result<(), String> {
    match vspace::SPACE.lock().as_mut() {
        Some(s) => s.ensure_usable(a, len),
        None => Err("no address space reserved".into()),
    }
}

/// Give mimalloc one more arena (after an allocation failed). False when the part of the
/// address space for mimalloc is used up.
pub fn add_arena() -> bool {
    let mut a = ARENAS.lock();
    let (next, end, last) = *a;
    let size = if last == 0 {
        FIRST_ARENA
    } else {
        (last * 2).min(MAX_ARENA)
    };
    if next + size > end {
        return false;
    }
    // SAFETY: the range is our reservation, handed to mimalloc for good; `commit` is a plain
    // function that never unwinds.
    let rc = super::in_allocator(|| unsafe { fm_mi_add_arena(next as *mut c_void, size, commit) });
    if rc != 0 {
        return false;
    }
    *a = (next + size, end, size);
    true
}

/// mimalloc's commit callback (`mi_commit_fun_t`).
extern "C" fn commit(
    commit: bool,
    start: *mut c_void,
    size: usize,
    _is_zero: *mut bool,
    _arg: *mut c_void,
) -> bool {
    let r = std::panic::catch_unwind(|| {
        let a = start as usize;
        if commit {
            usable(a, size)
                .map_err(|e| eprintln!("farmem: mimalloc arena: {e}"))
                .is_ok()
        } else {
            // Purge: drop the pages. mimalloc commits again before reusing them, which is a
            // no-op for chunks already registered. (`_is_zero` is left as mimalloc set it:
            // a committed range may include pages that still hold data.)
            let rt = vspace::runtime();
            vspace::discard(rt.as_ref(), a, size);
            true
        }
    });
    r.unwrap_or_else(|_| {
        farmem_sys::process::fatal("internal error (panic) in the mimalloc commit callback")
    })
}
