//! Sequential scans with read-ahead in flight, shared by the local-backend tests and the TCP
//! tests of `farmem-cli`: under heavy eviction, scanners whose windows overlap and unhinted
//! readers touching pages whose window is still in flight, after writes through sequential
//! write hints and through write-protect faults; every page is checked.

use std::sync::atomic::{AtomicBool, Ordering};

use super::*;
use crate::{Runtime, FM_SEQ, FM_WRITE, PAGE_SIZE};

pub const PAGES: usize = 16384; // 64 MiB
pub const BUDGET: u64 = 8 << 20; // 2048 pages

/// Check the first, a middle and the last word of a page.
pub fn check(r: &crate::Region, p: usize, salt: u64, who: &str) {
    for w in [0, 257, WORDS_PER_PAGE - 1] {
        let got = rd_at(r, p * PAGE_SIZE + w * 8);
        assert_eq!(got, pattern(salt, p, w), "{who}: page {p} word {w}");
    }
}

/// Run the workload on a runtime whose budget is [`BUDGET`]; panics on any wrong page.
pub fn overlapping_scans(rt: Runtime) {
    let r = rt.create_region(PAGES * PAGE_SIZE).unwrap();
    for salt in [1u64, 2] {
        // Write every page (version `salt`). Round 1 uses sequential write hints; round 2
        // sequential read hints and plain writes, so the pages read ahead are written through
        // write-protect faults where far copies are kept (TCP), and unverified (installed
        // writable, compared at eviction) where they are dropped at the fetch.
        let flags = if salt == 1 { FM_WRITE | FM_SEQ } else { FM_SEQ };
        std::thread::scope(|s| {
            for t in 0..4 {
                let r = &r;
                s.spawn(move || {
                    for p in t * PAGES / 4..(t + 1) * PAGES / 4 {
                        crate::hint_ex(at(r, p * PAGE_SIZE), PAGE_SIZE, flags, 31, 0);
                        fill_page(r, p, |w| pattern(salt, p, w));
                    }
                });
            }
        });
        // Read: four scanners over overlapping ranges (each starts where another is), two
        // threads reading random pages without hints, all checking contents.
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for t in 0..2 {
                let (r, stop) = (&r, &stop);
                s.spawn(move || {
                    let mut rng = XorShift::new(77 + t);
                    while !stop.load(Ordering::Relaxed) {
                        check(r, rng.below(PAGES), salt, "random reader");
                    }
                });
            }
            let scanners: Vec<_> = (0..4)
                .map(|t| {
                    let r = &r;
                    s.spawn(move || {
                        let start = t * PAGES / 8;
                        for i in 0..PAGES / 2 {
                            let p = (start + i) % PAGES;
                            crate::hint_ex(at(r, p * PAGE_SIZE), 8, FM_SEQ, 31, 0);
                            check(r, p, salt, "scanner");
                        }
                    })
                })
                .collect();
            let _stop = StopOnDrop(&stop);
            for h in scanners {
                h.join().unwrap();
            }
        });
    }
    let s = rt.stats();
    eprintln!("{s}");
    assert!(s.prefetch_batches > 200, "windows were in flight: {s}");
    assert!(s.pages_evicted > 4 * PAGES as u64, "heavy eviction: {s}");
    assert!(
        s.unhinted_faults > 0 && (s.wp_faults > 0 || s.unverified_installs > 0),
        "{s}"
    );
    assert!(s.peak_resident_pages * PAGE_SIZE as u64 <= BUDGET, "{s}");
}
