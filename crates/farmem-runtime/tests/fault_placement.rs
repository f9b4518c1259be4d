//! The fault thread follows a program thread that faults alone (`placement.rs`): both are
//! pinned to that thread's CPU. It must stop following when several threads fault, and a
//! fault from another CPU must be served while a busy thread holds the fault thread's CPU.
//!
//! Each test looks at the runtime's fault thread by name, so they run one at a time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use farmem_runtime::testing::*;
use farmem_runtime::{Config, Runtime, PAGE_SIZE};
use farmem_sys::sched;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Two CPUs this process may use, or `None` (then the placement has nothing to do).
fn two_cpus() -> Option<(u32, u32)> {
    let set = sched::allowed_cpus().ok()?;
    let mut cpus = (0..libc::CPU_SETSIZE as u32).filter(|&c| sched::has_cpu(&set, c));
    Some((cpus.next()?, cpus.next()?))
}

fn runtime(budget_pages: usize) -> Runtime {
    Runtime::new(Config {
        local_mem: (budget_pages * PAGE_SIZE) as u64,
        evict_batch: 32,
        fault_readahead: 0,
        // A stalled fault fails the test with its cause instead of hanging it.
        watchdog_s: 10.0,
        watchdog_abort: true,
        ..Config::default()
    })
    .expect("a runtime (needs userfaultfd)")
}

/// The CPUs the runtime's fault thread may run on, from its `/proc` status.
fn fault_thread_cpus() -> String {
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() == "farmem-fault-0" {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap();
            return status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .unwrap()
                .trim()
                .to_string();
        }
    }
    panic!("no fault thread");
}

/// Run `f` on a thread pinned to `cpu`.
fn on_cpu<T: Send + 'static>(
    cpu: u32,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    std::thread::spawn(move || {
        sched::pin_to(cpu).unwrap();
        f()
    })
}

/// Write `pages` pages of `r` from `first` (so that most go far), then read them back in a
/// scattered order, checking each.
fn write_then_read(r: &farmem_runtime::Region, first: usize, pages: usize, salt: u64) {
    for p in first..first + pages {
        wr_at(r, p * PAGE_SIZE, mix(p as u64 ^ salt));
    }
    for k in 0..pages {
        let p = first + (k * 7919) % pages;
        assert_eq!(rd_at(r, p * PAGE_SIZE), mix(p as u64 ^ salt), "page {p}");
    }
}

#[test]
fn the_fault_thread_follows_a_thread_that_faults_alone() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some((_, cpu)) = two_cpus() else { return };
    let rt = runtime(512);
    let r = Arc::new(rt.create_region(8192 * PAGE_SIZE).unwrap());
    let r2 = Arc::clone(&r);
    on_cpu(cpu, move || write_then_read(&r2, 0, 8192, 1))
        .join()
        .unwrap();
    let s = rt.stats();
    assert!(s.unhinted_faults > 5000, "faults far memory: {s}");
    assert!(s.fault_thread_moves >= 1, "never followed: {s}");
    // Once the faults stop, the fault thread stops following within a few ms: it may use
    // every CPU again.
    let t0 = Instant::now();
    let all = {
        let set = sched::allowed_cpus().unwrap();
        (0..libc::CPU_SETSIZE as u32)
            .filter(|&c| sched::has_cpu(&set, c))
            .count()
    };
    while fault_thread_cpus() == cpu.to_string() && all > 1 {
        assert!(t0.elapsed() < Duration::from_secs(5), "still pinned: {s}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn threads_faulting_on_two_cpus_stop_the_following() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some((a, b)) = two_cpus() else { return };
    let rt = runtime(512);
    let r = Arc::new(rt.create_region(2 * 6144 * PAGE_SIZE).unwrap());
    let (ra, rb) = (Arc::clone(&r), Arc::clone(&r));
    let ta = on_cpu(a, move || {
        for round in 0..3 {
            write_then_read(&ra, 0, 6144, round)
        }
    });
    let tb = on_cpu(b, move || {
        for round in 0..3 {
            write_then_read(&rb, 6144, 6144, 10 + round)
        }
    });
    ta.join().unwrap();
    tb.join().unwrap();
    let s = rt.stats();
    assert!(
        s.follow_pauses >= 1,
        "threads faulting side by side on two CPUs did not stop the following: {s}"
    );
}

/// Thread A, on one CPU, faults over its half of a region (so that the fault thread follows
/// it there), then keeps that CPU busy until B is done, touching a far page
/// every `fault_every` if given. Thread B, on the other CPU, faults over the other half
/// meanwhile, checking every page. Returns the runtime's statistics after; a fault of B
/// left waiting fails the test through the watchdog.
fn beside_a_busy_thread(fault_every: Option<Duration>, salt: u64) -> farmem_runtime::StatsSnapshot {
    let Some((a, b)) = two_cpus() else {
        return Default::default();
    };
    let rt = runtime(512);
    let r = Arc::new(rt.create_region(2 * 4096 * PAGE_SIZE).unwrap());
    let done = Arc::new(AtomicBool::new(false));
    let (ra, d) = (Arc::clone(&r), Arc::clone(&done));
    let busy = on_cpu(a, move || {
        write_then_read(&ra, 0, 4096, salt);
        let mut x = 0u64;
        let mut p = 0;
        while !d.load(Ordering::Relaxed) {
            let spell = Instant::now();
            while fault_every.is_none_or(|every| spell.elapsed() < every) {
                x = mix(x);
                if d.load(Ordering::Relaxed) {
                    return x;
                }
            }
            p = (p + 2053) % 4096;
            assert_eq!(rd_at(&ra, p * PAGE_SIZE), mix(p as u64 ^ salt), "page {p}");
        }
        x
    });
    // Let A fault first, the fault thread settle beside it, and A finish its faults.
    let t0 = Instant::now();
    while rt.stats().fault_thread_moves == 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(200));
    let rb = Arc::clone(&r);
    let served = on_cpu(b, move || {
        for round in 0..2 {
            write_then_read(&rb, 4096, 4096, salt + 10 + round);
        }
    })
    .join();
    done.store(true, Ordering::Relaxed);
    busy.join().unwrap();
    served.unwrap();
    rt.stats()
}

