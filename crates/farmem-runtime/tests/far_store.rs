//! The in-process far store holds no page for nothing and frees what the program frees: by
//! default a page leaves it when fetched (`FarCopies::Drop`), with `Clean` only an outdated
//! copy is forgotten, and a discarded page's copy always is; the memory the store holds is
//! counted. Contents are checked throughout, under each choice of copies.

use farmem_runtime::testing::*;
use farmem_runtime::{BackendSpec, Config, FarCopies, Runtime, PAGE_SIZE};

const PAGES: usize = 4096; // 16 MiB
const BUDGET: u64 = 2 << 20;

fn start(lz4: bool, copies: Option<FarCopies>) -> Runtime {
    Runtime::new(Config {
        local_mem: BUDGET,
        backend: BackendSpec::Local { lz4 },
        evict_batch: 32,
        far_copies: copies,
        ..Config::default()
    })
    .expect("a runtime (needs userfaultfd)")
}

/// The tiered store with a compressed tier of 1 MiB: most far pages end up in its file.
fn start_tiered() -> Runtime {
    Runtime::new(Config {
        local_mem: BUDGET,
        backend: BackendSpec::Tiered {
            dir: farmem_runtime::default_far_dir(),
            compressed_max: Some(1 << 20),
        },
        evict_batch: 32,
        ..Config::default()
    })
    .expect("a runtime (needs userfaultfd)")
}

/// Half of each page from the pattern, half zeros: compressible, never all zeros.
fn content(salt: u64, page: usize, w: usize) -> u64 {
    if w.is_multiple_of(2) {
        pattern(salt, page, w)
    } else {
        0
    }
}

/// Every page holds `word(page, w)` in its word `w`.
fn check_pages(r: &farmem_runtime::Region, word: impl Fn(usize, usize) -> u64) {
    for p in 0..PAGES {
        if let Some((w, got, want)) = page_mismatch(r, p, |w| word(p, w)) {
            panic!("page {p} word {w}: read {got:#x}, wrote {want:#x}");
        }
    }
}

fn check_all(r: &farmem_runtime::Region, salt: u64) {
    check_pages(r, |p, w| content(salt, p, w));
}

/// The statistics once the control thread has stopped evicting ahead (an eviction in
/// flight has stored pages that are still counted resident).
fn quiet(rt: &Runtime) -> farmem_runtime::StatsSnapshot {
    let mut last = rt.stats();
    for _ in 0..100 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let s = rt.stats();
        if (s.resident_pages, s.far_pages, s.pages_evicted)
            == (last.resident_pages, last.far_pages, last.pages_evicted)
        {
            return s;
        }
        last = s;
    }
    panic!("the runtime never stopped evicting: {last}");
}

/// A backend counter from the runtime's report.
fn counter(rt: &Runtime, name: &str) -> u64 {
    rt.report()
        .lines()
        .find_map(|l| l.trim().strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("the store reports {name}"))
}

/// Write every page, read every page back twice (each pass evicts most of them again), and
/// count what the store holds against what is far.
fn write_and_reread(rt: &Runtime) -> farmem_runtime::Region {
    let r = rt.create_region(PAGES * PAGE_SIZE).unwrap();
    for p in 0..PAGES {
        fill_page(&r, p, |w| content(1, p, w));
    }
    check_all(&r, 1);
    check_all(&r, 1);
    r
}

#[test]
fn by_default_the_store_holds_each_page_once() {
    let rt = start(true, None);
    let r = write_and_reread(&rt);
    let s = quiet(&rt);
    assert!(s.pages_written_back > 0 && s.pages_fetched > 0, "{s}");
    // Every page was written (none is all zeros): each is either local or far, never both.
    assert_eq!(
        s.far_pages + s.resident_pages,
        PAGES as u64,
        "each page is held once: {} far + {} resident",
        s.far_pages,
        s.resident_pages
    );
    assert_eq!(
        s.clean_drops, 0,
        "no far copy is kept to drop a clean page against"
    );
    // Compressed (half the words are zeros: about 1.5:1 with lz4), held with little slack.
    let raw = s.far_pages * PAGE_SIZE as u64;
    assert!(
        s.backend_bytes < raw * 3 / 4,
        "stored {} for {raw}",
        s.backend_bytes
    );
    assert!(
        s.far_held_bytes < s.backend_bytes + s.backend_bytes / 4 + (4 << 20),
        "held {} for {} stored",
        s.far_held_bytes,
        s.backend_bytes
    );
    // Discarding every page frees the store.
    rt.discard(r.as_ptr() as usize, r.len());
    let s = rt.stats();
    assert_eq!(s.far_pages, 0, "discarded pages are forgotten by the store");
    assert_eq!(s.backend_bytes, 0);
    for p in (0..PAGES).step_by(97) {
        assert_eq!(
            page_mismatch(&r, p, |_| 0),
            None,
            "discarded page {p} reads zeros"
        );
    }
}

