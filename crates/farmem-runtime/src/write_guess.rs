//! A guess, per neighbourhood of addresses, of whether a page fetched for reading will be
//! written before it is evicted again: how to install it.
//!
//! Installed write-protected, a page that is then written costs a write-protect fault (a
//! round trip through the fault thread, no data moved). Installed writable, a page that is
//! not written costs its eviction a write-protect ioctl, whose TLB shootdown interrupts every
//! CPU running the program: 1.7 us per page when no other CPU runs it, 18-21 us when one does
//! (`probes/eviction_flush.c`), the largest cost of eviction on this machine. The suite's kvs
//! at half its peak (objects written once when loaded, then only read) took 6.2-6.7 s with
//! every fetched page installed writable and 4.3-4.6 s with pages fetched for reading
//! installed write-protected.
//!
//! Programs differ: CPython writes most objects it reads (reference counts), sqlite writes
//! the pages of its cache. So the choice is learnt per 2 MiB neighbourhood, as data of one
//! kind tends to live together: of the pages fetched for reading and installed
//! write-protected there, how many were written during their stay. Where a quarter or more
//! were, pages are installed writable (the eviction then decides by their contents whether
//! they changed). A page written during its last stay is installed writable in any case
//! (`PageWord::wrote_last`).

use std::sync::atomic::{AtomicU32, Ordering};

/// Neighbourhoods are 2 MiB (512 pages).
const NEIGHBOURHOOD_SHIFT: u32 = 9;
/// Cells in the table; neighbourhoods that share a cell share a guess.
const CELLS: usize = 4096;
/// Counts are halved once this many protected installs were seen, so that the guess follows
/// a program whose phases change.
const WINDOW: u32 = 64;
/// Installed writable once written pages are at least 1 in this many protected installs. A
/// write-protect fault costs the program a round trip; a needless writable install costs the
/// eviction a shootdown, paid mostly by the control thread: the balance leans writable.
const WRITTEN_ONE_IN: u32 = 4;
/// Protected installs seen before the guess is trusted either way (until then: protected,
/// whose mistakes teach the guess, where writable installs' mistakes teach nothing).
const EVIDENCE: u32 = 8;

/// Per cell: protected installs (low half) and first writes to them (high half).
pub(crate) struct WriteGuess {
    cells: Box<[AtomicU32]>,
}

impl Default for WriteGuess {
    fn default() -> Self {
        WriteGuess {
            cells: (0..CELLS).map(|_| AtomicU32::new(0)).collect(),
        }
    }
}

fn split(v: u32) -> (u32, u32) {
    (v & 0xffff, v >> 16)
}

impl WriteGuess {
    fn cell(&self, vpn: usize) -> &AtomicU32 {
        let h = ((vpn >> NEIGHBOURHOOD_SHIFT) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.cells[(h >> 52) as usize % CELLS]
    }

    /// Whether a page at `vpn` fetched for reading will likely be written during its stay.
    pub(crate) fn likely_written(&self, vpn: usize) -> bool {
        let (protected, written) = split(self.cell(vpn).load(Ordering::Relaxed));
        protected >= EVIDENCE && written * WRITTEN_ONE_IN >= protected
    }

    /// `n` pages around `vpn` were installed write-protected after a read.
    pub(crate) fn installed_protected(&self, vpn: usize, n: u32) {
        self.bump(vpn, n, 0);
    }

    /// A page at `vpn` installed write-protected was written (its protection lifted).
    pub(crate) fn written(&self, vpn: usize) {
        self.bump(vpn, 0, 1);
    }

    fn bump(&self, vpn: usize, protected: u32, written: u32) {
        // A lost update between threads only shifts the guess a little.
        let _ = self
            .cell(vpn)
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                let (mut p, mut w) = split(v);
                p += protected;
                w = (w + written).min(p.max(1));
                while p >= WINDOW {
                    p /= 2;
                    w /= 2;
                }
                Some(p | (w << 16))
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_that_a_neighbourhood_writes_what_it_reads() {
        let g = WriteGuess::default();
        assert!(!g.likely_written(1000), "no evidence: protected");
        for i in 0..16 {
            g.installed_protected(1000 + i, 1);
            if i % 2 == 0 {
                g.written(1000 + i);
            }
        }
        assert!(g.likely_written(1001), "half of them were written");
        let far = 1000 + (1 << NEIGHBOURHOOD_SHIFT) * 7;
        assert!(
            !g.likely_written(far),
            "another neighbourhood knows nothing"
        );
    }

    #[test]
    fn read_only_data_stays_protected_and_the_guess_follows_a_change() {
        let g = WriteGuess::default();
        for i in 0..200 {
            g.installed_protected(i, 1);
        }
        assert!(!g.likely_written(5), "nothing was written");
        for i in 0..64 {
            g.installed_protected(i, 1);
            g.written(i);
        }
        assert!(g.likely_written(5), "now everything is written");
        for i in 0..300 {
            g.installed_protected(i, 1);
        }
        assert!(!g.likely_written(5), "and then read only again");
    }

    #[test]
    fn counts_never_overflow() {
        let g = WriteGuess::default();
        for _ in 0..100_000 {
            g.written(3);
            g.installed_protected(3, 1000);
        }
        let (p, w) = split(g.cell(3).load(Ordering::Relaxed));
        assert!(p < WINDOW + 1000 && w <= p, "{p} {w}");
    }
}
