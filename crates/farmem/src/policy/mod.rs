//! Reclaim policies: which resident pages to evict next.
//!
//! A policy only orders pages; the reclaimer (`reclaim.rs`) locks, writes back and unmaps
//! them. Adding a policy means one new module implementing [`Policy`] and one line in
//! [`build`].

mod fifo;

pub use fifo::Fifo;

use crate::config::PolicyKind;

/// Pages are named by their virtual page number (unique across regions).
pub trait Policy: Send {
    /// Pages just became resident; `prio` is the hint's eviction priority (0 if none).
    fn insert(&mut self, vpns: &[usize], prio: u8);

    /// Remove and return up to `n` eviction candidates, best victim first. The reclaimer
    /// hands back the ones it could not evict right now through [`Policy::reinsert`].
    fn take_victims(&mut self, n: usize, out: &mut Vec<usize>);

    /// Return a candidate that could not be evicted now (locked, or kept local because the
    /// far tier was full).
    fn reinsert(&mut self, vpn: usize);

    /// Forget every page in `[first, first + n)` (region destroyed).
    fn remove_range(&mut self, first: usize, n: usize);

    /// Number of pages tracked.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn name(&self) -> &'static str;
}

pub fn build(kind: PolicyKind) -> Box<dyn Policy> {
    match kind {
        PolicyKind::Fifo => Box::new(Fifo::default()),
    }
}
