//! One run of one workload in one mode: start it (natively, in a Linux-swap cgroup, or under
//! `farmem run`), wait for it with its resource usage, and read what it reports (its result,
//! the work done and the time of its measured phase) and what the mode counted (faults,
//! bytes moved).

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::mode::Mode;
use crate::spawn::LocalServer;
use crate::swap::{kill_group_on_signal, SwapBaseline, SwapKind};

/// What a run measured.
#[derive(Clone, Debug)]
pub struct Measured {
    /// The program's `result=` line: the same in every mode, or the run is wrong.
    pub result: String,
    /// Work done in the measured phase and its duration, as the program reports them.
    pub ops: u64,
    pub secs: f64,
    /// The whole process, start to end (set-up phases included).
    pub wall_s: f64,
    /// Peak resident set of the program (largest process), as the kernel counts it.
    pub peak_rss: u64,
    /// Page faults that moved data: farmem's unhinted and write-protect faults; the kernel's
    /// major faults (swap-ins) otherwise.
    pub faults: u64,
    /// Bytes moved between local and far memory (or swap) in both directions.
    pub bytes_moved: u64,
    /// Memory the run used at its peak, far copies included (0: not known), charged the same
    /// way on both sides: the peak of a memory cgroup holding the whole process tree (for
    /// farmem with no limit, its in-process far pages in it) plus what a memory server held
    /// for it, or zram's peak memory use. Pages of the program's files already cached (its
    /// code, its libraries) are charged to neither, as a cgroup does not charge them.
    pub mem_used: u64,
    /// Mode-specific counters, for the JSON.
    pub detail: Value,
}

#[derive(Clone, Debug)]
pub enum Outcome {
    Done(Measured),
    /// Linux swap could not run the program within the limit: the cgroup's OOM killer ended
    /// it. A result, not an error.
    OomKilled {
        wall_s: f64,
    },
    /// The program failed, ran past the time limit, or printed something unexpected.
    Failed(String),
}

/// Everything a run needs besides the program.
pub struct Runner<'a> {
    pub farmem: PathBuf,
    pub server: Option<&'a LocalServer>,
    pub swap_file: PathBuf,
    pub logs: PathBuf,
    pub timeout: Duration,
}

use crate::limits::PROCESS_ALLOWANCE;

/// One run to make.
pub struct Job<'a> {
    pub mode: Mode,
    pub argv: &'a [OsString],
    /// The load client of a server program (see [`super::workload::Launch`]).
    pub client: Option<&'a [OsString]>,
    pub env: &'a [(&'static str, &'static str)],
    /// Local memory in bytes (ignored natively).
    pub local: u64,
    /// The program's native peak: sizes the swap device.
    pub peak: u64,
    /// Names the log files of the run.
    pub tag: String,
}

