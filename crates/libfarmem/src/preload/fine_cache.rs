//! A thread's cache of free blocks of the fine classes (`fine.rs`), taken and given back
//! without the class's lock, as glibc's tcache does for its bins.
//!
//! Why: with every `malloc` and `free` under the class's lock, two threads allocating and
//! freeing blocks of the same classes (600-1,000 bytes) took 230 ns a pair against 25 ns
//! natively: the lock's cache line moved between the CPUs at every call; one thread took 46
//! ns against 23. With the cache: 38-42 and 30 ns. (Blocks of 260-500 bytes, which mimalloc
//! served before the fine classes began at 256 bytes: 26-27 and 24 ns there, 37-40 and
//! 29-32 now.)
//!
//! A cached block stays counted live in its slab, so a slab whose blocks sit in caches is not
//! given back. That is why a cache is small: [`CLASS_BYTES`] of a class (at most
//! [`MAX_PER_CLASS`] blocks), only classes up to [`MAX_CACHED`] bytes, and [`MAX_BYTES`] in
//! all; and why only freed blocks are cached (`fine::alloc_locked`). A thread flushes its
//! cache when it ends. In a child made by `fork`, the caches of the parent's other threads
//! are never flushed: they hold at most [`MAX_BYTES`] each.

use std::cell::UnsafeCell;

use super::fine::{class_size, free_locked, CLASSES};

/// Blocks of one class a thread keeps: [`CLASS_BYTES`] of them, at most [`MAX_PER_CLASS`];
/// none of classes over [`MAX_CACHED`] bytes (a program's few large buffers, freed and
/// cached, would keep their slabs from going back, and their calls are rarer).
const MAX_PER_CLASS: usize = 16;
const CLASS_BYTES: usize = 16 << 10;
const MAX_CACHED: usize = 4 << 10;
/// Bytes a thread keeps in all classes.
const MAX_BYTES: usize = 256 << 10;
/// Most blocks moved between the cache and the slabs under one taking of a class's lock
/// while the thread runs (half a class's cache: a thread that frees and allocates blocks
/// of a class in turn takes the lock once every so many calls).
pub(super) const REFILL: usize = MAX_PER_CLASS / 2;
/// Most blocks given back at once (a whole class's cache, at the thread's end).
pub(super) const MAX_BATCH: usize = MAX_PER_CLASS + 1;

/// How many blocks of class `c` a thread keeps.
fn cap(c: usize) -> usize {
    let cs = class_size(c);
    if cs > MAX_CACHED {
        0
    } else {
        (CLASS_BYTES / cs).min(MAX_PER_CLASS)
    }
}

struct Cache {
    /// Each class's free blocks, a list through their first word (0: none).
    head: [usize; CLASSES],
    count: [u8; CLASSES],
    bytes: usize,
    /// The flush at the thread's end is registered (`FLUSH`).
    flush_registered: bool,
    /// The thread is ending and its cache was flushed: later frees go to the slabs.
    off: bool,
}

thread_local! {
    static CACHE: UnsafeCell<Cache> = const {
        UnsafeCell::new(Cache {
            head: [0; CLASSES],
            count: [0; CLASSES],
            bytes: 0,
            flush_registered: false,
            off: false,
        })
    };
    static FLUSH: FlushAtExit = const { FlushAtExit };
}

/// Flushes the thread's cache when the thread ends (its destructor).
struct FlushAtExit;

impl Drop for FlushAtExit {
    fn drop(&mut self) {
        // Giving a slab back reaches the runtime, whose thread-locals may already be gone
        // this late in the thread's end: a panic then leaves the rest cached, never unwinds
        // out of a destructor.
        let _ = std::panic::catch_unwind(flush_all);
    }
}

/// Give every cached block back and cache no more (the thread is ending).
fn flush_all() {
    for c in 0..CLASSES {
        let mut blocks = [0usize; MAX_PER_CLASS];
        let n = with(|k| {
            k.off = true;
            drain(k, c, &mut blocks)
        });
        if n > 0 {
            // Emptied slabs are discarded: the runtime's work.
            super::in_allocator(|| free_locked(c, &blocks[..n]));
        }
    }
}

/// Run `f` on this thread's cache. `f` must not allocate or free (that would reach the cache
/// again).
fn with<R>(f: impl FnOnce(&mut Cache) -> R) -> R {
    // SAFETY: the cache is this thread's alone and `f` does not reenter it (above), so this
    // is the only reference to it while `f` runs.
    CACHE.with(|k| f(unsafe { &mut *k.get() }))
}

/// Take up to `out.len()` blocks of class `c` off the cache; how many.
fn drain(k: &mut Cache, c: usize, out: &mut [usize]) -> usize {
    let mut n = 0;
    while n < out.len() && k.head[c] != 0 {
        let p = k.head[c];
        // SAFETY: a cached block is free and holds the address of the next one.
        k.head[c] = unsafe { *(p as *const usize) };
        k.count[c] -= 1;
        k.bytes -= class_size(c);
        out[n] = p;
        n += 1;
    }
    n
}

/// A cached block of class `c`, if the thread has one.
pub(super) fn take(c: usize) -> Option<usize> {
    let mut one = [0usize];
    (with(|k| drain(k, c, &mut one)) == 1).then_some(one[0])
}

/// How many blocks of class `c` an allocation takes from the slabs at once: the one asked
/// for, and half as many as the cache keeps of the class.
pub(super) fn refill_count(c: usize) -> usize {
    (cap(c) / 2).clamp(1, REFILL)
}

/// Keep free `blocks` of class `c` (taken from the slabs for this thread); those that do
/// not fit go back.
pub(super) fn keep(c: usize, blocks: &[usize]) {
    let mut back = [0usize; REFILL];
    let mut n_back = 0;
    for &p in blocks {
        if !put(c, p) {
            back[n_back] = p;
            n_back += 1;
        }
    }
    if n_back > 0 {
        free_locked(c, &back[..n_back]);
    }
}

/// Cache free block `p` of class `c`; false when the cache has no room for it.
pub(super) fn put(c: usize, p: usize) -> bool {
    let cs = class_size(c);
    let registered = with(|k| {
        if k.off || k.count[c] as usize >= cap(c) || k.bytes + cs > MAX_BYTES {
            return None;
        }
        // SAFETY: `p` is a free block of at least 16 bytes, ours until taken again.
        unsafe { *(p as *mut usize) = k.head[c] };
        k.head[c] = p;
        k.count[c] += 1;
        k.bytes += cs;
        Some(std::mem::replace(&mut k.flush_registered, true))
    });
    match registered {
        None => false,
        Some(true) => true,
        Some(false) => {
            // The first block this thread caches: flush at its end. (During the thread's
            // own end the destructor cannot be registered: the block stays cached.)
            let _ = FLUSH.try_with(|_| ());
            true
        }
    }
}

/// Take up to `out.len()` cached blocks of class `c` out, to go back to the slabs with the
/// one the cache had no room for; how many.
pub(super) fn spill(c: usize, out: &mut [usize]) -> usize {
    let want = out.len().min(refill_count(c));
    with(|k| drain(k, c, &mut out[..want]))
}
