//! Where an in-process or on-disk tier keeps each page: a map from page key to a value
//! (a slot), in shards so that the threads of a batch do not serialize on one lock.

use std::collections::HashMap;

use parking_lot::{Mutex, MutexGuard};

use farmem_proto::PageKey;

const SHARDS: usize = 64;

pub(crate) struct PageIndex<V> {
    shards: Vec<Mutex<HashMap<(u32, u64), V>>>,
}

impl<V: Copy> PageIndex<V> {
    pub(crate) fn new() -> PageIndex<V> {
        PageIndex {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    /// The shard of `k`, locked. Neighbouring pages go to different shards.
    pub(crate) fn shard(&self, k: PageKey) -> MutexGuard<'_, HashMap<(u32, u64), V>> {
        let h = (k.page ^ ((k.region as u64) << 40)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.shards[(h >> 58) as usize % SHARDS].lock()
    }

    pub(crate) fn get(&self, k: PageKey) -> Option<V> {
        self.shard(k).get(&(k.region, k.page)).copied()
    }

    /// Set `k`'s value; the one it replaces, if any.
    pub(crate) fn insert(&self, k: PageKey, v: V) -> Option<V> {
        self.shard(k).insert((k.region, k.page), v)
    }

    pub(crate) fn remove(&self, k: PageKey) -> Option<V> {
        self.shard(k).remove(&(k.region, k.page))
    }

    /// Remove every page of `region`; their values.
    pub(crate) fn remove_region(&self, region: u32) -> Vec<V> {
        let mut out = Vec::new();
        for s in &self.shards {
            s.lock().retain(|&(r, _), v| {
                if r == region {
                    out.push(*v);
                    false
                } else {
                    true
                }
            });
        }
        out
    }

    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Bytes the index's tables take: their buckets (at most 7 in 8 used) with a control
    /// byte each, whatever their load. A fixed guess per entry (48 bytes) missed half of it
    /// when the tables had just doubled, and what it missed counted as the program's memory.
    pub(crate) fn table_bytes(&self) -> usize {
        let per_bucket = std::mem::size_of::<((u32, u64), V)>() + 1;
        self.shards
            .iter()
            .map(|s| {
                let cap = s.lock().capacity();
                if cap == 0 {
                    0
                } else {
                    (cap * 8 / 7).next_power_of_two() * per_bucket
                }
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the tables take is counted whatever their load: between one entry and a little
    /// over two entries' worth of buckets per page (tables double when 7 in 8 are used).
    #[test]
    fn table_bytes_follow_the_tables_not_a_guess_per_entry() {
        let ix = PageIndex::<[u64; 3]>::new();
        assert_eq!(ix.table_bytes(), 0);
        let entry = std::mem::size_of::<((u32, u64), [u64; 3])>() + 1;
        for n in [1_000u64, 10_000, 53_000] {
            for p in 0..n {
                ix.insert(PageKey { region: 1, page: p }, [p; 3]);
            }
            let (len, bytes) = (ix.len(), ix.table_bytes());
            assert_eq!(len as u64, n);
            assert!(bytes >= len * entry, "{bytes} bytes for {len} entries");
            assert!(
                bytes <= len * entry * 8 / 3,
                "{bytes} bytes for {len} entries"
            );
        }
    }
}
