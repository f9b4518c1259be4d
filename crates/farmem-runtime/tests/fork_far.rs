//! fork() keeps far pages far: the child reads every page as it was at the fork, within a
//! budget of its own, while the parent goes on changing its pages (and so reusing the far
//! store's space) and never holds more than its budget.

use std::sync::atomic::{AtomicU64, Ordering};

use farmem_runtime::testing::mix;
use farmem_runtime::{BackendSpec, Config, Region, Runtime, PAGE_SIZE};

const PAGES: usize = 8192; // 32 MiB of data
const BUDGET: u64 = 4 << 20; // 4 MiB local: most of it is far

fn stamp(region: &Region, page: usize, gen: u64) {
    let p = region.as_mut_ptr().wrapping_add(page * PAGE_SIZE) as *mut u64;
    // SAFETY: inside the region; one writer per page.
    unsafe { p.write(mix(page as u64 ^ (gen << 40))) };
    // The last word too: a page is checked at both ends.
    let q = region
        .as_mut_ptr()
        .wrapping_add(page * PAGE_SIZE + PAGE_SIZE - 8) as *mut u64;
    // SAFETY: as above.
    unsafe { q.write(!mix(page as u64 ^ (gen << 40))) };
}

fn wrong(region: &Region, gen: u64) -> usize {
    wrong_in(region, 0..PAGES, gen)
}

fn wrong_in(region: &Region, pages: std::ops::Range<usize>, gen: u64) -> usize {
    pages
        .filter(|&page| {
            let p = region.as_ptr().wrapping_add(page * PAGE_SIZE) as *const AtomicU64;
            let q = region
                .as_ptr()
                .wrapping_add(page * PAGE_SIZE + PAGE_SIZE - 8)
                as *const AtomicU64;
            let want = mix(page as u64 ^ (gen << 40));
            // SAFETY: inside the region, aligned.
            unsafe { (*p).load(Ordering::Relaxed) != want || (*q).load(Ordering::Relaxed) != !want }
        })
        .count()
}

fn within(rt: &Runtime, budget: u64) -> bool {
    // A batch of slack: the control thread keeps the budget, a fetch may be in flight.
    rt.stats().resident_pages * PAGE_SIZE as u64 <= budget + (64 * PAGE_SIZE) as u64
}

fn within_budget(rt: &Runtime) -> bool {
    within(rt, BUDGET)
}

fn check(backend: BackendSpec) {
    check_with(backend, None)
}

/// `child_budget`: the children's own (`Config::fork_local_mem`), else the parent's.
fn check_with(backend: BackendSpec, child_budget: Option<u64>) {
    let rt = Runtime::new(Config {
        local_mem: BUDGET,
        backend,
        evict_batch: 32,
        fork_local_mem: child_budget,
        ..Config::default()
    })
    .expect("a runtime (needs userfaultfd)");
    let region = rt.create_region(PAGES * PAGE_SIZE).unwrap();
    for p in 0..PAGES {
        stamp(&region, p, 3);
    }
    assert!(
        rt.stats().pages_evicted > PAGES as u64 / 2,
        "most pages are far"
    );
    // Read back twice (a page written in its last stay comes back writable; one only read
    // comes back write-protected): the pages local at the fork are then clean copies of far
    // ones, which the child writes.
    assert_eq!(wrong(&region, 3), 0);
    assert_eq!(wrong(&region, 3), 0);
    let mut go = [0i32; 2];
    // SAFETY: pipe fills the array.
    assert_eq!(unsafe { libc::pipe(go.as_mut_ptr()) }, 0);
    // SAFETY: the child runs the code below and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let mut byte = 0u8;
        // SAFETY: reading one byte from our pipe into a live byte.
        unsafe { libc::read(go[0], &mut byte as *mut u8 as *mut libc::c_void, 1) };
        // Everything as it was at the fork, though the parent has rewritten it all since.
        // First the pages local at the fork (the last ones read), written at once: the
        // kernel made them writable in the child, whatever the parent's protection; then
        // the rest, whose fetches evict those.
        let tail = PAGES - 256..PAGES;
        let mut bad = wrong_in(&region, tail.clone(), 3);
        for p in tail.clone() {
            stamp(&region, p, 9);
        }
        bad += wrong_in(&region, 0..tail.start, 3);
        bad += wrong_in(&region, tail.clone(), 9);
        // The child's own writes, evicted and fetched by its own runtime.
        for p in 0..tail.start {
            stamp(&region, p, 9);
        }
        bad += wrong(&region, 9);
        let code = if bad > 0 {
            1
        } else if !within(&rt, child_budget.unwrap_or(BUDGET)) {
            2
        } else if rt.stats().pages_evicted == 0 {
            3
        } else {
            0
        };
        // SAFETY: ends the child without the parent's exit handlers.
        unsafe { libc::_exit(code) };
    }
    let s = rt.stats();
    assert_eq!(s.fork_fetched_pages, 0, "the fork brought far pages back");
    assert!(
        within_budget(&rt),
        "{} pages local after the fork",
        s.resident_pages
    );
    // Rewrite everything while the child has not read a page yet: the far store's space
    // for the old contents is freed and reused here, never under the child's feet.
    for p in 0..PAGES {
        stamp(&region, p, 5);
    }
    assert_eq!(wrong(&region, 5), 0, "the parent's own pages");
    // SAFETY: writing one byte to our pipe.
    unsafe { libc::write(go[1], b"x".as_ptr() as *const libc::c_void, 1) };
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status), "child died: status {status:#x}");
    let what = [
        "",
        "pages wrong in the child",
        "child over its budget",
        "child evicted nothing",
    ];
    let code = libc::WEXITSTATUS(status) as usize;
    assert_eq!(code, 0, "{}", what.get(code).copied().unwrap_or("?"));
    // SAFETY: closing our pipe.
    unsafe {
        libc::close(go[0]);
        libc::close(go[1]);
    }
    assert_eq!(wrong(&region, 5), 0, "the parent's pages after the child");
    assert!(within_budget(&rt));
}

#[test]
fn the_child_of_an_in_process_store_reads_its_far_pages() {
    check(BackendSpec::Local { lz4: false });
}

#[test]
fn the_child_of_a_compressed_store_reads_its_far_pages() {
    check(BackendSpec::Local { lz4: true });
}

#[test]
fn the_child_of_a_file_tier_reads_the_parents_file_as_it_was() {
    check(BackendSpec::File {
        dir: farmem_runtime::default_far_dir(),
        max_bytes: None,
    });
}

#[test]
fn the_child_of_the_tiered_default_reads_both_tiers() {
    check(BackendSpec::Tiered {
        dir: farmem_runtime::default_far_dir(),
        compressed_max: Some(256 << 10),
    });
}

/// A child with a budget of its own, smaller than its parent's, evicts down to it.
#[test]
fn a_child_keeps_to_the_budget_given_to_forked_children() {
    check_with(BackendSpec::Local { lz4: true }, Some(1 << 20));
}
