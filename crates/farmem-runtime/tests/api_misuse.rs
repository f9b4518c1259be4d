//! Misuse of the API must neither crash nor corrupt anything: hints on NULL, on memory
//! outside every region, with absurd lengths, read-ahead and priorities, across the end of a
//! region, after the region is gone; bad configurations and region sizes are errors.

use farmem_runtime::testing::*;
use farmem_runtime::{Config, Error, Runtime, FM_SEQ, FM_WRITE, PAGE_SIZE};

const SALT: u64 = 0xBAD;

/// Lengths given to `hint_ex`. `usize::MAX` itself (at an address that is not page aligned)
/// once overflowed the inline check; it has its own regression test,
/// `hint_ex_with_usize_max_length_covers_the_rest_of_the_region`.
fn lengths() -> Vec<usize> {
    let mut v = vec![
        0usize,
        1,
        4095,
        4096,
        4097,
        1 << 20,
        usize::MAX / 2,
        usize::MAX - 4095,
    ];
    if !cfg!(debug_assertions) {
        v.push(usize::MAX);
    }
    v
}

/// Every hint flavour with a set of hostile arguments at `p`.
fn hint_everything(p: *const u8) {
    farmem_runtime::hint(p);
    farmem_runtime::hint_write(p);
    for len in lengths() {
        for &flags in &[0u32, FM_WRITE, FM_SEQ, FM_WRITE | FM_SEQ, u32::MAX] {
            for &(ra, prio) in &[
                (0i32, 0u8),
                (-1000, 255),
                (i32::MAX, 255),
                (i32::MIN, 7),
                (1000, 8),
            ] {
                farmem_runtime::hint_ex(p, len, flags, ra, prio);
            }
        }
    }
    let a = p as usize;
    farmem_runtime::hint_slow(a, usize::MAX, FM_WRITE, i32::MAX, 255);
    farmem_runtime::hint_slow(a, 0, 0, i32::MIN, 0);
}

#[test]
fn hints_on_null_and_foreign_memory_are_harmless() {
    // Keep a runtime with a region alive so the hint paths are fully initialised.
    let rt = runtime(8 << 20, 32, 64);
    let r = rt.create_region(1 << 20).unwrap();
    fill_page(&r, 0, |w| pattern(SALT, 0, w));

    hint_everything(std::ptr::null());
    farmem_runtime::hint_slow(0, 4096, FM_WRITE, 10, 1);

    // Stack memory.
    let mut stack = [0x5Au8; 10_000];
    hint_everything(stack.as_ptr());
    hint_everything(stack[9_999..].as_ptr());
    stack[5] = 1;
    assert!(stack
        .iter()
        .enumerate()
        .all(|(i, &b)| b == if i == 5 { 1 } else { 0x5A }));

    // Heap memory.
    let heap: Vec<u64> = (0..100_000).collect();
    hint_everything(heap.as_ptr().cast());
    hint_everything(heap[99_999..].as_ptr().cast());
    assert!(heap.iter().enumerate().all(|(i, &x)| x == i as u64));

    // Addresses that are not mapped at all: low memory, the top of user space, kernel
    // space, the very last byte of the address space.
    for a in [
        1usize,
        4096,
        0x7fff_ffff_f000,
        1 << 47,
        0xffff_8000_0000_0000,
        usize::MAX - 4095,
        usize::MAX,
    ] {
        hint_everything(a as *const u8);
    }

    // None of this reached the runtime's fetch path or disturbed the region.
    let s = rt.stats();
    assert_eq!(s.pages_fetched, 0);
    assert!(page_mismatch(&r, 0, |w| pattern(SALT, 0, w)).is_none());
}

