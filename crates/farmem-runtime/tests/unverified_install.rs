//! Pages installed writable without write tracking ("unverified": written during their last
//! stay after a fetch, in a neighbourhood that writes what it reads, or zero fills): their
//! writes cost no fault, and eviction decides by their contents whether they changed. No
//! write may be lost that way, no unchanged page is written back, and a page written to
//! zeros is never mistaken for one that needs its old far copy.
//!
//! Far copies are kept here (as a remote tier keeps them): an embedded store forgets the copy
//! of a page installed writable, so there would be nothing to compare with.

use farmem_runtime::testing::*;
use farmem_runtime::{Config, FarCopies, Region, Runtime, PAGE_SIZE};

const N: usize = 64;

/// A runtime on the embedded backend that keeps the far copies of fetched pages; no fault
/// read-ahead, so counts are exact.
fn keeping_copies(local_mem: u64) -> Runtime {
    Runtime::new(Config {
        local_mem,
        evict_batch: 16,
        fault_readahead: 0,
        far_copies: Some(FarCopies::Keep),
        ..Config::default()
    })
    .expect("a runtime (needs userfaultfd)")
}

fn fixture() -> (Runtime, Region, Pressure) {
    let rt = keeping_copies(2 << 20); // 512 pages
    let r = rt.create_region(N * PAGE_SIZE).unwrap();
    let pressure = Pressure::new(&rt, 2048);
    (rt, r, pressure)
}

fn check(r: &Region, p: usize, salt: u64) {
    if let Some(m) = page_mismatch(r, p, |w| pattern(salt, p, w)) {
        panic!("page {p} (salt {salt:#x}): (word, got, want) {m:x?}");
    }
}

#[test]
fn written_pages_come_back_writable_and_only_changed_ones_are_written_back() {
    let (rt, r, mut pressure) = fixture();
    for p in 0..N {
        fill_page(&r, p, |w| pattern(1, p, w));
    }
    pressure.evict(&r, 0..N);
    // Fetched by reads after a stay that began as a zero fill: its writes only initialised
    // the pages, so they come back write-protected, and their first writes fault.
    let t0 = rt.stats();
    for p in 0..N {
        check(&r, p, 1);
    }
    let t1 = rt.stats();
    assert_eq!(t1.pages_fetched - t0.pages_fetched, N as u64, "{t1}");
    assert_eq!(t1.unverified_installs, t0.unverified_installs, "{t1}");
    for p in 0..N {
        fill_page(&r, p, |w| pattern(1, p, w));
    }
    let mut t2 = rt.stats();
    for _ in 0..100 {
        if t2.wp_faults - t1.wp_faults >= N as u64 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        t2 = rt.stats();
    }
    assert_eq!(t2.wp_faults - t1.wp_faults, N as u64, "{t2}");
    pressure.evict(&r, 0..N);
    let s0 = rt.stats();
    // Fetched by reads: written last time, so installed writable.
    for p in 0..N {
        check(&r, p, 1);
    }
    let s1 = rt.stats();
    assert_eq!(s1.pages_fetched - s0.pages_fetched, N as u64, "{s1}");
    assert_eq!(
        s1.unverified_installs - s0.unverified_installs,
        N as u64,
        "{s1}"
    );
    // Writing half of them costs no fault: they are writable.
    for p in (0..N).step_by(2) {
        fill_page(&r, p, |w| pattern(2, p, w));
    }
    let s2 = rt.stats();
    assert_eq!(
        s2.unhinted_faults, s1.unhinted_faults,
        "writes faulted: {s2}"
    );
    assert_eq!(s2.wp_faults, s1.wp_faults);
    // Evicted: the written half is written back, the other half is found unchanged.
    pressure.evict(&r, 0..N);
    let s3 = rt.stats();
    assert_eq!(
        s3.verified_unchanged - s2.verified_unchanged,
        N as u64 / 2,
        "{s3}"
    );
    let written: u64 = s3.pages_written_back - s2.pages_written_back;
    // The pressure region's pages are zero fills: found zero, never written back.
    assert_eq!(written, N as u64 / 2, "{s3}");
    for p in 0..N {
        check(&r, p, if p % 2 == 0 { 2 } else { 1 });
    }
    // The written half comes back writable again; the unchanged half too where their
    // neighbourhood writes what it reads (`write_guess`: here half of it does), else
    // write-protected, its first write then a fault. Each page is one or the other.
    let s4 = rt.stats();
    let writable = s4.unverified_installs - s3.unverified_installs;
    assert!(writable >= N as u64 / 2, "{s4}");
    for p in 0..N {
        fill_page(&r, p, |w| pattern(3, p, w));
    }
    // (The count of the last write-protect fault may land just after its write resumed.)
    let mut s5 = rt.stats();
    for _ in 0..100 {
        if s5.wp_faults - s4.wp_faults + writable >= N as u64 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        s5 = rt.stats();
    }
    assert_eq!(s5.wp_faults - s4.wp_faults + writable, N as u64, "{s5}");
    pressure.evict(&r, 0..N);
    for p in 0..N {
        check(&r, p, 3);
    }
}

