//! Mid-size blocks (over 256 bytes, up to 32 KiB) in size classes finer than mimalloc's.
//!
//! Why: mimalloc has four size classes per doubling, so a block just past a class boundary
//! takes up to 25% more memory than asked. Under a budget that equals the program's native
//! peak that overhead is paged: CPython's `bytearray(1024)` (1,025 bytes) took 1,280, and
//! its 128 MiB build job a far heap of 141 MiB against 131 MiB for the whole process
//! natively (1.7x native at that budget, 1.0x with room); sqlite's page cache blocks (a
//! 4 KiB page and its header) took 5 KiB. glibc rounds to 16 bytes. From 256 bytes, not 512:
//! jq holding a 54 MB JSON document (600 K blocks each of 272-287 and 384-399 bytes, which
//! mimalloc rounds to 320 and 448) peaked at 597.5 MiB against 550.7 natively, 540.9 now, at
//! the same speed.
//!
//! Here classes are 16 bytes apart up to 2 KiB, then 64 per doubling (at most 1/64 more
//! than asked): sixteen per doubling still gave sqlite's 4,368-byte blocks 4,608 bytes, 3 MiB
//! of a 57 MiB heap. Each class fills slabs of [`SLAB`] bytes of its own part of the
//! reservation (`vspace`): blocks are laid end to end, handed out from a slab's free list or
//! else past its last block, so only pages that held a block ever become resident. A slab
//! whose blocks are all freed is discarded and goes back to a pool for any class: at once,
//! or, the class's current slab, once it has been idle a while ([`release`]).
//!
//! Locks: one per class, then the pool's, then `vspace::SPACE` (taken in that order, also
//! by the fork handlers); most calls take none, served by the thread's cache
//! (`fine_cache.rs`). A block's slab, class and size follow from its address alone.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};

use parking_lot::lock_api::RawMutex as _;
use parking_lot::Mutex;

use super::{fine_cache, vspace};

/// Blocks larger than this (and at most [`MAX`]) are served here.
pub const MIN: usize = 256;
pub const MAX: usize = 32 << 10;
/// Up to [`LINEAR_MAX`], classes 16 bytes apart (as glibc rounds); above, [`PER_DOUBLING`]
/// classes per doubling.
const LINEAR_MAX: usize = 2048;
const LINEAR: usize = (LINEAR_MAX - MIN) / 16;
const PER_DOUBLING: usize = 64;
/// The doublings from `LINEAR_MAX` to `MAX`: 4.
pub(super) const CLASSES: usize = LINEAR + 4 * PER_DOUBLING;
/// A slab: at least 8 blocks of the largest class.
pub const SLAB: usize = 256 << 10;
/// Address space of all slabs (virtual; only used slabs are registered).
pub const SPACE: usize = 64 << 30;
const SLABS: usize = SPACE / SLAB;

/// Start of the slabs' space (0 until `init`).
static BASE: AtomicUsize = AtomicUsize::new(0);

/// A slab's bookkeeping. `class` (class + 1, 0: in the pool) is written when the slab is
/// taken from the pool and read by `free` without a lock: a caller freeing a live block keeps
/// its slab from going back to the pool meanwhile. `state` belongs to the class's lock while
/// the slab is the class's, to the pool's lock while it is in the pool.
struct Slab {
    class: AtomicU16,
    state: UnsafeCell<SlabState>,
}

#[derive(Clone, Copy)]
struct SlabState {
    /// First free block (0: none); each free block holds the address of the next.
    free: usize,
    /// Blocks handed out past the last one ever used.
    used: u32,
    /// Blocks live.
    live: u32,
    /// Neighbours in the class's list of slabs with free blocks, or the pool's list (slab
    /// index + 1, 0: none).
    prev: u32,
    next: u32,
    /// In the class's list of slabs with free blocks.
    listed: bool,
}

const EMPTY: SlabState = SlabState {
    free: 0,
    used: 0,
    live: 0,
    prev: 0,
    next: 0,
    listed: false,
};

// SAFETY: `state` is only touched under the lock that owns the slab (see `Slab`).
unsafe impl Sync for Slab {}

static SLAB_TABLE: [Slab; SLABS] = [const {
    Slab {
        class: AtomicU16::new(0),
        state: UnsafeCell::new(EMPTY),
    }
}; SLABS];

