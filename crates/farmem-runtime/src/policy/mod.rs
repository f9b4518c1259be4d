//! Reclaim policies: which resident pages to evict next.
//!
//! A policy only orders pages; the reclaimer (`reclaim.rs`) locks, writes back and unmaps
//! them. Adding a policy means one new module implementing [`Policy`] and one line in
//! [`build`].
//!
//! Recency comes through [`UseBits`] (in the runtime, the page word's idle mark and
//! working-set credit: `workingset.rs`): a policy's hand marks a page idle when it passes
//! it, and any hint or fault on the page clears the mark. A page still idle when the hand
//! comes back was not used in between.

mod clock;
mod dueling;
mod fifo;
mod interface;
mod lru;
mod priority;

use clock::SecondChance;
use fifo::Fifo;
use lru::Lru;
use priority::Priority;

use crate::config::PolicyKind;
pub(crate) use interface::{Policy, UseBits};

/// The policy a configuration names.
pub(crate) fn build(kind: PolicyKind) -> Box<dyn Policy> {
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
    use std::collections::{HashMap, HashSet};

    use super::{Policy, UseBits};

    /// Use bits for policy tests: `touch` marks pages used; a look clears the mark.
    /// `hint_prio` is a hint's priority reported on a page.
    #[derive(Default)]
    pub struct FakeBits {
        used: RefCell<HashSet<usize>>,
        prio: RefCell<HashMap<usize, u8>>,
        level: RefCell<HashMap<usize, u8>>,
        gone: RefCell<HashSet<usize>>,
    }

    impl FakeBits {
        pub fn touch(&self, vpns: &[usize]) {
            self.used.borrow_mut().extend(vpns.iter().copied());
        }

        /// The page was discarded: no longer resident.
        pub fn discard(&self, vpn: usize) {
            self.gone.borrow_mut().insert(vpn);
        }

        pub fn set_level(&self, vpn: usize, level: u8) {
            self.level.borrow_mut().insert(vpn, level);
        }

        pub fn hint_prio(&self, vpn: usize, prio: u8) {
            self.touch(&[vpn]);
            self.prio.borrow_mut().insert(vpn, prio);
        }
    }

    impl UseBits for FakeBits {
        fn used_since_last_look(&self, vpn: usize) -> bool {
            self.used.borrow_mut().remove(&vpn)
        }

        fn watch(&self, vpn: usize) -> u8 {
            self.prio.borrow().get(&vpn).copied().unwrap_or(0)
        }

        fn level(&self, vpn: usize) -> u8 {
            self.level.borrow().get(&vpn).copied().unwrap_or(0)
        }

        fn present(&self, vpn: usize) -> bool {
            !self.gone.borrow().contains(&vpn)
        }
    }

    /// The victims a policy picks next.
    pub fn take(p: &mut dyn Policy, n: usize, bits: &FakeBits) -> Vec<usize> {
        let mut v = Vec::new();
        p.take_victims(n, &mut v, bits);
        v
    }
}
