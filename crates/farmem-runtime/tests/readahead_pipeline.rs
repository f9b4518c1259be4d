//! Read-ahead in flight (sequential hints keep windows fetched asynchronously ahead): under
//! heavy eviction, with scanners whose windows overlap and unhinted readers touching pages
//! whose window is still in flight, every page reads back right; windows nobody comes back
//! for are completed without anyone touching them; a region dropped with windows in flight goes
//! cleanly and returns its budget.

use std::time::Duration;

use farmem_runtime::testing::scans::{overlapping_scans, BUDGET, PAGES};
use farmem_runtime::testing::*;
use farmem_runtime::{Config, Runtime, FM_SEQ, PAGE_SIZE};

fn rt() -> Runtime {
    Runtime::new(Config {
        local_mem: BUDGET,
        hint_pipeline: 3,
        ..Config::default()
    })
    .unwrap()
}

#[test]
fn overlapping_scans_and_faults_on_windows_in_flight() {
    overlapping_scans(rt());
}

#[test]
fn abandoned_windows_are_completed_and_dropping_a_region_mid_scan_is_clean() {
    let rt = rt();
    let r = rt.create_region(PAGES * PAGE_SIZE).unwrap();
    for p in 0..PAGES {
        wr_at(&r, p * PAGE_SIZE, pattern(9, p, 0));
    }
    // Scan until windows are in flight ahead, and stop there: they are abandoned. (Whether
    // a window is in flight at a given page depends on free budget at that moment, so the
    // scan watches rather than stopping at a fixed page.)
    let mut stop = None;
    for p in 0..PAGES {
        farmem_runtime::hint_ex(at(&r, p * PAGE_SIZE), 8, FM_SEQ, 63, 0);
        assert_eq!(rd_at(&r, p * PAGE_SIZE), pattern(9, p, 0));
        if p > 256 && rt.stats().prefetch_inflight > 0 {
            stop = Some(p);
            break;
        }
    }
    let end = stop.expect("read-ahead windows went in flight during the scan") + 1;
    // Nobody comes back: the control thread's sweep installs them, or the fault thread when
    // it next wakes (it installs whatever has arrived); which one depends on timing.
    let mut s = rt.stats();
    for _ in 0..1000 {
        if s.prefetch_inflight == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        s = rt.stats();
    }
    assert_eq!(
        s.prefetch_inflight, 0,
        "abandoned windows were completed: {s}"
    );
    // The pages just past the scan were read ahead and are now resident.
    settle(&r, end..end + 8);
    assert!(r.is_resident(end * PAGE_SIZE), "page {end} was read ahead");
    assert_eq!(rd_at(&r, end * PAGE_SIZE), pattern(9, end, 0));
    // Start another scan and drop the region while its windows are in flight.
    for p in 0..4 * 64 {
        farmem_runtime::hint_ex(at(&r, p * PAGE_SIZE), 8, FM_SEQ, 63, 0);
    }
    drop(r);
    let mut resident = rt.stats().resident_pages;
    for _ in 0..500 {
        if resident == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
        resident = rt.stats().resident_pages;
    }
    assert_eq!(resident, 0, "every page's budget came back: {}", rt.stats());
}
