//! Prefetches that would arrive too late are dropped (Canvas's timeliness). Each prefetch read
//! carries how long its pages stay useful: until its stream, at its measured pace, passes the
//! last page, and never less than a floor (`Config::prefetch_deadline_us`). A server that
//! cannot start the read in that time answers `Late`; the runtime puts the pages back as they
//! were (absent, unlocked, budget returned) and whoever needs them reads them on demand.
//!
//! Here the floor is 0, so deadlines follow the pace alone, and the server is capped at
//! 8 MiB/s while two threads read at random beside a strided scan (which the runtime reads
//! ahead asynchronously): windows are dropped, and every page must still read back right,
//! including pages a thread was waiting for when their window was dropped.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};

use farmem_runtime::testing::*;
use farmem_runtime::{BackendSpec, Config, Runtime, PAGE_SIZE};
use support::*;

const PAGES: usize = 1024;
const STRIDE: usize = 4;
/// Scan passes at most, until a window is dropped.
const PASSES: usize = 5;

#[test]
fn prefetches_that_would_arrive_late_are_dropped_and_nothing_is_lost() {
    let server = Server::start(
        "late-secret\n",
        &["--metrics", "127.0.0.1:0", "--max-bandwidth", "8M"],
    );
    let rt = Runtime::new(Config {
        local_mem: 1 << 20, // 256 pages
        backend: BackendSpec::Tcp(server.spec("late", "late-secret")),
        prefetch_deadline_us: 0,
        ..Config::default()
    })
    .unwrap();
    let scan = rt.create_region(PAGES * PAGE_SIZE).unwrap();
    let noise = rt.create_region(PAGES * PAGE_SIZE).unwrap();
    for p in 0..PAGES {
        fill_page(&scan, p, |w| pattern(1, p, w));
        fill_page(&noise, p, |w| pattern(2, p, w));
    }
    // Whether a window arrives late depends on how the threads share the CPUs: a pass that
    // happens to drop none (a quiet moment of the server) is run again, a few times at most.
    for _pass in 0..PASSES {
        scan_beside_random_reads(&scan, &noise);
        if rt.stats().prefetch_dropped_late > 0 {
            break;
        }
    }
    let st = rt.stats();
    assert!(
        st.prefetch_batches > 0,
        "the strided scan was read ahead: {st}"
    );
    assert!(
        st.prefetch_dropped_late > 0,
        "no read-ahead was dropped although deadlines followed the pace alone: {st}"
    );
    assert!(server.metric("farmem_server_errors_total{code=\"late\"}") > 0.0);
    // Every page, in a dropped window or not, still reads back right, and the budget that
    // dropped windows had reserved came back.
    for p in 0..PAGES {
        assert_eq!(page_mismatch(&scan, p, |w| pattern(1, p, w)), None);
        assert_eq!(page_mismatch(&noise, p, |w| pattern(2, p, w)), None);
    }
    let st = rt.stats();
    assert!(st.peak_resident_pages <= 256, "{st}");
    assert!(st.resident_pages <= 256, "{st}");
}

/// Two threads read `noise` at random while this one reads every `STRIDE`th page of `scan`,
/// checking every word read.
fn scan_beside_random_reads(scan: &farmem_runtime::Region, noise: &farmem_runtime::Region) {
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&done);
        for t in 0..2u64 {
            let (noise, done) = (noise, &done);
            s.spawn(move || {
                let mut rng = XorShift::new(t + 1);
                while !done.load(Ordering::Relaxed) {
                    let p = rng.below(PAGES);
                    let w = rng.below(WORDS_PER_PAGE);
                    assert_eq!(rd_at(noise, p * PAGE_SIZE + w * 8), pattern(2, p, w));
                }
            });
        }
        for p in (0..PAGES).step_by(STRIDE) {
            for w in [0, 300, WORDS_PER_PAGE - 1] {
                assert_eq!(
                    rd_at(scan, p * PAGE_SIZE + w * 8),
                    pattern(1, p, w),
                    "scan page {p}"
                );
            }
        }
        done.store(true, Ordering::Relaxed);
    });
}
