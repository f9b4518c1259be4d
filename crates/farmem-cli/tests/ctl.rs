//! `farmem ctl`: a running program's budget changes from outside, its resident set follows at
//! once, its data stays right, and what cannot be done is refused with the reason.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

mod run_support;

use run_support::{child_of, compile, farmem_bin, start_until_filled, Scratch};

fn ctl(args: &[&str]) -> std::process::Output {
    Command::new(farmem_bin())
        .arg("ctl")
        .args(args)
        .output()
        .unwrap()
}

fn stats(pid: &str) -> serde_json::Value {
    let o = ctl(&[pid, "--stats"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// `farmem run` of a program holding 48 MiB under a 64 MiB budget, compressed in process.
fn holding_48m(program: &std::path::Path) -> Command {
    let mut c = Command::new(farmem_bin());
    c.args([
        "run",
        "--local-mem",
        "64M",
        "--backend",
        "local+lz4://",
        "--",
    ])
    .arg(program)
    .arg("48")
    // A group of its own, for `KillOnPanic`.
    .process_group(0);
    c
}

/// Kills the process group of a started `farmem run` if the test fails: the programs run
/// until told to stop, and a failed assertion would leave them spinning.
struct KillOnPanic(u32);

impl Drop for KillOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // SAFETY: kill(2) of the process group our own child leads.
            unsafe { libc::kill(-(self.0 as i32), libc::SIGKILL) };
        }
    }
}

#[test]
fn a_running_program_is_shrunk_and_grown_from_outside_and_keeps_its_data() {
    let scratch = Scratch::new("ctl");
    let hold = compile("hold", &scratch);
    let (run, pid) = start_until_filled(holding_48m(&hold).stderr(Stdio::piped()));
    let _kill = KillOnPanic(run.id());
    let pid = pid.to_string();
    let s = stats(&pid);
    assert_eq!(s["budget_bytes"], 64u64 << 20);
    assert!(
        s["resident_pages"].as_u64().unwrap() > 8192,
        "48 MiB local: {s}"
    );

    let o = ctl(&[&pid, "--local-mem", "8M"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = stats(&pid);
    assert_eq!(s["budget_bytes"], 8u64 << 20);
    assert!(
        s["resident_pages"].as_u64().unwrap() <= 2048,
        "within the new budget as soon as ctl returns: {s}"
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    let s = stats(&pid);
    assert!(s["resident_pages"].as_u64().unwrap() <= 2048, "{s}");
    assert!(
        s["unhinted_faults"].as_u64().unwrap() > 0,
        "it keeps checking: {s}"
    );

    let o = ctl(&[&pid, "--local-mem", "64M"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::thread::sleep(std::time::Duration::from_millis(500));
    let s = stats(&pid);
    assert!(
        s["resident_pages"].as_u64().unwrap() > 4096,
        "its data comes back and stays: {s}"
    );

    // Refused, with the reason: a budget below the minimum, a size that is not one.
    let o = ctl(&[&pid, "--local-mem", "4K"]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("too small"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!ctl(&[&pid, "--local-mem", "lots"]).status.success());

    // SAFETY: plain kill(2) of the program we started.
    unsafe { libc::kill(pid.parse().unwrap(), libc::SIGTERM) };
    let out = run.wait_with_output().unwrap();
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("BAD"),
        "the program found its data wrong"
    );
}

#[test]
fn a_process_not_under_farmem_is_named_in_the_error() {
    let me = std::process::id().to_string();
    let o = ctl(&[&me, "--stats"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no farmem control socket"), "{err}");
}

/// `farmem ctl PID --watch SECS` prints a line per interval until the program ends: the
/// budget asked, the far heap's resident memory within what the program's other memory
/// leaves of it (the budget covers the whole program under `farmem run`), and that other
/// memory.
#[test]
fn watching_a_program_shows_its_budget_local_and_other_memory() {
    let scratch = Scratch::new("ctl-watch");
    let hold = compile("hold", &scratch);
    let (run, pid) = start_until_filled(
        Command::new(farmem_bin())
            .args(["run", "--local-mem", "24M", "--"])
            .arg(&hold)
            .arg("48")
            .process_group(0)
            .stderr(Stdio::piped()),
    );
    let _kill = KillOnPanic(run.id());
    let watch = Command::new(farmem_bin())
        .args(["ctl", &pid.to_string(), "--watch", "0.2"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1200));
    // The program ends; the watch ends with it.
    // SAFETY: plain kill(2) of the program we started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let out = run.wait_with_output().unwrap();
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("BAD"),
        "the program found its data wrong"
    );
    let out = watch.wait_with_output().unwrap();
    assert!(out.status.success(), "the watch ends when the program does");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert!(header.windows(2).any(|w| w == ["other", "MiB"]), "{text}");
    let rows: Vec<Vec<f64>> = lines
        .map(|l| {
            l.split_whitespace()
                .take(6)
                .map(|v| v.parse().unwrap())
                .collect()
        })
        .collect();
    assert!(rows.len() >= 3, "a line per 0.2 s: {text}");
    let last = rows.last().unwrap();
    let (budget, local, other, far) = (last[1], last[2], last[3], last[4]);
    assert_eq!(budget, 24.0, "{text}");
    assert!(other > 0.0, "the program's other memory is counted: {text}");
    assert!(
        local <= budget - other + 1.0,
        "the far heap keeps to what the other memory leaves: {text}"
    );
    assert!(far > 0.0, "most of 48 MiB is far: {text}");
}

/// A child made by `fork()` that keeps its far memory answers `farmem ctl` under its own pid:
/// its own statistics, and a size sent to it is the budget of the tree both share.
#[test]
fn a_forked_child_is_watched_and_resized_through_its_own_socket() {
    use std::io::{BufRead, BufReader};
    let scratch = Scratch::new("ctl-fork");
    let hold = compile("hold_fork", &scratch);
    let mut run = holding_48m(&hold)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _kill = KillOnPanic(run.id());
    let mut line = String::new();
    BufReader::new(run.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let child = line
        .trim()
        .strip_prefix("forked ")
        .unwrap_or_else(|| panic!("the program forked: {line:?}"))
        .to_string();
    let parent = child_of(run.id()).to_string();
    assert_ne!(child, parent);

    // Its own statistics: its counters start at the fork, its pages are its own.
    let s = stats(&child);
    assert!(s["resident_pages"].as_u64().unwrap() > 0, "{s}");

    // Shrinking the tree through the child: the child fits its share at once, and the parent
    // follows; both keep checking their data.
    let o = ctl(&[&child, "--local-mem", "16M"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let (c, p) = (stats(&child), stats(&parent));
        let resident = |s: &serde_json::Value| s["resident_pages"].as_u64().unwrap();
        if resident(&c) + resident(&p) <= 4096 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the tree fits 16 MiB within 5 s: child {c}, parent {p}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        stats(&child)["unhinted_faults"].as_u64().unwrap() > 0,
        "the child reads its far data back"
    );

    // SAFETY: plain kill(2) of the program we started (its child follows it).
    unsafe { libc::kill(parent.parse().unwrap(), libc::SIGTERM) };
    let out = run.wait_with_output().unwrap();
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("BAD"),
        "a process found its data wrong: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