#[test]
fn a_store_keeping_far_copies_reads_right_and_drops_clean_pages() {
    let rt = start(true, Some(FarCopies::Keep));
    let _r = write_and_reread(&rt);
    let s = quiet(&rt);
    assert!(
        s.clean_drops > 0,
        "clean pages are dropped against their copies: {s}"
    );
    assert!(
        s.far_pages + s.resident_pages > PAGES as u64,
        "pages fetched back keep their copies: {} far + {} resident",
        s.far_pages,
        s.resident_pages
    );
}

#[test]
fn clean_copies_stay_until_written_and_rewrites_read_right() {
    let rt = start(false, Some(FarCopies::Clean));
    let r = write_and_reread(&rt);
    let s = quiet(&rt);
    assert!(
        s.far_pages + s.resident_pages > PAGES as u64,
        "pages only read since their fetch keep their copies: {s}"
    );
    assert!(s.clean_drops > 0, "and are dropped without a write: {s}");
    // A write outdates the copy: writing the local pages (their own contents again: each
    // store is a write-protect fault) leaves no page held twice.
    let local: Vec<usize> = (0..PAGES)
        .filter(|&p| r.is_resident(p * PAGE_SIZE))
        .collect();
    for &p in &local {
        wr_at(&r, p * PAGE_SIZE, rd_at(&r, p * PAGE_SIZE));
    }
    let s2 = quiet(&rt);
    assert!(s2.wp_faults > s.wp_faults, "the writes were noticed: {s2}");
    assert_eq!(
        s2.far_pages + s2.resident_pages,
        PAGES as u64,
        "written pages keep no far copy: {} local pages written, {s2}",
        local.len()
    );
    // Rewrite every page (two kinds of new contents), then check everything again.
    let salt = |p: usize| if p.is_multiple_of(2) { 2 } else { 3 };
    for p in 0..PAGES {
        fill_page(&r, p, |w| content(salt(p), p, w));
    }
    only_clean_pages_held_twice(&rt, &r, "after the rewrite");
    check_pages(&r, |p, w| content(salt(p), p, w));
    let s = only_clean_pages_held_twice(&rt, &r, "after reading it all back");
    assert_eq!(
        s.backend_bytes,
        s.far_pages * PAGE_SIZE as u64,
        "raw pages take one page each"
    );
}

/// Once eviction is quiet: no local page that was written since its fetch (or may have
/// been: mapped writable) still has a far copy, and the far store holds nothing else twice
/// (far + resident pages count each page once, plus once for each clean local page whose
/// copy is kept).
///
/// Whether any page is held twice at all depends on timing: a page rewritten, evicted,
/// fetched back by read-ahead and evicted again unwritten (found unchanged) is fetched for
/// reading next time write-protected, keeping its copy, as it should.
fn only_clean_pages_held_twice(
    rt: &Runtime,
    r: &farmem_runtime::Region,
    when: &str,
) -> farmem_runtime::StatsSnapshot {
    let s = quiet(rt);
    let mut clean_twice = 0u64;
    for p in 0..PAGES {
        let v = page_view(r, p);
        assert!(
            !v.held_twice_for_nothing(),
            "{when}: page {p} is local and written (or writable) yet keeps its far copy: {v:?}"
        );
        clean_twice += (v.present && v.far_copy) as u64;
    }
    assert_eq!(
        s.far_pages + s.resident_pages,
        PAGES as u64 + clean_twice,
        "{when}: only the {clean_twice} clean local pages keep a far copy: {s}"
    );
    s
}

/// Pages that do not compress, and pages beyond the compressed tier's cap, go to the file;
/// everything reads back right, and the store says where it is.
#[test]
fn the_tiered_store_spills_to_its_file_and_reads_back_right() {
    let rt = start_tiered();
    let r = rt.create_region(PAGES * PAGE_SIZE).unwrap();
    // Even pages compress (half zeros), odd ones do not (every word random).
    let word = |p: usize, w: usize| {
        if p.is_multiple_of(2) {
            content(4, p, w)
        } else {
            pattern(5, p, w)
        }
    };
    for p in 0..PAGES {
        fill_page(&r, p, |w| word(p, w));
    }
    for _ in 0..2 {
        check_pages(&r, word);
    }
    let s = quiet(&rt);
    // A page is held in memory once (locally or compressed); the file keeps copies of
    // pages fetched back (disk is cheap, writing them again is not).
    let compressed = s.far_pages - s.far_file_bytes / PAGE_SIZE as u64;
    assert!(
        compressed + s.resident_pages <= PAGES as u64,
        "each page once in memory: {s}"
    );
    assert!(
        s.far_pages + s.resident_pages >= PAGES as u64,
        "each page somewhere: {s}"
    );
    assert!(
        s.far_file_bytes >= (PAGES as u64 / 2 - s.resident_pages) * PAGE_SIZE as u64,
        "at least the incompressible far pages are in the file: {s}"
    );
    assert!(
        s.far_held_bytes < (2 << 20),
        "the compressed tier keeps to its cap (1 MiB, plus bookkeeping): {s}"
    );
    assert!(
        s.backend_bytes > s.far_file_bytes,
        "some pages are compressed in memory: {s}"
    );
    rt.discard(r.as_ptr() as usize, r.len());
    let s = rt.stats();
    assert_eq!((s.far_pages, s.far_file_bytes), (0, 0), "discarded: {s}");
}

