//! Faults on objects that straddle two pages get the second page read with the first
//! (`neighbour.rs`) on a disk backend. Those pages come in beside a fault, while other
//! threads write their own objects and eviction runs at a quarter of the data: every word
//! must read back as last written, and the neighbours must have been read (or the test
//! tests nothing).

use std::sync::Arc;

use farmem_runtime::testing::*;
use farmem_runtime::{BackendSpec, Config, Region, Runtime, PAGE_SIZE};

const PAGES: usize = 8192; // 32 MiB
const BUDGET: u64 = 8 << 20; // 25%
const OBJECTS: usize = PAGES / 2; // two pages each
const THREADS: usize = 3;
const ROUNDS: usize = 6000;
const WORDS: usize = PAGE_SIZE / 8;

/// The words of an object's two pages that get rewritten: first and last of each.
fn rewritten(w: usize) -> bool {
    w == 0 || w == WORDS - 1
}

/// Checks object `k` (pages 2k, 2k+1) at version `ver`; returns the words that differ.
fn check(r: &Region, k: usize, ver: u64) -> usize {
    let mut bad = 0;
    for p in [2 * k, 2 * k + 1] {
        for w in [0, WORDS / 2, WORDS - 1] {
            let want = if rewritten(w) {
                pattern(ver, p, w)
            } else {
                pattern(0, p, w)
            };
            if rd_at(r, p * PAGE_SIZE + w * 8) != want {
                bad += 1;
            }
        }
    }
    bad
}

#[test]
fn objects_across_two_pages_read_back_right_with_their_neighbours_read() {
    let rt = Runtime::new(Config {
        local_mem: BUDGET,
        backend: BackendSpec::File {
            dir: farmem_runtime::default_far_dir(),
            max_bytes: None,
        },
        ..Config::default()
    })
    .expect("a runtime (needs userfaultfd)");
    let r = Arc::new(rt.create_region(PAGES * PAGE_SIZE).unwrap());
    for p in 0..PAGES {
        fill_page(&r, p, |w| pattern(0, p, w));
    }
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let r = Arc::clone(&r);
            std::thread::spawn(move || {
                // Each thread writes only its own objects (k % THREADS == t) and reads all.
                let mut ver = vec![0u64; OBJECTS];
                let mut rng = XorShift::new(t as u64 + 1);
                let mut bad = 0;
                for _ in 0..ROUNDS {
                    let k = rng.below(OBJECTS);
                    if k % THREADS == t {
                        bad += check(&r, k, ver[k]);
                        ver[k] += 1;
                        for p in [2 * k, 2 * k + 1] {
                            for w in [0, WORDS - 1] {
                                wr_at(&r, p * PAGE_SIZE + w * 8, pattern(ver[k], p, w));
                            }
                        }
                    } else {
                        // Another thread's object: only its unchanging middle words.
                        for p in [2 * k, 2 * k + 1] {
                            let w = WORDS / 2;
                            bad +=
                                usize::from(rd_at(&r, p * PAGE_SIZE + w * 8) != pattern(0, p, w));
                        }
                    }
                }
                (ver, bad)
            })
        })
        .collect();
    let mut vers = vec![0u64; OBJECTS];
    for (t, h) in threads.into_iter().enumerate() {
        let (ver, bad) = h.join().unwrap();
        assert_eq!(bad, 0, "thread {t} read {bad} words wrong");
        for k in (t..OBJECTS).step_by(THREADS) {
            vers[k] = ver[k];
        }
    }
    let bad: usize = (0..OBJECTS).map(|k| check(&r, k, vers[k])).sum();
    assert_eq!(bad, 0, "{bad} words wrong at the end");
    let s = rt.stats();
    eprintln!(
        "{} faults, {} neighbours read, {} pages evicted",
        s.unhinted_faults, s.neighbour_reads, s.pages_evicted
    );
    assert!(s.pages_evicted > PAGES as u64, "eviction ran: {s}");
    assert!(s.neighbour_reads > 0, "no neighbour was read: {s}");
}