/// Thread A keeps the fault thread's CPU busy, with a fault every 2 ms; thread B faults
/// from the other CPU. B's faults are served and the following stops (two threads fault).
#[test]
fn a_fault_is_served_while_a_busy_thread_holds_the_fault_threads_cpu() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if two_cpus().is_none() {
        return;
    }
    let s = beside_a_busy_thread(Some(Duration::from_millis(2)), 3);
    assert!(
        s.follow_pauses >= 1,
        "B's faults beside busy A did not stop the following: {s}"
    );
}

/// Thread A keeps the fault thread's CPU busy for good without a system call, having faulted
/// just before: the fault thread, pinned there, shares the CPU with it. Thread B's faults
/// from the other CPU must still be served (the fault thread at its fair share, or the
/// control thread stealing them).
#[test]
fn faults_are_served_while_the_followed_thread_keeps_its_cpu_busy() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if two_cpus().is_none() {
        return;
    }
    let s = beside_a_busy_thread(None, 5);
    assert!(s.unhinted_faults > 4000, "{s}");
}

/// While the fault thread follows a thread that writes at random over four times its
/// budget, the control thread hands the write-protects of its evictions to the fault thread
/// (`protect_handoff.rs`): every page must still hold its last write, word for word.
#[test]
fn handed_over_write_protects_lose_no_write() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some((_, cpu)) = two_cpus() else { return };
    let rt = runtime(512);
    let pages = 2048;
    let r = Arc::new(rt.create_region(pages * PAGE_SIZE).unwrap());
    let r2 = Arc::clone(&r);
    let versions = on_cpu(cpu, move || {
        let mut version = vec![0u64; pages];
        let mut x = 12345u64;
        for _ in 0..40_000 {
            x = mix(x);
            let p = (x as usize) % pages;
            version[p] += 1;
            let (p_, v) = (p as u64, version[p]);
            // Two words per write, at either end of the page: a torn or stale page shows.
            wr_at(&r2, p * PAGE_SIZE, mix(p_ ^ v << 32));
            wr_at(&r2, p * PAGE_SIZE + PAGE_SIZE - 8, mix(p_ ^ v << 32) ^ 1);
        }
        version
    })
    .join()
    .unwrap();
    for (p, &v) in versions.iter().enumerate() {
        let want = if v == 0 { 0 } else { mix(p as u64 ^ v << 32) };
        assert_eq!(rd_at(&r, p * PAGE_SIZE), want, "page {p}, version {v}");
        let last = if v == 0 { 0 } else { want ^ 1 };
        assert_eq!(
            rd_at(&r, p * PAGE_SIZE + PAGE_SIZE - 8),
            last,
            "page {p} end"
        );
    }
    let s = rt.stats();
    assert!(s.pages_written_back > 10_000, "dirty evictions: {s}");
    assert!(
        s.protect_handoffs >= 1,
        "the fault thread never made an eviction's write-protects: {s}"
    );
}
