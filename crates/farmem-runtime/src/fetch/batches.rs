//! The registry of read-ahead batches in flight: pages locked and read asynchronously, by
//! first page, until whoever reaches one of them first completes the batch
//! (`readahead.rs`). Taking a batch out of the registry is what gives the right to complete
//! it, so it is completed once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

use super::request::{InFlight, Locked};
use crate::regions::RegionInfo;

/// A window of pages being read ahead.
pub(crate) struct Batch {
    pub reg: RegionInfo,
    /// Locked, absent pages in ascending order (not always contiguous).
    pub pages: Vec<Locked>,
    pub read: Option<InFlight>,
    pub prio: u8,
    pub submitted: Instant,
}

impl Batch {
    pub(crate) fn last_vpn(&self) -> usize {
        self.pages.last().expect("non-empty batch").vpn
    }
}

/// The batches in flight of one runtime, by first page.
#[derive(Default)]
pub(crate) struct InFlightSet {
    map: Mutex<BTreeMap<usize, Batch>>,
    count: AtomicUsize,
}

impl InFlightSet {
    /// Nothing in flight (one atomic load: cheap enough for every locked-page encounter).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Batches in flight.
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    pub(crate) fn insert(&self, b: Batch) {
        self.map.lock().insert(b.pages[0].vpn, b);
        self.count.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn take_where(&self, mut pick: impl FnMut(&Batch) -> bool) -> Vec<Batch> {
        let mut m = self.map.lock();
        let keys: Vec<usize> = m.iter().filter(|(_, b)| pick(b)).map(|(&k, _)| k).collect();
        let out: Vec<Batch> = keys.iter().filter_map(|k| m.remove(k)).collect();
        self.count.fetch_sub(out.len(), Ordering::AcqRel);
        out
    }

    /// The batch holding page `vpn`, if one does.
    pub(crate) fn take_covering(&self, vpn: usize) -> Option<Batch> {
        let mut m = self.map.lock();
        let (&k, b) = m.range(..=vpn).next_back()?;
        if vpn > b.last_vpn() || b.pages.binary_search_by_key(&vpn, |l| l.vpn).is_err() {
            return None;
        }
        let b = m.remove(&k);
        self.count.fetch_sub(1, Ordering::AcqRel);
        b
    }
}
