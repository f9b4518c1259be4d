//! `farmem run` on unmodified C programs (tests/programs/*.c) whose heap is much larger than
//! the local budget: fork without exec, threads, signal handlers, exit while busy, the mmap
//! family. Each program verifies its own data and exits non-zero with a message on its first
//! mismatch; here we check that it exited 0 (within a time limit: a hang is a failure), and
//! from `--stats-json` that pages really were evicted.
//!
//! Needs `cc` and a release build of libfarmem.so next to the farmem binary
//! (`cargo build --release`).

use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod run_support;
mod support;

use run_support::{compile, Scratch};

/// A program that has not finished by then is taken to hang, and fails the test.
const TIMEOUT: Duration = Duration::from_secs(120);

struct Outcome {
    cmd: String,
    status: Option<ExitStatus>,
    stdout: String,
    stderr: String,
    stats: Option<Value>,
}

impl Outcome {
    /// Everything worth seeing when a run went wrong.
    fn describe(&self) -> String {
        let how = match self.status {
            None => format!("did not finish within {} s (hang?)", TIMEOUT.as_secs()),
            Some(s) => match (s.code(), s.signal()) {
                (Some(c), _) => format!("exited with status {c}"),
                (_, Some(sig)) => format!("was killed by signal {sig}"),
                _ => format!("ended with {s:?}"),
            },
        };
        format!(
            "`{}` {how}\n--- its stderr ---\n{}\n--- its stdout ---\n{}",
            self.cmd, self.stderr, self.stdout
        )
    }

    fn assert_success(&self) {
        assert!(
            self.status.is_some_and(|s| s.success()),
            "{}",
            self.describe()
        );
    }

    /// A counter of the program's runtime statistics (from --stats-json).
    fn stat(&self, key: &str) -> u64 {
        let s = self.stats.as_ref().unwrap_or_else(|| {
            panic!("no --stats-json output\n{}", self.describe());
        });
        s["stats"][key]
            .as_u64()
            .unwrap_or_else(|| panic!("no stats.{key} in the JSON report: {s}"))
    }
}

/// `farmem run --local-mem LOCAL --stats-json F -- PROG ARGS...`, killed (with everything it
/// started: it runs in its own process group) if it is still running after [`TIMEOUT`].
fn farmem_run(scratch: &Scratch, local: &str, prog: &Path, args: &[&str]) -> Outcome {
    farmem_run_with(scratch, &["--local-mem", local], &[], prog, args)
}

