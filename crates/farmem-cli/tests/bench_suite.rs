//! `farmem bench suite` end to end on tiny sizes: every workload in every mode at one point,
//! results checked against native, every output file written; the Linux-swap baselines it
//! sets up are gone afterwards, also when it is interrupted with Ctrl-C mid-run; what an
//! interrupted suite measured still makes a report (`--report-only`).

mod run_support;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use run_support::{farmem_bin, require, Scratch};

const WORKLOADS: [&str; 6] = [
    "seqscan",
    "randscan",
    "kvs",
    "dataframe",
    "psort",
    "memcached",
];
const MODES: [&str; 10] = [
    "native",
    "swap-zram",
    "swap-file",
    "farmem",
    "farmem-default",
    "farmem-file",
    "farmem-lz4",
    "farmem-tcp",
    "farmem-hinted",
    "farmem-hinted-tcp",
];

/// Whether `mode` applies to `workload` (memcached has no hinted build).
fn applies(workload: &str, mode: &str) -> bool {
    !(workload == "memcached" && mode.contains("hinted"))
}

/// Memory cgroups named after process `pid` (the baselines name theirs
/// `farmem-bench-<pid>-<n>`), anywhere under /sys/fs/cgroup.
fn cgroups_of(pid: u32) -> Vec<PathBuf> {
    fn walk(dir: &Path, prefix: &str, depth: usize, found: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            if !ft.is_dir() {
                continue;
            }
            if e.file_name().to_string_lossy().starts_with(prefix) {
                found.push(e.path());
            } else if depth > 0 {
                walk(&e.path(), prefix, depth - 1, found);
            }
        }
    }
    let mut found = Vec::new();
    walk(
        Path::new("/sys/fs/cgroup"),
        &format!("farmem-bench-{pid}-"),
        4,
        &mut found,
    );
    found
}

/// The active swap devices (first column of /proc/swaps).
fn swaps() -> Vec<String> {
    std::fs::read_to_string("/proc/swaps")
        .unwrap()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

#[test]
fn tiny_suite_runs_every_workload_in_every_mode_and_leaves_nothing_behind() {
    require("/usr/bin/memcached", "memcached");
    let out = Scratch::new("suite");
    let swap_file = out.path("suite.swap");
    let swaps_before = swaps();
    let t0 = Instant::now();
    let child = Command::new(farmem_bin())
        .args([
            "bench",
            "suite",
            "--scale",
            "0.02",
            "--local",
            "50",
            "--repeat",
            "1",
            "--timeout",
            "300",
        ])
        .arg("--modes")
        .arg(MODES.join(","))
        .arg("--out")
        .arg(out.dir())
        .arg("--swap-file")
        .arg(&swap_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let res = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&res.stdout);
    let stderr = String::from_utf8_lossy(&res.stderr);
    println!("{stderr}\n{stdout}\ntook {:?}", t0.elapsed());
    assert!(res.status.success(), "{stderr}");

    // Every run, each checked against native (a wrong result is a failed run, which fails
    // the suite), recorded as it ended.
    let runs = std::fs::read_to_string(out.path("runs.csv")).unwrap();
    let rows: Vec<Vec<&str>> = runs
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    for w in WORKLOADS {
        for m in MODES.iter().filter(|m| applies(w, m)) {
            let r = rows
                .iter()
                .find(|r| r[0] == w && r[1] == *m)
                .unwrap_or_else(|| panic!("no run of {w} {m}:\n{runs}"));
            // Linux swap may fail to fit a program in the limit (its OOM killer is a
            // result); farmem must always run it.
            let ok = r[4] == "ok" || (m.starts_with("swap") && r[4] == "oom-killed");
            assert!(ok, "{w} {m}: {r:?}");
            if r[4] == "ok" {
                let throughput: f64 = r[7].parse().unwrap();
                assert!(throughput > 0.0, "{r:?}");
                let peak: u64 = r[9].parse().unwrap();
                assert!(peak > 0, "{r:?}");
                // Memory used: known for every run (under farmem, its far heap's peak at
                // least: checked below from the JSON).
                let used: u64 = r[12].parse().unwrap();
                assert!(used > 0, "{r:?}");
            }
        }
    }
    let expected: usize = WORKLOADS
        .iter()
        .map(|w| MODES.iter().filter(|m| applies(w, m)).count())
        .sum();
    assert_eq!(rows.len(), expected, "{runs}");
    // At 50% local the data must have moved: farmem fetched pages in every farmem mode.
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path("results.json")).unwrap()).unwrap();
    for r in j["runs"].as_array().unwrap() {
        if r["mode"].as_str().unwrap().starts_with("farmem") {
            assert!(r["bytes_moved"].as_u64().unwrap() > 0, "nothing moved: {r}");
            assert!(
                r["detail"]["pages_fetched"].as_u64().unwrap() > 0,
                "nothing fetched: {r}"
            );
            // The cgroup's peak holds the far heap's: the memory used is measured over the
            // program's memory, not beside it.
            let heap = r["detail"]["far_heap_peak_bytes"].as_u64().unwrap();
            assert!(r["mem_used_bytes"].as_u64().unwrap() >= heap, "{r}");
        }
    }
    let points = j["points"].as_array().unwrap();
    assert_eq!(points.len(), expected);
    for p in points.iter().filter(|p| p["mode"] == "native") {
        assert_eq!(p["normalized"].as_f64(), Some(1.0), "{p}");
    }

    // The tables, and a plot per workload plus the overview, well-formed.
    let md = std::fs::read_to_string(out.path("summary.md")).unwrap();
    for w in WORKLOADS {
        assert!(md.contains(&format!("| {w} | 50% |")), "{md}");
    }
    assert!(md.contains("farmem ÷ Linux swap"), "{md}");
    assert!(md.contains("Memory used at the peak"), "{md}");
    for name in WORKLOADS.iter().copied().chain(["overview"]) {
        let svg = std::fs::read_to_string(out.path(&format!("{name}.svg"))).unwrap();
        let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{name}.svg: {e}"));
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        assert!(svg.contains("farmem-tcp"), "{name}.svg has no legend");
        let png = std::fs::read(out.path(&format!("{name}.png"))).unwrap();
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{name}.png");
    }

    // Nothing left: no cgroup of the suite, no swap device it added, no swap file.
    assert!(cgroups_of(pid).is_empty(), "{:?}", cgroups_of(pid));
    assert_eq!(swaps(), swaps_before);
    assert!(!swap_file.exists());
}