#[test]
fn hostile_hints_on_a_region_keep_contents_right() {
    const PAGES: usize = 2048; // 8 MiB region, 2 MiB budget
    let rt = runtime(2 << 20, 16, 64);
    let r = rt.create_region(PAGES * PAGE_SIZE).unwrap();
    let mut pressure = Pressure::new(&rt, 1024);
    // Even pages written, odd pages never written.
    for p in (0..PAGES).step_by(2) {
        fill_page(&r, p, |w| pattern(SALT, p, w));
    }
    let want = |p: usize, w: usize| {
        if p.is_multiple_of(2) {
            pattern(SALT, p, w)
        } else {
            0
        }
    };
    let check = |what: &str| {
        for p in 0..PAGES {
            if let Some((w, got, exp)) = page_mismatch(&r, p, |w| want(p, w)) {
                panic!("{what}: page {p} word {w}: got {got:#x}, want {exp:#x}");
            }
        }
    };
    pressure.evict(&r, (0..PAGES).step_by(2));

    let last = r.len() - 1;
    let targets = [
        0,
        1,
        PAGE_SIZE - 1,
        PAGES / 2 * PAGE_SIZE + 123,
        last - PAGE_SIZE,
        last - 7,
        last,
    ];
    for &off in &targets {
        hint_everything(at(&r, off));
    }
    // The last byte with a length running far past the end of the region (and read-ahead
    // past it too).
    farmem_runtime::hint_ex(at(&r, last), 1 << 30, FM_WRITE, i32::MAX, 255);
    farmem_runtime::hint_ex(at(&r, last), usize::MAX - 4095, 0, 1000, 0);
    farmem_runtime::hint_ex(at(&r, 0), usize::MAX, 0, -1000, 255); // page aligned: no overflow
                                                                   // FM_SEQ repeated on one page, with the page evicted in between.
    for _ in 0..3 {
        farmem_runtime::hint_ex(at(&r, 2 * PAGE_SIZE), 8, FM_SEQ, 4, 0);
        pressure.evict(&r, 2..3);
    }
    check("after hostile hints");
    // Write-hinted pages were made writable: they get written back on eviction, and the
    // contents stay right through another round.
    pressure.evict(&r, 0..PAGES);
    check("after another eviction");
    let s = rt.stats();
    assert!(s.peak_resident_pages as usize <= budget_pages(&rt), "{s}");
    // A hint is clipped to a quarter of the budget, whatever length it asks for.
    assert!(s.hint_calls > 0 && s.pages_fetched > 0, "{s}");
}

#[test]
fn hints_after_the_region_is_dropped_are_harmless() {
    let rt = runtime(4 << 20, 32, 64);
    let r = rt.create_region(4 << 20).unwrap();
    let mut pressure = Pressure::new(&rt, 2048);
    for p in 0..256 {
        fill_page(&r, p, |w| pattern(SALT, p, w));
    }
    pressure.evict(&r, 0..256);
    let base = r.as_ptr() as usize;
    let len = r.len();
    let resident_before = rt.stats().resident_pages;
    drop(r);
    for off in [0, 1, PAGE_SIZE * 100 + 5, len - 1] {
        hint_everything((base + off) as *const u8);
    }
    let fetched = rt.stats().pages_fetched;
    assert_eq!(fetched, 0, "hints on a dropped region fetched pages");
    assert!(rt.stats().resident_pages <= resident_before);

    // The runtime still works: a new region (possibly at the same address) starts as zeros
    // and keeps what is written to it, through eviction.
    let r2 = rt.create_region(4 << 20).unwrap();
    for p in 0..256 {
        assert!(
            page_mismatch(&r2, p, |_| 0).is_none(),
            "new region page {p} not zero"
        );
        fill_page(&r2, p, |w| pattern(SALT + 1, p, w));
    }
    hint_everything(at(&r2, 0));
    pressure.evict(&r2, 0..256);
    for p in 0..256 {
        assert!(
            page_mismatch(&r2, p, |w| pattern(SALT + 1, p, w)).is_none(),
            "page {p}"
        );
    }
    // Hints on the new region's pages go to its own runtime, also with another runtime
    // alive whose regions were dropped.
    let other = runtime(2 << 20, 16, 0);
    let r3 = other.create_region(1 << 20).unwrap();
    drop(r3);
    hint_everything(at(&r2, 5 * PAGE_SIZE));
    assert_eq!(other.stats().hint_calls, 0);
}

