//! A program that fits its budget keeps every page: the control thread reclaims ahead of
//! demand (the free target) only once the program has needed more than its budget. Before,
//! a budget of 100% of a program's peak still evicted the free target, and a random scan
//! over the data refaulted it for ever (0.1x native).

use std::time::Duration;

use farmem_runtime::testing::*;
use farmem_runtime::PAGE_SIZE;

#[test]
fn a_program_within_its_budget_keeps_every_page_and_one_beyond_gets_a_free_pool() {
    const BUDGET: usize = 4096; // pages (16 MiB)
    let rt = runtime((BUDGET * PAGE_SIZE) as u64, 32, 64);
    let r = rt.create_region(2 * BUDGET * PAGE_SIZE).unwrap();
    // Everything but a few pages of the budget, written, then left for the control thread.
    let fit = BUDGET - 8;
    for p in 0..fit {
        wr_at(&r, p * PAGE_SIZE, p as u64 ^ 0x5a5a);
    }
    std::thread::sleep(Duration::from_millis(300));
    let s = rt.stats();
    assert_eq!(s.pages_evicted, 0, "evicted within the budget: {s}");
    let mut rng = XorShift::new(9);
    for _ in 0..50_000 {
        let p = rng.below(fit);
        assert_eq!(rd_at(&r, p * PAGE_SIZE), p as u64 ^ 0x5a5a);
    }
    let after = rt.stats();
    assert_eq!(
        after.unhinted_faults, s.unhinted_faults,
        "revisits of resident pages faulted: {after}"
    );
    // Past the budget: pages are evicted (nothing lost), and from then on the control
    // thread keeps a pool of free pages.
    for p in fit..2 * BUDGET {
        wr_at(&r, p * PAGE_SIZE, p as u64 ^ 0x5a5a);
    }
    for p in 0..2 * BUDGET {
        assert_eq!(rd_at(&r, p * PAGE_SIZE), p as u64 ^ 0x5a5a, "page {p}");
    }
    let mut waited = 0;
    while (rt.stats().resident_pages as usize) > BUDGET - 32 {
        std::thread::sleep(Duration::from_millis(10));
        waited += 1;
        assert!(
            waited < 500,
            "no free pool kept past the budget: {}",
            rt.stats()
        );
    }
    assert!(rt.stats().pages_evicted > 0);
}

/// New memory that grows resident memory is zero-filled a block at a time while the program
/// fits its budget; sparse first touches get only the pages they touch. (Fault read-ahead is
/// off here, so that the counts are the fault-around's alone.) A fault for a page that was
/// installed meanwhile (spurious) is not counted: the demanded page is installed and its
/// thread woken before the rest of the block, so on a loaded machine the thread can touch
/// the next page first; that fault then finds it installed (CI saw 3 faults, 1 spurious).
/// Not always counted as spurious: when the control thread steals it (the fault thread busy
/// for 500 µs installing the block on a loaded machine), CI saw 3 faults, 0 spurious, 1
/// stolen, 16 pages installed. So one such fault is allowed; a fault per page (16) is not.
#[test]
fn growing_fresh_memory_faults_once_per_block_and_sparse_touches_take_no_more() {
    let rt = runtime(64 << 20, 32, 0);
    let r = rt.create_region(16 << 20).unwrap();
    let faults = |rt: &farmem_runtime::Runtime| {
        let s = rt.stats();
        s.unhinted_faults - s.spurious_faults
    };
    // A heap growing page by page through 64 KiB: the first page, then its neighbour
    // (which fills the rest of the 16-page block), then nothing more.
    for p in 0..16 {
        wr_at(&r, p * PAGE_SIZE, p as u64 + 1);
    }
    let s = rt.stats();
    assert!((2..=3).contains(&faults(&rt)), "{s}");
    assert_eq!(s.pages_installed, 16, "{s}");
    // Sparse touches far apart: one page each.
    let before = rt.stats();
    let faults_before = faults(&rt);
    for k in 1..=20 {
        assert_eq!(rd_at(&r, (k * 100) * PAGE_SIZE), 0);
    }
    let after = rt.stats();
    assert_eq!(faults(&rt) - faults_before, 20, "{after}");
    assert_eq!(
        after.pages_installed - before.pages_installed,
        20,
        "{after}"
    );
    for p in 0..16 {
        assert_eq!(rd_at(&r, p * PAGE_SIZE), p as u64 + 1);
    }
}

