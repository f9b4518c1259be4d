//! LRU approximated by generations (as Eden's LRU keeps lists by recency epoch): new pages
//! enter the youngest generation; the hand evicts from the oldest one, sending a page used
//! since it last looked back to the youngest. When the oldest generation is empty an epoch
//! ends: pages used during it become the youngest generation and the others age by one, so
//! a page's generation says in which of the last `GENERATIONS` epochs it was last seen used
//! (second chance only knows "since the hand passed").

use std::collections::VecDeque;

use super::interface::{Policy, UseBits};

const GENERATIONS: usize = 4;

#[derive(Default)]
pub struct Lru {
    /// `gens[0]` is the youngest.
    gens: [VecDeque<usize>; GENERATIONS],
}

impl Lru {
    /// An epoch ends (the oldest generation is empty): pages used since they were last
    /// looked at become the youngest generation, every other page ages by one.
    fn age(&mut self, bits: &dyn UseBits) -> bool {
        if self.gens.iter().all(VecDeque::is_empty) {
            return false;
        }
        let oldest = GENERATIONS - 1;
        debug_assert!(self.gens[oldest].is_empty());
        let mut fresh = VecDeque::new();
        for g in self.gens[..oldest].iter_mut().rev() {
            g.retain(|&v| {
                let used = bits.used_since_last_look(v);
                if used {
                    fresh.push_back(v);
                }
                !used
            });
        }
        self.gens.rotate_right(1); // the empty oldest becomes the youngest slot
        self.gens[0] = fresh;
        true
    }
}

impl Policy for Lru {
    fn insert(&mut self, vpns: &[usize], _prio: u8) {
        self.gens[0].extend(vpns.iter().copied());
    }

    fn take_victims(&mut self, n: usize, out: &mut Vec<usize>, bits: &dyn UseBits) {
        let oldest = GENERATIONS - 1;
        // Two looks per page at most, then take pages in age order (reclaim must progress).
        let mut looks = 2 * self.len();
        let mut taken = 0;
        while taken < n {
            let Some(v) = self.gens[oldest].pop_front() else {
                if self.age(bits) {
                    continue;
                }
                break;
            };
            if looks > 0 && bits.used_since_last_look(v) {
                looks -= 1;
                self.gens[0].push_back(v);
                continue;
            }
            looks = looks.saturating_sub(1);
            out.push(v);
            taken += 1;
        }
    }

    fn reinsert(&mut self, vpn: usize) {
        // Busy (being fetched or written): in use, so young.
        self.gens[0].push_back(vpn);
    }

    fn remove_range(&mut self, first: usize, n: usize) {
        for g in &mut self.gens {
            g.retain(|&v| v < first || v >= first + n);
        }
    }

    fn len(&self) -> usize {
        self.gens.iter().map(VecDeque::len).sum()
    }

    fn name(&self) -> &'static str {
        "lru"
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{take, FakeBits};
    use super::*;

    #[test]
    fn pages_used_again_outlive_pages_used_once() {
        let bits = FakeBits::default();
        let mut p = Lru::default();
        p.insert(&[1, 2, 3, 4], 0);
        bits.touch(&[1, 2, 3, 4]);
        // The first look finds all four used (young again); the second evicts in age order.
        assert_eq!(take(&mut p, 1, &bits), [1]);
        // 5 and 6 arrive after that pass: younger than 2 3 4.
        p.insert(&[5, 6], 0);
        bits.touch(&[5, 6, 3]);
        // 2 and 4 were idle since the pass; 3 was used: it joins the youngest.
        assert_eq!(take(&mut p, 2, &bits), [2, 4]);
        // 3's use was seen by that pass; 5 and 6's are news to the epoch's end, so 3 is older.
        assert_eq!(take(&mut p, 3, &bits), [3, 5, 6]);
        assert!(p.is_empty());
    }

    #[test]
    fn an_epoch_sorts_pages_by_their_last_use() {
        let bits = FakeBits::default();
        let mut p = Lru::default();
        p.insert(&[1, 2, 3, 4], 0);
        bits.touch(&[3]);
        // The first epoch ends at once (nothing is old yet): 3 was used, so 1 2 4 are older.
        assert_eq!(take(&mut p, 3, &bits), [1, 2, 4]);
        assert_eq!(take(&mut p, 1, &bits), [3]);
    }

    #[test]
    fn busy_pages_come_back_young_and_ranges_are_forgotten() {
        let bits = FakeBits::default();
        let mut p = Lru::default();
        p.insert(&[1, 2, 3], 0);
        assert_eq!(take(&mut p, 1, &bits), [1]);
        p.reinsert(1);
        p.remove_range(3, 1);
        assert_eq!(take(&mut p, 3, &bits), [2, 1]);
        assert!(p.is_empty());
    }
}