/// A compressed tier that fills up sends its oldest pages to the file in the background
/// (the control thread locks them first), down to three quarters of its cap: pages still
/// read back right, and the tier keeps room for new evictions.
#[test]
fn the_tiered_store_moves_its_oldest_compressed_pages_to_the_file() {
    let rt = start_tiered();
    let r = rt.create_region(PAGES * PAGE_SIZE).unwrap();
    for p in 0..PAGES {
        fill_page(&r, p, |w| content(6, p, w));
    }
    check_all(&r, 6);
    let s = quiet(&rt);
    let demoted = counter(&rt, "demoted_to_file");
    assert!(demoted > 0, "nothing moved to the file: {s}");
    assert!(
        s.far_file_bytes > 0 && s.backend_bytes > s.far_file_bytes,
        "pages in both tiers: {s}\n{}",
        rt.report()
    );
    // Rewritten (new contents in whichever tier), then read back twice.
    for p in 0..PAGES {
        fill_page(&r, p, |w| content(7, p, w));
    }
    check_all(&r, 7);
    check_all(&r, 7);
}

/// A far file that is full refuses pages: they stay local beyond the budget, the pressure is
/// counted, and nothing is lost.
#[test]
fn a_full_far_file_keeps_pages_local_and_loses_nothing() {
    let rt = Runtime::new(Config {
        local_mem: BUDGET,
        backend: BackendSpec::File {
            dir: farmem_runtime::default_far_dir(),
            max_bytes: Some(4 << 20),
        },
        evict_batch: 32,
        ..Config::default()
    })
    .expect("a runtime (needs userfaultfd)");
    let r = rt.create_region(PAGES * PAGE_SIZE).unwrap();
    for p in 0..PAGES {
        fill_page(&r, p, |w| pattern(6, p, w));
    }
    check_pages(&r, |p, w| pattern(6, p, w));
    let s = rt.stats();
    assert!(s.backend_full > 0, "the file refused pages: {s}");
    assert!(s.over_budget_pages > 0, "kept local beyond the budget: {s}");
    assert!(
        s.far_file_bytes <= 4 << 20,
        "the file keeps to its limit: {s}"
    );
}

/// Pages whose neighbours did not compress skip the compressor (they go to the file, or
/// stay raw in `local+lz4://`), and read back right; once the same pages are rewritten with
/// compressible contents, the probes see it and they are compressed again.
#[test]
fn incompressible_neighbourhoods_skip_the_compressor_until_they_compress_again() {
    for tiered in [true, false] {
        let rt = if tiered {
            start_tiered()
        } else {
            start(true, None)
        };
        let r = rt.create_region(PAGES * PAGE_SIZE).unwrap();
        for p in 0..PAGES {
            fill_page(&r, p, |w| pattern(8, p, w));
        }
        check_pages(&r, |p, w| pattern(8, p, w));
        let s = quiet(&rt);
        let skipped = counter(&rt, "compress_skipped");
        assert!(
            skipped > PAGES as u64 / 2,
            "tiered {tiered}: most incompressible pages skip the compressor ({skipped}): {s}"
        );
        let raw_stored = s.backend_bytes;
        for p in 0..PAGES {
            fill_page(&r, p, |w| content(9, p, w));
        }
        check_all(&r, 9);
        let s = quiet(&rt);
        if tiered {
            assert!(
                s.backend_bytes > s.far_file_bytes,
                "compressible pages are compressed in memory again: {s}"
            );
        } else {
            assert!(
                s.backend_bytes < raw_stored * 3 / 4,
                "compressible pages are compressed again ({raw_stored} bytes before): {s}"
            );
        }
        // Until a probe sees the change, a neighbourhood (512 pages) skips up to 15 pages
        // (more while the old incompressible pages still resident are evicted among them).
        let more = counter(&rt, "compress_skipped") - skipped;
        assert!(
            more < PAGES as u64 / 4,
            "tiered {tiered}: {more} compressible pages skipped"
        );
    }
}