/// A predicted stream of writes through fresh memory (fault read-ahead on) zero-fills no
/// more than the front rule allows beyond what it wrote (64 pages): the pages after a
/// stream's end may be memory the program never uses (the room after a large block, the
/// tail of an allocator's slot), and they would cost the budget. Pages with far copies are
/// still read ahead past it.
#[test]
fn speculative_zero_fills_stay_within_the_front_of_the_fault() {
    const PAGES: usize = 300;
    let rt = runtime(4 << 20, 32, 64);
    let r = rt.create_region(16 << 20).unwrap();
    for p in 0..PAGES {
        wr_at(&r, p * PAGE_SIZE, p as u64 + 1);
    }
    let s = rt.stats();
    assert!(
        s.pages_installed as usize <= PAGES + 64,
        "{PAGES} pages written, {} installed: {s}",
        s.pages_installed
    );
    assert!(s.readahead_pages > 0, "the stream was predicted: {s}");
    for p in 0..PAGES {
        assert_eq!(rd_at(&r, p * PAGE_SIZE), p as u64 + 1, "page {p}");
    }
    // Far pages are read ahead as before: evict them all, then read them in order.
    let mut pressure = Pressure::new(&rt, 2048);
    pressure.evict(&r, 0..PAGES);
    let before = rt.stats();
    for p in 0..PAGES {
        assert_eq!(rd_at(&r, p * PAGE_SIZE), p as u64 + 1, "page {p}");
    }
    let after = rt.stats();
    assert!(
        after.readahead_pages - before.readahead_pages > (PAGES / 2) as u64,
        "{after}"
    );
}

/// Inside an allocation the allocator reported, a predicted stream of first writes may
/// zero-fill ahead up to its end and never past it: a large block fills in few faults (the
/// front goes up to 256 pages there), and the room after it stays untouched. Once freed,
/// the small block and the front of 64 pages apply again.
#[test]
fn speculative_zero_fills_run_to_the_end_of_a_known_allocation_and_stop_there() {
    const PAGES: usize = 1000;
    let rt = runtime(64 << 20, 32, 256);
    let r = rt.create_region(16 << 20).unwrap();
    let base = r.as_ptr() as usize;
    rt.mark_allocated(base, PAGES * PAGE_SIZE);
    for p in 0..PAGES {
        wr_at(&r, p * PAGE_SIZE, p as u64 + 1);
    }
    let s = rt.stats();
    assert_eq!(
        s.pages_installed as usize, PAGES,
        "nothing past the allocation's end: {s}"
    );
    // The front doubles up to 256 pages inside a known allocation: 8 faults here (at most
    // 64 pages, as outside one, took 27).
    assert!(
        (s.unhinted_faults as usize) < PAGES / 64,
        "fewer faults than one per 64 pages: {s}"
    );
    // Freed: a stream over the same pages (discarded, fresh again) gets the front rule.
    rt.mark_freed(base, PAGES * PAGE_SIZE);
    rt.discard(base, 2 * PAGES * PAGE_SIZE);
    let before = rt.stats();
    for p in 0..300 {
        wr_at(&r, p * PAGE_SIZE, p as u64 + 7);
    }
    let after = rt.stats();
    // The front rule: at most 64 pages past the 300 written (321 installed here), where
    // the allocation's end allowed 1,000. A fault the control thread serves for a busy fault
    // thread may install one page more, and so may a fault that finds its page already
    // resolved by the other server (CI saw both).
    let raced = (after.stolen_faults - before.stolen_faults) as usize
        + (after.spurious_faults - before.spurious_faults) as usize;
    assert!(
        ((after.pages_installed - before.pages_installed) as usize) <= 300 + 64 + raced,
        "{after}"
    );
    for p in 0..300 {
        assert_eq!(rd_at(&r, p * PAGE_SIZE), p as u64 + 7, "page {p}");
    }
}