/// A class's slabs: the one it fills, and those with free blocks (slab index + 1, 0: none).
#[derive(Clone, Copy)]
struct Class {
    current: u32,
    avail: u32,
    /// When the current slab's last block was freed ([`now_ns`]; 0: it has live
    /// blocks). Such a slab stays the class's, so that a program freeing and allocating
    /// one block at a time does not take a fresh slab (and fault its pages in) each time,
    /// until [`release`] finds it idle.
    idle_since: u64,
}

static CLASS_LOCKS: [Mutex<Class>; CLASSES] = [const {
    Mutex::new(Class {
        current: 0,
        avail: 0,
        idle_since: 0,
    })
}; CLASSES];

/// A current slab idle this long goes back to the pool (when the budget is short, at once).
/// sqlite's sorter buffers and other short-lived blocks left one such slab in each of ~30
/// classes, 5 MiB of a 62 MiB peak, each holding every page its blocks ever touched.
const IDLE_NS: u64 = 200_000_000;

/// Now, in ns (never 0: `idle_since` uses 0 for "not idle").
fn now_ns() -> u64 {
    farmem_runtime::fault_log::monotonic_ns() + 1
}

/// Slabs never used yet start at `fresh`; emptied ones wait in `empty` (a list).
struct Pool {
    fresh: u32,
    empty: u32,
}

static POOL: Mutex<Pool> = Mutex::new(Pool { fresh: 0, empty: 0 });

/// Set where the slabs live (part of the reservation, `SPACE` bytes, `SLAB`-aligned).
pub fn init(base: usize) {
    BASE.store(base, Ordering::Release);
}

/// The class of a block of `size` bytes (`MIN < size <= MAX`).
fn class_of(size: usize) -> usize {
    if size <= LINEAR_MAX {
        return (size - MIN).div_ceil(16) - 1;
    }
    // 2^(k-1) < size <= 2^k; the doubling's step is 2^(k-1) / PER_DOUBLING.
    let k = (usize::BITS - (size - 1).leading_zeros()) as usize;
    let j = (size - (1usize << (k - 1))).div_ceil(1usize << (k - 7)); // 1..=64
    LINEAR + (k - 12) * PER_DOUBLING + j - 1
}

/// The size of the blocks of class `c`.
pub(super) fn class_size(c: usize) -> usize {
    if c < LINEAR {
        return MIN + (c + 1) * 16;
    }
    let k = (c - LINEAR) / PER_DOUBLING + 12;
    (1usize << (k - 1)) + ((c - LINEAR) % PER_DOUBLING + 1) * (1usize << (k - 7))
}

fn slab_addr(s: usize) -> usize {
    BASE.load(Ordering::Relaxed) + s * SLAB
}

/// # Safety
/// The caller holds the lock that owns slab `s` (see [`Slab`]).
#[allow(clippy::mut_from_ref)]
unsafe fn state(s: usize) -> &'static mut SlabState {
    // SAFETY: the caller's lock makes this the only reference.
    unsafe { &mut *SLAB_TABLE[s].state.get() }
}

/// A slab for class `c` from the pool (made usable on first use); `None` when the space is
/// exhausted or cannot be made usable.
fn take_slab(c: usize) -> Option<usize> {
    let mut pool = POOL.lock();
    let s = if pool.empty != 0 {
        let s = pool.empty as usize - 1;
        // SAFETY: pooled slabs belong to the pool's lock, held.
        pool.empty = unsafe { state(s) }.next;
        s
    } else {
        let s = pool.fresh as usize;
        if s >= SLABS {
            return None;
        }
        let mut space = vspace::SPACE.lock();
        space.as_mut()?.ensure_usable(slab_addr(s), SLAB).ok()?;
        pool.fresh += 1;
        s
    };
    // SAFETY: the slab is the pool's (lock held) until its class is set below.
    unsafe { *state(s) = EMPTY };
    SLAB_TABLE[s].class.store(c as u16 + 1, Ordering::Release);
    Some(s)
}

/// Give an emptied slab back: discarded (its pages read as zeros again), then pooled.
fn give_back(s: usize) {
    SLAB_TABLE[s].class.store(0, Ordering::Release);
    vspace::discard(vspace::runtime().as_ref(), slab_addr(s), SLAB);
    let mut pool = POOL.lock();
    // SAFETY: the slab belongs to the pool's lock now, held.
    let st = unsafe { state(s) };
    *st = EMPTY;
    st.next = pool.empty;
    pool.empty = s as u32 + 1;
}

