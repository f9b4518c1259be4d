//! Helpers for the tests that run programs (`run_programs.rs`, `run_c_programs.rs`, ...):
//! real programs from Debian packages or compiled from `tests/programs`, started natively or
//! under `farmem run`, with their output in files, their peak memory from `wait4`, a deadline
//! (a hang fails the test instead of blocking it forever) and clean-up of every process
//! started here.
#![allow(dead_code)]

use std::ffi::OsString;
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

pub fn farmem_bin() -> &'static str {
    env!("CARGO_BIN_EXE_farmem")
}

/// A file of this crate's `tests/programs` directory.
pub fn program_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(name)
}

/// The absolute path of a Debian program this test needs; fails with the package to install
/// when it is missing.
pub fn require(path: &str, package: &str) -> PathBuf {
    let p = Path::new(path);
    assert!(
        p.is_file(),
        "{path} is missing: this test runs the Debian program itself. Install it with \
         `apt-get install {package}` (.ci/run does this in CI)."
    );
    p.to_path_buf()
}

/// Compile this crate's `tests/programs/NAME.c` into `scratch`; the executable's path.
pub fn compile(name: &str, scratch: &Scratch) -> PathBuf {
    let src = program_file(&format!("{name}.c"));
    let exe = scratch.path(name);
    let out = Command::new("cc")
        .args(["-O2", "-pthread", "-Wall", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("running cc");
    assert!(
        out.status.success(),
        "compiling {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A scratch directory, removed when dropped.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(what: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!(
            "farmem-run-programs-{}-{}-{what}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// The directory itself.
    pub fn dir(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A program and how to start it.
#[derive(Clone, Debug)]
pub struct Prog {
    pub argv: Vec<OsString>,
    pub env: Vec<(String, String)>,
    /// Variables taken out of the environment the test runs in.
    pub unset: Vec<String>,
    pub stdin: Option<PathBuf>,
}

impl Prog {
    pub fn new(path: impl Into<OsString>) -> Prog {
        Prog {
            argv: vec![path.into()],
            env: Vec::new(),
            unset: Vec::new(),
            stdin: None,
        }
    }

    pub fn arg(mut self, a: impl Into<OsString>) -> Prog {
        self.argv.push(a.into());
        self
    }

    pub fn env(mut self, k: &str, v: &str) -> Prog {
        self.env.push((k.into(), v.into()));
        self
    }

    pub fn env_remove(mut self, k: &str) -> Prog {
        self.unset.push(k.into());
        self
    }

    pub fn stdin(mut self, f: impl Into<PathBuf>) -> Prog {
        self.stdin = Some(f.into());
        self
    }
}

/// Natively, or under `farmem run` with this `--local-mem` (and `--peak` for a percentage).
#[derive(Clone, Debug)]
pub enum Mode {
    Native,
    Farmem {
        local_mem: String,
        peak: Option<u64>,
    },
}

impl Mode {
    /// 25% of a peak measured natively.
    pub fn quarter_of(peak: u64) -> Mode {
        Mode::Farmem {
            local_mem: "25%".into(),
            peak: Some(peak),
        }
    }

    pub fn absolute(local_mem: &str) -> Mode {
        Mode::Farmem {
            local_mem: local_mem.into(),
            peak: None,
        }
    }

    pub fn name(&self) -> String {
        match self {
            Mode::Native => "native".into(),
            Mode::Farmem {
                local_mem,
                peak: None,
            } => format!("farmem run --local-mem {local_mem}"),
            Mode::Farmem {
                local_mem,
                peak: Some(p),
            } => format!("farmem run --local-mem {local_mem} --peak {p}"),
        }
    }
}

/// A process started here (in its own process group). Dropped before it was reaped, the
/// whole group is killed and reaped, so a failing test leaves nothing running.
pub struct Running {
    pub label: String,
    pub pid: i32,
    reaped: bool,
    started: Instant,
    stdout: PathBuf,
    stderr: PathBuf,
    stats_json: Option<PathBuf>,
}

/// How a program ended.
pub struct Finished {
    pub label: String,
    /// Raw wait status.
    pub status: i32,
    /// Peak resident set (bytes) of the process and the descendants it waited for.
    pub peak_rss: u64,
    pub wall: Duration,
    pub stdout: Vec<u8>,
    pub stderr: String,
    /// `farmem run --stats-json` (for runs under farmem).
    pub report: Option<Value>,
}

pub fn describe_status(status: i32) -> String {
    if libc::WIFEXITED(status) {
        format!("exit status {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        format!("killed by signal {}", libc::WTERMSIG(status))
    } else {
        format!("wait status {status:#x}")
    }
}

fn tail(s: &str, n: usize) -> &str {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

impl Running {
    /// Start `prog` in `mode`; its stdout and stderr go to files in `scratch`.
    // The child is reaped with wait4 (for its rusage) by `finish`/`has_exited`, or killed and
    // reaped by `Drop`: never left a zombie, but not through `Child::wait`.
    #[allow(clippy::zombie_processes)]
    pub fn spawn(label: &str, prog: &Prog, mode: &Mode, scratch: &Scratch) -> Running {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let stdout = scratch.path(&format!("{n}.stdout"));
        let stderr = scratch.path(&format!("{n}.stderr"));
        let mut stats_json = None;
        let mut cmd = match mode {
            Mode::Native => {
                let mut c = Command::new(&prog.argv[0]);
                c.args(&prog.argv[1..]);
                c
            }
            Mode::Farmem { local_mem, peak } => {
                let json = scratch.path(&format!("{n}.stats.json"));
                let mut c = Command::new(farmem_bin());
                c.args(["run", "--stats", "--local-mem", local_mem]);
                if let Some(p) = peak {
                    c.arg("--peak").arg(p.to_string());
                }
                c.arg("--stats-json").arg(&json).arg("--").args(&prog.argv);
                stats_json = Some(json);
                c
            }
        };
        for k in &prog.unset {
            cmd.env_remove(k);
        }
        for (k, v) in &prog.env {
            cmd.env(k, v);
        }
        let stdin = match &prog.stdin {
            Some(f) => Stdio::from(
                File::open(f).unwrap_or_else(|e| panic!("opening {}: {e}", f.display())),
            ),
            None => Stdio::null(),
        };
        cmd.stdin(stdin)
            .stdout(File::create(&stdout).unwrap())
            .stderr(File::create(&stderr).unwrap())
            .process_group(0);
        let label = format!("{label} ({})", mode.name());
        let started = Instant::now();
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{label}: cannot start {:?}: {e}", prog.argv[0]));
        Running {
            label,
            pid: child.id() as i32,
            reaped: false,
            started,
            stdout,
            stderr,
            stats_json,
        }
    }

    /// Send `sig` to the process started (for `farmem run`, farmem forwards SIGTERM).
    pub fn signal(&self, sig: i32) {
        assert!(!self.reaped);
        // SAFETY: kill(2) on the pid of our own child, not yet reaped (so not reused).
        let r = unsafe { libc::kill(self.pid, sig) };
        assert_eq!(
            r,
            0,
            "{}: kill: {}",
            self.label,
            std::io::Error::last_os_error()
        );
    }

    /// The stderr written so far.
    pub fn stderr_so_far(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Reap the process if it has ended: its wait status and rusage.
    fn try_reap(&mut self) -> Option<(i32, libc::rusage)> {
        assert!(!self.reaped);
        let mut status = 0;
        // SAFETY: rusage is plain old data; all-zero is a valid value.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: waiting (without blocking) for our own child, with valid out-pointers.
        let r = unsafe { libc::wait4(self.pid, &mut status, libc::WNOHANG, &mut ru) };
        if r == self.pid {
            self.reaped = true;
            return Some((status, ru));
        }
        if r < 0 {
            let e = std::io::Error::last_os_error();
            assert_eq!(
                e.raw_os_error(),
                Some(libc::EINTR),
                "{}: wait4: {e}",
                self.label
            );
        }
        None
    }

    /// Whether the process has ended (it is then reaped; call `finish` for the result).
    pub fn has_exited(&mut self) -> Option<Finished> {
        self.try_reap().map(|(s, ru)| self.finished(s, &ru))
    }

    /// Wait for the end, at most `deadline` from the start. Past it the process group is
    /// killed and the test fails: the program hung (or is far slower than it should be).
    pub fn finish(mut self, deadline: Duration) -> Finished {
        loop {
            if let Some((s, ru)) = self.try_reap() {
                return self.finished(s, &ru);
            }
            if self.started.elapsed() > deadline {
                let threads = threads_of_group(self.pid);
                self.kill_group();
                panic!(
                    "{} did not finish within {:?} and was killed (hung?). Its stderr ends \
                     with:\n{}\nIts processes' threads were:\n{threads}",
                    self.label,
                    deadline,
                    tail(&self.stderr_so_far(), 8000)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn finished(&self, status: i32, ru: &libc::rusage) -> Finished {
        let report = self.stats_json.as_ref().and_then(|f| {
            let text = std::fs::read_to_string(f).ok()?;
            Some(serde_json::from_str(&text).unwrap_or_else(|e| {
                panic!("{}: --stats-json is not JSON: {e}\n{text}", self.label)
            }))
        });
        Finished {
            label: self.label.clone(),
            status,
            peak_rss: ru.ru_maxrss as u64 * 1024,
            wall: self.started.elapsed(),
            stdout: std::fs::read(&self.stdout).unwrap_or_default(),
            stderr: self.stderr_so_far(),
            report,
        }
    }

    fn kill_group(&mut self) {
        if self.reaped {
            return;
        }
        // SAFETY: the process group was created by our child (process_group(0)), which is
        // not reaped yet, so the id still names it; then wait for that child.
        unsafe {
            libc::kill(-self.pid, libc::SIGKILL);
            let mut status = 0;
            libc::waitpid(self.pid, &mut status, 0);
        }
        self.reaped = true;
    }
}

/// Every thread of every process in process group `pgid`: its command, state, wait channel,
/// system call and (as root) kernel stack, so that a hang seen once says where it was.
fn threads_of_group(pgid: i32) -> String {
    let mut out = String::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let Ok(pid) = p.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(p.path().join("stat")).unwrap_or_default();
        // Fields after the command name: state, ppid, pgrp.
        let pgrp = farmem_sys::threads::stat_fields(&stat)
            .get(2)
            .and_then(|g| g.parse::<i32>().ok());
        if pgrp != Some(pgid) {
            continue;
        }
        let cmdline = std::fs::read_to_string(p.path().join("cmdline"))
            .unwrap_or_default()
            .replace('\0', " ");
        out.push_str(&format!("process {pid}: {cmdline}\n"));
        for line in farmem_sys::threads::describe(&p.path()) {
            out.push_str(&format!("  {line}\n"));
        }
    }
    out
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill_group();
    }
}

/// Run `prog` to its end (at most `deadline`).
pub fn run(
    label: &str,
    prog: &Prog,
    mode: &Mode,
    scratch: &Scratch,
    deadline: Duration,
) -> Finished {
    let f = Running::spawn(label, prog, mode, scratch).finish(deadline);
    f.print();
    f
}

impl Finished {
    pub fn ok(&self) -> bool {
        libc::WIFEXITED(self.status) && libc::WEXITSTATUS(self.status) == 0
    }

    /// Fail unless the program exited with status 0.
    pub fn assert_ok(&self) {
        assert!(
            self.ok(),
            "{}: {}; stderr ends with:\n{}",
            self.label,
            describe_status(self.status),
            tail(&self.stderr, 4000)
        );
    }

    /// A counter of the program's main process (`stats` of `--stats-json`), if reported.
    pub fn stat(&self, key: &str) -> Option<u64> {
        self.report.as_ref()?.get("stats")?.get(key)?.as_u64()
    }

    /// One line for the test log (`--nocapture`).
    pub fn print(&self) {
        let mut line = format!(
            "[run_programs] {}: {} in {:.2} s, peak RSS {:.1} MiB",
            self.label,
            describe_status(self.status),
            self.wall.as_secs_f64(),
            self.peak_rss as f64 / (1u64 << 20) as f64
        );
        if self.report.is_some() {
            let g = |k: &str| self.stat(k).unwrap_or(0);
            line += &format!(
                "; budget {:.1} MiB, {} unhinted faults, {} pages fetched, {} evicted, {} \
                 written back, {} fork-fetched",
                g("budget_bytes") as f64 / (1u64 << 20) as f64,
                g("unhinted_faults"),
                g("pages_fetched"),
                g("pages_evicted"),
                g("pages_written_back"),
                g("fork_fetched_pages")
            );
        }
        eprintln!("{line}");
    }

    /// Fail unless the run under farmem really used far memory: pages went out and came
    /// back (so the outputs compared were computed through far memory).
    pub fn assert_used_far_memory(&self) {
        assert!(
            self.report.is_some(),
            "{}: no --stats-json report; stderr:\n{}",
            self.label,
            tail(&self.stderr, 4000)
        );
        let evicted = self.stat("pages_evicted").unwrap_or(0);
        let fetched = self.stat("pages_fetched").unwrap_or(0);
        assert!(
            evicted > 0 && fetched > 0,
            "{}: the program ran within its local budget ({evicted} pages evicted, \
             {fetched} fetched): the test data is too small to exercise far memory. \
             Report: {}",
            self.label,
            self.report.as_ref().unwrap()
        );
    }
}

/// Fail unless both runs succeeded with byte-identical standard output.
pub fn assert_same_stdout(native: &Finished, far: &Finished) {
    native.assert_ok();
    far.assert_ok();
    if native.stdout != far.stdout {
        let n = String::from_utf8_lossy(&native.stdout);
        let f = String::from_utf8_lossy(&far.stdout);
        let first = native
            .stdout
            .iter()
            .zip(&far.stdout)
            .position(|(a, b)| a != b)
            .unwrap_or(native.stdout.len().min(far.stdout.len()));
        panic!(
            "output differs: {} wrote {} bytes, {} wrote {} bytes, first difference at byte \
             {first}.\n--- native (end) ---\n{}\n--- farmem (end) ---\n{}\n--- farmem stderr \
             ---\n{}",
            native.label,
            native.stdout.len(),
            far.label,
            far.stdout.len(),
            tail(&n, 3000),
            tail(&f, 3000),
            tail(&far.stderr, 3000)
        );
    }
}

/// The pid of process `parent`'s first child (the program `farmem run` started).
pub fn child_of(parent: u32) -> u32 {
    let kids = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")).unwrap();
    kids.split_whitespace()
        .next()
        .expect("farmem run has started the program")
        .parse()
        .unwrap()
}

/// Start `farmem run` (stdout piped) and wait for its program to print `filled`: the
/// running `farmem run` and the program's pid.
pub fn start_until_filled(cmd: &mut Command) -> (std::process::Child, u32) {
    use std::io::{BufRead, BufReader};
    let mut run = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(run.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(
        line.trim(),
        "filled",
        "the program filled and checked its memory"
    );
    let pid = child_of(run.id());
    (run, pid)
}
