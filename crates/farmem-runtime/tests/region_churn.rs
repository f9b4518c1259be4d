//! Regions created and dropped while other regions are in use and reclaim is busy: other
//! regions keep their data, new regions (often mapped at the address of a dropped one) start
//! as zeros and keep what is written to them, and the runtime's accounting (resident pages,
//! backend bytes) returns to zero once every region is gone.

use std::sync::atomic::{AtomicBool, Ordering};

use farmem_runtime::testing::*;
use farmem_runtime::{Runtime, FM_WRITE, PAGE_SIZE};

const BUDGET: u64 = 2 << 20; // 512 pages
const PAGES: usize = 768; // per short-lived region: more than the budget

/// Wait (bounded) for in-flight reclaim to settle, then return the resident count. A
/// reclaim batch unmaps and unlocks its pages before it subtracts them from the count, so
/// the count can briefly be above the truth; it can never legitimately be below it.
fn settled_resident(rt: &Runtime, want: u64) -> u64 {
    let mut v = rt.stats().resident_pages;
    for _ in 0..5000 {
        if v == want {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
        v = rt.stats().resident_pages;
    }
    v
}

/// One short-lived region: fresh pages read as zeros, written pages keep their data while
/// part of them is evicted. Returns the region, fully checked.
fn use_region(rt: &Runtime, cycle: usize, rng: &mut XorShift) -> farmem_runtime::Region {
    let r = rt.create_region(PAGES * PAGE_SIZE).unwrap();
    let salt = 1000 + cycle as u64;
    let mut written = vec![false; PAGES];
    for (p, wrote) in written.iter_mut().enumerate() {
        if rng.chance(25) {
            if rng.chance(50) {
                farmem_runtime::hint_ex(at(&r, p * PAGE_SIZE), PAGE_SIZE, FM_WRITE, 2, 0);
            }
            wr_at(&r, p * PAGE_SIZE, pattern(salt, p, 0));
            wr_at(&r, p * PAGE_SIZE + 8 * (1 + p % 511), pattern(salt, p, 1));
            *wrote = true;
        } else {
            let w = rng.below(WORDS_PER_PAGE);
            assert_eq!(
                rd_at(&r, p * PAGE_SIZE + 8 * w),
                0,
                "cycle {cycle}: fresh page {p} word {w} is not zero"
            );
        }
    }
    for (p, &wrote) in written.iter().enumerate() {
        let (a, b) = if wrote {
            (pattern(salt, p, 0), pattern(salt, p, 1))
        } else {
            (0, 0)
        };
        assert_eq!(
            rd_at(&r, p * PAGE_SIZE),
            a,
            "cycle {cycle}: page {p} (written: {wrote})"
        );
        assert_eq!(
            rd_at(&r, p * PAGE_SIZE + 8 * (1 + p % 511)),
            b,
            "cycle {cycle}: page {p}"
        );
    }
    r
}

/// A thread keeps a long-lived region busy (reads, writes, checks against a shadow) while
/// the main thread creates, uses and drops regions. Each short-lived region is dropped once
/// its pages are all evicted (so no reclaim batch is working on them at that moment).
#[test]
fn regions_come_and_go_while_another_region_churns() {
    churn_scenario(60, true);
}

fn churn_scenario(cycles: usize, evict_before_drop: bool) {
    let rt = runtime(BUDGET, 16, 16);
    let budget = budget_pages(&rt) as u64;
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let _stop_on_panic = StopOnDrop(&stop);
        let churn = {
            let (rt, stop) = (&rt, &stop);
            s.spawn(move || {
                let r = rt.create_region(1024 * PAGE_SIZE).unwrap();
                let n = r.len() / PAGE_SIZE;
                let mut shadow = vec![0u64; n];
                let mut rng = XorShift::new(17);
                let mut ops = 0u64;
                while !stop.load(Ordering::Relaxed) || ops < 1000 {
                    let p = rng.below(n);
                    assert_eq!(rd_at(&r, p * PAGE_SIZE + 16), shadow[p], "churn page {p}");
                    if rng.chance(30) {
                        shadow[p] += 1;
                        wr_at(&r, p * PAGE_SIZE + 16, shadow[p]);
                    }
                    ops += 1;
                }
                for (p, &v) in shadow.iter().enumerate() {
                    assert_eq!(
                        rd_at(&r, p * PAGE_SIZE + 16),
                        v,
                        "churn page {p} at the end"
                    );
                }
                ops
            })
        };
        let mut pressure = Pressure::new(&rt, 1536);
        let mut rng = XorShift::new(99);
        for cycle in 0..cycles {
            let r = use_region(&rt, cycle, &mut rng);
            if evict_before_drop {
                pressure.evict(&r, 0..PAGES);
            }
            drop(r);
            let resident = rt.stats().resident_pages;
            assert!(
                resident <= budget,
                "cycle {cycle}: resident count {resident} above the budget {budget}"
            );
        }
        stop.store(true, Ordering::Relaxed);
        assert!(churn.join().unwrap() >= 1000);
    });
    let s = rt.stats();
    assert!(s.pages_written_back > 0 && s.pages_fetched > 0, "{s}");
    assert!(s.peak_resident_pages <= budget, "{s}");
    // Every region is gone now (the churn and pressure regions were dropped in the scope).
    assert_eq!(
        settled_resident(&rt, 0),
        0,
        "pages still counted resident after every region was dropped"
    );
    assert_eq!(
        rt.stats().backend_bytes,
        0,
        "the backend still holds pages of dropped regions"
    );
}

