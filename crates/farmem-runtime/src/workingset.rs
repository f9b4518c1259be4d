//! Hotness for pages no hint touches: the working set, from refault distances.
//!
//! Linux keeps a program's hot pages because the hardware marks every access; farmem sees
//! only the accesses that fault. What it can see is how soon an evicted page comes back.
//! Each eviction advances the eviction clock, and the evicted page keeps the clock's value
//! as its *shadow* (in its page word). When a fault brings it back, the clock's advance since
//! then is its refault distance (Linux's workingset shadow entries): below the budget, one
//! more pass of the policy's hand would have kept it local, so it belongs to the working set.
//!
//! - A recent refault is installed as used, one *level* higher (up to three: recent
//!   refaults in a row), with as many *credits*: extra passes of the hand it survives
//!   unused ([`PageTableUse`] spends them).
//! - Anything else a fault installs (a first touch, an old refault, read-ahead) starts on
//!   probation: idle, evicted at the hand's first pass unless used meanwhile.
//! - Pages fetched for hints start used; the hint already said they matter.
//!
//! Only recency policies (`probation`) use this; FIFO ignores it.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::page::table;
use crate::page::word::{Hotness, PageWord, MAX_LEVEL, SHADOW_BITS};
use crate::policy::UseBits;

/// The eviction clock and the rules that read it.
pub(crate) struct WorkingSet {
    /// Pages evicted so far, from 1: a shadow of 0 means "never evicted".
    clock: AtomicU64,
    /// The policy orders by recency, so a fault's page may start on probation.
    probation: bool,
    /// The local budget, in pages: the refault distance that still counts as recent.
    budget: usize,
}

impl WorkingSet {
    pub(crate) fn new(probation: bool, budget: usize) -> WorkingSet {
        WorkingSet {
            clock: AtomicU64::new(1),
            probation,
            budget,
        }
    }

    /// The clock stamp for `n` pages being evicted now (each keeps it as its shadow).
    pub(crate) fn stamp_evictions(&self, n: usize) -> u64 {
        self.clock.fetch_add(n as u64, Ordering::Relaxed) & ((1 << SHADOW_BITS) - 1)
    }

    /// How a page that a fault installs starts, given its word before the fetch; the
    /// second value says whether it was a recent refault (for the statistics).
    pub(crate) fn at_fault_install(&self, old: PageWord) -> (Hotness, bool) {
        if !self.probation {
            return (Hotness::Used, false);
        }
        let clock = self.clock.load(Ordering::Relaxed);
        let recent = recent_refault(old, clock, self.budget);
        (hotness(old, recent), recent)
    }
}

/// Was a page evicted so recently that it belongs to the working set? Its refault distance
/// (pages evicted since it was) is below the budget: with one more pass of the hand it would
/// still have been local.
fn recent_refault(old: PageWord, clock: u64, budget: usize) -> bool {
    let bits = (1u64 << SHADOW_BITS) - 1;
    let shadow = old.shadow();
    old.has_far_copy() && shadow != 0 && (clock.wrapping_sub(shadow) & bits) < budget as u64
}

/// A recent refault goes up a level (up to `MAX_LEVEL`), with as many extra passes of the
/// hand, starting as used; any other page starts over at level 0, on probation.
fn hotness(old: PageWord, recent: bool) -> Hotness {
    if recent {
        Hotness::WorkingSet((old.level() + 1).min(MAX_LEVEL))
    } else {
        Hotness::Probation
    }
}

/// The use bits policies read: the page word's idle mark, which any hint or fault clears,
/// and the working-set credit.
pub(crate) struct PageTableUse;

impl UseBits for PageTableUse {
    fn used_since_last_look(&self, vpn: usize) -> bool {
        table::slot(vpn).update(PageWord::passed_by_hand)
    }

    fn watch(&self, vpn: usize) -> u8 {
        let slot = table::slot(vpn);
        slot.update(PageWord::watched);
        slot.load().prio()
    }

    fn level(&self, vpn: usize) -> u8 {
        table::slot(vpn).load().level()
    }

    fn present(&self, vpn: usize) -> bool {
        table::slot(vpn).load().is_present()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page::word::Access;

    fn evicted_at(stamp: u64) -> PageWord {
        PageWord::FRESH
            .installed(Access::Written, 0, Hotness::Used)
            .evicting()
            .evicted(stamp)
    }

    #[test]
    fn refault_distance_below_the_budget_is_the_working_set() {
        let budget = 1000;
        assert!(recent_refault(evicted_at(5000), 5999, budget));
        assert!(
            !recent_refault(evicted_at(5000), 6000, budget),
            "a full budget ago"
        );
        let top = (1 << SHADOW_BITS) - 10;
        assert!(
            recent_refault(evicted_at(top), (1 << SHADOW_BITS) + 100, budget),
            "the clock wraps"
        );
        assert!(
            !recent_refault(evicted_at(0), 10, budget),
            "no shadow: never evicted (or discarded)"
        );
        let clean = PageWord::FRESH
            .installed(Access::Protected, 0, Hotness::Used)
            .evicting()
            .evicted(5000);
        assert!(
            !recent_refault(clean, 5001, budget),
            "a page with no far copy was not evicted with its data"
        );
    }

    #[test]
    fn recent_refaults_in_a_row_earn_more_passes() {
        assert_eq!(hotness(PageWord::FRESH, false), Hotness::Probation);
        let mut w = evicted_at(1);
        for expect in [1, 2, 3, 3] {
            let h = hotness(w, true);
            assert_eq!(h, Hotness::WorkingSet(expect));
            let local = w.installed(Access::Protected, 0, h);
            assert!(!local.is_idle(), "a working-set page starts used");
            assert_eq!((local.level(), local.credit()), (expect, expect));
            w = local.evicting().evicted(7);
            assert_eq!(w.level(), expect, "the level stays while far");
        }
        assert_eq!(
            hotness(w, false),
            Hotness::Probation,
            "an old refault starts over"
        );
        let restarted = w.installed(Access::Protected, 0, hotness(w, false));
        assert_eq!(restarted.level(), 0);
    }

    #[test]
    fn without_recency_every_page_starts_used() {
        let ws = WorkingSet::new(false, 100);
        assert_eq!(ws.at_fault_install(evicted_at(1)), (Hotness::Used, false));
        let ws = WorkingSet::new(true, 100);
        let stamp = ws.stamp_evictions(1);
        assert_eq!(
            ws.at_fault_install(evicted_at(stamp)),
            (Hotness::WorkingSet(1), true)
        );
    }
}
