//! Priority: the hint's `ev_prio` (0..=7) sorts pages into levels; the highest non-empty level
//! is evicted first, with second chance inside a level. This generalizes AIFM's non-temporal
//! access: data read once (a scan's objects) goes before the index that every request uses.
//!
//! A page gets its level when it becomes resident. Pages a program wrote before it hinted
//! them (a loader filling its objects with plain stores) start at level 0, beside the
//! index, and a hint that finds them resident costs nothing and changes nothing. Level 0 is
//! evicted only when every other level is empty, so those objects stayed local for good,
//! the cold ones included, and the objects that came back through hints churned in what
//! room was left: with a table of 10% of the footprint at 50% local, priority fetched 0.39
//! pages a request against FIFO's 0.04 (`bench kv --modes objprio`, long warm-up). So a
//! second hand sorts level 0, a few pages per victim taken, while the program gives
//! priorities: it marks each page idle, so that the next hint on it reports out of line with
//! its priority (in the page word), and moves pages so reported to their level. Each *area*
//! (aligned [`AREA_PAGES`] pages) remembers the last non-zero priority reported or fetched
//! in it, and the hand moves the area's other pages with it: the cold objects, never hinted
//! again, beside the hot ones.

use std::collections::HashMap;

use super::clock::Ring;
use super::dueling::Dueling;
use super::interface::{Policy, UseBits};

const LEVELS: usize = 8;
/// Pages of an area (256 KiB, aligned): small enough that an index and the objects it
/// points to rarely share one when each is an allocation of its own, large enough that the
/// map stays small (4 K entries per GiB hinted).
const AREA_SHIFT: u32 = 6;
pub(crate) const AREA_PAGES: usize = 1 << AREA_SHIFT;
/// Level-0 pages the hand looks at per victim asked for (and a few more per call).
const LOOKS_PER_VICTIM: usize = 2;

#[derive(Default)]
pub struct Priority {
    /// Level 0: second chance, or with a protected band (`dueling.rs`).
    level0: Dueling,
    /// Levels 1 and up (`upper[0]` is level 1).
    upper: [Ring; LEVELS - 1],
    /// Level of each page handed out by the last `take_victims`, so that one the reclaimer
    /// could not evict goes back to its own level.
    last_taken: HashMap<usize, u8>,
    /// The last non-zero priority given to pages fetched or reported in each area.
    area_prio: HashMap<usize, u8>,
}

impl Priority {
    fn push(&mut self, level: usize, vpn: usize) {
        match level {
            0 => self.level0.push(vpn),
            l => self.upper[l - 1].push(vpn),
        }
    }

    /// Look at up to `looks` pages of level 0 and move those with a priority to its level.
    fn sort_level0(&mut self, looks: usize, bits: &dyn UseBits) {
        // Only a program that gives priorities has pages to sort; the looks of this hand
        // would otherwise only disturb level 0's order.
        if self.area_prio.is_empty() && self.upper.iter().all(|r| r.len() == 0) {
            return;
        }
        for _ in 0..looks.min(self.level0.len()) {
            let Some(v) = self.level0.pop_front() else {
                break;
            };
            let area = v >> AREA_SHIFT;
            let level = match self.area_prio.get(&area) {
                Some(&p) => p,
                None => {
                    let p = bits.watch(v).min(LEVELS as u8 - 1);
                    if p > 0 {
                        self.area_prio.insert(area, p);
                    }
                    p
                }
            };
            self.push(level as usize, v);
        }
    }
}

impl Policy for Priority {
    fn insert(&mut self, vpns: &[usize], prio: u8) {
        let level = (prio as usize).min(LEVELS - 1);
        if level > 0 {
            let mut last = usize::MAX;
            for &v in vpns {
                let area = v >> AREA_SHIFT;
                if area != last {
                    last = area;
                    self.area_prio.insert(area, level as u8);
                }
            }
        }
        match level {
            0 => self.level0.extend(vpns),
            l => self.upper[l - 1].extend(vpns),
        }
    }

    fn insert_missed(&mut self, vpns: &[usize], prio: u8, demanded: bool, bits: &dyn UseBits) {
        if prio == 0 {
            self.level0.insert_missed(vpns, demanded, bits);
        } else {
            self.insert(vpns, prio);
        }
    }

    fn protected(&self) -> usize {
        self.level0.protected()
    }

    fn take_victims(&mut self, n: usize, out: &mut Vec<usize>, bits: &dyn UseBits) {
        self.sort_level0(LOOKS_PER_VICTIM * n + 16, bits);
        // A batch is at most a few hundred pages: a map once grown far larger goes.
        if self.last_taken.capacity() > 4 * n.max(1024) {
            self.last_taken = HashMap::new();
        }
        self.last_taken.clear();
        let mut taken = 0;
        for level in (0..LEVELS).rev() {
            if taken == n {
                break;
            }
            let from = out.len();
            taken += match level {
                0 => self.level0.take(n - taken, out, bits),
                l => self.upper[l - 1].take(n - taken, out, bits),
            };
            for &v in &out[from..] {
                self.last_taken.insert(v, level as u8);
            }
        }
    }

    /// Every level in turn, highest first, with no record of each page's level (none comes
    /// back): at a fork with 512 MiB resident, recording them in `last_taken` took ~17 ms
    /// of the parent's first `fork()` (26 ms against 8.5 natively) and left a map of 131 K
    /// entries behind.
    fn take_all(&mut self, out: &mut Vec<usize>, bits: &dyn UseBits) {
        self.last_taken = HashMap::new();
        for level in (1..LEVELS).rev() {
            let ring = &mut self.upper[level - 1];
            let n = ring.len();
            ring.take(n, out, bits);
        }
        let n = self.level0.len();
        self.level0.take(n, out, bits);
    }

