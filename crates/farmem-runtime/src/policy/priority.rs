//! Priority: the hint's `ev_prio` (0..=7) sorts pages into levels; the highest non-empty level
//! is evicted first, with second chance inside a level. This generalizes AIFM's non-temporal
//! access: data read once (a scan's objects) goes before the index that every request uses.

use std::collections::HashMap;

use super::clock::Ring;
use super::interface::{Policy, UseBits};

const LEVELS: usize = 8;

#[derive(Default)]
pub struct Priority {
    levels: [Ring; LEVELS],
    /// Level of each page handed out by the last `take_victims`, so that one the reclaimer
    /// could not evict goes back to its own level.
    last_taken: HashMap<usize, u8>,
}

impl Policy for Priority {
    fn insert(&mut self, vpns: &[usize], prio: u8) {
        self.levels[(prio as usize).min(LEVELS - 1)].extend(vpns);
    }

    fn take_victims(&mut self, n: usize, out: &mut Vec<usize>, bits: &dyn UseBits) {
        self.last_taken.clear();
        let mut taken = 0;
        for level in (0..LEVELS).rev() {
            if taken == n {
                break;
            }
            let from = out.len();
            taken += self.levels[level].take(n - taken, out, bits);
            for &v in &out[from..] {
                self.last_taken.insert(v, level as u8);
            }
        }
    }

    fn reinsert(&mut self, vpn: usize) {
        let level = self.last_taken.get(&vpn).copied().unwrap_or(0) as usize;
        self.levels[level].push(vpn);
    }

    fn remove_range(&mut self, first: usize, n: usize) {
        for l in &mut self.levels {
            l.remove_range(first, n);
        }
        self.last_taken.retain(|&v, _| v < first || v >= first + n);
    }

    fn len(&self) -> usize {
        self.levels.iter().map(Ring::len).sum()
    }

    fn name(&self) -> &'static str {
        "priority"
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{take, FakeBits};
    use super::*;

    #[test]
    fn higher_levels_go_first_with_second_chance_inside_a_level() {
        let bits = FakeBits::default();
        let mut p = Priority::default();
        p.insert(&[1, 2, 3], 0); // an index, hint without ev_prio
        p.insert(&[10, 11, 12], 5); // objects read once
        p.insert(&[20], 2);
        bits.touch(&[1, 2, 3, 10, 11, 12, 20]);
        // Level 5 first: a turn marks 10 11 12, then they go in ring order.
        assert_eq!(take(&mut p, 2, &bits), [10, 11]);
        bits.touch(&[12]);
        // 12 was used again: a second chance, but level 5 still goes before level 2.
        assert_eq!(take(&mut p, 2, &bits), [12, 20]);
        assert_eq!(take(&mut p, 1, &bits), [1]);
        bits.touch(&[2]);
        // Inside level 0, the page used since the hand passed goes last.
        assert_eq!(take(&mut p, 2, &bits), [3, 2]);
        assert!(p.is_empty());
    }

    #[test]
    fn a_busy_victim_returns_to_its_level() {
        let bits = FakeBits::default();
        let mut p = Priority::default();
        p.insert(&[1], 0);
        p.insert(&[7], 7);
        assert_eq!(take(&mut p, 1, &bits), [7]);
        p.reinsert(7);
        assert_eq!(take(&mut p, 1, &bits), [7]);
        p.remove_range(7, 1);
        assert_eq!(take(&mut p, 5, &bits), [1]);
    }
}
