//! Level 0 of the default policy: second chance, or second chance with a protected band,
//! whichever the program's own faults say is better (set dueling).
//!
//! Why: a program that sweeps data slightly larger than its budget again and again (sqlite's
//! GROUP BY visiting the table through an index, once per group) defeats any order of
//! recency: every page is evicted just before its next use, and second chance read back as
//! many pages as FIFO (1.05 M at 7.5 K resident in a replay of that trace, where Linux swaps
//! in 572 K: its accessed bits keep part of the sweep on the active list). The cure for a
//! loop is to keep a fixed part of it and let the rest churn: a *protected band* that a page
//! enters when it comes back soon after its eviction (a recent refault, `workingset.rs`),
//! up to [`PROTECT_NUM`]/[`PROTECT_DEN`] of the pages, and leaves only one in [`RATE`]
//! times another recent refault knocks. Pages in the band are evicted last.
//!
//! But farmem sees no use of resident pages, so the band cannot tell a loop (its pages are
//! used every sweep) from data the program has left (a phase that ended): there it holds
//! dead pages while the new working set churns in what is left (2x the faults of second
//! chance in a synthetic two-phase replay; 75% more on GNU sort at a quarter of its peak).
//! So each program chooses by *set dueling* (Qureshi et al., adaptive insertion, ISCA'07):
//! pages are split by a hash of their number; one group in [`SHARE`] always runs second
//! chance, another always the band, each in its own share of the resident pages, and a
//! counter moves with each of their pages that becomes resident (a miss): the rest follow
//! the group that misses less. A leader costs at most its share of the accesses when its
//! side is the wrong one.
//!
//! Replays of fault traces (`probes/policy_replay.c`, `duel`), pages read back against
//! second chance: sqlite's 128 MiB table at 7.5 K resident 0.55x; its 512 MiB table at half
//! its peak 0.58x and at a quarter 0.82x; GNU sort 0.93-1.00x and python3 0.99-1.03x at a
//! quarter and half of theirs. Live, sqlite's `bench programs` job at half its peak took
//! 44-49 s instead of 68-69 s.

use std::collections::VecDeque;

use super::clock::Ring;
use super::interface::UseBits;

/// One page in `SHARE` leads for each side.
const SHARE: usize = 64;
/// The band holds at most this share of a group's pages.
const PROTECT_NUM: usize = 9;
const PROTECT_DEN: usize = 10;
/// A full band lets one page out (to the probation ring) for every `RATE` recent refaults
/// that knock: slow enough that a loop keeps most of what it holds, fast enough that a
/// band of data no longer used drains.
const RATE: u64 = 8;
/// The dueling counter saturates here: it takes this many misses more on one side to turn.
const PSEL_MAX: i32 = 1024;
/// Below this many resident pages a leader's share (64 pages) is too small to judge by:
/// the followers stay on second chance.
const MIN_PAGES: usize = 64 * SHARE;

/// Pages of one group: the probation ring (second chance) and the protected band (evicted
/// only when the ring is empty, oldest first).
#[derive(Default)]
struct Group {
    ring: Ring,
    band: VecDeque<usize>,
    /// Pages put in the band since it was last cleared of pages no longer resident.
    since_purge: usize,
}

impl Group {
    fn len(&self) -> usize {
        self.ring.len() + self.band.len()
    }

    /// Take up to `n` victims: from the ring (second chance), then the band's oldest.
    fn take(&mut self, n: usize, out: &mut Vec<usize>, bits: &dyn UseBits) -> usize {
        let mut taken = self.ring.take(n, out, bits);
        while taken < n {
            let Some(v) = self.band.pop_front() else {
                break;
            };
            out.push(v);
            taken += 1;
        }
        taken
    }

    /// A recent refault comes to the band. Once as many came as half the band holds, the
    /// band drops its entries of pages no longer resident (discarded by the program:
    /// nothing tells the policy, and the ring forgets them when its hand comes by, but the
    /// band would keep them for good in room meant for resident pages). Amortized, a check
    /// per page that comes.
    fn knock(&mut self, bits: &dyn UseBits) {
        self.since_purge += 1;
        if self.since_purge > self.band.len() / 2 + 64 {
            self.since_purge = 0;
            self.band.retain(|&v| bits.present(v));
        }
    }

