//! Memory for the blocks of an in-process tier (compressed pages of 32 B to 4 KiB): slots of
//! size classes (16- to 64-byte steps) carved from 64 KiB chunks of one reserved address
//! range.
//!
//! Why not the ordinary heap: a far tier that lives in the program's own process saves memory
//! only if what it holds costs little more than its payload. glibc's allocator rounds each
//! block up, keeps a header per block, spreads blocks over per-thread arenas and rarely gives
//! freed memory back, so the heap grew by more than the pages the tier took in. Here a block
//! wastes at most 63 bytes (15 where blocks are small), a chunk goes back to the kernel as
//! soon as its last block is freed (beyond a small cache of empty chunks, which spares the
//! kernel faults of reusing fresh memory), and what is held is counted exactly
//! ([`Slabs::held_bytes`]).
//!
//! Chunks that keep a few live blocks would still hold all their pages: when a program's
//! pages change how well they compress (filled, then rewritten), the old sizes' chunks empty
//! slowly, in random order. So once what is held exceeds the live slots by more than
//! [`SLACK_SHIFT`]'s share (and 4 MiB), a free that empties a page of its chunk gives the
//! page back, with its class's other emptied pages: a suite key-value store at half its peak
//! held 175 MiB for 119 MiB of slots at the end of its fill, 128 MiB afterwards.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use farmem_sys::mem::PAGE_SIZE;

/// The classes: 16-byte steps from 32 to 128 bytes, 32-byte steps to 256, 64-byte steps to
/// a page. Blocks that small are pages that compress 16:1 or better, where a coarse step
/// costs most: python3's multiprocessing data (pages of one repeated byte but for an
/// object header) compresses to 60-90 bytes, which 64-byte steps stored in 128-byte slots.
/// Each class more can cost a partly used chunk per process, so the steps stay coarse
/// where blocks are larger.
const SMALL: usize = 7; // 32..=128
const MID: usize = 4; // 160..=256
const CLASSES: usize = SMALL + MID + (PAGE_SIZE - 256) / 64;
/// The most a block's slot exceeds it by.
#[cfg(test)]
const MAX_WASTE: usize = 63;
/// Bytes per chunk: 16 pages of 4 KiB blocks, 2,048 of 32 B ones.
const CHUNK: usize = 64 << 10;
/// Empty chunks kept for reuse instead of being given back at once (each spares the kernel
/// 16 page faults when a class next needs a chunk). Every process has its own: with 32
/// (2 MiB) python3's multiprocessing job at a quarter of its peak, three processes, peaked
/// at 193-203 MiB; with 8, 177-188, and a key-value churn ran no slower.
const SPARE_CHUNKS: usize = 8;
const CHUNK_PAGES: usize = CHUNK / PAGE_SIZE;
/// Emptied pages are given back while the memory held exceeds the live slots by more than
/// 1/2^SLACK_SHIFT of it and by [`SLACK_MIN`].
const SLACK_SHIFT: u32 = 3;
const SLACK_MIN: usize = 4 << 20;
/// Slack (memory held beyond the live slots) below which compaction does not run.
const COMPACT_MIN: u64 = 8 << 20;

/// Where a block lives: its chunk, its place in the chunk and its class. 8 bytes, so that
/// the store's index entry of a page is 16 (an offset of 8 bytes made it 24).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Slot {
    chunk: u32,
    n: u16,
    class: u8,
}

impl Slot {
    /// Bytes the slot occupies (its class's size).
    pub(crate) fn size(self) -> usize {
        class_size(self.class as usize)
    }

    /// Its offset in the reserved range.
    fn off(self) -> usize {
        self.chunk as usize * CHUNK + self.n as usize * self.size()
    }
}

fn class_size(class: usize) -> usize {
    if class < SMALL {
        32 + 16 * class
    } else if class < SMALL + MID {
        128 + 32 * (class + 1 - SMALL)
    } else {
        256 + 64 * (class + 1 - SMALL - MID)
    }
}

