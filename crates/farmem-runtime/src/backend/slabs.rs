//! Memory for the blocks of an in-process tier (compressed pages of 64 B to 4 KiB): slots of
//! 64-byte size classes carved from 64 KiB chunks of one reserved address range.
//!
//! Why not the ordinary heap: a far tier that lives in the program's own process saves memory
//! only if what it holds costs little more than its payload. glibc's allocator rounds each
//! block up, keeps a header per block, spreads blocks over per-thread arenas and rarely gives
//! freed memory back, so the heap grew by more than the pages the tier took in. Here a block
//! wastes at most 63 bytes, a chunk goes back to the kernel as soon as its last block is freed
//! (beyond a small cache of empty chunks, which spares the kernel faults of reusing fresh
//! memory), and what is held is counted exactly ([`Slabs::held_bytes`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use farmem_sys::mem::PAGE_SIZE;

/// Size granularity of the classes.
pub(crate) const GRAIN: usize = 64;
const CLASSES: usize = PAGE_SIZE / GRAIN;
/// Bytes per chunk: 16 pages of 4 KiB blocks, 1,024 of 64 B ones.
const CHUNK: usize = 64 << 10;
/// Empty chunks kept for reuse instead of being given back at once.
const SPARE_CHUNKS: usize = 32;

/// Where a block lives: its offset in the reserved range and its class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    off: u64,
    class: u8,
}

impl Slot {
    /// Bytes the slot occupies (its class's size).
    pub(crate) fn size(self) -> usize {
        class_size(self.class as usize)
    }
}

fn class_size(class: usize) -> usize {
    (class + 1) * GRAIN
}

/// The chunks of one class that still have free slots, and each chunk's bookkeeping.
#[derive(Default)]
struct Class {
    /// Chunk indices with at least one free slot.
    partial: Vec<u32>,
    /// Per chunk of this class: live slots and the free slot numbers.
    chunks: std::collections::HashMap<u32, ChunkUse>,
}

#[derive(Default)]
struct ChunkUse {
    live: u32,
    /// Slot numbers given back; `fresh` counts the ones never handed out yet.
    free: Vec<u16>,
    fresh: u16,
}

/// The pool: one reservation, chunks handed out to classes in order, empty chunks recycled.
pub(crate) struct Slabs {
    base: *mut u8,
    len: usize,
    /// Chunks ever handed out (bump pointer over the reservation).
    bumped: AtomicUsize,
    classes: Vec<Mutex<Class>>,
    /// Empty chunks, resident (first SPARE_CHUNKS) or given back to the kernel.
    spare: Mutex<(Vec<u32>, Vec<u32>)>,
    /// Chunks in use by a class, or kept as resident spares.
    held_chunks: AtomicUsize,
    /// Bytes of live slots (their class sizes) and of the payloads in them.
    slot_bytes: AtomicU64,
    /// Most bytes of chunks the pool may hold (a tier's cap).
    max_held: usize,
}

// SAFETY: `base` points to a reservation owned by the pool for its whole life; every access
// to the memory behind it goes through slots that the pool hands out to one owner at a time.
unsafe impl Send for Slabs {}
// SAFETY: as above; the bookkeeping is behind mutexes and atomics.
unsafe impl Sync for Slabs {}

impl Slabs {
    /// Reserve address space for up to `max_held` bytes of chunks (nothing is resident until
    /// written). The reservation shrinks until the kernel accepts it (strict overcommit).
    pub(crate) fn new(max_held: usize) -> std::io::Result<Slabs> {
        let mut len = max_held.next_multiple_of(CHUNK).max(CHUNK);
        let base = loop {
            match farmem_sys::mem::map_anon(len, libc::PROT_READ | libc::PROT_WRITE) {
                Ok(p) => break p,
                Err(e) if len <= 64 * CHUNK => return Err(e),
                Err(_) => len = (len / 2).next_multiple_of(CHUNK),
            }
        };
        Ok(Slabs {
            base,
            len,
            bumped: AtomicUsize::new(0),
            classes: (0..CLASSES).map(|_| Mutex::new(Class::default())).collect(),
            spare: Mutex::new((Vec::new(), Vec::new())),
            held_chunks: AtomicUsize::new(0),
            slot_bytes: AtomicU64::new(0),
            max_held: len,
        })
    }