/// A block of at least `size` bytes (`MIN < size <= MAX`), 16-byte aligned; null when the
/// space is exhausted (the caller falls back to mimalloc). From the thread's cache when it
/// has one of the class (`fine_cache.rs`), else from the class's slabs, with a few more for
/// the cache under the same lock.
pub fn alloc(size: usize) -> *mut u8 {
    let c = class_of(size);
    if let Some(p) = fine_cache::take(c) {
        return p as *mut u8;
    }
    // The slabs' side may take address space and register it: the runtime's memory.
    super::in_allocator(|| {
        let mut got = [0usize; fine_cache::REFILL];
        let n = alloc_locked(c, &mut got[..fine_cache::refill_count(c)]);
        if n == 0 {
            return std::ptr::null_mut();
        }
        fine_cache::keep(c, &got[1..n]);
        got[0] as *mut u8
    })
}

/// Up to `out.len()` blocks of class `c` under one taking of its lock: the first wherever
/// there is one, the others only from free lists; how many (0 when the space is exhausted).
fn alloc_locked(c: usize, out: &mut [usize]) -> usize {
    let cs = class_size(c);
    let per_slab = (SLAB / cs) as u32;
    let mut class = CLASS_LOCKS[c].lock();
    let mut n = 0;
    while n < out.len() {
        if class.current == 0 {
            if class.avail != 0 {
                let s = class.avail as usize - 1;
                // SAFETY: the slab is class `c`'s; its lock is held.
                let st = unsafe { state(s) };
                class.avail = st.next;
                if st.next != 0 {
                    // SAFETY: as above, for the next slab of the list.
                    unsafe { state(st.next as usize - 1) }.prev = 0;
                }
                st.listed = false;
                class.current = s as u32 + 1;
            } else if n > 0 {
                break; // no fresh slab for the cache alone
            } else {
                match take_slab(c) {
                    Some(s) => class.current = s as u32 + 1,
                    None => return 0,
                }
            }
        }
        let s = class.current as usize - 1;
        // SAFETY: the slab is class `c`'s; its lock is held.
        let st = unsafe { state(s) };
        if st.free != 0 {
            let p = st.free;
            // SAFETY: a free block of this slab holds the address of the next free one.
            st.free = unsafe { *(p as *const usize) };
            st.live += 1;
            class.idle_since = 0;
            out[n] = p;
            n += 1;
        } else if n > 0 {
            // Only freed blocks go to the cache: a block never used yet would be touched (its
            // link written) for nothing, and the fresh memory around it zero-filled.
            break;
        } else if st.used < per_slab {
            out[n] = slab_addr(s) + st.used as usize * cs;
            st.used += 1;
            st.live += 1;
            class.idle_since = 0;
            n += 1;
        } else {
            class.current = 0; // full: the next free block makes it available again
        }
    }
    n
}

/// The slab and class of block `p`, checked: a pointer that is not the start of a live
/// class block stops the program (as glibc does for an invalid `free`).
fn locate(p: usize) -> (usize, usize) {
    let off = p - BASE.load(Ordering::Relaxed);
    let s = off / SLAB;
    let c = SLAB_TABLE[s].class.load(Ordering::Acquire) as usize;
    if c == 0 || !(off % SLAB).is_multiple_of(class_size(c - 1)) {
        farmem_sys::process::fatal(&format!("free({p:#x}): not a block returned by malloc"));
    }
    (s, c - 1)
}

/// The usable size of block `p`.
pub fn usable_size(p: usize) -> usize {
    class_size(locate(p).1)
}

/// Free block `p`: into the thread's cache if it has room for the class, else back to the
/// slabs with half of what the cache holds of the class, under one taking of the lock.
pub fn free(p: usize) {
    let (_, c) = locate(p);
    if fine_cache::put(c, p) {
        return;
    }
    let mut blocks = [0usize; fine_cache::REFILL + 1];
    let n = fine_cache::spill(c, &mut blocks[1..]);
    blocks[0] = p;
    // Emptied slabs are discarded: the runtime's work.
    super::in_allocator(|| free_locked(c, &blocks[..n + 1]));
}