/// The chunks of one class that still have free slots, and each chunk's bookkeeping.
#[derive(Default)]
struct Class {
    /// Chunk indices with at least one free slot.
    partial: Vec<u32>,
    /// Per chunk of this class: live slots and the free slot numbers.
    chunks: std::collections::HashMap<u32, ChunkUse>,
    /// Pages that frees left without a live slot since the class was last trimmed (some
    /// may have been used again since). A count, not a list: a list of (chunk, page) per
    /// class grew to 8,192 entries (up to 128 KiB of capacity, never shrunk) in each of 64
    /// classes, memory that the process budget counts against the program.
    emptied: u32,
}

#[derive(Default)]
struct ChunkUse {
    live: u32,
    /// Slot numbers given back; `fresh` counts the ones never handed out yet.
    free: Vec<u16>,
    fresh: u16,
    /// Live slots on each page of the chunk (a slot may straddle two pages).
    page_live: [u8; CHUNK_PAGES],
    /// Pages given back to the kernel (bit per page): they read as zeros until written.
    trimmed: u16,
    /// Being emptied by compaction: out of the partial list, no new slot goes here.
    draining: bool,
}

/// Emptied pages a class waits for before it looks for pages to give back: at least this
/// many, and a quarter of its chunks, so that each look (a scan of the class's chunks, 16
/// pages each) is paid for by at most 64 page checks per emptied page.
const TRIM_AFTER: u32 = 32;

fn trim_due(c: &Class) -> bool {
    c.emptied >= TRIM_AFTER.max((c.chunks.len() / 4) as u32)
}