impl Runner<'_> {
    pub fn run(&self, job: &Job) -> Result<Outcome> {
        let stderr_log = self.logs.join(format!("{}.stderr", job.tag));
        match job.mode {
            Mode::Native => {
                let mut cmd = command(job.argv);
                let w = spawn_wait(&mut cmd, &stderr_log, self.timeout, job.client)?;
                let used = w.peak_rss();
                Ok(finish(
                    &w,
                    &stderr_log,
                    w.ru.ru_majflt as u64,
                    0,
                    used,
                    json!({}),
                ))
            }
            Mode::SwapZram | Mode::SwapFile => self.run_swap(job, &stderr_log),
            _ => self.run_farmem(job, &stderr_log),
        }
    }

    fn run_swap(&self, job: &Job, stderr_log: &Path) -> Result<Outcome> {
        let kind = if job.mode == Mode::SwapZram {
            SwapKind::Zram
        } else {
            SwapKind::File(self.swap_file.clone())
        };
        // Room for the whole footprint plus slack: the limit, not the device, must decide.
        let swap_bytes = job.peak + job.peak / 4 + (64 << 20);
        let base = SwapBaseline::setup(kind, swap_bytes, job.local + PROCESS_ALLOWANCE)?;
        let w = base.run_with(command(job.argv), |c| {
            spawn_wait(c, stderr_log, self.timeout, job.client).map(|w| (w.status, w))
        })?;
        let st = base.stats();
        let oom = base.oom_kills().unwrap_or(0) > 0;
        base.close()?;
        let killed = w.status.signal() == Some(libc::SIGKILL) || w.status.code() == Some(137);
        if !w.timed_out && (oom || killed) && !w.status.success() {
            return Ok(Outcome::OomKilled { wall_s: w.wall_s });
        }
        let pages = st.pages_swapped_in.unwrap_or(0) + st.pages_swapped_out.unwrap_or(0);
        let mut detail = st.to_json();
        detail["limit_bytes"] = json!(job.local + PROCESS_ALLOWANCE);
        Ok(finish(
            &w,
            stderr_log,
            w.ru.ru_majflt as u64,
            pages * farmem_runtime::PAGE_SIZE as u64,
            st.mem_used(),
            detail,
        ))
    }

    fn run_farmem(&self, job: &Job, stderr_log: &Path) -> Result<Outcome> {
        let stats_file = self.logs.join(format!("{}.stats.json", job.tag));
        let _ = std::fs::remove_file(&stats_file);
        let mut cmd = Command::new(&self.farmem);
        cmd.arg("run")
            .arg("--local-mem")
            .arg((job.local + PROCESS_ALLOWANCE).to_string())
            .arg("--stats-json")
            .arg(&stats_file);
        if job.mode == Mode::FarmemLz4 {
            cmd.arg("--backend").arg("local+lz4://");
        } else if job.mode == Mode::FarmemDefault {
            // What a user gets: the default backend, whatever the environment says.
            cmd.env_remove("FARMEM_BACKEND");
        } else if job.mode == Mode::FarmemFile {
            let dir = self.swap_file.parent().unwrap_or(Path::new("/var/tmp"));
            cmd.arg("--backend")
                .arg(format!("file://{}", dir.display()));
        } else if !job.mode.over_tcp() {
            // The embedded modes measure the mechanism: far pages raw in the process.
            cmd.arg("--backend").arg("local://");
        }
        if job.mode.over_tcp() {
            let srv = self
                .server
                .context("a tcp mode runs without the loopback server")?;
            cmd.arg("--backend")
                .arg(format!("tcp://suite@{}", srv.addr))
                .env("FARMEM_TOKEN", srv.secret());
        }
        if job.mode.hinted() {
            cmd.envs(job.env.iter().copied());
        }
        cmd.arg("--").args(job.argv);
        // In a memory cgroup with no limit it reaches, so that its memory is measured as
        // Linux swap's is: the resident set would also count the program's code and
        // libraries, which neither cgroup is charged for (10 MiB for python3).
        let cg = SwapBaseline::setup(SwapKind::None, 1 << 20, farmem_sys::mem::physical_memory())?;
        let w = cg.run_with(cmd, |c| {
            spawn_wait(c, stderr_log, self.timeout, job.client).map(|w| (w.status, w))
        })?;
        let tree_peak = cg.stats().mem_used();
        cg.close()?;
        let stats: Value = std::fs::read_to_string(&stats_file)
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or(Value::Null);
        // Counters of the program and of what it executed (memcached under its shell).
        let count = |k: &str| {
            ["stats", "other_stats"]
                .iter()
                .filter_map(|s| stats[s][k].as_u64())
                .sum::<u64>()
        };
        let detail = json!({
            "unhinted_faults": count("unhinted_faults"),
            "wp_faults": count("wp_faults"),
            "hint_fetches": count("hint_misses"),
            "pages_fetched": count("pages_fetched"),
            "pages_evicted": count("pages_evicted"),
            "readahead_pages": count("readahead_pages"),
            "prefetch_pages": count("prefetch_pages"),
            "far_heap_peak_bytes": stats["stats"]["peak_resident_pages"].as_u64().map(|p| p * farmem_runtime::PAGE_SIZE as u64),
            "fetch_p50_ns": stats["stats"]["fetch_p50_ns"],
            "local_mem_bytes": job.local,
            "limit_bytes": job.local + PROCESS_ALLOWANCE,
        });
        // A server's share is memory this run used too; an embedded backend's far pages are
        // in the process's resident set already.
        let remote = if job.mode.over_tcp() {
            count("backend_bytes")
        } else {
            0
        };
        let used = if tree_peak > 0 {
            tree_peak
        } else {
            w.peak_rss()
        } + remote;
        Ok(finish(
            &w,
            stderr_log,
            count("unhinted_faults") + count("wp_faults"),
            count("bytes_read") + count("bytes_written"),
            used,
            detail,
        ))
    }
}

fn command(argv: &[OsString]) -> Command {
    let mut c = Command::new(&argv[0]);
    c.args(&argv[1..]);
    c
}

/// A process that ended.
struct Waited {
    status: ExitStatus,
    /// The program's output, or its load client's.
    stdout: Vec<u8>,
    ru: libc::rusage,
    wall_s: f64,
    timed_out: bool,
    /// How the load client ended, if there was one.
    client: Option<ExitStatus>,
}

impl Waited {
    /// The program's peak resident set, in bytes (the kernel counts `ru_maxrss` in KiB).
    fn peak_rss(&self) -> u64 {
        self.ru.ru_maxrss as u64 * 1024
    }
}

