//! Hotness for pages no hint touches: a hot set read over and over (plain loads) while a cold
//! stream passes through local memory. FIFO evicts the hot pages with the stream; a recency
//! policy learns from their short refault distances (shadows) that they are the working set,
//! keeps them more passes of its hand (more for each recent refault in a row) and so faults
//! on them less, with every value still right.

use farmem_runtime::testing::*;
use farmem_runtime::{Config, PolicyKind, Runtime, PAGE_SIZE};

const BUDGET_PAGES: usize = 2048;
const HOT: usize = 600;
const COLD_PER_ROUND: usize = 1200;
const ROUNDS: usize = 24;

fn value(page: usize) -> u64 {
    mix(page as u64 ^ 0x5EED)
}

/// Faults taken while reading the hot set, over all rounds after the first two.
fn hot_faults(policy: PolicyKind) -> (u64, u64) {
    let rt = Runtime::new(Config {
        local_mem: (BUDGET_PAGES * PAGE_SIZE) as u64,
        evict_batch: 32,
        // No read-ahead: the cold stream is sequential and must cost one fault per page, so
        // the fault counts measure the policy alone.
        fault_readahead: 0,
        policy,
        ..Config::default()
    })
    .unwrap();
    let pages = HOT + COLD_PER_ROUND * ROUNDS;
    let r = rt.create_region(pages * PAGE_SIZE).unwrap();
    for p in 0..pages {
        wr_at(&r, p * PAGE_SIZE, value(p));
    }
    let mut faults = 0;
    for round in 0..ROUNDS {
        let before = rt.stats().unhinted_faults;
        for p in 0..HOT {
            assert_eq!(rd_at(&r, p * PAGE_SIZE), value(p), "hot page {p}");
        }
        if round >= 2 {
            faults += rt.stats().unhinted_faults - before;
        }
        let first = HOT + round * COLD_PER_ROUND;
        for p in first..first + COLD_PER_ROUND {
            assert_eq!(rd_at(&r, p * PAGE_SIZE), value(p), "cold page {p}");
        }
    }
    (faults, rt.stats().recent_refaults)
}

#[test]
fn refault_distance_keeps_the_working_set_local() {
    let (fifo, fifo_recent) = hot_faults(PolicyKind::Fifo);
    let (clock, clock_recent) = hot_faults(PolicyKind::SecondChance);
    let (lru, _) = hot_faults(PolicyKind::Lru);
    // The default: without ev_prio hints, one level, which is second chance.
    let (prio, prio_recent) = hot_faults(PolicyKind::Priority);
    eprintln!("hot-set faults: fifo {fifo}, second-chance {clock}, lru {lru}, priority {prio}");
    assert_eq!(fifo_recent, 0, "fifo does not look at refault distances");
    assert!(clock_recent > 0, "no refault was recognized as recent");
    // FIFO refaults the whole hot set about every other round (6600 faults here); a policy
    // that recognizes the hot set must do clearly better: second-chance keeps it up to four
    // passes (3000 here), lru's epochs spend the credit faster (4800). The margins leave
    // room for reclaim timing (a round is 600 faults).
    assert!(fifo > (ROUNDS as u64 - 2) * HOT as u64 / 4, "fifo {fifo}");
    assert!(clock * 3 < fifo * 2, "second-chance {clock} vs fifo {fifo}");
    assert!(lru < fifo, "lru {lru} vs fifo {fifo}");
    assert!(prio_recent > 0, "priority recognized no recent refault");
    assert!(prio * 3 < fifo * 2, "priority {prio} vs fifo {fifo}");
}