/// Dropping a region while reclaim is evicting its pages must leave the resident count
/// right. Regression test for the race fixed in 5b3d57b (src/region.rs `unmap`): a
/// reclaimer took a batch of victims from the policy, `unmap` then counted the pages it found
/// present and unlocked, and the reclaimer locked and evicted one of them afterwards,
/// subtracting it from `resident` a second time (the count wrapped to 18446744073709551615;
/// seen at cycle 55 of the churn variant below and at cycle 675 of this loop before the fix).
#[test]
fn dropping_regions_during_reclaim_keeps_the_resident_count() {
    // The simplest program that showed it: one thread, one region at a time, each read
    // through once (more pages than the budget, so the control thread is evicting the
    // region's clean pages when it is dropped).
    let rt = runtime(BUDGET, 16, 16);
    let budget = budget_pages(&rt) as u64;
    for cycle in 0..1000 {
        let r = rt.create_region(PAGES * PAGE_SIZE).unwrap();
        for p in 0..PAGES {
            assert_eq!(rd_at(&r, p * PAGE_SIZE), 0);
        }
        drop(r);
        let resident = rt.stats().resident_pages;
        assert!(
            resident <= budget,
            "cycle {cycle}: resident_pages = {resident} right after dropping the only region"
        );
    }
    assert_eq!(
        settled_resident(&rt, 0),
        0,
        "resident count once every region is gone"
    );
}

/// The same with a second thread whose direct reclaim also evicts the dropped regions'
/// pages, and data checks in the regions created after each drop.
#[test]
fn dropping_regions_during_reclaim_with_another_region_busy() {
    churn_scenario(150, false);
}

/// Two runtimes in one process, each creating, reading through and dropping regions, so
/// that one often gets an address the other just gave up. A page the first runtime still
/// had queued for reclaim belongs to the second one's region by then: the first must leave
/// it alone. Before the fix it evicted the page and subtracted it from its own count (which
/// wrapped below zero) while the owner's count kept it forever; once enough such pages
/// leaked, the owner believed itself full with nothing to evict and hung (seen in CI).
#[test]
fn two_runtimes_reusing_each_others_addresses_keep_their_counts() {
    let rts = [runtime(BUDGET, 16, 16), runtime(BUDGET, 16, 16)];
    std::thread::scope(|s| {
        for (k, rt) in rts.iter().enumerate() {
            s.spawn(move || {
                let budget = budget_pages(rt) as u64;
                let mut rng = XorShift::new(k as u64 + 5);
                for cycle in 0..400 {
                    // Sizes vary so that the regions of the two land on each other's pages.
                    let n = PAGES / 2 + rng.below(PAGES);
                    let r = rt.create_region(n * PAGE_SIZE).unwrap();
                    for p in 0..n {
                        if rng.chance(10) {
                            wr_at(&r, p * PAGE_SIZE, pattern(k as u64, p, cycle));
                        } else {
                            assert_eq!(rd_at(&r, p * PAGE_SIZE + 8), 0);
                        }
                    }
                    drop(r);
                    let resident = rt.stats().resident_pages;
                    assert!(
                        resident <= budget,
                        "runtime {k} cycle {cycle}: resident count {resident} above the budget {budget}"
                    );
                }
            });
        }
    });
    for (k, rt) in rts.iter().enumerate() {
        assert_eq!(
            settled_resident(rt, 0),
            0,
            "runtime {k}: resident count once every region is gone"
        );
    }
}
