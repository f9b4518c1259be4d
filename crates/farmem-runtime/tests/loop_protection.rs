//! A program that sweeps data larger than its budget again and again (a loop): second chance
//! evicts each page just before its next use and reads every page back on every sweep. The
//! default policy's dueling groups (`policy/dueling.rs`) find that a protected band misses
//! less and keep part of the loop local. Checked here: the band forms, fewer pages are read
//! back than under second chance (a count, not a time), and every value stays right while
//! two threads write the pages they sweep.

use std::sync::atomic::{AtomicU64, Ordering};

use farmem_runtime::testing::*;
use farmem_runtime::{BackendSpec, Config, PolicyKind, Runtime, PAGE_SIZE};

/// Enough pages that the dueling groups are active (they judge from 4,096 resident pages).
const BUDGET_PAGES: usize = 8192;
const LOOP_PAGES: usize = BUDGET_PAGES * 3 / 2;
const SWEEPS: u64 = 8;

fn runtime(policy: PolicyKind, fault_readahead: usize) -> Runtime {
    Runtime::new(Config {
        local_mem: (BUDGET_PAGES * PAGE_SIZE) as u64,
        backend: BackendSpec::Local { lz4: true },
        fault_readahead,
        policy,
        ..Config::default()
    })
    .unwrap()
}

fn value(page: usize, sweep: u64) -> u64 {
    mix(page as u64 ^ (sweep << 40) ^ 0x100F)
}

/// Fill the loop, then sweep it `SWEEPS` times with `threads` threads (thread t takes the
/// pages equal to t modulo `threads`, all in ascending order): each checks the value its
/// page got in the previous sweep and writes the next one, in its first and last word.
/// Returns the pages fetched during the sweeps after the first two and the most pages
/// protected seen between sweeps.
fn sweep_loop(rt: &Runtime, threads: usize) -> (u64, u64) {
    let r = rt.create_region(LOOP_PAGES * PAGE_SIZE).unwrap();
    let last = PAGE_SIZE - 8;
    for p in 0..LOOP_PAGES {
        wr_at(&r, p * PAGE_SIZE, value(p, 0));
        wr_at(&r, p * PAGE_SIZE + last, value(p, 0));
    }
    let mut fetched = 0;
    let mut protected = 0;
    for sweep in 1..=SWEEPS {
        let before = rt.stats().pages_fetched;
        let bad = AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..threads {
                let (r, bad) = (&r, &bad);
                s.spawn(move || {
                    for p in (t..LOOP_PAGES).step_by(threads) {
                        let (a, b) = (rd_at(r, p * PAGE_SIZE), rd_at(r, p * PAGE_SIZE + last));
                        if a != value(p, sweep - 1) || b != a {
                            bad.fetch_add(1, Ordering::Relaxed);
                        }
                        wr_at(r, p * PAGE_SIZE, value(p, sweep));
                        wr_at(r, p * PAGE_SIZE + last, value(p, sweep));
                    }
                });
            }
        });
        assert_eq!(
            bad.load(Ordering::Relaxed),
            0,
            "stale pages in sweep {sweep}"
        );
        let st = rt.stats();
        if sweep > 2 {
            fetched += st.pages_fetched - before;
        }
        protected = protected.max(st.protected_pages);
    }
    (fetched, protected)
}

#[test]
fn a_loop_larger_than_the_budget_keeps_part_of_it_local() {
    // No read-ahead: the loop is sequential, and the counts should measure the policy.
    let (second_chance, none) = sweep_loop(&runtime(PolicyKind::SecondChance, 0), 1);
    let (default, protected) = sweep_loop(&runtime(PolicyKind::Priority, 0), 1);
    eprintln!(
        "pages read back in {} sweeps: second chance {second_chance}, default {default} \
         ({protected} pages protected)",
        SWEEPS - 2
    );
    assert_eq!(none, 0, "second chance keeps no band");
    assert!(
        protected as usize > BUDGET_PAGES / 2,
        "{protected} pages protected"
    );
    // Second chance reads back every page of every sweep (73,728 here); with most of the
    // budget protected, about half of that.
    assert!(
        second_chance as usize >= (SWEEPS as usize - 2) * LOOP_PAGES * 9 / 10,
        "second chance {second_chance}"
    );
    assert!(
        default * 4 < second_chance * 3,
        "default {default} vs second chance {second_chance}"
    );
}

/// Two threads writing the pages they sweep, with read-ahead on: pages go in and out of the
/// band while they are written, and every value read is the last one written.
#[test]
fn loop_pages_stay_right_while_threads_write_them() {
    let rt = runtime(PolicyKind::Priority, 256);
    let (fetched, _) = sweep_loop(&rt, 2);
    assert!(fetched > 0, "the loop never left local memory");
    assert!(rt.stats().pages_evicted > 0);
}
