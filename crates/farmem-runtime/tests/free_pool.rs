//! The control thread keeps a pool of free pages for read-ahead (read-ahead only takes budget
//! that is free), sized to the read-ahead asked for lately: a program reading at random asks
//! for none and keeps nearly all of its budget resident, while a scan still gets whole
//! windows. Before, the pool was two full windows whatever the program did: 512 of a
//! 4,096-page budget stayed empty under random reads.

use std::time::{Duration, Instant};

use farmem_runtime::testing::*;
use farmem_runtime::PAGE_SIZE;

fn value(p: usize) -> u64 {
    (p as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5a5a
}

#[test]
fn random_reads_keep_nearly_the_whole_budget_and_scans_still_get_whole_windows() {
    const BUDGET: usize = 4096; // pages; the pool's floor is one eviction batch (128)
    const PAGES: usize = 4 * BUDGET;
    let rt = runtime((BUDGET * PAGE_SIZE) as u64, 128, 256);
    let r = rt.create_region(PAGES * PAGE_SIZE).unwrap();
    for p in 0..PAGES {
        wr_at(&r, p * PAGE_SIZE, value(p));
    }
    let mut rng = XorShift::new(11);
    let mut resident = Vec::new();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(1500) {
        for _ in 0..500 {
            let p = rng.below(PAGES);
            assert_eq!(rd_at(&r, p * PAGE_SIZE), value(p), "page {p}");
        }
        if t.elapsed() > Duration::from_millis(500) {
            resident.push(rt.stats().resident_pages as usize);
        }
    }
    resident.sort_unstable();
    let median = resident[resident.len() / 2];
    assert!(
        median > BUDGET - 400,
        "random reads kept {median} of {BUDGET} pages resident (median of {}): {}",
        resident.len(),
        rt.stats()
    );
    // A scan from here asks for windows of 256 pages: the pool grows for them, so that the
    // pages fault a window at a time, not one by one.
    let before = rt.stats();
    for p in 0..PAGES {
        assert_eq!(rd_at(&r, p * PAGE_SIZE), value(p), "page {p} in the scan");
    }
    let after = rt.stats();
    let faults = after.unhinted_faults - before.unhinted_faults;
    assert!(
        faults < (PAGES / 16) as u64,
        "{faults} faults scanning {PAGES} pages: {after}"
    );
}
