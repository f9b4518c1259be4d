//! Reclaim policies: which resident pages to evict next.
//!
//! A policy only orders pages; the reclaimer (`reclaim.rs`) locks, writes back and unmaps
//! them. Adding a policy means one new module implementing [`Policy`] and one line in
//! [`build`].
//!
//! Recency comes from the page table's `IDLE` bit, through [`UseBits`]: a policy's hand marks
//! a page idle when it passes it, and any hint or fault on the page clears the mark. A page
//! still idle when the hand comes back was not used in between.

mod clock;
mod fifo;
mod lru;
mod priority;

pub use clock::SecondChance;
pub use fifo::Fifo;
pub use lru::Lru;
pub use priority::Priority;

use std::sync::atomic::Ordering;

use crate::config::PolicyKind;
use crate::page_table::{self as pt, CREDIT_MASK, CREDIT_SHIFT, IDLE, REGISTERED};

/// Where a policy learns whether a page was used since it last looked.
pub trait UseBits {
    /// Was `vpn` used since the previous call for it (or since it became resident)? Marks it
    /// idle, so that the next call answers for the time from now on.
    fn used_since_last_look(&self, vpn: usize) -> bool;
}

/// The real source: the page table's `IDLE` bit.
pub struct PageTableBits;

impl UseBits for PageTableBits {
    fn used_since_last_look(&self, vpn: usize) -> bool {
        let w = pt::entry(vpn);
        let mut cur = w.load(Ordering::Acquire);
        loop {
            let new = if cur & REGISTERED == 0 {
                return false; // its region is gone: nothing to mark, evict (forget) it
            } else if cur & IDLE == 0 {
                cur | IDLE
            } else if cur & CREDIT_MASK != 0 {
                // Not used since, but a working-set page (recent refaults): one pass less.
                cur - (1 << CREDIT_SHIFT)
            } else {
                return false;
            };
            match w.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(c) => cur = c,
            }
        }
    }
}

/// Pages are named by their virtual page number (unique across regions).
pub trait Policy: Send {
    /// Pages just became resident; `prio` is the hint's eviction priority (0 if none).
    fn insert(&mut self, vpns: &[usize], prio: u8);

    /// Remove and return up to `n` eviction candidates, best victim first. The reclaimer
    /// hands back the ones it could not evict right now through [`Policy::reinsert`].
    fn take_victims(&mut self, n: usize, out: &mut Vec<usize>, bits: &dyn UseBits);

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
        PolicyKind::SecondChance => Box::new(SecondChance::default()),
        PolicyKind::Lru => Box::new(Lru::default()),
        PolicyKind::Priority => Box::new(Priority::default()),
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use std::cell::RefCell;
    use std::collections::HashSet;

    use super::{Policy, UseBits};

    /// Use bits for policy tests: `touch` marks pages used; a look clears the mark.
    #[derive(Default)]
    pub struct FakeBits {
        used: RefCell<HashSet<usize>>,
    }

    impl FakeBits {
        pub fn touch(&self, vpns: &[usize]) {
            self.used.borrow_mut().extend(vpns.iter().copied());
        }
    }

    impl UseBits for FakeBits {
        fn used_since_last_look(&self, vpn: usize) -> bool {
            self.used.borrow_mut().remove(&vpn)
        }
    }

    /// The victims a policy picks next.
    pub fn take(p: &mut dyn Policy, n: usize, bits: &FakeBits) -> Vec<usize> {
        let mut v = Vec::new();
        p.take_victims(n, &mut v, bits);
        v
    }
}
