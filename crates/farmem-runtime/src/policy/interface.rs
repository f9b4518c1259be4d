//! What a reclaim policy is, and where it learns about use.

/// Where a policy learns whether a page was used since it last looked.
pub(crate) trait UseBits {
    /// Was `vpn` used since the previous call for it (or since it became resident)? Marks it
    /// idle, so that the next call answers for the time from now on.
    fn used_since_last_look(&self, vpn: usize) -> bool;

    /// The eviction priority of the last hint that fetched `vpn` or reported its use; marks
    /// it idle, so that the next hint on it reports again. For the priority policy's hand
    /// that sorts pages which became resident without a hint.
    fn watch(&self, vpn: usize) -> u8;

    /// The page's working-set level: recent refaults in a row when it was last installed
    /// (0: it came back long after its eviction, or was never evicted).
    fn level(&self, _vpn: usize) -> u8 {
        0
    }

    /// Is the page resident? Policies keep entries of pages discarded since they arrived
    /// (the reclaimer forgets them when they come up); one that holds pages apart from its
    /// hand checks now and then.
    fn present(&self, _vpn: usize) -> bool {
        true
    }
}

/// Pages are named by their virtual page number (unique across regions).
pub(crate) trait Policy: Send {
    /// Pages just became resident; `prio` is the hint's eviction priority (0 if none).
    fn insert(&mut self, vpns: &[usize], prio: u8);

    /// Pages just became resident through a miss: a fetch or a first touch, `demanded` by
    /// a fault or hint or else read ahead (`bits` tells their working-set level). Policies
    /// that do not learn from misses take them as [`Policy::insert`].
    fn insert_missed(&mut self, vpns: &[usize], prio: u8, _demanded: bool, _bits: &dyn UseBits) {
        self.insert(vpns, prio);
    }

    /// Pages held in a protected band (see `dueling.rs`; entries of pages discarded since
    /// included).
    fn protected(&self) -> usize {
        0
    }

    /// Remove and return up to `n` eviction candidates, best victim first. The reclaimer
    /// hands back the ones it could not evict right now through [`Policy::reinsert`].
    fn take_victims(&mut self, n: usize, out: &mut Vec<usize>, bits: &dyn UseBits);

    /// Remove every page, best victim first, none of them to be reinserted (a fork sets
    /// them all aside: `inherited.rs`).
    fn take_all(&mut self, out: &mut Vec<usize>, bits: &dyn UseBits) {
        let n = self.len();
        self.take_victims(n, out, bits);
    }

    /// Return a candidate that could not be evicted now (locked, or kept local because the
    /// far tier was full).
    fn reinsert(&mut self, vpn: usize);

    /// Forget every page in `[first, first + n)` (region destroyed).
    fn remove_range(&mut self, first: usize, n: usize);

    /// Number of pages tracked.
    fn len(&self) -> usize;

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn name(&self) -> &'static str;
}
