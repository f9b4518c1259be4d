//! Never-written pages read as zeros and cost no backend reads; written pages never read
//! back as zeros after eviction, whatever path brings them back (fault, hint, read-ahead
//! that mixes written and never-written pages in one run).

use farmem_runtime::testing::*;
use farmem_runtime::{FM_WRITE, PAGE_SIZE};

/// A 1 GiB region with a 16 MiB budget: reading every page (three words each, every 61st
/// page in full) sees zeros only, and nothing is read from or written to the backend.
#[test]
fn untouched_pages_read_as_zero_without_backend_reads() {
    let rt = runtime(16 << 20, 32, 64);
    let r = rt.create_region(1 << 30).unwrap();
    let pages = r.len() / PAGE_SIZE;
    assert_eq!(pages, 262_144);
    let mut rng = XorShift::new(5);
    let mut nonzero = Vec::new();
    let mut p = 0;
    while p < pages {
        // Mix the access styles: plain sequential faults (fault read-ahead kicks in),
        // hints, range hints with read-ahead, and random jumps.
        match rng.below(4) {
            0 => farmem_runtime::hint(at(&r, p * PAGE_SIZE)),
            1 => farmem_runtime::hint_ex(at(&r, p * PAGE_SIZE), 4 * PAGE_SIZE, 0, 32, 0),
            _ => {}
        }
        let words: Vec<usize> = if p % 61 == 0 {
            (0..WORDS_PER_PAGE).collect()
        } else {
            vec![0, rng.below(WORDS_PER_PAGE), WORDS_PER_PAGE - 1]
        };
        for w in words {
            let v = rd_at(&r, p * PAGE_SIZE + w * 8);
            if v != 0 && nonzero.len() < 10 {
                nonzero.push((p, w, v));
            }
        }
        p += 1;
    }
    // Some random revisits of pages evicted long ago.
    for _ in 0..20_000 {
        let p = rng.below(pages);
        let v = rd_at(&r, p * PAGE_SIZE + 8 * rng.below(WORDS_PER_PAGE));
        if v != 0 && nonzero.len() < 10 {
            nonzero.push((p, 0, v));
        }
    }
    assert!(
        nonzero.is_empty(),
        "never-written pages read non-zero: {nonzero:?}"
    );
    let s = rt.stats();
    eprintln!("{s}");
    assert_eq!(
        s.pages_fetched, 0,
        "reading never-written pages read the backend: {s}"
    );
    assert_eq!(s.bytes_read, 0);
    assert_eq!(
        s.pages_written_back, 0,
        "clean zero pages were written back: {s}"
    );
    assert_eq!(s.backend_bytes, 0, "the backend holds nothing");
    assert!(
        s.zero_fills >= pages as u64,
        "every page was zero-filled at least once: {s}"
    );
    assert!(s.pages_evicted >= (pages - budget_pages(&rt)) as u64, "{s}");
    assert_eq!(
        s.clean_drops, s.pages_evicted,
        "all evictions were clean drops: {s}"
    );
    assert!(s.peak_resident_pages as usize <= budget_pages(&rt));
}