    /// Move up to `n` of the band's oldest pages to the ring.
    fn release(&mut self, n: usize) {
        for _ in 0..n {
            let Some(v) = self.band.pop_front() else {
                break;
            };
            self.ring.push(v);
        }
    }
}

const SECOND_CHANCE: usize = 0;
const BAND: usize = 1;
const FOLLOWERS: usize = 2;

/// Level 0: three groups (the two leaders and the followers).
#[derive(Default)]
pub(super) struct Dueling {
    groups: [Group; 3],
    /// Misses of the second-chance leader less those of the band's (saturating).
    psel: i32,
    /// Recent refaults that knocked on a full band.
    knocks: u64,
}

/// The group a page belongs to by its number.
fn group_of(vpn: usize) -> usize {
    let h = (vpn as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
    match (h % SHARE as u64) as usize {
        0 => SECOND_CHANCE,
        1 => BAND,
        _ => FOLLOWERS,
    }
}

impl Dueling {
    pub fn len(&self) -> usize {
        self.groups.iter().map(Group::len).sum()
    }

    /// The group a page joins now: its own once there are enough pages to duel with, else
    /// the followers (one ring in plain second-chance order).
    fn place(&self, vpn: usize) -> usize {
        if self.len() < MIN_PAGES {
            FOLLOWERS
        } else {
            group_of(vpn)
        }
    }

    /// Whether the followers keep a band now.
    pub fn followers_protect(&self) -> bool {
        self.psel > 0 && self.len() >= MIN_PAGES
    }

    /// Pages in the protected bands.
    pub fn protected(&self) -> usize {
        self.groups.iter().map(|g| g.band.len()).sum()
    }

    /// Pages that became resident and are not in the policy yet (`bits` tells which came
    /// back as recent refaults). Only misses come here: fetches and first touches, demanded
    /// or read ahead. Only a demanded page enters a band: a page read ahead is not known to
    /// be used, and with read-ahead pages let in, sqlite's sweep read back 855 K pages
    /// instead of 575 K.
    pub fn insert_missed(&mut self, vpns: &[usize], demanded: bool, bits: &dyn UseBits) {
        let total = self.len();
        let leader_cap = total / SHARE;
        let protect = self.followers_protect();
        for &v in vpns {
            let g = self.place(v);
            match g {
                SECOND_CHANCE => self.psel = (self.psel + 1).min(PSEL_MAX),
                BAND => self.psel = (self.psel - 1).max(-PSEL_MAX),
                _ => {}
            }
            let recent = demanded && bits.level(v) > 0;
            let banded = g == BAND || (g == FOLLOWERS && protect);
            let grp = &mut self.groups[g];
            if recent && banded {
                grp.knock(bits);
                let cap = if g == FOLLOWERS {
                    total.saturating_sub(2 * leader_cap)
                } else {
                    leader_cap
                } * PROTECT_NUM
                    / PROTECT_DEN;
                if grp.band.len() >= cap {
                    self.knocks += 1;
                    if self.knocks.is_multiple_of(RATE) {
                        grp.release(1);
                    }
                }
                if grp.band.len() < cap {
                    grp.band.push_back(v);
                    continue;
                }
            } else if recent && g == FOLLOWERS && !grp.band.is_empty() {
                // Back on second chance: the band drains as the working set comes back.
                grp.release(1);
            }
            grp.ring.push(v);
        }
    }

    /// Pages that are resident again without a miss (a failed eviction undone, pages given
    /// back after a fork): into their group's ring.
    pub fn extend(&mut self, vpns: &[usize]) {
        for &v in vpns {
            self.push(v);
        }
    }

    pub fn push(&mut self, vpn: usize) {
        let g = self.place(vpn);
        self.groups[g].ring.push(vpn);
    }

    /// The next page in the followers' ring (then the leaders'), for the priority policy's
    /// sorting hand.
    pub fn pop_front(&mut self) -> Option<usize> {
        self.groups
            .iter_mut()
            .rev()
            .find_map(|g| g.ring.pop_front())
    }

    /// Up to `n` victims: from a leader holding more than its share first, else from the
    /// followers; any group once those run out.
    pub fn take(&mut self, n: usize, out: &mut Vec<usize>, bits: &dyn UseBits) -> usize {
        let share = self.len() / SHARE;
        let mut taken = 0;
        for g in [SECOND_CHANCE, BAND] {
            let over = self.groups[g].len().saturating_sub(share);
            taken += self.groups[g].take(over.min(n - taken), out, bits);
        }
        if !self.followers_protect() {
            // Second chance: what the band held joins the ring as it is evicted.
            self.groups[FOLLOWERS].release(n - taken);
        }
        for g in [FOLLOWERS, SECOND_CHANCE, BAND] {
            if taken == n {
                break;
            }
            taken += self.groups[g].take(n - taken, out, bits);
        }
        taken
    }

    pub fn remove_range(&mut self, first: usize, n: usize) {
        for g in &mut self.groups {
            g.ring.remove_range(first, n);
            g.band.retain(|&v| v < first || v >= first + n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::FakeBits;
    use super::*;

    /// Page numbers of one group.
    fn pages_of(group: usize, n: usize) -> Vec<usize> {
        (0..).filter(|&v| group_of(v) == group).take(n).collect()
    }

    /// A loop over 1.5x the resident pages, every miss a recent refault after the first
    /// sweep: the band's leader misses less than the second-chance leader, the followers
    /// turn to the band and keep most of their pages from sweep to sweep.
    #[test]
    fn a_loop_larger_than_memory_turns_the_followers_to_the_band() {
        let bits = FakeBits::default();
        let mut d = Dueling::default();
        let resident = 64 * 1024;
        let pages: Vec<usize> = (0..resident * 3 / 2).collect();
        let mut present = std::collections::HashSet::new();
        let mut misses_last = 0;
        for sweep in 0..8 {
            let mut misses = 0;
            for &v in &pages {
                if present.contains(&v) {
                    continue;
                }
                misses += 1;
                if d.len() >= resident {
                    let mut out = Vec::new();
                    d.take(1, &mut out, &bits);
                    for o in out {
                        present.remove(&o);
                    }
                }
                bits.set_level(v, u8::from(sweep > 0));
                d.insert_missed(&[v], true, &bits);
                present.insert(v);
            }
            misses_last = misses;
        }
        assert!(d.followers_protect(), "psel {}", d.psel);
        assert!(d.protected() > resident / 2);
        // Second chance would miss every page of every sweep.
        assert!(
            misses_last < pages.len() * 3 / 4,
            "{misses_last} misses of {}",
            pages.len()
        );
    }

    /// Leaders hold their share: a leader over it gives the victims.
    #[test]
    fn a_leader_over_its_share_is_evicted_first() {
        let bits = FakeBits::default();
        let mut d = Dueling::default();
        let followers = pages_of(FOLLOWERS, MIN_PAGES);
        let leader = pages_of(SECOND_CHANCE, 2 * MIN_PAGES / SHARE);
        d.extend(&followers);
        d.extend(&leader);
        // A share is a little over 64 pages; the leader holds 128.
        let mut out = Vec::new();
        assert_eq!(d.take(5, &mut out, &bits), 5);
        assert_eq!(out, leader[..5]);
        d.remove_range(0, usize::MAX / 2);
        assert_eq!(d.len(), 0);
    }

    /// Pages the program discarded leave the band, so it keeps its room for resident ones.
    #[test]
    fn discarded_pages_leave_the_band() {
        let bits = FakeBits::default();
        let mut d = Dueling::default();
        let band = pages_of(BAND, 4 * MIN_PAGES / SHARE);
        d.extend(&pages_of(FOLLOWERS, MIN_PAGES));
        for &v in &band {
            bits.set_level(v, 1);
        }
        let (first, rest) = band.split_at(band.len() / 4);
        d.insert_missed(first, true, &bits);
        let held = d.protected();
        assert!(held > 0);
        for &v in first {
            bits.discard(v);
        }
        d.insert_missed(rest, true, &bits);
        assert!(d.groups[BAND].band.iter().all(|&v| bits.present(v)));
    }

    /// Without recent refaults nothing enters a band, and the followers stay on second
    /// chance: their ring order is kept.
    #[test]
    fn first_touches_stay_on_second_chance() {
        let bits = FakeBits::default();
        let mut d = Dueling::default();
        let f = pages_of(FOLLOWERS, 8);
        d.insert_missed(&f, true, &bits);
        assert_eq!(d.protected(), 0);
        let mut out = Vec::new();
        d.take(8, &mut out, &bits);
        assert_eq!(out, f);
    }
}
