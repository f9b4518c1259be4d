//! Where an in-process or on-disk tier keeps each page: a map from page key to a value
//! (a slot), in shards so that the threads of a batch do not serialize on one lock.
//!
//! The map is a table of chunks, each the values of [`CHUNK_PAGES`] neighbouring pages with
//! a bit per page saying which are stored. Far pages come in runs (evicted in steps of
//! neighbouring pages, a heap's blocks side by side), so a chunk is mostly full: 4 bytes a
//! page and a bit for the file tier's slot numbers. A hash map with an entry per page took
//! 33 to 66 bytes a page (key, value and control byte, up to half its buckets empty after
//! it doubled) and left each outgrown table in the runtime's heap: a STREAM-shaped program
//! with 960 MiB of static arrays at a 240 MiB budget held 12.5 MiB of index for 240 K far
//! pages, 5% of its budget, where Linux keeps a byte per swap slot. A lone page costs a
//! whole chunk (264 bytes for slot numbers): at most a chunk per 256 KiB of the heap.

use std::collections::HashMap;

use parking_lot::{Mutex, MutexGuard};

use farmem_proto::PageKey;

const SHARDS: usize = 64;
/// Pages per chunk.
const CHUNK_PAGES: usize = 64;
const CHUNK_SHIFT: u32 = CHUNK_PAGES.trailing_zeros();

/// The values of [`CHUNK_PAGES`] neighbouring pages; `present` bit `i` says `vals[i]` is set.
struct Chunk<V> {
    present: u64,
    vals: [V; CHUNK_PAGES],
}

/// One lock's part of the index: its chunks by (region, page / [`CHUNK_PAGES`]).
pub(crate) struct Shard<V> {
    chunks: HashMap<(u32, u64), Box<Chunk<V>>>,
    len: usize,
}

impl<V: Copy + Default> Shard<V> {
    fn new() -> Shard<V> {
        Shard {
            chunks: HashMap::new(),
            len: 0,
        }
    }

    fn at(k: PageKey) -> ((u32, u64), usize) {
        (
            (k.region, k.page >> CHUNK_SHIFT),
            (k.page as usize) & (CHUNK_PAGES - 1),
        )
    }

    pub(crate) fn get(&self, k: PageKey) -> Option<V> {
        let (ck, i) = Self::at(k);
        let c = self.chunks.get(&ck)?;
        (c.present & (1 << i) != 0).then(|| c.vals[i])
    }

