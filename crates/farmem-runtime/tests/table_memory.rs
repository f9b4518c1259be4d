//! The page table costs memory where a region is used, not for its size: a region's words
//! read as fresh from a shared copy-on-write template until they are written. Before, making
//! a region wrote every word, 8 bytes per page of its size: a 4 GiB region made 8 MiB of
//! the process resident before any of it was touched. (Alone in its file: it measures the
//! process's anonymous memory, which other tests running beside it would move.)

use farmem_runtime::testing::*;
use farmem_runtime::PAGE_SIZE;

/// The process's anonymous resident memory, KiB (`/proc/self/statm`: resident - shared).
fn anon_kib() -> usize {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let f: Vec<usize> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();
    (f[1] - f[2]) * PAGE_SIZE / 1024
}

fn value(p: usize) -> u64 {
    (p as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xfeed
}

#[test]
fn a_large_region_costs_table_memory_only_where_it_is_used() {
    const GIB: usize = 1 << 30;
    let rt = runtime(64 << 20, 128, 256);
    // A small region first: the runtime's threads and buffers are up before measuring.
    let warm = rt.create_region(16 * PAGE_SIZE).unwrap();
    wr_at(&warm, 0, 1);

    let before = anon_kib();
    let r = rt.create_region(4 * GIB).unwrap();
    let made = anon_kib().saturating_sub(before);
    // 8 MiB if every word were written; a few table pages at the ends at most.
    assert!(
        made < 1024,
        "making a 4 GiB region took {made} KiB of anonymous memory"
    );

    // One page in each of 64 spread 2 MiB areas: 64 data pages and at most 64 table pages
    // (one per 512 pages), 512 KiB, where writing every word would have been 8 MiB.
    let stride = 4 * GIB / 64;
    let pages: Vec<usize> = (0..64).map(|i| (i * stride + 12_345) / PAGE_SIZE).collect();
    let start = anon_kib();
    for &p in &pages {
        wr_at(&r, p * PAGE_SIZE, value(p));
    }
    for &p in &pages {
        assert_eq!(rd_at(&r, p * PAGE_SIZE), value(p), "page {p}");
    }
    // Untouched pages of the region read as zeros (fresh), next to used ones too.
    for &p in &pages {
        assert_eq!(rd_at(&r, (p + 1) * PAGE_SIZE), 0, "page {}", p + 1);
    }
    let used = anon_kib().saturating_sub(start);
    assert!(
        used < 2048,
        "64 scattered pages (and 64 of the next) took {used} KiB"
    );

    // The first and last pages' words share table pages with whatever lies beside the
    // region (written word by word): they work as the others do.
    let last = 4 * GIB / PAGE_SIZE - 1;
    for p in [0, 1, last - 1, last] {
        assert_eq!(rd_at(&r, p * PAGE_SIZE), 0, "page {p}");
        wr_at(&r, p * PAGE_SIZE, value(p));
        assert_eq!(rd_at(&r, p * PAGE_SIZE), value(p), "page {p}");
    }

    // Dropped, and a region made again over the same words: they read fresh again, and
    // pages written in the first life read as zeros in the second.
    drop(r);
    let r = rt.create_region(4 * GIB).unwrap();
    for &p in pages.iter().step_by(8) {
        assert_eq!(rd_at(&r, p * PAGE_SIZE), 0, "page {p} of a new region");
        wr_at(&r, p * PAGE_SIZE, value(p) + 1);
        assert_eq!(rd_at(&r, p * PAGE_SIZE), value(p) + 1, "page {p}");
    }
    assert_eq!(rd_at(&warm, 0), 1);
}