/// As [`farmem_run`], with these options of `farmem run` and environment variables.
fn farmem_run_with(
    scratch: &Scratch,
    opts: &[&str],
    env: &[(&str, &str)],
    prog: &Path,
    args: &[&str],
) -> Outcome {
    let json = scratch.path(&format!(
        "stats-{}.json",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_farmem"));
    cmd.arg("run")
        .args(opts)
        .arg("--stats-json")
        .arg(&json)
        .envs(env.iter().copied())
        .arg("--")
        .arg(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let desc = format!(
        "farmem run {} -- {} {}",
        opts.join(" "),
        prog.display(),
        args.join(" ")
    );
    let mut child = cmd.spawn().expect("starting farmem run");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let t0 = Instant::now();
    let pid = child.id() as i32;
    let timed_out = loop {
        // Wait for the end without reaping, so that the process group (named by this pid)
        // cannot be anyone else's when it is killed below.
        // SAFETY: siginfo_t is plain old data; waitid on our own child with a valid pointer.
        let ended = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let r = libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            );
            r == 0 && info.si_pid() == pid
        };
        if ended {
            break false;
        }
        if t0.elapsed() > TIMEOUT {
            break true;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Whatever is left of the program: all of it on a timeout; normally nothing (a forked
    // child it left behind would keep the output pipes open).
    // SAFETY: signalling the process group made for this run (process_group(0) above); its
    // leader is not reaped yet, so the group is still ours.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    let status = child.wait().expect("waiting for farmem run");
    let status = (!timed_out).then_some(status);
    let stdout = String::from_utf8_lossy(&out_t.join().unwrap()).into_owned();
    let stderr = String::from_utf8_lossy(&err_t.join().unwrap()).into_owned();
    let stats = std::fs::read_to_string(&json)
        .ok()
        .map(|t| serde_json::from_str(&t).expect("--stats-json is valid JSON"));
    Outcome {
        cmd: desc,
        status,
        stdout,
        stderr,
        stats,
    }
}

/// fork() without exec: the child must see every page of the parent's heap, including the
/// ones that were in far memory at the moment of the fork, and the two copies must stay
/// independent.
fn fork_test(mode: &str) {
    let dir = Scratch::new(&format!("fork-{mode}"));
    let prog = compile("fork", &dir);
    let r = farmem_run(&dir, "32M", &prog, &[mode]);
    r.assert_success();
    let evicted = r.stat("pages_evicted");
    let fork_fetched = r.stat("fork_fetched_pages");
    eprintln!("fork {mode}: {evicted} pages evicted, {fork_fetched} brought back for forks");
    assert!(
        evicted > 0,
        "nothing was evicted: the test did not cover far pages\n{}",
        r.describe()
    );
    // The default far store is in-process: the child reads its own copy of it.
    assert_eq!(
        fork_fetched,
        0,
        "far pages were brought back for the child\n{}",
        r.describe()
    );
}

#[test]
fn fork_child_sees_the_evicted_heap_and_copies_stay_independent() {
    fork_test("simple");
}

#[test]
fn forked_child_allocates_frees_and_forks_a_grandchild() {
    fork_test("nested");
}

/// Over a memory server the child cannot share the connection: the fork brings the far
/// pages back first, and the child runs with its memory local.
#[test]
fn fork_over_a_memory_server_brings_far_pages_back_for_the_child() {
    let server = support::Server::shared("run-c-programs-secret");
    let dir = Scratch::new("fork-tcp");
    let prog = compile("fork", &dir);
    let backend = format!("tcp://{}", server.addr);
    let r = farmem_run_with(
        &dir,
        &["--local-mem", "32M", "--backend", &backend],
        &[("FARMEM_TOKEN", "run-c-programs-secret")],
        &prog,
        &["nested"],
    );
    r.assert_success();
    assert!(r.stat("pages_evicted") > 0, "{}", r.describe());
    assert!(
        r.stat("fork_fetched_pages") > 0,
        "nothing was brought back for the child\n{}",
        r.describe()
    );
}

/// A forked worker that ends with `_exit` (python3's multiprocessing workers, a shell's
/// subshells) runs no exit handler: its runtime's control thread writes its statistics, so
/// the report counts what it evicted.
#[test]
fn a_forked_child_ending_with_underscore_exit_reports_its_statistics() {
    let dir = Scratch::new("fork-exit");
    let prog = compile("fork_exit", &dir);
    let r = farmem_run(&dir, "16M", &prog, &["48"]);
    r.assert_success();
    let s = r.stats.as_ref().expect("--stats-json output");
    assert_eq!(s["other_processes"], 1, "{}", r.describe());
    let evicted = s["other_stats"]["pages_evicted"].as_u64().unwrap_or(0);
    assert!(
        evicted > 0,
        "the child's evictions are missing from the report\n{}",
        r.describe()
    );
}

#[test]
fn eight_threads_allocate_reallocate_and_free_under_a_small_budget() {
    let dir = Scratch::new("threads");
    let prog = compile("threads", &dir);
    let r = farmem_run(&dir, "16M", &prog, &["8", "1000"]);
    r.assert_success();
    assert!(r.stat("pages_evicted") > 0, "{}", r.describe());
    assert!(r.stat("pages_fetched") > 0, "{}", r.describe());
}

/// Mid-size blocks (257 bytes to 32 KiB) take at most 1/32 more than asked (16 bytes up to
/// 2 KiB), keep their data through eviction, frees of their neighbours, realloc and calloc
/// of reused blocks, and once all freed, their memory goes back (even a class's last slab).
#[test]
fn mid_size_blocks_are_held_tightly_and_keep_their_data() {
    let dir = Scratch::new("midsize");
    let prog = compile("midsize", &dir);
    let r = farmem_run(&dir, "16M", &prog, &["2"]);
    r.assert_success();
    assert!(r.stat("pages_evicted") > 0, "{}", r.describe());
    assert!(r.stat("pages_fetched") > 0, "{}", r.describe());
    // With room to spare nothing is evicted: the resident set can only drop at the end
    // because freed slabs went back (each class's last one after it was idle a while).
    let r = farmem_run(&dir, "1G", &prog, &["0"]);
    r.assert_success();
    assert_eq!(r.stat("pages_evicted"), 0, "{}", r.describe());
}

/// The same allocation storm as above with every block of a mid size or smaller (up to
/// 32 KiB: the fine classes' sizes and mimalloc's), passed between threads.
#[test]
fn eight_threads_hammer_mid_size_blocks_under_a_small_budget() {
    let dir = Scratch::new("threads-mid");
    let prog = compile("threads", &dir);
    let r = farmem_run(&dir, "4M", &prog, &["8", "1500", "15"]);
    r.assert_success();
    assert!(r.stat("pages_evicted") > 0, "{}", r.describe());
}

#[test]
fn signal_handlers_read_far_memory_without_deadlock() {
    let dir = Scratch::new("signals");
    let prog = compile("signals", &dir);
    // Far pages in compressed memory: the default backend sends this program's pages (an
    // arithmetic pattern LZ4 cannot shrink) to a file, and a run of its 1,000 iterations of
    // churn then takes what the disk gives, 97-155 s on one machine against the bound of
    // 120 s (whatever the build), 2 s in memory. What is tested here is signal handlers.
    let r = farmem_run_with(
        &dir,
        &["--local-mem", "16M", "--backend", "local+lz4://"],
        &[],
        &prog,
        &["2000"],
    );
    r.assert_success();
    eprint!("{}", r.stderr);
    assert!(r.stat("pages_evicted") > 0, "{}", r.describe());
}

/// The runtime may pin a thread that faults alone beside its fault thread: the program sees
/// its own affinity all along, its new threads and its children (posix_spawn, vfork, fork,
/// system) get that affinity from the kernel, not the pin, and its own sched_setaffinity
/// holds while it faults (`programs/affinity.c`).
#[test]
fn the_fault_threads_placement_never_shows_in_the_programs_affinity() {
    let dir = Scratch::new("affinity");
    let prog = compile("affinity", &dir);
    let r = farmem_run(&dir, "16M", &prog, &["64"]);
    r.assert_success();
    assert!(r.stdout.contains("seen throughout"), "{}", r.describe());
    assert!(r.stat("unhinted_faults") > 1000, "{}", r.describe());
}

#[test]
fn exit_while_threads_hammer_the_heap_ends_promptly_with_status_0() {
    let dir = Scratch::new("exit-busy");
    let prog = compile("exit_busy", &dir);
    let mut evicted = 0;
    for run in 0..20 {
        // Every fourth run exits from a worker thread while main waits in pthread_join.
        let from = if run % 4 == 3 { "thread" } else { "main" };
        let r = farmem_run(&dir, "16M", &prog, &[&run.to_string(), from]);
        if !r.status.is_some_and(|s| s.success()) {
            panic!("run {run} of 20: {}", r.describe());
        }
        // The report is written by the exit handlers, which ran with the workers still busy.
        let json = r.stats.as_ref().expect("--stats-json written");
        assert_eq!(json["exit_code"], 0, "{json}");
        evicted += r.stat("pages_evicted");
    }
    assert!(
        evicted > 0,
        "the runs never evicted: the runtime was not busy"
    );
}

#[test]
fn mmap_munmap_mremap_madvise_and_file_mappings_under_a_small_budget() {
    let dir = Scratch::new("mmap");
    let prog = compile("mmap", &dir);
    let d = dir.dir().to_str().unwrap().to_string();
    let r = farmem_run(&dir, "16M", &prog, &[&d]);
    r.assert_success();
    assert!(r.stat("pages_evicted") > 0, "{}", r.describe());
}

/// Heaps made the way V8 and the JVM make theirs (address space reserved `PROT_NONE`,
/// committed and decommitted with `mprotect` and fixed mappings, data made unreadable for a
/// while, private file mappings at fixed addresses) are far memory: 96 MiB committed at a
/// 16 MiB budget, most of it evicted and read back, every byte verified by the program.
/// Before, such reservations went to the kernel unmanaged: the same run held 77 MiB
/// resident and evicted nothing.
#[test]
fn reserved_then_committed_heaps_are_far_memory() {
    let dir = Scratch::new("reserve");
    let prog = compile("reserve", &dir);
    let d = dir.dir().to_str().unwrap().to_string();
    let r = farmem_run(&dir, "16M", &prog, &[&d]);
    r.assert_success();
    assert!(r.stat("pages_evicted") > 20_000, "{}", r.describe());
    let peak = r.stats.as_ref().and_then(|s| s["peak_rss_bytes"].as_u64());
    assert!(
        peak.is_some_and(|p| p < 48 << 20),
        "peak resident set {peak:?} bytes\n{}",
        r.describe()
    );
}

/// A program that closes every descriptor it did not open (`close_range`, `closefrom`,
/// `close` of every number, `dup2` onto every number), as daemons and process helpers do
/// (Erlang's `erl_child_setup` hung at its next `fork` when it closed the runtime's
/// userfaultfd), then forks: the runtime's descriptors survive, the heap (4x the budget,
/// its far pages in the default tiers) verifies in both processes, and `dup2` onto one of
/// them is refused.
#[test]
fn programs_that_close_every_descriptor_keep_their_far_memory() {
    let dir = Scratch::new("closeall");
    let prog = compile("closeall", &dir);
    let r = farmem_run(&dir, "16M", &prog, &["64"]);
    r.assert_success();
    assert!(r.stdout.contains("ok"), "{}", r.describe());
    assert!(r.stat("pages_evicted") > 16_000, "{}", r.describe());
    assert!(
        r.stderr.contains("refused (EBUSY)"),
        "dup2 onto the runtime's descriptor was not refused\n{}",
        r.describe()
    );
}

/// The program's stderr is its own: a heap growing to several GiB of address space (more
/// than one arena of the small-object allocator) adds nothing to it.
#[test]
fn a_heap_growing_past_gibibytes_adds_nothing_to_stderr() {
    let dir = Scratch::new("grow");
    let prog = compile("grow", &dir);
    let r = farmem_run(&dir, "16M", &prog, &["3"]);
    r.assert_success();
    assert!(
        r.stderr.is_empty(),
        "the runtime wrote to the program's stderr:\n{}",
        r.describe()
    );
}

/// The threads program again, with blocks of up to 64 KiB that --prefault makes present at
/// allocation time (the allocating thread runs the runtime's fetch path itself, evicting when
/// the budget is full), and far memory on a `farmem server` (write-backs complete on the
/// connection threads).
#[test]
fn threads_with_prefault_over_a_memory_server() {
    let server = support::Server::shared("run-c-programs-secret");
    let dir = Scratch::new("threads-tcp");
    let prog = compile("threads", &dir);
    let backend = format!("tcp://{}", server.addr);
    let r = farmem_run_with(
        &dir,
        &["--local-mem", "4M", "--prefault", "--backend", &backend],
        &[("FARMEM_TOKEN", "run-c-programs-secret")],
        &prog,
        &["8", "3000", "16"],
    );
    r.assert_success();
    assert!(r.stat("pages_evicted") > 0, "{}", r.describe());
    assert!(r.stat("pages_fetched") > 0, "{}", r.describe());
}

/// The kernel reads and writes heap pages in each state the runtime gives them (far, fresh,
/// fetched back writable without tracking), through write, pwrite, read, pread, readv, recv,
/// fread/getline into a heap `FILE` buffer, futexes of a mutex and a condition variable inside
/// a heap object, and execve with argv/envp built in far memory (tests/programs/kernel_io.c
/// checks each). Run at a budget far below the program's memory, where every step meets far
/// pages and pages installed unverified, and with budget to spare, where fresh memory is
/// zero-filled ahead of the touch.
#[test]
fn kernel_reads_and_writes_far_fresh_and_unverified_pages() {
    let dir = Scratch::new("kernel-io");
    let prog = compile("kernel_io", &dir);
    let tight = farmem_run(&dir, "4M", &prog, &["32"]);
    tight.assert_success();
    eprintln!(
        "kernel_io at 4M: {} pages evicted, {} installed unverified, {} of them found unchanged",
        tight.stat("pages_evicted"),
        tight.stat("unverified_installs"),
        tight.stat("verified_unchanged")
    );
    assert!(tight.stat("pages_evicted") > 0, "{}", tight.describe());
    assert!(
        tight.stat("unverified_installs") > 0,
        "no page was installed unverified: the test did not cover that state\n{}",
        tight.describe()
    );
    let roomy = farmem_run(&dir, "1G", &prog, &["32"]);
    roomy.assert_success();
}

/// A figure a run printed (`KEY <kB> kB`), in bytes.
fn printed_kib(r: &Outcome, key: &str) -> u64 {
    let kib: u64 = r
        .stdout
        .split_whitespace()
        .skip_while(|w| *w != key)
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} line\n{}", r.describe()));
    kib << 10
}

/// The peak resident set a run printed (`VmHWM <kB> kB`), in bytes.
fn peak_rss(r: &Outcome) -> u64 {
    printed_kib(r, "VmHWM")
}

/// Static arrays (48 MiB of `.bss`, STREAM's shape) at a 12 MiB budget, far memory on a
/// server (so far pages are not in the process): the program's peak resident set is that of
/// the same arrays taken from the heap, within a quarter of the budget (runs of either kind
/// vary by up to 3 MiB here: I/O buffers, when the control thread runs; the budget covers
/// those buffers under `farmem run` from its next measurement, `process_budget.rs`), and far
/// below the arrays' size. Before, `.bss` was not managed at all: all 48 MiB stayed resident. The program also
/// has the kernel read and write its far arrays (`write` to a file, `read` back).
#[test]
fn static_arrays_are_far_memory_too() {
    let server = support::Server::shared("run-c-programs-secret");
    let dir = Scratch::new("statics");
    let prog = compile("statics", &dir);
    let backend = format!("tcp://{}", server.addr);
    const BUDGET: u64 = 12 << 20;
    let all = (2u32 << 20).to_string();
    let run = |args: &[&str]| {
        let r = farmem_run_with(
            &dir,
            &["--local-mem", "12M", "--backend", &backend],
            &[("FARMEM_TOKEN", "run-c-programs-secret")],
            &prog,
            args,
        );
        r.assert_success();
        r
    };
    let idle = run(&["0", "2"]);
    // The runtime's I/O buffers make a run's peak vary by a MiB or two: the lower of two
    // runs of each kind is compared.
    let heap = [run(&[&all, "2", "heap"]), run(&[&all, "2", "heap"])];
    let statics = [run(&[&all, "2"]), run(&[&all, "2"])];
    let lowest = |rs: &[Outcome; 2]| rs.iter().map(peak_rss).min().unwrap();
    let (base, on_heap, peak) = (peak_rss(&idle), lowest(&heap), lowest(&statics));
    let statics = &statics[0];
    eprintln!(
        "peak resident: {} KiB touching nothing, {} KiB with 48 MiB of arrays on the heap, \
         {} KiB with them static; budget {} KiB",
        base >> 10,
        on_heap >> 10,
        peak >> 10,
        BUDGET >> 10
    );
    assert!(
        peak <= on_heap + BUDGET / 4,
        "static arrays: {} KiB resident at the peak, against {} KiB for the same arrays on the \
         heap\n{}",
        peak >> 10,
        on_heap >> 10,
        statics.describe()
    );
    assert!(peak < base + 3 * BUDGET, "{}", statics.describe());
    assert!(statics.stat("pages_evicted") > 0, "{}", statics.describe());
}

/// The measure for static arrays: the resident set of a STREAM-shaped program with
/// 192 MiB of `.bss` stays within its 96 MiB budget + 5%, far pages in a file (outside the
/// process). The budget, as a cgroup's limit, covers anonymous memory: the program's code
/// and libraries (`RssFile`, ~3 MiB, already in the page cache, which a cgroup does not
/// charge again) are left out of the comparison. Counting them in the budget was tried: it
/// took 13 MiB from python3's heap (libcrypto, libpython) and made it thrash at its native
/// peak. Measured: +1.1-2.0% (also beside two busy loops); +2.5-3.0% before the file tier's
/// index shrank (a hash entry per far page).
#[test]
fn static_arrays_keep_the_resident_set_within_the_budget() {
    let dir = Scratch::new("statics-rss");
    let prog = compile("statics", &dir);
    const BUDGET: u64 = 96 << 20;
    let backend = format!("file://{}", dir.dir().display());
    let r = farmem_run_with(
        &dir,
        &["--local-mem", "96M", "--backend", &backend],
        &[],
        &prog,
        &[&(8u32 << 20).to_string(), "1"],
    );
    r.assert_success();
    let peak = peak_rss(&r) - printed_kib(&r, "RssFile");
    eprintln!(
        "peak resident set less code {} KiB, budget {} KiB",
        peak >> 10,
        BUDGET >> 10
    );
    assert!(
        peak <= BUDGET + BUDGET / 20,
        "peak resident set less code {} KiB for a {} KiB budget\n{}",
        peak >> 10,
        BUDGET >> 10,
        r.describe()
    );
    assert!(r.stat("pages_evicted") > 0, "{}", r.describe());
}

/// One budget for the whole process tree, as one cgroup's limit: a parent with 16 MiB and
/// four forked workers that each fill and rewrite 48 MiB of their own (208 MiB in all) at
/// `--local-mem 64M`, far pages in a file. The parent measures the tree's memory every 5 ms
/// (the sum of `Pss_Anon`, which counts pages shared copy-on-write once) and every process
/// verifies its data. With a budget per process (`--fork-local-mem 64M`, the behaviour
/// before) the tree peaks at ~208 MiB; with the shared budget at 58-62 MiB here (78-95 when
/// the pages shared with the parent were evicted in the policy's order, which frees nothing
/// until the parent drops them too). The parent need not evict at all now: its 16 MiB are
/// what it shares with the workers, and they evict their own pages first; 208 MiB of data in
/// a tree that peaks under 103 MiB is eviction enough.
#[test]
fn forked_workers_share_one_budget() {
    let dir = Scratch::new("tree");
    let prog = compile("tree", &dir);
    const BUDGET: u64 = 64 << 20;
    let backend = format!("file://{}", dir.dir().display());
    let r = farmem_run_with(
        &dir,
        &["--local-mem", "64M", "--backend", &backend],
        &[],
        &prog,
        &["4", "16", "48", "2"],
    );
    r.assert_success();
    let peak = printed_kib(&r, "tree-peak-kib");
    eprintln!(
        "tree peak {} KiB for a {} KiB budget",
        peak >> 10,
        BUDGET >> 10
    );
    assert!(
        peak < BUDGET * 8 / 5,
        "the tree peaked at {} KiB for a {} KiB budget (208 MiB of data)\n{}",
        peak >> 10,
        BUDGET >> 10,
        r.describe()
    );
}

/// As root, `farmem run` puts the program's tree in a memory cgroup of its own and the budget
/// covers what that cgroup is charged, as a cgroup's limit does: here a 32 MiB process the
/// program starts without farmem (`env -u LD_PRELOAD`), beside a program filling 96 MiB under
/// farmem, leaves that program the other half of a 64 MiB budget. Without the cgroup
/// (`FARMEM_CGROUP=`, or not root) it had the whole budget. Both verify their data.
#[test]
fn memory_of_processes_farmem_does_not_run_is_within_the_budget() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: making the tree's cgroup needs root");
        return;
    }
    let dir = Scratch::new("uncounted");
    let hold = compile("hold", &dir);
    let fill = compile("fill", &dir);
    const MIB: u64 = 1 << 20;
    let flag = dir.path("held");
    let script = format!(
        "env -u LD_PRELOAD -u FARMEM_PRELOAD {hold} 32 > {flag} & H=$!; \
         until grep -q filled {flag}; do sleep 0.02; done; \
         {fill} 96; R=$?; kill $H; exit $R",
        hold = hold.display(),
        flag = flag.display(),
        fill = fill.display()
    );
    let run = |env: &[(&str, &str)]| {
        let r = farmem_run_with(
            &dir,
            &["--local-mem", "64M"],
            env,
            Path::new("/bin/sh"),
            &["-c", &script],
        );
        r.assert_success();
        // The stand-in for the shell's statistics is the largest process it executed: fill.
        (r.stat("peak_resident_pages") * 4096, r)
    };
    let (with_cgroup, r) = run(&[]);
    let (without, _) = run(&[("FARMEM_CGROUP", "")]);
    eprintln!(
        "fill's peak far heap: {} KiB with the tree's cgroup, {} KiB without",
        with_cgroup >> 10,
        without >> 10
    );
    if !fill_kept_to_the_rest(&r, with_cgroup, "the 32 MiB held outside farmem") {
        return;
    }
    assert!(
        without > 48 * MIB,
        "without the cgroup fill has the budget to itself: {} KiB",
        without >> 10
    );
}

/// A file the program has written and the kernel has not yet written back holds memory, and
/// a cgroup's limit counts it: under `farmem run` (root, the tree's cgroup) 32 MiB written to
/// a file just before a program fills 96 MiB leave that program about the other half of a
/// 64 MiB budget (sqlite's sort spilling to a temporary file took its peak 15-19 MiB above
/// zram's while these pages were not counted). Skipped where the file's directory is a tmpfs
/// (its pages are shared memory, never dirty) or no cgroup can be made.
#[test]
fn dirty_file_pages_are_within_the_budget() {
    let Some(file) = file_on_disk("dirty") else {
        return;
    };
    let dir = Scratch::new("dirty");
    let fill = compile("fill", &dir);
    let script = format!(
        "dd if=/dev/zero of={f} bs=1M count=32 2>/dev/null && {fill} 96; R=$?; rm -f {f}; exit $R",
        f = file.display(),
        fill = fill.display()
    );
    // Without the page cache trim, which would have the dirty pages written and dropped
    // (`page_cache_beyond_the_budget_is_written_back_and_dropped`).
    let r = farmem_run_with(
        &dir,
        &["--local-mem", "64M"],
        &[("FARMEM_TRIM_CACHE", "0")],
        Path::new("/bin/sh"),
        &["-c", &script],
    );
    let _ = std::fs::remove_file(&file);
    r.assert_success();
    let peak = r.stat("peak_resident_pages") * 4096;
    eprintln!(
        "fill's peak far heap beside 32 MiB of dirty file pages: {} KiB",
        peak >> 10
    );
    fill_kept_to_the_rest(&r, peak, "32 MiB of dirty file pages");
}

/// As under a memory cgroup's limit, a program's page cache does not stay beyond its budget:
/// 96 MiB written to a file (dirty, not synced) beside 8 MiB of heap at a 64 MiB budget is
/// written back and dropped until the tree's cgroup is charged at most the budget and the
/// heap (which may have gone far in the meantime, into the in-process store) plus 8 MiB;
/// with the trim off it stays. The file and the heap are then read back and checked.
#[test]
fn page_cache_beyond_the_budget_is_written_back_and_dropped() {
    let Some(file) = file_on_disk("page-cache") else {
        return;
    };
    let dir = Scratch::new("pagecache");
    let prog = compile("page_cache", &dir);
    let run = |trim: &str, secs: &str| {
        let r = farmem_run_with(
            &dir,
            &["--local-mem", "64M"],
            &[("FARMEM_TRIM_CACHE", trim)],
            &prog,
            &["8", "96", file.to_str().unwrap(), "80", secs],
        );
        let _ = std::fs::remove_file(&file);
        r
    };
    let r = run("1", "30");
    if r.status.and_then(|s| s.code()) == Some(4) {
        eprintln!("skipped: no cgroup for the tree here\n{}", r.describe());
        return;
    }
    r.assert_success();
    eprintln!("trimmed: {}", r.stdout.trim());
    let trimmed = r.stats.as_ref().unwrap()["page_cache_trimmed_bytes"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        trimmed >= 16 << 20,
        "only {trimmed} bytes of page cache were reclaimed\n{}",
        r.describe()
    );
    // The same program without the trim: its file stays in the cgroup (the check that the
    // bound above means something): 3 s is ten times what the trim took here.
    let r = run("0", "3");
    assert_eq!(
        r.status.and_then(|s| s.code()),
        Some(2),
        "the page cache went without the trim\n{}",
        r.describe()
    );
}

/// A file for a page cache test in `/var/tmp`, or None (with the reason) where the test
/// cannot run: not root (the tree's cgroup cannot be made) or `/var/tmp` is a tmpfs (its
/// pages are shared memory, never dirty and never written back).
fn file_on_disk(what: &str) -> Option<std::path::PathBuf> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: making the tree's cgroup needs root");
        return None;
    }
    // SAFETY: statfs fills the struct for a NUL-terminated path.
    let on_tmpfs = unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c"/var/tmp".as_ptr(), &mut st) == 0 && st.f_type == libc::TMPFS_MAGIC
    };
    if on_tmpfs {
        eprintln!("skipped: /var/tmp is a tmpfs");
        return None;
    }
    Some(
        std::path::PathBuf::from("/var/tmp")
            .join(format!("farmem-{what}-test-{}", std::process::id())),
    )
}