#[test]
fn ctrl_c_during_a_swap_run_removes_the_baseline() {
    let out = Scratch::new("suite-int");
    let swap_file = out.path("int.swap");
    let swaps_before = swaps();
    let mut cmd = Command::new(farmem_bin());
    cmd.args([
        "bench",
        "suite",
        "--workloads",
        "seqscan",
        "--modes",
        "swap-file,farmem-tcp",
        "--scale",
        "0.05",
        "--local",
        "25",
        "--repeat",
        "3",
    ])
    .arg("--out")
    .arg(out.dir())
    .arg("--swap-file")
    .arg(&swap_file)
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .process_group(0);
    // SAFETY: signal is async-signal-safe. Undoes an inherited SIG_IGN (tests started in the
    // background), which the suite respects.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGTERM, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let pid = child.id();
    let stderr = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(|l| l.ok())
            .collect::<Vec<_>>()
    });
    // Wait for a swap run to be under way: its cgroup exists and the swap file is on.
    let deadline = Instant::now() + Duration::from_secs(240);
    while cgroups_of(pid).is_empty() || !swap_file.exists() {
        assert!(
            Instant::now() < deadline,
            "no swap run started: {:?}",
            child.try_wait()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Ctrl-C reaches the whole foreground process group.
    // SAFETY: kill has no memory-safety preconditions; pid leads the group we made.
    assert_eq!(unsafe { libc::kill(-(pid as i32), libc::SIGINT) }, 0);
    let status = child.wait().unwrap();
    let log = log.join().unwrap().join("\n");
    println!("{log}");
    assert_eq!(status.code(), Some(130), "{log}");
    assert!(cgroups_of(pid).is_empty(), "{:?}", cgroups_of(pid));
    assert_eq!(swaps(), swaps_before);
    assert!(!swap_file.exists());
    // What was measured before the interruption is on disk, and makes a report.
    let runs = std::fs::read_to_string(out.path("runs.csv")).unwrap();
    assert!(runs.starts_with("workload,mode,"), "{runs}");
    let again = Command::new(farmem_bin())
        .args([
            "bench",
            "suite",
            "--report-only",
            "--scale",
            "0.05",
            "--out",
        ])
        .arg(out.dir())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "--report-only: {stderr}\n{runs}");
    let md = std::fs::read_to_string(out.path("summary.md")).unwrap();
    assert!(md.contains("| seqscan | 51 MiB |"), "{md}");
    let svg = std::fs::read_to_string(out.path("seqscan.svg")).unwrap();
    roxmltree::Document::parse(&svg).expect("seqscan.svg is well-formed");
    // Nothing ran: no cgroup, no swap.
    assert_eq!(swaps(), swaps_before);
}