/// The pages of the chunk that slot `n` of `size` bytes covers.
fn slot_pages(n: u16, size: usize) -> std::ops::Range<usize> {
    let start = n as usize * size;
    start / PAGE_SIZE..(start + size).div_ceil(PAGE_SIZE)
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
    /// Pages of chunks in use given back to the kernel (not held).
    trimmed_pages: AtomicUsize,
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
            trimmed_pages: AtomicUsize::new(0),
            slot_bytes: AtomicU64::new(0),
            max_held: len,
        })
    }

    /// The reservation: its address and length.
    pub(crate) fn range(&self) -> (usize, usize) {
        (self.base as usize, self.len)
    }

    /// The class of a block of `len` bytes (1..=4096).
    pub(crate) fn class_for(len: usize) -> usize {
        if len <= 128 {
            len.max(32).div_ceil(16) - 2
        } else if len <= 256 {
            SMALL + (len - 128).div_ceil(32) - 1
        } else {
            SMALL + MID + (len - 256).div_ceil(64) - 1
        }
    }

    /// Bytes a block of `len` bytes (1..=4096) occupies.
    pub(crate) fn slot_size_for(len: usize) -> usize {
        class_size(Self::class_for(len))
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
        for p in slot_pages(n, size) {
            if u.page_live[p] == 0 && u.trimmed & (1 << p) != 0 {
                u.trimmed &= !(1 << p); // faulted in again when the slot is written
                self.trimmed_pages.fetch_sub(1, Ordering::Relaxed);
            }
            u.page_live[p] += 1;
        }
        if u.free.is_empty() && u.fresh == per_chunk {
            c.partial.pop();
        }
        self.slot_bytes.fetch_add(size as u64, Ordering::Relaxed);
        Some(Slot {
            chunk,
            n,
            class: class as u8,
        })
    }

    /// Give a slot back; its chunk goes back to the spares when it empties.
    pub(crate) fn free(&self, s: Slot) {
        let size = s.size();
        let per_chunk = (CHUNK / size) as u16;
        let (chunk, n) = (s.chunk, s.n);
        let mut c = self.classes[s.class as usize].lock();
        let u = c
            .chunks
            .get_mut(&chunk)
            .expect("a slot's chunk belongs to its class");
        let was_full = u.free.is_empty() && u.fresh == per_chunk;
        u.live -= 1;
        u.free.push(n);
        let mut emptied = 0;
        for p in slot_pages(n, size) {
            u.page_live[p] -= 1;
            if u.page_live[p] == 0 && u.live > 0 {
                emptied += 1;
            }
        }
        let (live, trimmed, draining) = (u.live, u.trimmed.count_ones() as usize, u.draining);
        self.slot_bytes.fetch_sub(size as u64, Ordering::Relaxed);
        c.emptied = c.emptied.saturating_add(emptied);
        if live == 0 {
            c.chunks.remove(&chunk);
            if let Some(i) = c.partial.iter().rposition(|&x| x == chunk) {
                c.partial.swap_remove(i);
            }
            drop(c);
            self.give_chunk(chunk, trimmed);
        } else {
            if was_full && !draining {
                c.partial.push(chunk);
            }
            if emptied > 0 && trim_due(&c) && self.too_much_held() {
                self.trim(&mut c);
            }
        }
    }

    /// Whether the memory held exceeds the live slots by more than the slack.
    fn too_much_held(&self) -> bool {
        let held = self.held_bytes() as usize;
        let slack = held.saturating_sub(self.slot_bytes() as usize);
        slack > SLACK_MIN && slack > held >> SLACK_SHIFT
    }

    /// Give back the pages of the class's chunks that hold no live slot (class lock held).
    fn trim(&self, c: &mut Class) {
        c.emptied = 0;
        let mut empty: Vec<usize> = Vec::new();
        for (&chunk, u) in &c.chunks {
            for (p, &live) in u.page_live.iter().enumerate() {
                if live == 0 && u.trimmed & (1 << p) == 0 {
                    empty.push(chunk as usize * CHUNK + p * PAGE_SIZE);
                }
            }
        }
        empty.sort_unstable();
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for addr in empty {
            match ranges.last_mut() {
                Some((s, l)) if *s + *l == addr => *l += PAGE_SIZE,
                _ => ranges.push((addr, PAGE_SIZE)),
            }
        }
        for (off, len) in ranges {
            // No live slot is on these pages, and none can be placed there meanwhile (the
            // class lock is held); a slot placed later faults the page in again.
            let addr = self.base as usize + off;
            if farmem_sys::mem::madvise(addr, len, libc::MADV_DONTNEED).is_err() {
                continue; // still resident, and counted as held
            }
            for o in (off..off + len).step_by(PAGE_SIZE) {
                if let Some(u) = c.chunks.get_mut(&((o / CHUNK) as u32)) {
                    u.trimmed |= 1 << ((o % CHUNK) / PAGE_SIZE);
                }
            }
            self.trimmed_pages
                .fetch_add(len / PAGE_SIZE, Ordering::Relaxed);
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
        unsafe { std::slice::from_raw_parts(self.base.add(s.off()), len) }
    }

    /// Write `data` into a slot.
    ///
    /// # Safety
    /// As [`Slabs::bytes`], and `data.len()` must fit the slot.
    pub(crate) unsafe fn fill(&self, s: Slot, data: &[u8]) {
        assert!(data.len() <= s.size(), "a block larger than its slot");
        // SAFETY: the slot is ours alone and large enough (checked above).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(s.off()), data.len()) }
    }

    /// Whether compaction would pay: the memory held exceeds the live slots by more than an
    /// eighth and [`COMPACT_MIN`]. Freed slots are reused only by blocks of their own size
    /// class, and a page goes back only when none of its slots is live, so after a program
    /// reads many far pages back at random the holes stay: python3 building lists at a
    /// quarter of its peak held 56 MiB for 39 MiB of live blocks, 13 MiB of it in holes.
    pub(crate) fn worth_compacting(&self) -> bool {
        let held = self.held_bytes();
        let slack = held.saturating_sub(self.slot_bytes());
        slack > COMPACT_MIN && slack > held / 8
    }

    /// Start compaction: every chunk at most half live, in classes of two chunks or more, is
    /// set draining: no new slot goes there. Returns them, for [`Slabs::relocate`] and
    /// [`Slabs::stop_draining`].
    pub(crate) fn start_draining(&self) -> std::collections::HashSet<u32> {
        let mut out = std::collections::HashSet::new();
        for (ci, c) in self.classes.iter().enumerate() {
            let per_chunk = (CHUNK / class_size(ci)) as u32;
            let mut c = c.lock();
            if c.chunks.len() < 2 {
                continue;
            }
            for (&ch, u) in c.chunks.iter_mut() {
                if u.live * 2 <= per_chunk {
                    u.draining = true;
                    out.insert(ch);
                }
            }
            c.partial.retain(|ch| !out.contains(ch));
        }
        out
    }

    /// Whether slot `s` (live) lies in a chunk [`Slabs::start_draining`] set draining and
    /// that is still so (not emptied and taken again since). A chunk in `draining` (the set
    /// it returned) is checked under its class's lock; any other is not draining.
    pub(crate) fn is_draining(&self, s: Slot, draining: &std::collections::HashSet<u32>) -> bool {
        draining.contains(&s.chunk)
            && self.classes[s.class as usize]
                .lock()
                .chunks
                .get(&s.chunk)
                .is_some_and(|u| u.draining)
    }

    /// Move slot `s`'s bytes to a new slot of its class (never in a draining chunk) and free
    /// `s`; the new slot, or None when the pool has no room (nothing changed).
    ///
    /// # Safety
    /// `s` must be live and the caller's alone while this runs: no one reads, writes or
    /// frees it meanwhile (the index shard naming it is locked).
    pub(crate) unsafe fn relocate(&self, s: Slot) -> Option<Slot> {
        let size = s.size();
        let n = self.alloc(size)?;
        // SAFETY: `s` is live and ours (the caller's contract), `n` is fresh and ours; both
        // lie in the reservation and are distinct slots.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base.add(s.off()), self.base.add(n.off()), size)
        };
        self.free(s);
        Some(n)
    }

    /// End compaction: chunks still draining (some slot could not move) take slots again.
    pub(crate) fn stop_draining(&self, draining: &std::collections::HashSet<u32>) {
        for (ci, c) in self.classes.iter().enumerate() {
            let per_chunk = (CHUNK / class_size(ci)) as u16;
            let mut c = c.lock();
            let mut back = Vec::new();
            // A chunk emptied meanwhile may have been taken again, fresh (not draining, and
            // in a partial list already).
            for (&ch, u) in c.chunks.iter_mut().filter(|(ch, _)| draining.contains(ch)) {
                if !std::mem::take(&mut u.draining) {
                    continue;
                }
                if !(u.free.is_empty() && u.fresh == per_chunk) {
                    back.push(ch);
                }
            }
            // Before the class's current chunk: new slots keep going to the fuller one.
            c.partial.splice(0..0, back);
        }
    }

    /// Bytes of memory the pool holds: chunks in use (less their pages given back) and
    /// resident spares.
    pub(crate) fn held_bytes(&self) -> u64 {
        let chunks = self.held_chunks.load(Ordering::Relaxed) * CHUNK;
        chunks.saturating_sub(self.trimmed_pages.load(Ordering::Relaxed) * PAGE_SIZE) as u64
    }

    /// Bytes of the pool's records of the chunks in use: a hash-table entry each, with the
    /// table's slack (their lists of freed slots are not counted: at most 2 bytes a slot).
    pub(crate) fn bookkeeping_bytes(&self) -> usize {
        let per_chunk = 2 * (std::mem::size_of::<(u32, ChunkUse)>() + 1);
        self.held_chunks.load(Ordering::Relaxed) * per_chunk
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

    /// Take back an emptied chunk, `trimmed` of whose pages were given back already.
    fn give_chunk(&self, ch: u32, trimmed: usize) {
        let mut sp = self.spare.lock();
        if sp.0.len() < SPARE_CHUNKS && trimmed == 0 {
            sp.0.push(ch);
            return;
        }
        // SAFETY: the chunk lies in our reservation and no slot of it is live.
        let addr = unsafe { self.base.add(ch as usize * CHUNK) } as usize;
        if farmem_sys::mem::madvise(addr, CHUNK, libc::MADV_DONTNEED).is_ok() {
            self.held_chunks.fetch_sub(1, Ordering::Relaxed);
            self.trimmed_pages.fetch_sub(trimmed, Ordering::Relaxed);
            sp.1.push(ch);
        } else {
            // Still resident (but for the trimmed pages, which read as zeros): keep it as a
            // spare beyond the usual count, counted whole.
            self.trimmed_pages.fetch_sub(trimmed, Ordering::Relaxed);
            sp.0.push(ch);
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
    fn every_length_has_the_smallest_class_that_holds_it() {
        assert_eq!(class_size(CLASSES - 1), PAGE_SIZE);
        for c in 1..CLASSES {
            assert!(class_size(c) > class_size(c - 1));
        }
        for len in 1..=PAGE_SIZE {
            let c = Slabs::class_for(len);
            assert!(class_size(c) >= len, "{len} in class {c}");
            assert!(c == 0 || class_size(c - 1) < len, "{len} in class {c}");
        }
        // A slot's live count per page is a u8: no class may put 256 slots on a page.
        assert!(PAGE_SIZE / class_size(0) < 256);
    }

    #[test]
    fn blocks_keep_their_contents_and_chunks_go_back_when_empty() {
        let s = Slabs::new(64 << 20).unwrap();
        let mut live = Vec::new();
        for i in 0..5000usize {
            let len = 1 + (i * 37) % 4096;
            let slot = s.alloc(len).unwrap();
            assert!(slot.size() >= len && slot.size() <= (len + MAX_WASTE).max(32));
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

    /// Resident pages of the chunks handed out so far.
    fn resident_pages(s: &Slabs) -> usize {
        let len = s.bumped.load(Ordering::Relaxed) * CHUNK;
        let pages = farmem_sys::mem::resident_pages(s.base as usize, len).unwrap();
        pages.iter().filter(|&&r| r).count()
    }

    #[test]
    fn pages_emptied_by_frees_go_back_when_far_more_is_held_than_used() {
        let s = Slabs::new(256 << 20).unwrap();
        let data = |i: usize| -> Vec<u8> { (0..1000).map(|j| (i * 7 + j) as u8).collect() };
        // 1,000-byte blocks: 64 per chunk, four per page (none straddles two).
        let mut slots: Vec<Option<Slot>> = (0..20_000)
            .map(|i| {
                let slot = s.alloc(1000).unwrap();
                // SAFETY: the slot is ours and fits.
                unsafe { s.fill(slot, &data(i)) };
                Some(slot)
            })
            .collect();
        let full = s.held_bytes() as usize;
        assert!(full >= 20_000 * 1024, "held {full}");
        // Keep one block in 16: three pages in four have no live block left, but every
        // chunk still has some.
        for (i, slot) in slots.iter_mut().enumerate() {
            if i % 16 != 0 {
                s.free(slot.take().unwrap());
            }
        }
        let (held, live) = (s.held_bytes() as usize, s.slot_bytes() as usize);
        assert!(
            held < full / 3 && held <= 1250 * PAGE_SIZE + SLACK_MIN + SPARE_CHUNKS * CHUNK,
            "held {held} of {full} for {live} bytes of live blocks"
        );
        let resident = resident_pages(&s) * PAGE_SIZE;
        assert!(
            resident <= held + CHUNK,
            "{resident} bytes resident, {held} counted as held"
        );
        for (i, slot) in slots.iter().enumerate() {
            if let Some(slot) = slot {
                // SAFETY: live and ours.
                assert_eq!(unsafe { s.bytes(*slot, 1000) }, &data(i)[..], "block {i}");
            }
        }
        // Blocks placed on given-back pages hold what is written to them.
        for (i, slot) in slots.iter_mut().enumerate() {
            if slot.is_none() {
                let new = s.alloc(1000).unwrap();
                // SAFETY: the slot is ours and fits.
                unsafe { s.fill(new, &data(i + 1)) };
                *slot = Some(new);
            }
        }
        for (i, slot) in slots.iter().enumerate() {
            let want = if i % 16 != 0 { data(i + 1) } else { data(i) };
            // SAFETY: live and ours.
            assert_eq!(
                unsafe { s.bytes(slot.unwrap(), 1000) },
                &want[..],
                "block {i}"
            );
        }
        assert!(s.held_bytes() as usize >= 20_000 * 1024);
        for slot in slots.into_iter().flatten() {
            s.free(slot);
        }
        assert_eq!(s.slot_bytes(), 0);
        assert!(s.held_bytes() as usize <= SPARE_CHUNKS * CHUNK);
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
