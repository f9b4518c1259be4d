//! The server's page store.
//!
//! Pages live in one arena of 4 KiB slots, reserved (virtually, `MAP_NORESERVE`) up to the
//! capacity: memory is used only for pages actually written, and a freed slot is handed back
//! to the kernel at once (`MADV_DONTNEED`) and reused by the next new page. The index maps
//! (session, region, page) to a slot, so a session's namespace is all it can name: no
//! request can reach another session's pages, let alone another tenant's.

use std::collections::HashMap;

use farmem_proto::PageKey;
use farmem_proto::PAGE_SIZE;
use farmem_sys::mem;

/// Server-internal number of a session.
pub(crate) type SessionIdx = u32;

/// Pages per index chunk: one hash lookup finds the chunk, an array index finds the page.
/// Consecutive pages (what batches carry) share a chunk; a sparse region costs at most
/// 256 bytes of index per stored page.
const CHUNK: u64 = 64;

/// The slots of one region's pages, by chunk of `CHUNK` pages (`NONE`: not stored).
#[derive(Default)]
struct RegionIndex {
    chunks: HashMap<u64, Box<[u32; CHUNK as usize]>>,
    pages: usize,
}

const NONE: u32 = u32::MAX;

impl RegionIndex {
    fn get(&self, page: u64) -> Option<u32> {
        let c = self.chunks.get(&(page / CHUNK))?;
        let slot = c[(page % CHUNK) as usize];
        (slot != NONE).then_some(slot)
    }

    fn insert(&mut self, page: u64, slot: u32) {
        let c = self
            .chunks
            .entry(page / CHUNK)
            .or_insert_with(|| Box::new([NONE; CHUNK as usize]));
        let e = &mut c[(page % CHUNK) as usize];
        debug_assert_eq!(*e, NONE, "insert of a stored page");
        *e = slot;
        self.pages += 1;
    }

    fn remove(&mut self, page: u64) -> Option<u32> {
        let c = self.chunks.get_mut(&(page / CHUNK))?;
        let e = &mut c[(page % CHUNK) as usize];
        let slot = std::mem::replace(e, NONE);
        if slot == NONE {
            return None;
        }
        self.pages -= 1;
        if c.iter().all(|&s| s == NONE) {
            self.chunks.remove(&(page / CHUNK));
        }
        Some(slot)
    }

    /// Remove the pages in `[first, end)`, pushing their slots.
    fn remove_range(&mut self, first: u64, end: u64, out: &mut Vec<u32>) {
        let before = out.len();
        if end - first < self.chunks.len() as u64 * CHUNK {
            for p in first..end {
                out.extend(self.remove(p));
            }
            return;
        }
        // Cheaper to walk what is stored than the range.
        self.chunks.retain(|&ci, c| {
            for (i, e) in c.iter_mut().enumerate() {
                let p = ci * CHUNK + i as u64;
                if *e != NONE && (first..end).contains(&p) {
                    out.push(std::mem::replace(e, NONE));
                }
            }
            c.iter().any(|&s| s != NONE)
        });
        self.pages -= out.len() - before;
    }
}

pub(crate) struct Store {
    base: *mut u8,
    capacity: usize,
    /// Slots below this index have been handed out at least once.
    next: usize,
    free: Vec<u32>,
    /// Checksum of the page in each slot (verified on arrival, sent with every read).
    crcs: Vec<u32>,
    /// Per (session, region): page index to slot.
    regions: HashMap<(SessionIdx, u32), RegionIndex>,
    used: usize,
}

// SAFETY: the arena is owned by the store and only reached through `&self`/`&mut self`.
unsafe impl Send for Store {}

