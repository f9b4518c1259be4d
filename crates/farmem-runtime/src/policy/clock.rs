//! Second chance (clock): pages wait in arrival order; the hand gives a page used since it
//! last passed another round (marking it idle) and evicts the first idle one.

use std::collections::VecDeque;

use super::interface::{Policy, UseBits};

/// One clock ring, shared by `second-chance` and each level of `priority`.
#[derive(Default)]
pub(super) struct Ring {
    q: VecDeque<usize>,
}

impl Ring {
    pub fn push(&mut self, vpn: usize) {
        self.q.push_back(vpn);
    }

    pub fn extend(&mut self, vpns: &[usize]) {
        self.q.extend(vpns.iter().copied());
    }

    pub fn len(&self) -> usize {
        self.q.len()
    }

    pub fn pop_front(&mut self) -> Option<usize> {
        self.q.pop_front()
    }

    pub fn remove_range(&mut self, first: usize, n: usize) {
        self.q.retain(|&v| v < first || v >= first + n);
    }

    /// Move up to `n` victims to `out`; returns how many. After two full turns of the hand
    /// without finding enough idle pages (everything is in use right now) it takes pages in
    /// ring order anyway: reclaim must make progress.
    pub fn take(&mut self, n: usize, out: &mut Vec<usize>, bits: &dyn UseBits) -> usize {
        let mut looks = 2 * self.q.len();
        let mut taken = 0;
        while taken < n {
            let Some(v) = self.q.pop_front() else { break };
            if looks > 0 && bits.used_since_last_look(v) {
                looks -= 1;
                self.q.push_back(v);
                continue;
            }
            looks = looks.saturating_sub(1);
            out.push(v);
            taken += 1;
        }
        taken
    }
}

#[derive(Default)]
pub struct SecondChance {
    ring: Ring,
}

impl Policy for SecondChance {
    fn insert(&mut self, vpns: &[usize], _prio: u8) {
        self.ring.extend(vpns);
    }

    fn take_victims(&mut self, n: usize, out: &mut Vec<usize>, bits: &dyn UseBits) {
        self.ring.take(n, out, bits);
    }

    fn reinsert(&mut self, vpn: usize) {
        self.ring.push(vpn);
    }

    fn remove_range(&mut self, first: usize, n: usize) {
        self.ring.remove_range(first, n);
    }

    fn len(&self) -> usize {
        self.ring.len()
    }

    fn name(&self) -> &'static str {
        "second-chance"
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{take, FakeBits};
    use super::*;

    #[test]
    fn used_pages_get_a_second_chance() {
        let bits = FakeBits::default();
        let mut p = SecondChance::default();
        p.insert(&[1, 2, 3, 4, 5, 6], 0);
        // Installing is a use: the first turn of the hand only marks them.
        bits.touch(&[1, 2, 3, 4, 5, 6]);
        assert_eq!(take(&mut p, 1, &bits), [1]);
        // Ring now 2 3 4 5 6, all marked idle. 2 and 4 are used again.
        bits.touch(&[2, 4]);
        assert_eq!(take(&mut p, 3, &bits), [3, 5, 6]);
        // Ring: 2 4 (both marked again by the pass). 7 arrives, used.
        p.insert(&[7], 0);
        bits.touch(&[7]);
        assert_eq!(take(&mut p, 2, &bits), [2, 4]);
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn all_pages_busy_still_yields_victims_in_ring_order() {
        // A source that always says "used": the hand gives up after two turns.
        struct AlwaysUsed;
        impl UseBits for AlwaysUsed {
            fn used_since_last_look(&self, _vpn: usize) -> bool {
                true
            }

            fn watch(&self, _vpn: usize) -> u8 {
                0
            }
        }
        let mut p = SecondChance::default();
        p.insert(&[1, 2, 3], 0);
        let mut v = Vec::new();
        p.take_victims(2, &mut v, &AlwaysUsed);
        assert_eq!(v, [1, 2]);
    }

    #[test]
    fn reinserted_and_removed_pages() {
        let bits = FakeBits::default();
        let mut p = SecondChance::default();
        p.insert(&[10, 11, 12, 20, 21], 0);
        assert_eq!(take(&mut p, 1, &bits), [10]);
        p.reinsert(10); // busy: back of the ring
        p.remove_range(20, 2);
        assert_eq!(take(&mut p, 5, &bits), [11, 12, 10]);
        assert!(p.is_empty());
    }
}
