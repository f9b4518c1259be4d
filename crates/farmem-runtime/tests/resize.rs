//! Changing the local budget of a running runtime: shrinking evicts at once down to the new
//! budget while threads keep reading and writing their checksummed pages; growing stops the
//! evictions, so the resident set can grow to the new budget. Nothing is lost either way.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use farmem_runtime::testing::*;
use farmem_runtime::{BackendSpec, Config, Runtime, PAGE_SIZE};

const PAGES: usize = 8192; // 32 MiB
const THREADS: usize = 2;

#[test]
fn shrinking_evicts_at_once_growing_stops_evictions_and_nothing_is_lost() {
    let rt = Runtime::new(Config {
        local_mem: 24 << 20,
        backend: BackendSpec::Local { lz4: true },
        evict_batch: 64,
        ..Config::default()
    })
    .expect("a runtime (needs userfaultfd)");
    let r = rt.create_region(PAGES * PAGE_SIZE).unwrap();
    let per = PAGES / THREADS;
    for p in 0..PAGES {
        fill_page(&r, p, |w| pattern(0, p, w));
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (r, stop) = (&r, &stop);
            s.spawn(move || {
                // Each thread owns its pages: rewrites one now and then, checks the others.
                let mut rng = XorShift::new(t as u64 + 1);
                let mut salt = vec![0u64; per];
                while !stop.load(Ordering::Relaxed) {
                    let i = rng.below(per);
                    let p = t * per + i;
                    if rng.chance(30) {
                        salt[i] += 1;
                        fill_page(r, p, |w| pattern(salt[i], p, w));
                    } else if let Some(m) = page_mismatch(r, p, |w| pattern(salt[i], p, w)) {
                        panic!("page {p}: (word, got, want) {m:x?}");
                    }
                }
                for (i, &sl) in salt.iter().enumerate() {
                    let p = t * per + i;
                    if let Some(m) = page_mismatch(r, p, |w| pattern(sl, p, w)) {
                        panic!("page {p} at the end: (word, got, want) {m:x?}");
                    }
                }
            });
        }
        std::thread::sleep(Duration::from_millis(300));
        let before = rt.stats();
        assert!(
            before.resident_pages > 4096,
            "resident near 24 MiB: {before}"
        );
        rt.set_local_mem(4 << 20, Duration::from_secs(10))
            .expect("shrinking to 4 MiB");
        let after = rt.stats();
        assert_eq!(after.budget_bytes, 4 << 20);
        assert!(
            after.resident_pages <= 1024,
            "resident set within the new budget at once: {after}"
        );
        std::thread::sleep(Duration::from_millis(300));
        let s = rt.stats();
        assert!(s.peak_resident_pages >= before.resident_pages, "{s}");
        assert!(s.resident_pages <= 1024, "and it stays there: {s}");
        rt.set_local_mem(48 << 20, Duration::from_secs(10))
            .expect("growing to 48 MiB");
        std::thread::sleep(Duration::from_millis(500));
        let grown = rt.stats();
        assert!(
            grown.resident_pages > 1024,
            "touched pages come back and stay: {grown}"
        );
        let evicted = grown.pages_evicted;
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            rt.stats().pages_evicted,
            evicted,
            "everything fits: no more evictions"
        );
        stop.store(true, Ordering::Relaxed);
    });
    assert!(
        rt.set_local_mem(4096, Duration::from_secs(1)).is_err(),
        "a budget below the minimum is refused"
    );
}
