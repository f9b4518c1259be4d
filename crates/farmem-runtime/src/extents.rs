//! Where the program's allocations end, as its allocator tells (`Runtime::mark_allocated`).
//!
//! A fault's read-ahead may zero-fill fresh pages ahead of a stream of first touches, so
//! that memory being filled faults once per window instead of once per page. Past the end
//! of an allocation that speculation only costs: the pages are never touched (the room left
//! after a large block to grow into), yet they take the budget like real ones. Inside a
//! known allocation the window may run to its end; elsewhere it stays within a small block
//! around the fault (`fetch::demand`).

use std::collections::BTreeMap;

use parking_lot::RwLock;

/// Allocated page ranges: first vpn -> end vpn (exclusive), never overlapping.
#[derive(Default)]
pub(crate) struct Extents {
    map: RwLock<BTreeMap<usize, usize>>,
}

impl Extents {
    /// `[first, end)` is allocated (it replaces whatever was recorded over it).
    pub(crate) fn note(&self, first: usize, end: usize) {
        if first >= end {
            return;
        }
        let mut m = self.map.write();
        crate::disjoint::take(&mut m, first, end);
        m.insert(first, end);
    }

    /// `[first, end)` is no longer allocated.
    pub(crate) fn forget(&self, first: usize, end: usize) {
        if first < end {
            crate::disjoint::take(&mut self.map.write(), first, end);
        }
    }

    /// The allocated range holding `vpn`, if one is known.
    pub(crate) fn around(&self, vpn: usize) -> Option<std::ops::Range<usize>> {
        let m = self.map.read();
        let (&s, &e) = m.range(..=vpn).next_back()?;
        (vpn < e).then_some(s..e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_noted_trimmed_split_and_forgotten() {
        let x = Extents::default();
        x.note(10, 20);
        x.note(30, 40);
        assert_eq!(x.around(10), Some(10..20));
        assert_eq!(x.around(19), Some(10..20));
        assert_eq!(x.around(20), None);
        assert_eq!(x.around(9), None);
        // Freeing the middle of one splits it.
        x.forget(33, 35);
        assert_eq!(x.around(32), Some(30..33));
        assert_eq!(x.around(34), None);
        assert_eq!(x.around(35), Some(35..40));
        // A block grown in place is noted again over itself.
        x.note(10, 25);
        assert_eq!(x.around(24), Some(10..25));
        // Shrunk: the tail is forgotten.
        x.forget(15, 25);
        assert_eq!(x.around(14), Some(10..15));
        assert_eq!(x.around(15), None);
        // A range over several is cut out of all of them.
        x.note(0, 100);
        x.forget(5, 95);
        assert_eq!(x.around(4), Some(0..5));
        assert_eq!(x.around(50), None);
        assert_eq!(x.around(95), Some(95..100));
        x.forget(0, 100);
        assert_eq!(x.around(0), None);
        assert_eq!(x.around(99), None);
    }
}