/// Starts `cmd` in a process group of its own (so a time-out, or Ctrl-C of the suite, ends
/// all it started), stdout captured, stderr to `stderr_log`; with a `client`, runs it to the
/// end once `cmd` is started (its output is the report), then stops `cmd` with SIGTERM.
/// Waits for `cmd` with its rusage.
fn spawn_wait(
    cmd: &mut Command,
    stderr_log: &Path,
    timeout: Duration,
    client: Option<&[OsString]>,
) -> io::Result<Waited> {
    let log = File::create(stderr_log)?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log.try_clone()?)
        .process_group(0);
    let t0 = Instant::now();
    let deadline = t0 + timeout;
    let mut child = cmd.spawn()?;
    let pid = child.id() as libc::pid_t;
    let _group = kill_group_on_signal(pid);
    let stdout = read_all(child.stdout.take().expect("stdout is piped"));
    let mut timed_out = false;
    let mut client_run = None;
    if let Some(argv) = client {
        let mut c = Command::new(&argv[0]);
        c.args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .process_group(0);
        let mut cl = c.spawn()?;
        let cpid = cl.id() as libc::pid_t;
        let _cgroup = kill_group_on_signal(cpid);
        let out = read_all(cl.stdout.take().expect("stdout is piped"));
        let (st, _) = wait_until(cpid, deadline, &mut timed_out)?;
        client_run = Some((ExitStatus::from_raw(st), out));
        // SAFETY: kill has no memory-safety preconditions; pid is our unreaped child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let (status, ru) = wait_until(pid, deadline, &mut timed_out)?;
    let wall_s = t0.elapsed().as_secs_f64();
    // Whatever the program left running (a server it started) goes with it.
    // SAFETY: as above; the group may be empty (ESRCH).
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    let own = stdout.join().unwrap_or_default();
    let (client, stdout) = match client_run {
        Some((st, out)) => (Some(st), out.join().unwrap_or_default()),
        None => (None, own),
    };
    Ok(Waited {
        status: ExitStatus::from_raw(status),
        stdout,
        ru,
        wall_s,
        timed_out,
        client,
    })
}

fn read_all(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        v
    })
}

/// Waits for child `pid` (wait status, rusage); past `deadline` kills its process group
/// and sets `timed_out`.
fn wait_until(
    pid: libc::pid_t,
    deadline: Instant,
    timed_out: &mut bool,
) -> io::Result<(i32, libc::rusage)> {
    loop {
        if let Some(r) = farmem_sys::process::try_wait_with_rusage(pid)? {
            return Ok(r);
        }
        if Instant::now() > deadline && !*timed_out {
            *timed_out = true;
            // SAFETY: kill has no memory-safety preconditions; pid leads our child's group.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The outcome of a run that ended: its report if it succeeded and printed one.
fn finish(
    w: &Waited,
    stderr_log: &Path,
    faults: u64,
    bytes_moved: u64,
    mem_used: u64,
    detail: Value,
) -> Outcome {
    let tail = || {
        let s = std::fs::read_to_string(stderr_log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(5)..].join("\n")
    };
    if w.timed_out {
        return Outcome::Failed(format!("ran past the time limit after {:.0} s", w.wall_s));
    }
    if let Some(c) = w.client.filter(|c| !c.success()) {
        return Outcome::Failed(format!(
            "the load client: {c} ({}): {}",
            stderr_log.display(),
            tail()
        ));
    }
    if !w.status.success() {
        return Outcome::Failed(format!(
            "{} ({}): {}",
            w.status,
            stderr_log.display(),
            tail()
        ));
    }
    match parse_report(&String::from_utf8_lossy(&w.stdout)) {
        Some((result, ops, secs)) => Outcome::Done(Measured {
            result,
            ops,
            secs,
            wall_s: w.wall_s,
            peak_rss: w.peak_rss(),
            faults,
            bytes_moved,
            mem_used,
            detail,
        }),
        None => Outcome::Failed(format!(
            "no `result=` and `ops= secs=` lines in its output: {:?}",
            String::from_utf8_lossy(&w.stdout)
        )),
    }
}

/// The `result=...` and `ops=N secs=S` lines of a workload's output.
pub fn parse_report(out: &str) -> Option<(String, u64, f64)> {
    let result = out.lines().find_map(|l| l.strip_prefix("result="))?;
    let (ops, secs) = out.lines().find_map(|l| {
        let rest = l.strip_prefix("ops=")?;
        let (ops, secs) = rest.split_once(" secs=")?;
        Some((ops.trim().parse().ok()?, secs.trim().parse().ok()?))
    })?;
    let ok = secs > 0.0 && f64::is_finite(secs);
    ok.then(|| (result.trim().to_string(), ops, secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_workload_report() {
        let out = "noise\nresult=ab12 7\nops=1000 secs=0.500000\n";
        assert_eq!(parse_report(out), Some(("ab12 7".into(), 1000, 0.5)));
        assert_eq!(parse_report("result=x\n"), None);
        assert_eq!(parse_report("ops=1 secs=1\n"), None);
        assert_eq!(parse_report("result=x\nops=1 secs=0\n"), None);
        assert_eq!(parse_report("result=x\nops=a secs=1\n"), None);
    }
}
