//! Several regions of one runtime share its budget and threads: together they never hold
//! more than the budget locally, and each keeps its own data (same page indices, different
//! regions, different contents).

use std::sync::atomic::{AtomicU64, Ordering};

use farmem_runtime::{Config, Runtime, PAGE_SIZE};

fn word(region: u64, page: usize) -> u64 {
    (region << 48) ^ (page as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

#[test]
fn regions_share_one_budget_and_keep_their_own_data() {
    let budget = 4u64 << 20;
    let rt = Runtime::new(Config {
        local_mem: budget,
        ..Config::default()
    })
    .unwrap();
    let regions: Vec<_> = (0..3).map(|_| rt.create_region(8 << 20).unwrap()).collect();
    let pages = regions[0].len() / PAGE_SIZE;
    let max_seen = AtomicU64::new(0);
    // Interleave the regions so they compete for the budget all the time.
    for round in 0..2 {
        for p in 0..pages {
            for (r, reg) in regions.iter().enumerate() {
                let ptr = unsafe { reg.as_mut_ptr().add(p * PAGE_SIZE) } as *mut u64;
                if round == 0 {
                    unsafe { ptr.write_volatile(word(r as u64, p)) };
                } else {
                    assert_eq!(
                        unsafe { ptr.read_volatile() },
                        word(r as u64, p),
                        "region {r} page {p}"
                    );
                }
            }
            max_seen.fetch_max(rt.stats().resident_pages, Ordering::Relaxed);
        }
    }
    let s = rt.stats();
    assert!(s.pages_evicted > 0 && s.pages_fetched > 0, "{s}");
    assert!(
        s.peak_resident_pages * PAGE_SIZE as u64 <= budget,
        "peak {} pages over a budget of {} pages",
        s.peak_resident_pages,
        budget / PAGE_SIZE as u64
    );
    assert!(max_seen.load(Ordering::Relaxed) * PAGE_SIZE as u64 <= budget);
    // Dropping a region returns its local pages to the shared budget.
    let before = rt.stats().resident_pages;
    drop(regions);
    let after = rt.stats().resident_pages;
    assert!(after < before, "resident {before} -> {after}");
    assert_eq!(after, 0, "no region left, nothing resident");
}