#[test]
fn zero_fills_written_to_zeros_or_left_alone_come_back_as_zeros_and_others_exact() {
    let (rt, r, mut pressure) = fixture();
    // Read first: zero fills, installed writable.
    for p in 0..N {
        assert_eq!(rd_at(&r, p * PAGE_SIZE), 0);
    }
    // A third written, a third written then zeroed again, a third left alone.
    for p in 0..N {
        match p % 3 {
            0 => fill_page(&r, p, |w| pattern(4, p, w)),
            1 => {
                fill_page(&r, p, |w| pattern(4, p, w));
                fill_page(&r, p, |_| 0);
            }
            _ => {}
        }
    }
    let s0 = rt.stats();
    pressure.evict(&r, 0..N);
    let s1 = rt.stats();
    let nonzero = (0..N).filter(|p| p % 3 == 0).count() as u64;
    assert!(
        s1.verified_zero - s0.verified_zero >= N as u64 - nonzero,
        "{s1}"
    );
    for p in 0..N {
        if p % 3 == 0 {
            check(&r, p, 4);
        } else {
            assert!(page_mismatch(&r, p, |_| 0).is_none(), "page {p} not zero");
        }
    }
    let s2 = rt.stats();
    assert_eq!(
        s2.pages_fetched - s1.pages_fetched,
        nonzero,
        "zeros need no fetch: {s2}"
    );
    // A page whose far copy exists, now written to all zeros: zeros it stays.
    for p in (0..N).filter(|p| p % 3 == 0) {
        fill_page(&r, p, |_| 0);
    }
    pressure.evict(&r, 0..N);
    for p in 0..N {
        assert!(page_mismatch(&r, p, |_| 0).is_none(), "page {p} not zero");
    }
}

/// Several threads write checksummed pages of one region, writable without tracking, while
/// the budget forces constant eviction: each page must end with its last value.
#[test]
fn threads_writing_unverified_pages_under_heavy_eviction_lose_nothing() {
    let rt = keeping_copies(1 << 20); // 256 pages for 4 x 256 pages
    const PAGES: usize = 256;
    let regions: Vec<Region> = (0..4)
        .map(|_| rt.create_region(PAGES * PAGE_SIZE).unwrap())
        .collect();
    std::thread::scope(|s| {
        for (t, r) in regions.iter().enumerate() {
            s.spawn(move || {
                let mut rng = XorShift::new(t as u64 + 11);
                let mut last = vec![0u64; PAGES];
                for round in 1..=12_000u64 {
                    let p = rng.below(PAGES);
                    if rng.chance(60) {
                        let salt = round ^ (t as u64) << 40;
                        fill_page(r, p, |w| pattern(salt, p, w));
                        last[p] = salt;
                    } else if last[p] != 0 {
                        check(r, p, last[p]);
                    }
                }
                for (p, &salt) in last.iter().enumerate() {
                    if salt != 0 {
                        check(r, p, salt);
                    }
                }
            });
        }
    });
    let s = rt.stats();
    eprintln!("{s}");
    assert!(s.unverified_installs > 0 && s.verified_unchanged > 0, "{s}");
    assert!(s.pages_evicted > 10_000, "not enough churn: {s}");
}
