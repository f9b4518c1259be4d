//! A guess, per neighbourhood of addresses, of whether a page will compress: an array's
//! pages tend to be alike, so once several pages of a neighbourhood in a row did not
//! compress, its next pages skip the compressor (an incompressible page costs about as
//! much to compress as a text page: 6–10 µs per 4 KiB with LZ4 on this machine) and go
//! where incompressible pages go (the file of `tiered://`, a raw block in `local+lz4://`).
//! One page in [`PROBE_EVERY`] is still tried, so a neighbourhood whose data changes is seen
//! again. A wrong guess costs room or speed, never data: the page is stored either way.

use std::sync::atomic::{AtomicU16, Ordering};

use farmem_proto::PageKey;

/// Neighbourhoods are 2 MiB of a region (512 pages).
const NEIGHBOURHOOD_SHIFT: u32 = 9;
/// Cells in the table; neighbourhoods that share a cell share a guess.
const CELLS: usize = 4096;
/// Pages of a neighbourhood that failed to compress, in a row, before the next are skipped
/// (a mix of compressible and incompressible pages seldom fails this often in a row).
const TRUST_AFTER: u16 = 4;
/// While skipping, one page in this many is compressed anyway.
const PROBE_EVERY: u16 = 16;

/// Per cell: the failures in a row (high byte, saturating), and the pages skipped since the
/// last probe (low byte).
pub(crate) struct Compressibility {
    cells: Box<[AtomicU16]>,
}

impl Default for Compressibility {
    fn default() -> Self {
        Compressibility {
            cells: (0..CELLS).map(|_| AtomicU16::new(0)).collect(),
        }
    }
}

impl Compressibility {
    fn cell(&self, k: PageKey) -> &AtomicU16 {
        let h = (u64::from(k.region).wrapping_mul(0x9E37_79B9_7F4A_7C15))
            ^ (k.page >> NEIGHBOURHOOD_SHIFT).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
        &self.cells[(h >> 52) as usize % CELLS]
    }

    /// Whether page `k` is worth compressing: `false` while its neighbourhood's last pages
    /// did not compress, except for one probe in [`PROBE_EVERY`].
    pub(crate) fn worth_trying(&self, k: PageKey) -> bool {
        let mut worth = true;
        // A lost update between threads only shifts when the next probe comes.
        let _ = self
            .cell(k)
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                let (failures, skipped) = (v >> 8, v & 0xff);
                if failures < TRUST_AFTER {
                    worth = true;
                    return None;
                }
                if skipped + 1 >= PROBE_EVERY {
                    worth = true;
                    Some(failures << 8)
                } else {
                    worth = false;
                    Some((failures << 8) | (skipped + 1))
                }
            });
        worth
    }

    /// What compressing page `k` gave: `compressed` if it was worth keeping compressed.
    pub(crate) fn record(&self, k: PageKey, compressed: bool) {
        let cell = self.cell(k);
        if compressed {
            if cell.load(Ordering::Relaxed) != 0 {
                cell.store(0, Ordering::Relaxed);
            }
            return;
        }
        let _ = cell.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            let failures = (v >> 8).saturating_add(1).min(0xff);
            Some((failures << 8) | (v & 0xff))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(page: u64) -> PageKey {
        PageKey { region: 3, page }
    }

    #[test]
    fn skips_after_failures_in_a_row_and_probes_now_and_then() {
        let c = Compressibility::default();
        for p in 0..u64::from(TRUST_AFTER) {
            assert!(c.worth_trying(key(p)), "{p} failures are not a pattern yet");
            c.record(key(p), false);
        }
        let tried = (10..10 + 64).filter(|&p| c.worth_trying(key(p))).count();
        assert_eq!(
            tried,
            64 / PROBE_EVERY as usize,
            "one probe in {PROBE_EVERY}"
        );
    }

    #[test]
    fn a_page_that_compresses_ends_the_skipping() {
        let c = Compressibility::default();
        for p in 0..8 {
            c.record(key(p), false);
        }
        assert!(!c.worth_trying(key(9)));
        c.record(key(6), true);
        assert!((7..40).all(|p| c.worth_trying(key(p))));
    }

    #[test]
    fn neighbourhoods_are_apart() {
        let c = Compressibility::default();
        for p in 0..8 {
            c.record(key(p), false);
        }
        // Another region, and the same region 64 MiB further on, are still tried (they
        // share a cell only by a hash collision, which this pair does not have).
        assert!(c.worth_trying(PageKey { region: 4, page: 0 }));
        assert!(c.worth_trying(key(1 << 14)));
    }
}