/// Inside an allocation the allocator reported, fresh memory filled from the allocation's
/// start is zero-filled 64 pages at a time once it grows (a language runtime's heap page or
/// region: V8's are 64 pages, filled from their header on), 16 at its first page (a block
/// used only at its start, such as mimalloc's bookkeeping, kept 63 untouched pages of zeros
/// resident in every process), never past the allocation's end; touches in the middle of an
/// allocation that grow nothing get only their page. (Fault read-ahead is
/// off: the counts are the zero-fill's alone; one raced fault per block is allowed, as in
/// the test above. A faulting thread resumes once its own page is in, before the rest of
/// the block is installed and counted: each phase lets the counts settle.)
#[test]
fn allocations_filled_from_their_start_fault_once_per_64_pages() {
    let settle = || std::thread::sleep(Duration::from_millis(50));
    let rt = runtime(64 << 20, 32, 0);
    let r = rt.create_region(16 << 20).unwrap();
    let base = r.as_ptr() as usize;
    let faults = |rt: &farmem_runtime::Runtime| {
        let s = rt.stats();
        s.unhinted_faults - s.spurious_faults - s.stolen_faults
    };
    rt.mark_allocated(base, 256 * PAGE_SIZE);
    for p in 0..256 {
        wr_at(&r, p * PAGE_SIZE, p as u64 + 3);
    }
    settle();
    let s = rt.stats();
    assert_eq!(s.pages_installed, 256, "{s}");
    assert!(
        (4..=8).contains(&faults(&rt)),
        "one fault per 64 pages: {s}"
    );
    // Pages installed by `touch` in an allocation of `pages` at page `at` of the region.
    let installed_by = |at: usize, pages: usize, touch: &dyn Fn()| {
        rt.mark_allocated(base + at * PAGE_SIZE, pages * PAGE_SIZE);
        let before = rt.stats().pages_installed;
        touch();
        settle();
        rt.stats().pages_installed - before
    };
    // A small allocation: its start fills it, and nothing past it.
    let n = installed_by(512, 10, &|| wr_at(&r, 512 * PAGE_SIZE, 1));
    assert!(n <= 10, "past the allocation's end: {n}");
    // A large allocation used only at its start: 16 pages, not 64.
    let n = installed_by(768, 128, &|| wr_at(&r, 768 * PAGE_SIZE, 1));
    assert_eq!(n, 16);
    // Sparse touches inside a large allocation, none at its start: a page each.
    let n = installed_by(1024, 2048, &|| {
        for k in 1..=10 {
            assert_eq!(rd_at(&r, (1024 + k * 150) * PAGE_SIZE), 0);
        }
    });
    assert_eq!(n, 10);
    for p in 0..256 {
        assert_eq!(rd_at(&r, p * PAGE_SIZE), p as u64 + 3, "page {p}");
    }
}

/// A heap filled in order from its start, page by page, where no allocation was reported
/// (mimalloc's arenas, filled a 64 KiB page at a time): each fault zero-fills as far ahead
/// as the run of resident pages behind it, up to 64 pages, so 2,048 pages take a few dozen
/// faults, not one per 16-page block (128), and no more than 64 pages go past the last one
/// written. Past the end of a reported allocation it is the room after a block, not a front:
/// only the rest of the 16-page block. (Fault read-ahead is off, so that the counts are the
/// zero-fill's alone; raced faults are allowed as in the tests above.)
#[test]
fn a_heap_filled_in_order_faults_at_growing_distances_and_stops_at_a_block_end() {
    let settle = || std::thread::sleep(Duration::from_millis(50));
    const PAGES: usize = 2048;
    let rt = runtime(64 << 20, 32, 0);
    let r = rt.create_region(32 << 20).unwrap();
    let base = r.as_ptr() as usize;
    for p in 0..PAGES {
        wr_at(&r, p * PAGE_SIZE, p as u64 + 5);
    }
    settle();
    let s = rt.stats();
    let faults = s.unhinted_faults - s.spurious_faults - s.stolen_faults;
    // 1 + 1 (the first block) + 16, 32 (the ramp) + one per 64 pages after.
    assert!(
        (PAGES as u64 / 64..=PAGES as u64 / 64 + 6).contains(&faults),
        "{PAGES} pages written in order: {faults} faults: {s}"
    );
    assert!(
        s.pages_installed as usize <= PAGES + 64,
        "more than 64 pages past the front: {s}"
    );
    // A reported allocation filled to its end, then a touch just past it.
    let at = 4096;
    rt.mark_allocated(base + at * PAGE_SIZE, 100 * PAGE_SIZE);
    for p in at..at + 100 {
        wr_at(&r, p * PAGE_SIZE, p as u64 + 5);
    }
    settle();
    let before = rt.stats();
    wr_at(&r, (at + 100) * PAGE_SIZE, 1);
    settle();
    let after = rt.stats();
    let raced = (after.stolen_faults - before.stolen_faults)
        + (after.spurious_faults - before.spurious_faults);
    // Page 4196 is in the block 4192..4208: 12 pages.
    assert!(
        after.pages_installed - before.pages_installed <= 12 + raced,
        "past a reported allocation: {after}"
    );
    for p in (0..PAGES).chain(at..at + 100) {
        assert_eq!(rd_at(&r, p * PAGE_SIZE), p as u64 + 5, "page {p}");
    }
}