    fn reinsert(&mut self, vpn: usize) {
        let level = self.last_taken.get(&vpn).copied().unwrap_or(0) as usize;
        self.push(level, vpn);
    }

    fn remove_range(&mut self, first: usize, n: usize) {
        self.level0.remove_range(first, n);
        for l in &mut self.upper {
            l.remove_range(first, n);
        }
        self.last_taken.retain(|&v, _| v < first || v >= first + n);
        // Areas wholly inside the range are gone (a new mapping there starts unhinted).
        let (a0, a1) = (first.div_ceil(AREA_PAGES), (first + n) >> AREA_SHIFT);
        if a1 > a0 {
            self.area_prio.retain(|&a, _| a < a0 || a >= a1);
        }
    }

    fn len(&self) -> usize {
        self.level0.len() + self.upper.iter().map(Ring::len).sum::<usize>()
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
        // Each kind of page in an area of its own.
        let (o, s) = (2 * AREA_PAGES, 3 * AREA_PAGES);
        p.insert(&[1, 2, 3], 0); // an index, hint without ev_prio
        p.insert(&[o, o + 1, o + 2], 5); // objects read once
        p.insert(&[s], 2);
        bits.touch(&[1, 2, 3, o, o + 1, o + 2, s]);
        // Level 5 first: a turn marks the objects, then they go in ring order.
        assert_eq!(take(&mut p, 2, &bits), [o, o + 1]);
        bits.touch(&[o + 2]);
        // o + 2 was used again: a second chance, but level 5 still goes before level 2.
        assert_eq!(take(&mut p, 2, &bits), [o + 2, s]);
        assert_eq!(take(&mut p, 1, &bits), [1]);
        bits.touch(&[2]);
        // Inside level 0, the page used since the hand passed goes last.
        assert_eq!(take(&mut p, 2, &bits), [3, 2]);
        assert!(p.is_empty());
    }

    /// A fork takes every page, highest level first, and keeps no record of them.
    #[test]
    fn take_all_empties_every_level_highest_first() {
        let bits = FakeBits::default();
        let mut p = Priority::default();
        let (o, s) = (2 * AREA_PAGES, 3 * AREA_PAGES);
        p.insert(&[1, 2, 3], 0);
        p.insert(&[o, o + 1], 5);
        p.insert(&[s], 2);
        // A batch taken before leaves its record; taking all clears it.
        let mut first = Vec::new();
        p.take_victims(1, &mut first, &bits);
        assert_eq!(first, [o]);
        let mut out = Vec::new();
        p.take_all(&mut out, &bits);
        assert_eq!(out, [o + 1, s, 1, 2, 3]);
        assert!(p.is_empty());
        assert!(p.last_taken.is_empty());
    }

    #[test]
    fn unhinted_pages_of_an_area_hinted_with_a_priority_join_its_level() {
        let bits = FakeBits::default();
        let mut p = Priority::default();
        let objects = 10 * AREA_PAGES;
        let index = 20 * AREA_PAGES;
        // A loader wrote objects and an index with plain stores: all level 0, objects first.
        let loaded: Vec<usize> = (objects..objects + 8).chain(index..index + 8).collect();
        p.insert(&loaded, 0);
        // An object hinted with priority 3 came back from far memory.
        p.insert(&[objects + 40], 3);
        bits.touch(&[objects + 40]);
        // The hand moves the objects' loaded pages up: they go before the index, and the
        // used object gets its second chance after them.
        let v = take(&mut p, 9, &bits);
        assert_eq!(
            v,
            (objects..objects + 8)
                .chain([objects + 40])
                .collect::<Vec<_>>()
        );
        assert_eq!(
            take(&mut p, 8, &bits),
            (index..index + 8).collect::<Vec<_>>()
        );
        // An area's priority goes with its mapping.
        p.remove_range(objects, AREA_PAGES);
        assert!(p.area_prio.is_empty());
    }

    #[test]
    fn a_resident_page_a_hint_reports_with_a_priority_moves_to_its_level() {
        let bits = FakeBits::default();
        let mut p = Priority::default();
        let (objects, index, other) = (10 * AREA_PAGES, 20 * AREA_PAGES, 30 * AREA_PAGES);
        p.insert(&[objects, objects + 1, index], 0);
        // Nothing has a priority yet: the sorting hand stays still.
        assert_eq!(take(&mut p, 1, &bits), [objects]);
        p.insert(&[objects], 0);
        // An object elsewhere came back with priority 2: from now on level 0 is sorted.
        p.insert(&[other], 2);
        bits.touch(&[other]);
        // A hint reported objects + 1 with priority 4: it moves to level 4, and its area's
        // other page with it; the index stays. The reported page was used: it goes second.
        bits.hint_prio(objects + 1, 4);
        assert_eq!(take(&mut p, 1, &bits), [objects]);
        assert_eq!(take(&mut p, 1, &bits), [objects + 1]);
        assert_eq!(take(&mut p, 2, &bits), [other, index]);
    }

    #[test]
    fn a_busy_victim_returns_to_its_level() {
        let bits = FakeBits::default();
        let mut p = Priority::default();
        let other = 5 * AREA_PAGES; // an area of its own: level 0 stays level 0
        p.insert(&[other], 0);
        p.insert(&[7], 7);
        assert_eq!(take(&mut p, 1, &bits), [7]);
        p.reinsert(7);
        assert_eq!(take(&mut p, 1, &bits), [7]);
        p.remove_range(7, 1);
        assert_eq!(take(&mut p, 5, &bits), [other]);
    }
}
