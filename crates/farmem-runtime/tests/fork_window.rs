//! A forking thread that touches far memory after the runtime's prepare handler (the C
//! library's own fork code does: glibc copies its NSS configuration from the heap; other
//! libraries' prepare handlers run after the runtime's) is served, and the child sees the
//! page's contents, not zeros, even before its own handler runs. It used to wait in that
//! fault for ever: the fault thread waited at the fork gate the forking thread held closed
//! (bash under `farmem run` without `SHELL` in its environment hung at its first fork).
//!
//! Its own test binary: the fork handlers must be registered before the runtime's (prepare
//! handlers run in the reverse order of registration, child handlers in that order).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use farmem_runtime::testing::mix;
use farmem_runtime::{BackendSpec, Config, Runtime, PAGE_SIZE};

const PAGES: usize = 4096; // 16 MiB of data
const BUDGET: u64 = 2 << 20; // 2 MiB local: the first pages written are far at the fork
/// The pages the handlers read: far at every fork (the oldest written, never read since).
const WATCHED: [usize; 3] = [0, 1, 7];

/// The region's base, for the handlers.
static BASE: AtomicUsize = AtomicUsize::new(0);
/// What the parent's prepare handler read (the sum of the watched words), and the child's.
static PREPARE_SUM: AtomicU64 = AtomicU64::new(0);
static CHILD_SUM: AtomicU64 = AtomicU64::new(0);

fn word(page: usize) -> *mut u64 {
    (BASE.load(Ordering::SeqCst) + page * PAGE_SIZE + 8) as *mut u64
}

fn watched_sum() -> u64 {
    WATCHED.iter().fold(0u64, |acc, &p| {
        // SAFETY: inside the region (set before any fork).
        acc.wrapping_add(unsafe { word(p).read_volatile() })
    })
}

fn want_sum() -> u64 {
    WATCHED
        .iter()
        .fold(0u64, |acc, &p| acc.wrapping_add(mix(p as u64)))
}

extern "C" fn prepare() {
    if BASE.load(Ordering::SeqCst) != 0 {
        PREPARE_SUM.store(watched_sum(), Ordering::SeqCst);
    }
}

extern "C" fn child() {
    if BASE.load(Ordering::SeqCst) != 0 {
        // Before the runtime's child handler: the page must be here already.
        CHILD_SUM.store(watched_sum(), Ordering::SeqCst);
    }
}

fn check(backend: BackendSpec) {
    // SAFETY: registering two plain extern "C" functions that never unwind.
    assert_eq!(
        unsafe { libc::pthread_atfork(Some(prepare), None, Some(child)) },
        0
    );
    let rt = Runtime::new(Config {
        local_mem: BUDGET,
        backend,
        // A stall fails the test with its cause instead of hanging it.
        watchdog_s: 10.0,
        watchdog_abort: true,
        ..Config::default()
    })
    .expect("a runtime (needs userfaultfd)");
    let region = rt.create_region(PAGES * PAGE_SIZE).unwrap();
    BASE.store(region.as_mut_ptr() as usize, Ordering::SeqCst);
    for p in 0..PAGES {
        // SAFETY: inside the region.
        unsafe { word(p).write_volatile(mix(p as u64)) };
    }
    for round in 0..5 {
        // The watched pages far again: write over everything else once more.
        for p in 8..PAGES {
            // SAFETY: inside the region.
            unsafe { word(p).write_volatile(mix(p as u64)) };
        }
        let faults_before = rt.stats().unhinted_faults;
        PREPARE_SUM.store(0, Ordering::SeqCst);
        // SAFETY: the child only reads a static and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let ok = CHILD_SUM.load(Ordering::SeqCst) == want_sum() && watched_sum() == want_sum();
            // SAFETY: ends the child without the parent's exit handlers.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(
            libc::WIFEXITED(status),
            "round {round}: child died: {status:#x}"
        );
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "round {round}: the child read zeros or wrong data where the parent's pages were"
        );
        assert_eq!(
            PREPARE_SUM.load(Ordering::SeqCst),
            want_sum(),
            "round {round}: the prepare handler read wrong data"
        );
        assert!(
            rt.stats().unhinted_faults > faults_before,
            "round {round}: the watched pages were not far at the fork (the test tests nothing)"
        );
        assert_eq!(
            watched_sum(),
            want_sum(),
            "round {round}: the parent's pages after"
        );
    }
    BASE.store(0, Ordering::SeqCst);
}

#[test]
fn a_forking_thread_touching_far_memory_after_the_prepare_handler_is_served() {
    check(Config::default().backend);
}