/// Give `blocks` (of class `c`, no longer used by the program) back to their slabs under
/// one taking of the class's lock (at most [`fine_cache::MAX_BATCH`]); slabs they empty go
/// back to the pool after it.
pub(super) fn free_locked(c: usize, blocks: &[usize]) {
    assert!(blocks.len() <= fine_cache::MAX_BATCH);
    let mut emptied = [0usize; fine_cache::MAX_BATCH];
    let mut n_emptied = 0;
    let mut class = CLASS_LOCKS[c].lock();
    for &p in blocks {
        let s = (p - BASE.load(Ordering::Relaxed)) / SLAB;
        // SAFETY: the slab is class `c`'s; its lock is held.
        let st = unsafe { state(s) };
        // SAFETY: `p` is a block of this slab, no longer used by the program.
        unsafe { *(p as *mut usize) = st.free };
        st.free = p;
        st.live -= 1;
        let current = class.current == s as u32 + 1;
        if st.live == 0 && current {
            class.idle_since = now_ns();
        } else if st.live == 0 {
            if st.listed {
                unlink(&mut class, s);
            }
            // Out of every list: nothing reaches it until it is given back below.
            emptied[n_emptied] = s;
            n_emptied += 1;
        } else if !st.listed && !current {
            st.listed = true;
            st.prev = 0;
            st.next = class.avail;
            if class.avail != 0 {
                // SAFETY: the slab at the head is class `c`'s; its lock is held.
                unsafe { state(class.avail as usize - 1) }.prev = s as u32 + 1;
            }
            class.avail = s as u32 + 1;
        }
    }
    drop(class);
    for &s in &emptied[..n_emptied] {
        give_back(s);
    }
}

/// Give back the current slabs that have been idle for [`IDLE_NS`] (`short`: the budget is
/// short, any idle one). Called by the runtime's control thread; skips a class whose lock
/// is taken rather than wait.
pub fn release(short: bool) {
    let now = now_ns();
    for l in &CLASS_LOCKS {
        let Some(mut class) = l.try_lock() else {
            continue;
        };
        let idle = class.idle_since;
        if class.current == 0 || idle == 0 || (!short && now.saturating_sub(idle) < IDLE_NS) {
            continue;
        }
        let s = class.current as usize - 1;
        class.current = 0;
        class.idle_since = 0;
        drop(class);
        // No block of the slab is live (`idle_since`), and no longer the class's current
        // slab, nothing can reach it.
        give_back(s);
    }
}

/// Take slab `s` out of its class's list of slabs with free blocks (class lock held).
fn unlink(class: &mut Class, s: usize) {
    // SAFETY: the slab and its neighbours are the class's; the caller holds its lock.
    let st = unsafe { state(s) };
    if st.prev != 0 {
        // SAFETY: as above.
        unsafe { state(st.prev as usize - 1) }.next = st.next;
    } else {
        class.avail = st.next;
    }
    if st.next != 0 {
        // SAFETY: as above.
        unsafe { state(st.next as usize - 1) }.prev = st.prev;
    }
    st.listed = false;
}

/// Before `fork()`: every lock, in order, so that the child finds none held.
pub fn lock_all() {
    for l in &CLASS_LOCKS {
        // SAFETY: taking the raw lock without a guard; `unlock_all` releases it on this thread.
        unsafe { l.raw() }.lock();
    }
    // SAFETY: as above.
    unsafe { POOL.raw() }.lock();
}

/// After `fork()`, in the parent and in the child.
pub fn unlock_all() {
    // SAFETY: taken by `lock_all` on this thread.
    unsafe {
        POOL.raw().unlock();
        for l in &CLASS_LOCKS {
            l.raw().unlock();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_waste_under_16_bytes_up_to_2_kib_and_under_a_64th_above() {
        assert_eq!(class_of(MIN + 1), 0);
        assert_eq!(class_size(0), MIN + 16);
        assert_eq!(class_of(MAX), CLASSES - 1);
        assert_eq!(class_size(CLASSES - 1), MAX);
        assert_eq!(class_size(class_of(1025)), 1040);
        assert_eq!(class_size(class_of(2049)), 2080);
        assert_eq!(class_size(class_of(4368)), 4416);
        for size in MIN + 1..=MAX {
            let c = class_of(size);
            let cs = class_size(c);
            assert!(cs >= size && cs.is_multiple_of(16), "{size} -> {cs}");
            assert!(
                size <= LINEAR_MAX || (cs - size) * 64 < size,
                "{size} -> {cs}"
            );
            assert!(size > LINEAR_MAX || cs - size < 16, "{size} -> {cs}");
            assert!(
                c == 0 || class_size(c - 1) < size,
                "{size}: a smaller class fits"
            );
            assert!(SLAB / cs >= 8);
        }
    }
}