    fn insert(&mut self, k: PageKey, v: V) -> Option<V> {
        let (ck, i) = Self::at(k);
        let c = self.chunks.entry(ck).or_insert_with(|| {
            Box::new(Chunk {
                present: 0,
                vals: [V::default(); CHUNK_PAGES],
            })
        });
        let old = (c.present & (1 << i) != 0).then(|| c.vals[i]);
        c.present |= 1 << i;
        c.vals[i] = v;
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    fn remove(&mut self, k: PageKey) -> Option<V> {
        let (ck, i) = Self::at(k);
        let c = self.chunks.get_mut(&ck)?;
        if c.present & (1 << i) == 0 {
            return None;
        }
        c.present &= !(1 << i);
        let v = c.vals[i];
        if c.present == 0 {
            self.chunks.remove(&ck);
        }
        self.len -= 1;
        Some(v)
    }
}

pub(crate) struct PageIndex<V> {
    shards: Vec<Mutex<Shard<V>>>,
}

impl<V: Copy + Default> PageIndex<V> {
    pub(crate) fn new() -> PageIndex<V> {
        PageIndex {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::new())).collect(),
        }
    }

    /// The shard of `k`, locked. Neighbouring chunks go to different shards; a chunk's pages
    /// (a step of an eviction, a read-ahead window) share one.
    pub(crate) fn shard(&self, k: PageKey) -> MutexGuard<'_, Shard<V>> {
        let c = k.page >> CHUNK_SHIFT;
        let h = (c ^ ((k.region as u64) << 40)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.shards[(h >> 58) as usize % SHARDS].lock()
    }

    pub(crate) fn get(&self, k: PageKey) -> Option<V> {
        self.shard(k).get(k)
    }

    /// Set `k`'s value; the one it replaces, if any.
    pub(crate) fn insert(&self, k: PageKey, v: V) -> Option<V> {
        self.shard(k).insert(k, v)
    }

    pub(crate) fn remove(&self, k: PageKey) -> Option<V> {
        self.shard(k).remove(k)
    }

    /// Call `f` on every value, with its shard locked (`f` may change it).
    pub(crate) fn for_each_mut(&self, mut f: impl FnMut(&mut V)) {
        for s in &self.shards {
            let mut s = s.lock();
            for c in s.chunks.values_mut() {
                let mut bits = c.present;
                while bits != 0 {
                    f(&mut c.vals[bits.trailing_zeros() as usize]);
                    bits &= bits - 1;
                }
            }
        }
    }

    /// Remove every page of `region`; their values.
    pub(crate) fn remove_region(&self, region: u32) -> Vec<V> {
        let mut out = Vec::new();
        for s in &self.shards {
            let mut s = s.lock();
            let mut removed = 0;
            s.chunks.retain(|&(r, _), c| {
                if r != region {
                    return true;
                }
                let mut bits = c.present;
                while bits != 0 {
                    out.push(c.vals[bits.trailing_zeros() as usize]);
                    bits &= bits - 1;
                    removed += 1;
                }
                false
            });
            s.len -= removed;
        }
        out
    }

    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len).sum()
    }

    /// Bytes the index takes: its chunks (with the allocator's header each) and the tables
    /// that find them (at most 7 in 8 buckets used, a control byte each), whatever their load.
    pub(crate) fn table_bytes(&self) -> usize {
        const MALLOC_HEADER: usize = 16;
        let chunk = std::mem::size_of::<Chunk<V>>() + MALLOC_HEADER;
        let per_bucket = std::mem::size_of::<((u32, u64), Box<Chunk<V>>)>() + 1;
        self.shards
            .iter()
            .map(|s| {
                let s = s.lock();
                let cap = s.chunks.capacity();
                let table = if cap == 0 {
                    0
                } else {
                    (cap * 8 / 7).next_power_of_two() * per_bucket
                };
                table + s.chunks.len() * chunk
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(page: u64) -> PageKey {
        PageKey { region: 1, page }
    }

    /// Values come back as set, replaced ones are returned, removed ones are gone, and the
    /// count follows; a region's removal takes only its pages.
    #[test]
    fn values_follow_inserts_replacements_and_removals() {
        let ix = PageIndex::<u32>::new();
        for p in (0..3_000u64).step_by(3) {
            assert_eq!(ix.insert(key(p), p as u32), None);
        }
        assert_eq!(ix.len(), 1_000);
        assert_eq!(ix.insert(key(300), 7), Some(300));
        assert_eq!(ix.len(), 1_000);
        for p in 0..3_000u64 {
            let want = match p {
                300 => Some(7),
                p if p % 3 == 0 => Some(p as u32),
                _ => None,
            };
            assert_eq!(ix.get(key(p)), want, "page {p}");
        }
        assert_eq!(ix.remove(key(301)), None);
        assert_eq!(ix.remove(key(303)), Some(303));
        assert_eq!(ix.get(key(303)), None);
        assert_eq!(ix.len(), 999);
        ix.insert(PageKey { region: 2, page: 5 }, 55);
        let mut gone = ix.remove_region(1);
        gone.sort_unstable();
        assert_eq!(gone.len(), 999);
        assert_eq!(gone[0], 0);
        assert_eq!(ix.len(), 1);
        assert_eq!(ix.get(PageKey { region: 2, page: 5 }), Some(55));
        assert_eq!(ix.get(key(0)), None);
    }

    /// What the index takes is counted and small where far pages come in runs (a few bytes
    /// a page above the value), and at most a chunk per page where they are scattered; a
    /// chunk emptied by removals is given back.
    #[test]
    fn table_bytes_follow_the_chunks() {
        let ix = PageIndex::<u32>::new();
        assert_eq!(ix.table_bytes(), 0);
        let chunk = std::mem::size_of::<Chunk<u32>>();
        for n in [1_000u64, 10_000, 240_000] {
            for p in 0..n {
                ix.insert(key(p), p as u32);
            }
            let bytes = ix.table_bytes();
            assert!(bytes as u64 >= n * 4, "{bytes} bytes for {n} pages");
            assert!(
                bytes as u64 <= n * 8 + 64 * 1024,
                "{bytes} bytes for {n} pages"
            );
        }
        for p in 0..240_000u64 {
            ix.remove(key(p));
        }
        assert_eq!(ix.len(), 0);
        assert!(ix.shards.iter().all(|s| s.lock().chunks.is_empty()));
        let sparse = PageIndex::<u32>::new();
        for p in 0..1_000u64 {
            sparse.insert(key(p * CHUNK_PAGES as u64), 1);
        }
        let bytes = sparse.table_bytes();
        assert!(bytes >= 1_000 * chunk && bytes <= 1_000 * (chunk + 64) + 64 * 1024);
    }
}
