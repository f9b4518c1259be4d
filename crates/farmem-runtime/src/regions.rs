//! Where a runtime's regions are: each region's place ([`RegionInfo`], copied freely), and
//! the map from addresses to regions that every path consults.

use std::collections::BTreeMap;

use farmem_sys::mem::{PAGE_SHIFT, PAGE_SIZE};
use parking_lot::RwLock;

/// Where a region lives (copied freely; the [`crate::Region`] handle owns the mapping).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionInfo {
    pub id: u32,
    pub base: usize,
    pub npages: usize,
    /// Placed inside a reservation of the caller's (`Runtime::create_region_at`): on
    /// teardown the range goes back to an inaccessible reservation instead of being unmapped.
    pub fixed: bool,
}

impl RegionInfo {
    pub fn end(&self) -> usize {
        self.base + self.npages * PAGE_SIZE
    }

    pub fn first_vpn(&self) -> usize {
        self.base >> PAGE_SHIFT
    }

    pub fn end_vpn(&self) -> usize {
        self.first_vpn() + self.npages
    }

    /// Page index within the region (the backend's key) of a virtual page number.
    pub fn index_of(&self, vpn: usize) -> u64 {
        (vpn - self.first_vpn()) as u64
    }
}

/// A runtime's live regions, by base address.
#[derive(Default)]
pub(crate) struct Regions {
    map: RwLock<BTreeMap<usize, RegionInfo>>,
}

impl Regions {
    /// The region containing `addr`.
    pub(crate) fn containing(&self, addr: usize) -> Option<RegionInfo> {
        let regions = self.map.read();
        let (_, r) = regions.range(..=addr).next_back()?;
        (addr < r.end()).then_some(*r)
    }

    /// The regions overlapping `[addr, end)`.
    pub(crate) fn overlapping(&self, addr: usize, end: usize) -> Vec<RegionInfo> {
        self.map
            .read()
            .range(..end)
            .map(|(_, r)| *r)
            .filter(|r| r.end() > addr)
            .collect()
    }

    /// The pages of `[addr, end)` (partial pages at the ends included) in each region it
    /// overlaps: `(first, end)` page numbers, one run per region.
    pub(crate) fn page_runs(&self, addr: usize, end: usize) -> Vec<(usize, usize)> {
        self.overlapping(addr, end)
            .into_iter()
            .map(|r| {
                (
                    addr.max(r.base) / PAGE_SIZE,
                    end.min(r.end()).div_ceil(PAGE_SIZE),
                )
            })
            .filter(|(f, e)| f < e)
            .collect()
    }

    pub(crate) fn all(&self) -> Vec<RegionInfo> {
        self.map.read().values().copied().collect()
    }

    pub(crate) fn insert(&self, info: RegionInfo) {
        self.map.write().insert(info.base, info);
    }

    pub(crate) fn remove(&self, base: usize) {
        self.map.write().remove(&base);
    }

    /// Look up many pages under one read lock.
    pub(crate) fn with<T>(&self, f: impl FnOnce(&RegionsView<'_>) -> T) -> T {
        let g = self.map.read();
        f(&RegionsView { map: &g })
    }
}

/// The regions under one read lock.
pub(crate) struct RegionsView<'a> {
    map: &'a BTreeMap<usize, RegionInfo>,
}

impl RegionsView<'_> {
    /// The region containing page `vpn`.
    pub(crate) fn containing_vpn(&self, vpn: usize) -> Option<RegionInfo> {
        let (_, r) = self.map.range(..=vpn * PAGE_SIZE).next_back()?;
        (vpn < r.end_vpn()).then_some(*r)
    }
}
