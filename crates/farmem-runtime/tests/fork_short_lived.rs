//! A short-lived child of a process whose tree shares one budget (a shell's `$(...)`, a fork
//! before exec) evicts nothing for the little it touches. It had exactly what it inherited
//! as its budget, evicted ahead at once and was measured at once: every such child wrote
//! back a batch of pages it shared with its parent, which frees nothing (bash's subshells
//! under `farmem run`: ~200 pages each, 2 ms of a 5 ms subshell). Its own file: the budget
//! covers the whole test process's memory, which other tests' runtimes would share.

use farmem_runtime::testing::mix;
use farmem_runtime::{BudgetScope, Config, Runtime, PAGE_SIZE};

const PAGES: usize = 4096; // 16 MiB of region
const TOUCHED: usize = 2048; // the parent's 8 MiB, all resident
const BUDGET: u64 = 256 << 20; // the tree's: the child has room once measured too

fn word(base: usize, page: usize) -> *mut u64 {
    (base + page * PAGE_SIZE) as *mut u64
}

#[test]
fn a_short_lived_child_in_a_shared_budget_evicts_nothing() {
    let tree = std::env::temp_dir().join(format!("farmem-test-tree-{}", std::process::id()));
    farmem_runtime::tree_budget::create(&tree, Some(BUDGET / PAGE_SIZE as u64)).unwrap();
    let rt = Runtime::new(Config {
        local_mem: BUDGET,
        budget_scope: BudgetScope::Process,
        tree: Some(tree.clone()),
        ..Config::default()
    })
    .expect("a runtime (needs userfaultfd)");
    let region = rt.create_region(PAGES * PAGE_SIZE).unwrap();
    let base = region.as_mut_ptr() as usize;
    for p in 0..TOUCHED {
        // SAFETY: inside the region.
        unsafe { word(base, p).write_volatile(mix(p as u64)) };
    }
    // The parent's control thread has measured it (a member of the tree) by now.
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(rt.stats().pages_evicted, 0, "the parent fits its budget");
    // SAFETY: the child runs the code below and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // A little fresh memory, as a subshell's allocations, and a look at inherited data.
        for p in TOUCHED..TOUCHED + 32 {
            // SAFETY: inside the region.
            unsafe { word(base, p).write_volatile(mix(p as u64)) };
        }
        let wrong = (0..TOUCHED + 32)
            // SAFETY: inside the region.
            .filter(|&p| unsafe { word(base, p).read_volatile() } != mix(p as u64))
            .count();
        let code = if wrong > 0 {
            1
        } else if rt.stats().pages_evicted > 0 {
            2
        } else {
            0
        };
        // SAFETY: ends the child without the parent's exit handlers.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let _ = std::fs::remove_file(&tree);
    assert!(libc::WIFEXITED(status), "child died: status {status:#x}");
    let what = ["", "pages wrong in the child", "the child evicted pages"];
    let code = libc::WEXITSTATUS(status) as usize;
    assert_eq!(code, 0, "{}", what.get(code).copied().unwrap_or("?"));
}

/// Threads of this process named `name`.
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .count()
}

/// A forked child starts its fault thread at once and its control thread only once it has
/// lived a few milliseconds: most forked children exec or end before (starting the threads
/// took ~350 us of every fork's child handler).
#[test]
fn a_forked_child_starts_its_control_thread_only_once_it_lives_on() {
    let rt = Runtime::new(Config {
        local_mem: BUDGET,
        budget_scope: BudgetScope::Process,
        ..Config::default()
    })
    .expect("a runtime (needs userfaultfd)");
    let region = rt.create_region(64 * PAGE_SIZE).unwrap();
    let base = region.as_mut_ptr() as usize;
    // SAFETY: inside the region.
    unsafe { word(base, 0).write_volatile(7) };
    // SAFETY: the child runs the code below and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let forked = std::time::Instant::now();
        let early = threads_named("farmem-control");
        // Conclusive only if the child looked well within the delay (not descheduled).
        let code = if early > 0 && forked.elapsed() < std::time::Duration::from_millis(2) {
            1
        } else if threads_named("farmem-fault-0") == 0 {
            2
        } else {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while threads_named("farmem-control") == 0 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            // SAFETY: inside the region.
            if threads_named("farmem-control") == 0 {
                3
            } else if unsafe { word(base, 0).read_volatile() } != 7 {
                4
            } else {
                0
            }
        };
        // SAFETY: ends the child without the parent's exit handlers.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status), "child died: status {status:#x}");
    let what = [
        "",
        "the child had a control thread at once",
        "the child had no fault thread",
        "the child never started its control thread",
        "the child read a wrong value",
    ];
    let code = libc::WEXITSTATUS(status) as usize;
    assert_eq!(code, 0, "{}", what.get(code).copied().unwrap_or("?"));
}