#[test]
fn bad_configurations_are_rejected() {
    let min_pages = farmem_runtime::config::MIN_BUDGET_PAGES;
    let cfg = |local_mem: u64| Config {
        local_mem,
        ..Config::default()
    };
    for bad in [
        cfg(0),
        cfg(4096),
        cfg((min_pages * PAGE_SIZE - 1) as u64),
        Config {
            evict_batch: 0,
            ..cfg(64 << 20)
        },
        Config {
            evict_batch: 5000,
            ..cfg(1 << 30)
        },
        Config {
            free_pct: 60.0,
            ..cfg(64 << 20)
        },
        Config {
            free_pct: -1.0,
            ..cfg(64 << 20)
        },
        Config {
            fault_threads: 0,
            ..cfg(64 << 20)
        },
        Config {
            fault_threads: 65,
            ..cfg(64 << 20)
        },
        Config {
            max_readahead: 5000,
            ..cfg(64 << 20)
        },
        Config {
            fault_readahead: 5000,
            ..cfg(64 << 20)
        },
    ] {
        let desc = format!("{bad:?}");
        assert!(bad.validate().is_err(), "validate accepted {desc}");
        match Runtime::new(bad) {
            Err(Error::Config(msg)) => assert!(!msg.is_empty()),
            Err(e) => panic!("{desc}: expected a configuration error, got {e}"),
            Ok(_) => panic!("Runtime::new accepted {desc}"),
        }
    }
    // The smallest budget allowed works, with the default eviction batch cut to fit it.
    let rt = Runtime::new(cfg((min_pages * PAGE_SIZE) as u64)).unwrap();
    assert_eq!(rt.config().evict_batch, min_pages / 8);
    let r = rt.create_region(4 * min_pages * PAGE_SIZE).unwrap();
    for p in 0..4 * min_pages {
        wr_at(&r, p * PAGE_SIZE, p as u64 + 1);
    }
    for p in 0..4 * min_pages {
        assert_eq!(rd_at(&r, p * PAGE_SIZE), p as u64 + 1);
    }
    assert!(rt.stats().pages_written_back > 0);
}

#[test]
fn bad_region_sizes_are_rejected() {
    let rt = runtime(4 << 20, 32, 64);
    assert!(matches!(rt.create_region(0), Err(Error::Invalid(_))));
    assert!(matches!(
        rt.create_region(usize::MAX),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        rt.create_region((1 << 45) + 1),
        Err(Error::Invalid(_))
    ));
    // A one-byte region is one page, zero-filled, and tolerates hostile hints.
    let r = rt.create_region(1).unwrap();
    assert_eq!(r.len(), PAGE_SIZE);
    assert!(!r.is_empty());
    assert_eq!(rd_at(&r, PAGE_SIZE - 8), 0);
    hint_everything(at(&r, 0));
    hint_everything(at(&r, PAGE_SIZE - 1));
    wr_at(&r, 8, 42);
    assert_eq!(rd_at(&r, 8), 42);
    // Sizes are rounded up to whole pages.
    let r2 = rt.create_region(PAGE_SIZE + 1).unwrap();
    assert_eq!(r2.len(), 2 * PAGE_SIZE);
}

/// A hint whose length runs past the end of the region covers the rest of the region (up to
/// a quarter of the budget), even when its first page is already present.
fn huge_length_hint(len: usize) {
    const PAGES: usize = 64;
    let rt = runtime(4 << 20, 32, 0);
    let r = rt.create_region(PAGES * PAGE_SIZE).unwrap();
    let mut pressure = Pressure::new(&rt, 2048);
    for p in 0..PAGES {
        fill_page(&r, p, |w| pattern(SALT, p, w));
    }
    pressure.evict(&r, 0..PAGES);
    farmem_runtime::hint(at(&r, 0));
    assert!(r.is_resident(0));
    // The first page is present: only the "range crosses the page" part of the inline check
    // can send this hint to the runtime.
    farmem_runtime::hint_ex(at(&r, 8), len, 0, 0, 0);
    let missing: Vec<usize> = (0..PAGES)
        .filter(|&p| !r.is_resident(p * PAGE_SIZE))
        .collect();
    assert!(
        missing.is_empty(),
        "len {len:#x}: pages not fetched by the hint: {missing:?}"
    );
    for p in 0..PAGES {
        assert!(
            page_mismatch(&r, p, |w| pattern(SALT, p, w)).is_none(),
            "page {p}"
        );
    }
}

#[test]
fn hint_ex_with_huge_length_covers_the_rest_of_the_region() {
    huge_length_hint(usize::MAX - 4095);
    huge_length_hint(1 << 40);
}

/// Regression: `hint_ex` once computed `(a & (PAGE_SIZE - 1)) + len`, which overflowed for
/// `len` near `usize::MAX` at an unaligned address (debug: panic; release: range skipped).
#[test]
fn hint_ex_with_usize_max_length_covers_the_rest_of_the_region() {
    huge_length_hint(usize::MAX);
}
