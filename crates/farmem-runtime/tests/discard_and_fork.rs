//! Discarding pages (what munmap and MADV_DONTNEED mean for far memory) and fork (a child
//! must see every page, also those that were far when it was forked; `fork_far.rs` has
//! more).

use std::sync::atomic::{AtomicU64, Ordering};

use farmem_runtime::testing::*;
use farmem_runtime::PAGE_SIZE;

const PAGES: usize = 8192; // 32 MiB of data
const BUDGET: u64 = 4 << 20; // 4 MiB local: most of it is far

/// The first 8 bytes of every page name the page and a generation.
fn stamp(region: &farmem_runtime::Region, page: usize, gen: u64) {
    let p = region.as_mut_ptr().wrapping_add(page * PAGE_SIZE) as *mut u64;
    // SAFETY: inside the region; one writer per page in these tests.
    unsafe { p.write(mix(page as u64 ^ (gen << 40))) };
}

fn read(region: &farmem_runtime::Region, page: usize) -> u64 {
    let p = region.as_ptr().wrapping_add(page * PAGE_SIZE) as *const AtomicU64;
    // SAFETY: inside the region, aligned.
    unsafe { (*p).load(Ordering::Relaxed) }
}

#[test]
fn discarded_pages_read_zero_and_the_rest_is_intact() {
    let rt = runtime(BUDGET, 32, 16);
    let region = rt.create_region(PAGES * PAGE_SIZE).unwrap();
    for p in 0..PAGES {
        stamp(&region, p, 1);
    }
    assert!(rt.stats().pages_evicted > 0, "nothing was evicted");
    // A range mixing far pages (the start, evicted first) and local ones (the end).
    let (lo, hi) = (100, PAGES - 50);
    let local_before = rt.stats().resident_pages;
    rt.discard(
        region.as_ptr() as usize + lo * PAGE_SIZE,
        (hi - lo) * PAGE_SIZE,
    );
    assert!(rt.stats().resident_pages <= local_before);
    assert_eq!(rt.stats().pages_discarded, (hi - lo) as u64);
    for p in 0..PAGES {
        let want = if (lo..hi).contains(&p) {
            0
        } else {
            mix(p as u64 ^ (1 << 40))
        };
        assert_eq!(read(&region, p), want, "page {p} after discard");
    }
    // Written again after the discard, evicted and fetched: the new contents, never the old.
    for p in lo..hi {
        stamp(&region, p, 2);
    }
    for p in 0..PAGES {
        let gen = if (lo..hi).contains(&p) { 2 } else { 1 };
        assert_eq!(
            read(&region, p),
            mix(p as u64 ^ (gen << 40)),
            "page {p} rewritten"
        );
    }
}

#[test]
fn forked_child_sees_far_pages() {
    let rt = runtime(BUDGET, 32, 16);
    let region = rt.create_region(PAGES * PAGE_SIZE).unwrap();
    for p in 0..PAGES {
        stamp(&region, p, 3);
    }
    let evicted = rt.stats().pages_evicted;
    assert!(
        evicted > PAGES as u64 / 2,
        "most pages should be far ({evicted} evicted)"
    );
    // SAFETY: the child only reads memory and calls _exit (no allocation, no locks).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let mut bad = 0i32;
        for p in 0..PAGES {
            if read(&region, p) != mix(p as u64 ^ (3 << 40)) {
                bad += 1;
            }
        }
        // The child's writes are its own (copy on write).
        for p in 0..PAGES {
            stamp(&region, p, 9);
        }
        // SAFETY: ends the child without running the parent's exit handlers.
        unsafe { libc::_exit(bad.min(100)) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status), "child died: status {status:#x}");
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "pages the child saw wrong (capped at 100)"
    );
    // The child read its far pages from its own copy of the store: nothing came back here.
    assert_eq!(
        rt.stats().fork_fetched_pages,
        0,
        "the fork brought pages back"
    );
    // The parent is unaffected and goes back under its budget.
    for p in 0..PAGES {
        assert_eq!(
            read(&region, p),
            mix(p as u64 ^ (3 << 40)),
            "parent page {p}"
        );
    }
    let s = rt.stats();
    assert!(
        s.resident_pages * PAGE_SIZE as u64 <= BUDGET,
        "resident {} pages over a budget of {} bytes after the fork",
        s.resident_pages,
        BUDGET
    );
}