/// `fill 96` at a 64 MiB budget beside 32 MiB that the tree's cgroup is charged (`beside`):
/// its far heap peaked (`peak`, bytes) within the other half, 6 MiB of slack allowed. Where
/// the cgroup saw none of it (none could be made, or the memory was gone at once) the check
/// is skipped, with the reason; whether it was made.
fn fill_kept_to_the_rest(r: &Outcome, peak: u64, beside: &str) -> bool {
    const MIB: u64 = 1 << 20;
    if r.stat("tree_uncounted_bytes") == 0 && peak > 48 * MIB {
        eprintln!(
            "skipped: the tree's cgroup was charged nothing beside fill (none could be made \
             here?)\n{}",
            r.describe()
        );
        return false;
    }
    assert!(
        peak <= 32 * MIB + 6 * MIB,
        "{beside} left fill {} KiB of a 64 MiB budget\n{}",
        peak >> 10,
        r.describe()
    );
    true
}

/// Under `farmem run` the budget covers the whole process, as a memory cgroup's limit does:
/// 12 MiB of anonymous memory the runtime does not manage (mapped with the raw system call)
/// leaves the far heap the rest of a 32 MiB budget, and is reported as the program's other
/// memory; with `FARMEM_BUDGET_SCOPE=regions` the far heap has the whole budget. The data of
/// both kinds is checked.
#[test]
fn the_budget_covers_memory_the_runtime_does_not_manage() {
    let dir = Scratch::new("unmanaged");
    let prog = compile("unmanaged", &dir);
    const MIB: u64 = 1 << 20;
    let run = |scope: &str| {
        let r = farmem_run_with(
            &dir,
            &["--local-mem", "32M"],
            &[("FARMEM_BUDGET_SCOPE", scope)],
            &prog,
            &["12", "64"],
        );
        r.assert_success();
        r
    };
    let process = run("process");
    let heap_peak = process.stat("peak_resident_pages") * 4096;
    let other = process.stat("other_bytes");
    assert!(
        other >= 12 * MIB,
        "the unmanaged 12 MiB are counted: other {} KiB\n{}",
        other >> 10,
        process.describe()
    );
    assert!(
        heap_peak <= 32 * MIB - 12 * MIB + 2 * MIB,
        "the far heap keeps to the budget less the other memory: peak {} KiB\n{}",
        heap_peak >> 10,
        process.describe()
    );
    let regions = run("regions");
    assert_eq!(regions.stat("other_bytes"), 0);
    assert!(
        regions.stat("peak_resident_pages") * 4096 > 28 * MIB,
        "with the budget on the regions alone, the far heap fills it\n{}",
        regions.describe()
    );
}