    /// The class of a block of `len` bytes (1..=4096).
    pub(crate) fn class_for(len: usize) -> usize {
        len.max(1).div_ceil(GRAIN) - 1
    }

    /// A slot for `len` bytes (1..=4096), or `None` when the pool is at its cap.
    pub(crate) fn alloc(&self, len: usize) -> Option<Slot> {
        let class = Self::class_for(len);
        let size = class_size(class);
        let per_chunk = (CHUNK / size) as u16;
        let mut c = self.classes[class].lock();
        let chunk = match c.partial.last() {
            Some(&ch) => ch,
            None => {
                let ch = self.take_chunk()?;
                c.chunks.insert(ch, ChunkUse::default());
                c.partial.push(ch);
                ch
            }
        };
        let u = c.chunks.get_mut(&chunk).expect("a partial chunk is known");
        let n = match u.free.pop() {
            Some(n) => n,
            None => {
                u.fresh += 1;
                u.fresh - 1
            }
        };
        u.live += 1;
        if u.free.is_empty() && u.fresh == per_chunk {
            c.partial.pop();
        }
        self.slot_bytes.fetch_add(size as u64, Ordering::Relaxed);
        Some(Slot {
            off: (chunk as usize * CHUNK + n as usize * size) as u64,
            class: class as u8,
        })
    }

    /// Give a slot back; its chunk goes back to the spares when it empties.
    pub(crate) fn free(&self, s: Slot) {
        let size = s.size();
        let per_chunk = (CHUNK / size) as u16;
        let chunk = (s.off as usize / CHUNK) as u32;
        let n = ((s.off as usize % CHUNK) / size) as u16;
        let mut c = self.classes[s.class as usize].lock();
        let u = c
            .chunks
            .get_mut(&chunk)
            .expect("a slot's chunk belongs to its class");
        let was_full = u.free.is_empty() && u.fresh == per_chunk;
        u.live -= 1;
        u.free.push(n);
        self.slot_bytes.fetch_sub(size as u64, Ordering::Relaxed);
        if u.live == 0 {
            c.chunks.remove(&chunk);
            if let Some(i) = c.partial.iter().rposition(|&x| x == chunk) {
                c.partial.swap_remove(i);
            }
            drop(c);
            self.give_chunk(chunk);
        } else if was_full {
            c.partial.push(chunk);
        }
    }

    /// The bytes of a slot.
    ///
    /// # Safety
    /// `s` must be live (allocated and not freed) and owned by the caller for as long as the
    /// slice is used: no other thread writes it or frees it meanwhile.
    pub(crate) unsafe fn bytes(&self, s: Slot, len: usize) -> &[u8] {
        debug_assert!(len <= s.size());
        // SAFETY: the slot lies inside the reservation (offsets come from `alloc`), is
        // resident or zero-fill-on-demand memory, and the caller owns it.
        unsafe { std::slice::from_raw_parts(self.base.add(s.off as usize), len) }
    }