/// Different shapes of written pages: full patterns, a single non-zero byte anywhere in an
/// otherwise zero page, only the last byte, only the first. Written, evicted, and read back
/// through every path; then rewritten (partly with zeros) and checked again.
#[test]
fn written_pages_never_come_back_as_zeros() {
    const PAGES: usize = 4096; // 16 MiB, 4x the budget
    let rt = runtime(4 << 20, 32, 64);
    let r = rt.create_region(PAGES * PAGE_SIZE).unwrap();
    let mut pressure = Pressure::new(&rt, 3072);
    let mut rng = XorShift::new(77);
    // expected[p]: None = never written (zeros); Some(words).
    let mut expected: Vec<Option<Vec<u64>>> = vec![None; PAGES];

    let write = |expected: &mut Vec<Option<Vec<u64>>>, p: usize, rng: &mut XorShift, round: u64| {
        let mut words = vec![0u64; WORDS_PER_PAGE];
        match rng.below(5) {
            0 => {
                for (w, x) in words.iter_mut().enumerate() {
                    *x = pattern(round, p, w);
                }
            }
            1 => words[rng.below(WORDS_PER_PAGE)] = 1 << (8 * rng.below(8)),
            2 => words[WORDS_PER_PAGE - 1] = 0x8000_0000_0000_0000,
            3 => words[0] = 1,
            // Overwrite with all zeros (on a page that may hold data): reads zero again.
            _ => {}
        }
        match rng.below(3) {
            0 => farmem_runtime::hint_write(at(&r, p * PAGE_SIZE)),
            1 => farmem_runtime::hint_ex(at(&r, p * PAGE_SIZE), PAGE_SIZE, FM_WRITE, 0, 0),
            _ => {}
        }
        for (w, &x) in words.iter().enumerate() {
            // Write every word of pages written before (to clear old data), only the
            // non-zero words of fresh pages (so a page's only write may be one byte).
            if expected[p].is_some() || x != 0 {
                wr_at(&r, p * PAGE_SIZE + w * 8, x);
            }
        }
        if expected[p].is_some() || words.iter().any(|&x| x != 0) {
            expected[p] = Some(words);
        }
    };

    let check_all = |expected: &Vec<Option<Vec<u64>>>, how: usize| -> Vec<String> {
        let mut bad = Vec::new();
        let mut p = 0;
        while p < PAGES {
            match how {
                // Range hints with read-ahead: runs mix written and never-written pages.
                0 if p % 16 == 0 => {
                    farmem_runtime::hint_ex(at(&r, p * PAGE_SIZE), 3 * PAGE_SIZE, 0, 13, 0)
                }
                // Backwards read-ahead.
                1 if p % 16 == 15 => farmem_runtime::hint_ex(at(&r, p * PAGE_SIZE), 8, 0, -15, 0),
                2 => farmem_runtime::hint(at(&r, p * PAGE_SIZE)),
                // Unhinted (sequential: fault read-ahead), and the pages between range hints.
                _ => {}
            }
            let want = |w: usize| expected[p].as_ref().map_or(0, |v| v[w]);
            if let Some((w, got, exp)) = page_mismatch(&r, p, want) {
                if bad.len() < 10 {
                    bad.push(format!(
                        "page {p} (written: {}) word {w}: got {got:#x}, want {exp:#x}",
                        expected[p].is_some()
                    ));
                }
            }
            p += 1;
        }
        bad
    };

    for round in 0..4u64 {
        // Write about a third of the pages, scattered.
        for p in 0..PAGES {
            if rng.chance(33) {
                write(&mut expected, p, &mut rng, round + 1);
            }
        }
        let written: Vec<usize> = (0..PAGES).filter(|&p| expected[p].is_some()).collect();
        pressure.evict(&r, written.iter().copied());
        let fetched = rt.stats().pages_fetched;
        let how = round as usize % 4;
        let bad = check_all(&expected, how);
        assert!(
            bad.is_empty(),
            "round {round} (read path {how}):\n{}",
            bad.join("\n")
        );
        assert!(
            rt.stats().pages_fetched > fetched,
            "written pages came from the backend"
        );

        // Once more after evicting again: the pages are clean now (dropped without
        // write-back), their far copies must still be right.
        pressure.evict(&r, written.iter().copied());
        let bad = check_all(&expected, 3 - how);
        assert!(
            bad.is_empty(),
            "round {round}, clean refetch:\n{}",
            bad.join("\n")
        );
    }
    let s = rt.stats();
    eprintln!("{s}");
    assert!(
        s.clean_drops > 0 && s.pages_written_back > 0 && s.readahead_pages > 0,
        "{s}"
    );
}

/// A sequential writer hinting `FM_WRITE` with read-ahead (a merge's output) gets its
/// read-ahead pages writable: no second trip into the runtime per page to unprotect it
/// (a write fault, or a write hint that finds it read-only), and what it writes through
/// them is kept (they are dirty from the start), over two rounds of eviction: one over
/// never-written pages, one over pages the backend holds.
#[test]
fn write_hint_read_ahead_is_writable_and_keeps_what_is_written() {
    let rt = runtime(8 << 20, 32, 0);
    let r = rt.create_region(64 << 20).unwrap();
    let pages = r.len() / PAGE_SIZE;
    for salt in [1u64, 2] {
        let before = rt.stats();
        for p in 0..pages {
            farmem_runtime::hint_ex(at(&r, p * PAGE_SIZE), PAGE_SIZE, FM_WRITE, 16, 0);
            fill_page(&r, p, |w| pattern(salt, p, w));
        }
        let s = rt.stats();
        // About one page in 17 is demanded by a hint, the others come with its read-ahead:
        // hinting and writing those must not enter the runtime again.
        let trips = (s.hint_misses - before.hint_misses) + (s.wp_faults - before.wp_faults);
        assert!(
            trips < pages as u64 / 8,
            "round {salt}: the read-ahead of write hints was installed read-only: {trips} \
             hints or faults did work for {pages} pages: {s}"
        );
        for p in 0..pages {
            if let Some(bad) = page_mismatch(&r, p, |w| pattern(salt, p, w)) {
                panic!("round {salt}: page {p} lost what was written: {bad:?}");
            }
        }
    }
    let s = rt.stats();
    assert!(
        s.pages_evicted >= 2 * (pages - budget_pages(&rt)) as u64,
        "{s}"
    );
    assert!(s.pages_written_back > 0, "{s}");
}
