//! `farmem run` as a command: the program's exit status, death by signal and standard
//! streams pass through; termination signals are forwarded to it; its options are checked
//! before anything runs, with messages that say what is wrong; the summaries it writes.
//!
//! Needs a release build of libfarmem.so next to the farmem binary (`cargo build --release`).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn farmem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_farmem"))
}

/// `farmem run ARGS...`, with stdin closed.
fn run(args: &[&str]) -> Output {
    farmem()
        .arg("run")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("starting farmem run")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn show(o: &Output) -> String {
    format!(
        "status {:?}\n--- stderr ---\n{}\n--- stdout ---\n{}",
        o.status,
        text(&o.stderr),
        text(&o.stdout)
    )
}

/// A scratch path unique to this test process, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("farmem-run-cli-{}-{what}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        Scratch(p)
    }

    fn s(&self) -> &str {
        self.0.to_str().unwrap()
    }

    fn json(&self) -> Value {
        let t = std::fs::read_to_string(&self.0)
            .unwrap_or_else(|e| panic!("reading {}: {e}", self.0.display()));
        serde_json::from_str(&t).unwrap_or_else(|e| panic!("invalid JSON ({e}):\n{t}"))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn exit_status_passes_through() {
    let o = run(&["--local-mem", "16M", "--", "sh", "-c", "exit 7"]);
    assert_eq!(o.status.code(), Some(7), "{}", show(&o));
    let o = run(&["--local-mem", "16M", "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
}

#[test]
fn death_by_signal_passes_through() {
    let o = run(&["--local-mem", "16M", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(o.status.signal(), Some(libc::SIGTERM), "{}", show(&o));
    let o = run(&["--local-mem", "16M", "--", "sh", "-c", "kill -KILL $$"]);
    assert_eq!(o.status.signal(), Some(libc::SIGKILL), "{}", show(&o));
}

#[test]
fn stdin_stdout_and_stderr_pass_through_untouched() {
    // Every byte value, 3 MiB of them, through cat (with a budget smaller than that).
    let input: Vec<u8> = (0..3u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let mut child = farmem()
        .args(["run", "--local-mem", "2M", "--", "/usr/bin/cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting farmem run");
    let mut stdin = child.stdin.take().unwrap();
    let data = input.clone();
    let writer = std::thread::spawn(move || {
        stdin.write_all(&data).unwrap();
        // Dropping stdin closes it: cat sees the end.
    });
    let o = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(o.stdout.len(), input.len(), "{}", text(&o.stderr));
    assert!(o.stdout == input, "cat's output differs from its input");
    assert!(
        o.stderr.is_empty(),
        "unexpected stderr: {}",
        text(&o.stderr)
    );

    // stdout and stderr stay separate, byte for byte.
    let o = run(&[
        "--local-mem",
        "16M",
        "--",
        "sh",
        "-c",
        "printf 'to stdout\\n'; printf 'to stderr\\n' >&2; printf 'more stdout'",
    ]);
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(text(&o.stdout), "to stdout\nmore stdout");
    assert_eq!(text(&o.stderr), "to stderr\n");
}

#[test]
fn sigterm_to_farmem_run_is_forwarded_to_the_program() {
    let mut child = farmem()
        .args([
            "run",
            "--local-mem",
            "16M",
            "--",
            "sh",
            "-c",
            "trap 'exit 42' TERM; echo ready; while :; do sleep 0.1; done",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("starting farmem run");
    // Signal only once the trap is set (the program says so).
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    // SAFETY: signalling the child we started (still running: it loops until signalled).
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            // SAFETY: killing the process group made for this test (farmem run and the
            // program it started).
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            panic!("farmem run did not end after SIGTERM (not forwarded?)");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(42), "{status:?}\n{err}");
}

#[test]
fn a_percentage_needs_the_peak() {
    let marker = Scratch::new("pct-marker");
    let o = run(&[
        "--local-mem",
        "25%",
        "--",
        "sh",
        "-c",
        &format!("touch {}", marker.s()),
    ]);
    assert!(!o.status.success(), "{}", show(&o));
    let err = text(&o.stderr);
    assert!(
        err.contains("--peak") && err.contains("--measure-peak"),
        "the message should point to --peak and --measure-peak: {err}"
    );
    assert!(!marker.0.exists(), "the program ran anyway");
}

#[test]
fn a_percentage_of_a_given_peak() {
    let json = Scratch::new("pct-peak.json");
    let o = run(&[
        "--local-mem",
        "25%",
        "--peak",
        "400M",
        "--stats-json",
        json.s(),
        "--",
        "/usr/bin/true",
    ]);
    assert!(o.status.success(), "{}", show(&o));
    let j = json.json();
    assert_eq!(j["local_mem_bytes"], 100u64 << 20, "{j}");
    assert_eq!(j["stats"]["budget_bytes"], 100u64 << 20, "{j}");
}

#[test]
fn measure_peak_runs_the_program_twice_and_sizes_the_budget() {
    let json = Scratch::new("measure.json");
    // dd touches its 32 MiB buffer: a peak of at least 32 MiB, so 50% is at least 16 MiB.
    let o = run(&[
        "--local-mem",
        "50%",
        "--measure-peak",
        "--stats-json",
        json.s(),
        "--",
        "dd",
        "if=/dev/zero",
        "of=/dev/null",
        "bs=32M",
        "count=4",
    ]);
    assert!(o.status.success(), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("measuring"),
        "the measuring run is announced: {}",
        show(&o)
    );
    let j = json.json();
    let local = j["local_mem_bytes"].as_u64().expect("local_mem_bytes");
    assert!(
        (16u64 << 20..=128 << 20).contains(&local),
        "half of dd's peak should be about 16 MiB, got {local}: {j}"
    );
    assert_eq!(j["exit_code"], 0, "{j}");
}

#[test]
fn bad_options_are_refused_before_the_program_runs() {
    let marker = Scratch::new("bad-marker");
    let touch = format!("touch {}", marker.s());
    let cases: [(&[&str], &[&str]); 3] = [
        (&["--local-mem", "lots"], &["--local-mem", "lots"]),
        (
            &["--local-mem", "16M", "--backend", "bogus://x"],
            &["--backend", "bogus://x"],
        ),
        (&["--local-mem", "512K"], &["--local-mem", "too small"]),
    ];
    for (opts, words) in cases {
        let mut args: Vec<&str> = opts.to_vec();
        args.extend(["--", "sh", "-c", &touch]);
        let o = run(&args);
        assert!(!o.status.success(), "{opts:?}: {}", show(&o));
        assert!(o.status.code().is_some(), "{opts:?}: {}", show(&o));
        let err = text(&o.stderr);
        for w in words {
            assert!(
                err.contains(w),
                "{opts:?}: the message should name {w:?}: {err}"
            );
        }
        assert!(!marker.0.exists(), "{opts:?}: the program ran anyway");
    }
}

/// `farmem run --local-mem 16M --stats-json JSON -- PROG...`.
fn run_16m_with_stats(json: &Scratch, prog: &[&str]) -> Output {
    let mut args = vec!["--local-mem", "16M", "--stats-json", json.s(), "--"];
    args.extend_from_slice(prog);
    run(&args)
}

#[test]
fn stats_json_is_valid_and_has_the_outcome() {
    let json = Scratch::new("stats.json");
    // dash leaves with _exit, which runs no exit handler: its control thread writes the
    // statistics.
    let o = run_16m_with_stats(&json, &["sh", "-c", "exit 3"]);
    assert_eq!(o.status.code(), Some(3), "{}", show(&o));
    let j = json.json();
    assert!(j["stats"]["unhinted_faults"].is_u64(), "{j}");
    assert_eq!(j["exit_code"], 3, "{j}");
    assert!(j["signal"].is_null(), "{j}");
    assert!(j["pid"].as_u64().is_some_and(|p| p > 0), "{j}");
    assert!(
        j["outcome"].as_str().is_some_and(|s| s.contains('3')),
        "{j}"
    );
    assert!(j["wall_s"].as_f64().is_some_and(|w| w >= 0.0), "{j}");
    assert_eq!(j["local_mem_bytes"], 16u64 << 20, "{j}");
    assert!(j["peak_rss_bytes"].as_u64().is_some_and(|b| b > 0), "{j}");

    // A program that exits through exit() (ls: status 2 for a missing file) reports its
    // runtime statistics too.
    let o = run_16m_with_stats(&json, &["/usr/bin/ls", "/nonexistent/farmem-test"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let j = json.json();
    assert_eq!(j["exit_code"], 2, "{j}");
    assert!(
        j["backend"]
            .as_str()
            .is_some_and(|b| b.starts_with("lz4 then file://")),
        "the default backend: {j}"
    );
    for k in [
        "unhinted_faults",
        "pages_fetched",
        "pages_evicted",
        "pages_written_back",
        "fork_fetched_pages",
        "pages_discarded",
    ] {
        assert!(j["stats"][k].is_u64(), "stats.{k} missing: {j}");
    }
    assert_eq!(j["stats"]["budget_bytes"], 16u64 << 20, "{j}");

    // A shell that runs a program (dash forks it, then leaves with _exit, which runs no
    // exit handler): the statistics shown are the program's, and say whose they are; the
    // shell's (written by its control thread at _exit) count among the others.
    let o = run_16m_with_stats(
        &json,
        &["sh", "-c", "/usr/bin/ls /nonexistent/farmem-test; exit 4"],
    );
    assert_eq!(o.status.code(), Some(4), "{}", show(&o));
    let j = json.json();
    assert!(j["stats"]["unhinted_faults"].is_u64(), "{j}");
    let (pid, by) = (j["pid"].as_u64(), j["stats_pid"].as_u64());
    assert!(by.is_some() && by != pid, "whose statistics: {j}");
    assert_eq!(j["other_processes"], 1, "{j}");

    // Forked children that end with _exit without executing anything (dash's subshells)
    // report too: one of them stands in for the shell, the other two count as others.
    let o = run_16m_with_stats(&json, &["sh", "-c", "(exit 3); (exit 5); exit 0"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let j = json.json();
    assert_ne!(j["stats_pid"], j["pid"], "whose statistics: {j}");
    assert_eq!(j["other_processes"], 2, "{j}");

    // A shell (bash, which exits through exit()) that runs three programs: each process
    // appends its line to the run's statistics file, and the report counts the other three.
    let o = run_16m_with_stats(
        &json,
        &[
            "/usr/bin/bash",
            "-c",
            "/usr/bin/true; /usr/bin/true; /usr/bin/ls / >/dev/null; exit 0",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let j = json.json();
    assert_eq!(j["other_processes"], 3, "{j}");
    assert!(
        j["other_stats"]["pages_installed"].as_u64() > Some(0),
        "{j}"
    );

    // Killed by a signal: no exit code, the signal.
    let o = run_16m_with_stats(&json, &["sh", "-c", "kill -KILL $$"]);
    assert_eq!(o.status.signal(), Some(libc::SIGKILL), "{}", show(&o));
    let j = json.json();
    assert!(j["exit_code"].is_null(), "{j}");
    assert_eq!(j["signal"], libc::SIGKILL, "{j}");
}

#[test]
fn stats_prints_a_summary_on_stderr() {
    let o = run(&["--local-mem", "16M", "--stats", "--", "/usr/bin/echo", "hi"]);
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(text(&o.stdout), "hi\n", "the summary stays off stdout");
    let err = text(&o.stderr);
    assert!(err.contains("farmem run: exit status 0"), "{err}");
    assert!(err.contains("local budget"), "{err}");
    assert!(err.contains("faults"), "{err}");
}

#[test]
fn help_mentions_local_mem() {
    let o = farmem().args(["run", "--help"]).output().unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let out = text(&o.stdout);
    assert!(out.contains("--local-mem"), "{out}");
    assert!(out.contains("--measure-peak"), "{out}");
}

#[test]
fn a_missing_program_is_an_error_naming_it() {
    let o = run(&[
        "--local-mem",
        "16M",
        "--",
        "/nonexistent/farmem-test-program",
    ]);
    assert_eq!(o.status.code(), Some(127), "as a shell says: {}", show(&o));
    assert!(
        text(&o.stderr).contains("/nonexistent/farmem-test-program"),
        "{}",
        show(&o)
    );
}

#[test]
fn prefault_and_lib_options() {
    for pf in ["--prefault", "--prefault=1M"] {
        let o = run(&["--local-mem", "16M", pf, "--", "/usr/bin/echo", "ok"]);
        assert!(o.status.success(), "{pf}: {}", show(&o));
        assert_eq!(text(&o.stdout), "ok\n", "{pf}");
    }
    let marker = Scratch::new("lib-marker");
    let o = run(&[
        "--local-mem",
        "16M",
        "--lib",
        "/nonexistent/libfarmem.so",
        "--",
        "sh",
        "-c",
        &format!("touch {}", marker.s()),
    ]);
    assert!(!o.status.success(), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("/nonexistent/libfarmem.so"),
        "{}",
        show(&o)
    );
    assert!(!marker.0.exists(), "the program ran anyway");
}