    /// Write `data` into a slot.
    ///
    /// # Safety
    /// As [`Slabs::bytes`], and `data.len()` must fit the slot.
    pub(crate) unsafe fn fill(&self, s: Slot, data: &[u8]) {
        assert!(data.len() <= s.size(), "a block larger than its slot");
        // SAFETY: the slot is ours alone and large enough (checked above).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(s.off as usize), data.len())
        }
    }

    /// Bytes of memory the pool holds: chunks in use and resident spares.
    pub(crate) fn held_bytes(&self) -> u64 {
        (self.held_chunks.load(Ordering::Relaxed) * CHUNK) as u64
    }

    /// The most bytes of chunks the pool may hold.
    pub(crate) fn max_held(&self) -> u64 {
        self.max_held as u64
    }

    /// Bytes of the live slots (each block rounded up to its class).
    pub(crate) fn slot_bytes(&self) -> u64 {
        self.slot_bytes.load(Ordering::Relaxed)
    }

    fn take_chunk(&self) -> Option<u32> {
        {
            let mut sp = self.spare.lock();
            if let Some(ch) = sp.0.pop() {
                return Some(ch); // resident spare: already counted as held
            }
            if self.held_bytes() as usize + CHUNK > self.max_held {
                return None;
            }
            if let Some(ch) = sp.1.pop() {
                self.held_chunks.fetch_add(1, Ordering::Relaxed);
                return Some(ch);
            }
        }
        let ch = self.bumped.fetch_add(1, Ordering::Relaxed);
        if (ch + 1) * CHUNK > self.len {
            self.bumped.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        self.held_chunks.fetch_add(1, Ordering::Relaxed);
        Some(ch as u32)
    }

    fn give_chunk(&self, ch: u32) {
        let mut sp = self.spare.lock();
        if sp.0.len() < SPARE_CHUNKS {
            sp.0.push(ch);
            return;
        }
        // SAFETY: the chunk lies in our reservation and no slot of it is live.
        let addr = unsafe { self.base.add(ch as usize * CHUNK) } as usize;
        if farmem_sys::mem::madvise(addr, CHUNK, libc::MADV_DONTNEED).is_ok() {
            self.held_chunks.fetch_sub(1, Ordering::Relaxed);
            sp.1.push(ch);
        } else {
            sp.0.push(ch); // still resident: keep it as a spare beyond the usual count
        }
    }
}

impl Drop for Slabs {
    fn drop(&mut self) {
        // SAFETY: the reservation is ours and nothing refers to it once the pool is dropped.
        unsafe { farmem_sys::mem::unmap(self.base, self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_keep_their_contents_and_chunks_go_back_when_empty() {
        let s = Slabs::new(64 << 20).unwrap();
        let mut live = Vec::new();
        for i in 0..5000usize {
            let len = 1 + (i * 37) % 4096;
            let slot = s.alloc(len).unwrap();
            assert!(slot.size() >= len && slot.size() < len + GRAIN);
            let data: Vec<u8> = (0..len).map(|j| (i + j) as u8).collect();
            // SAFETY: the slot is ours and fits `data`.
            unsafe { s.fill(slot, &data) };
            live.push((slot, data));
        }
        for (slot, data) in &live {
            // SAFETY: live and ours.
            assert_eq!(unsafe { s.bytes(*slot, data.len()) }, &data[..]);
        }
        let payload: usize = live.iter().map(|(slot, _)| slot.size()).sum();
        assert_eq!(s.slot_bytes() as usize, payload);
        assert!(
            (s.held_bytes() as usize) < payload + CLASSES * CHUNK,
            "held {} for {payload} of slots",
            s.held_bytes()
        );
        for (slot, _) in live.drain(..) {
            s.free(slot);
        }
        assert_eq!(s.slot_bytes(), 0);
        assert_eq!(
            s.held_bytes() as usize,
            SPARE_CHUNKS * CHUNK,
            "only the spares stay"
        );
    }

    #[test]
    fn a_full_pool_refuses_and_recovers() {
        let s = Slabs::new(64 * CHUNK).unwrap();
        let mut got = Vec::new();
        while let Some(slot) = s.alloc(4096) {
            got.push(slot);
        }
        assert_eq!(got.len(), 64 * CHUNK / 4096);
        s.free(got.pop().unwrap());
        assert!(s.alloc(4096).is_some(), "a freed slot is used again");
    }
}