impl Store {
    /// A store for at most `capacity` pages.
    pub(crate) fn new(capacity: usize) -> std::io::Result<Store> {
        if capacity == 0 || capacity > u32::MAX as usize {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("capacity must be between 1 and {} pages", u32::MAX),
            ));
        }
        let base = mem::map_anon(capacity * PAGE_SIZE, libc::PROT_READ | libc::PROT_WRITE)?;
        // Pages come and go one by one; huge pages would pin 2 MiB for a 4 KiB page.
        let _ = mem::madvise(base as usize, capacity * PAGE_SIZE, libc::MADV_NOHUGEPAGE);
        Ok(Store {
            base,
            capacity,
            next: 0,
            free: Vec::new(),
            crcs: Vec::new(),
            regions: HashMap::new(),
            used: 0,
        })
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    pub(crate) fn used(&self) -> usize {
        self.used
    }

    fn slot_ptr(&self, slot: u32) -> *mut u8 {
        debug_assert!((slot as usize) < self.next);
        // SAFETY: slots below `next` are inside the arena.
        unsafe { self.base.add(slot as usize * PAGE_SIZE) }
    }

    fn slot_of(&self, s: SessionIdx, k: PageKey) -> Option<u32> {
        self.regions.get(&(s, k.region))?.get(k.page)
    }

    /// A stored page and its checksum.
    pub(crate) fn get(&self, s: SessionIdx, k: PageKey) -> Option<(u32, &[u8])> {
        let slot = self.slot_of(s, k)?;
        // SAFETY: the slot is allocated; the returned borrow of `self` keeps it from being
        // freed or overwritten meanwhile.
        let page = unsafe { std::slice::from_raw_parts(self.slot_ptr(slot), PAGE_SIZE) };
        Some((self.crcs[slot as usize], page))
    }

    /// How many of `keys` are not stored yet (an upper bound when keys repeat).
    pub(crate) fn count_new(&self, s: SessionIdx, keys: impl Iterator<Item = PageKey>) -> usize {
        keys.filter(|&k| self.slot_of(s, k).is_none()).count()
    }

    /// Store a page (the caller checked capacity). Returns whether it is a new page.
    pub(crate) fn put(&mut self, s: SessionIdx, k: PageKey, crc: u32, page: &[u8]) -> bool {
        assert_eq!(page.len(), PAGE_SIZE);
        let existing = self.slot_of(s, k);
        let (slot, new) = match existing {
            Some(slot) => (slot, false),
            None => {
                let slot = match self.free.pop() {
                    Some(f) => f,
                    None => {
                        assert!(self.next < self.capacity, "store is full");
                        self.next += 1;
                        self.crcs.push(0);
                        (self.next - 1) as u32
                    }
                };
                self.regions
                    .entry((s, k.region))
                    .or_default()
                    .insert(k.page, slot);
                self.used += 1;
                (slot, true)
            }
        };
        // SAFETY: the slot is allocated to this page only; `page` is a different buffer.
        unsafe { std::ptr::copy_nonoverlapping(page.as_ptr(), self.slot_ptr(slot), PAGE_SIZE) };
        self.crcs[slot as usize] = crc;
        new
    }

    /// Free pages `[first, first + count)` of a region. Returns how many were stored.
    pub(crate) fn free_range(
        &mut self,
        s: SessionIdx,
        region: u32,
        first: u64,
        count: u64,
    ) -> usize {
        let Some(index) = self.regions.get_mut(&(s, region)) else {
            return 0;
        };
        let mut slots = Vec::new();
        index.remove_range(first, first.saturating_add(count), &mut slots);
        if index.pages == 0 {
            self.regions.remove(&(s, region));
        }
        self.release(slots)
    }

    /// Free every page of a session. Returns how many there were.
    pub(crate) fn free_session(&mut self, s: SessionIdx) -> usize {
        let keys: Vec<(SessionIdx, u32)> = self
            .regions
            .keys()
            .filter(|(sess, _)| *sess == s)
            .copied()
            .collect();
        let mut slots = Vec::new();
        for k in keys {
            if let Some(index) = self.regions.remove(&k) {
                for c in index.chunks.into_values() {
                    slots.extend(c.iter().copied().filter(|&s| s != NONE));
                }
            }
        }
        self.release(slots)
    }

    /// Return slots to the free list and their memory to the kernel.
    fn release(&mut self, mut slots: Vec<u32>) -> usize {
        let n = slots.len();
        slots.sort_unstable();
        let mut i = 0;
        while i < slots.len() {
            let mut j = i + 1;
            while j < slots.len() && slots[j] == slots[j - 1] + 1 {
                j += 1;
            }
            let start = self.slot_ptr(slots[i]) as usize;
            let _ = mem::madvise(start, (j - i) * PAGE_SIZE, libc::MADV_DONTNEED);
            i = j;
        }
        self.free.extend(slots);
        self.used -= n;
        n
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: the arena was mapped in `new` and nothing refers to it past the store.
        unsafe { mem::unmap(self.base, self.capacity * PAGE_SIZE) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(region: u32, page: u64) -> PageKey {
        PageKey { region, page }
    }

    fn page(v: u8) -> Vec<u8> {
        vec![v; PAGE_SIZE]
    }

    #[test]
    fn sessions_are_separate_namespaces() {
        let mut st = Store::new(16).unwrap();
        assert!(st.put(1, key(1, 0), 11, &page(1)));
        assert!(st.put(2, key(1, 0), 22, &page(2)));
        assert_eq!(st.get(1, key(1, 0)).unwrap(), (11, &page(1)[..]));
        assert_eq!(st.get(2, key(1, 0)).unwrap(), (22, &page(2)[..]));
        assert!(st.get(3, key(1, 0)).is_none());
        // Overwriting is not a new page.
        assert!(!st.put(1, key(1, 0), 33, &page(3)));
        assert_eq!(st.get(1, key(1, 0)).unwrap().0, 33);
        assert_eq!(st.used(), 2);
        assert_eq!(st.free_session(1), 1);
        assert!(st.get(1, key(1, 0)).is_none());
        assert_eq!(st.get(2, key(1, 0)).unwrap().1, &page(2)[..]);
    }

    #[test]
    fn ranges_across_chunks_free_exactly_their_pages() {
        let mut st = Store::new(1024).unwrap();
        let stored: Vec<u64> = (0..300).chain([5000, 5001, 1 << 40]).collect();
        for &p in &stored {
            st.put(1, key(2, p), p as u32, &page(p as u8));
        }
        // A small range (walked page by page) and a huge one (walked by what is stored).
        assert_eq!(st.free_range(1, 2, 60, 10), 10);
        assert_eq!(st.free_range(1, 2, 250, 1 << 50), 50 + 3);
        for &p in &stored {
            let want = p < 60 || (70..250).contains(&p);
            assert_eq!(st.get(1, key(2, p)).is_some(), want, "page {p}");
        }
        assert_eq!(st.used(), 240);
        assert_eq!(st.free_range(1, 2, 0, u64::MAX), 240);
        assert_eq!(st.used(), 0);
        assert!(st.regions.is_empty());
    }

    #[test]
    fn freed_slots_are_reused_and_zeroed_back_to_the_kernel() {
        let mut st = Store::new(4).unwrap();
        for p in 0..4 {
            st.put(1, key(7, p), p as u32, &page(p as u8 + 1));
        }
        assert_eq!(st.count_new(1, [key(7, 3), key(7, 4)].into_iter()), 1);
        assert_eq!(st.free_range(1, 7, 1, 2), 2);
        assert_eq!(st.used(), 2);
        assert!(st.get(1, key(7, 1)).is_none() && st.get(1, key(7, 3)).is_some());
        // Two new pages fit again in the freed slots.
        assert!(st.put(1, key(8, 0), 0, &page(9)));
        assert!(st.put(1, key(8, 1), 0, &page(10)));
        assert_eq!(st.get(1, key(8, 1)).unwrap().1, &page(10)[..]);
        assert_eq!(st.free_range(1, 7, 0, u64::MAX), 2);
        assert_eq!(st.used(), 2);
    }
}
