//! Deferred bookkeeping (PFA's batched bookkeeping): what the fetch path would otherwise do
//! under shared locks — handing new pages to the reclaim policy and recording its latency in
//! the histogram — goes into per-thread queues instead, drained in batches by the control
//! thread (and by any reclaimer before it picks victims, so no resident page is invisible to
//! reclaim when it matters).
//!
//! A queue is a shard picked by the thread's owner id: the fault thread and each hinting
//! thread usually own one alone, so pushing is an uncontended lock and a `Vec` push. A
//! thread that stops fetching leaves its entries for the next drain, never lost.

use parking_lot::Mutex;

use crate::policy::Policy;
use crate::stats::Stats;
use crate::workingset::PageTableUse;

const SHARDS: usize = 16;
/// Entries after which the pushing thread asks the control thread to drain.
pub(crate) const DRAIN_AT: usize = 512;

#[derive(Default)]
struct Queue {
    /// Pages that became resident, with the eviction priority they were fetched with and
    /// whether a fault or hint demanded them (else read ahead).
    inserted: Vec<(usize, u8, bool)>,
    /// Fetch latencies to record, in nanoseconds.
    fetch_ns: Vec<u64>,
}

/// Keeps shards a cache line apart: two threads pushing never share a line.
#[repr(align(128))]
#[derive(Default)]
struct Shard(Mutex<Queue>);

pub(crate) struct Book {
    shards: Vec<Shard>,
}

impl Default for Book {
    fn default() -> Self {
        Book {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
        }
    }
}

impl Book {
    fn mine(&self) -> &Mutex<Queue> {
        &self.shards[crate::page::table::owner_id() as usize % SHARDS].0
    }

    /// Pages were installed with priority `prio`, each with whether it was demanded (by a
    /// fault or hint) or read ahead, by a fetch that took `ns` nanoseconds (none for
    /// prefetches completed later). Returns true when this thread's queue is long enough
    /// that the control thread should drain it.
    pub(crate) fn note_fetched(
        &self,
        pages: impl Iterator<Item = (usize, bool)>,
        prio: u8,
        ns: Option<u64>,
    ) -> bool {
        let mut q = self.mine().lock();
        q.inserted
            .extend(pages.map(|(v, demanded)| (v, prio, demanded)));
        q.fetch_ns.extend(ns);
        q.inserted.len() >= DRAIN_AT
    }

    /// Hand every queued page to the policy and every latency to the histogram. The caller
    /// holds the policy lock, so the pages are visible to it before it picks victims.
    pub(crate) fn drain(&self, policy: &mut dyn Policy, stats: &Stats) -> usize {
        let mut moved = 0;
        let mut vpns = Vec::new();
        for s in &self.shards {
            let (inserted, fetch_ns) = {
                let mut q = s.0.lock();
                if q.inserted.is_empty() && q.fetch_ns.is_empty() {
                    continue;
                }
                (
                    std::mem::take(&mut q.inserted),
                    std::mem::take(&mut q.fetch_ns),
                )
            };
            moved += inserted.len();
            // Consecutive entries of one kind go to the policy as one slice.
            let mut i = 0;
            while i < inserted.len() {
                let (_, prio, demanded) = inserted[i];
                vpns.clear();
                while i < inserted.len() && (inserted[i].1, inserted[i].2) == (prio, demanded) {
                    vpns.push(inserted[i].0);
                    i += 1;
                }
                policy.insert_missed(&vpns, prio, demanded, &PageTableUse);
            }
            stats.record_fetches(&fetch_ns);
        }
        moved
    }

    /// Entries waiting, for tests and diagnostics.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.shards.iter().map(|s| s.0.lock().inserted.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PolicyKind;

    #[test]
    fn drained_pages_reach_the_policy_in_order_with_their_priority() {
        let book = Book::default();
        let stats = Stats::default();
        let mut p = crate::policy::build(PolicyKind::Fifo);
        book.note_fetched([10, 11, 12].map(|v| (v, true)).into_iter(), 0, Some(1000));
        std::thread::scope(|s| {
            s.spawn(|| book.note_fetched([50, 51].map(|v| (v, false)).into_iter(), 3, Some(2000)));
        });
        assert_eq!(book.queued(), 5);
        assert!(p.is_empty(), "nothing reaches the policy before a drain");
        assert_eq!(book.drain(p.as_mut(), &stats), 5);
        assert_eq!(book.queued(), 0);
        assert_eq!(p.len(), 5);
        let mut out = Vec::new();
        p.take_victims(5, &mut out, &crate::policy::testing::FakeBits::default());
        out.sort_unstable();
        assert_eq!(out, vec![10, 11, 12, 50, 51]);
        assert_eq!(stats.snapshot().fetch_max_ns / 100, 2000 / 100);
    }

    #[test]
    fn a_long_queue_asks_for_a_drain() {
        let book = Book::default();
        assert!(!book.note_fetched((0..10).map(|v| (v, true)), 0, None));
        assert!(book.note_fetched((10..DRAIN_AT + 10).map(|v| (v, true)), 0, None));
    }
}
