//! The report at exit of the transparent mode.
//!
//! `farmem run` reads it: with `FARMEM_STATS_DIR` set, every process of the program (the
//! program itself and whatever it executes under farmem) appends a line to
//! `DIR/stats.jsonl` when it exits normally: the runtime's statistics plus the process's
//! peak resident set. One file for all, appended in one write: a file per process
//! (`PID.json`, written then renamed) cost ~300 µs of every process's exit to create here,
//! a tenth of what a bash subshell costs under farmem. With
//! `FARMEM_STATS=1` the statistics are also printed to stderr.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

static PRINT: AtomicBool = AtomicBool::new(false);
static DIR: OnceLock<Option<String>> = OnceLock::new();

pub fn install(print: bool) {
    PRINT.store(print, Ordering::Relaxed);
    let _ = DIR.set(super::env_flag("FARMEM_STATS_DIR"));
    // SAFETY: registering a plain extern "C" function with no arguments.
    unsafe { libc::atexit(at_exit) };
    if let Some(rt) = super::runtime() {
        rt.set_exit_report_hook(|| write("_exit"));
    }
}

/// Append `line` to the run's statistics file in one write (`O_APPEND`: the lines of
/// processes ending together do not mix). `farmem run` made the file; made here otherwise.
fn append(dir: &str, line: &str) {
    use std::io::Write;
    let path = format!("{dir}/{}", farmem_runtime::STATS_FILE);
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
    {
        let _ = f.write_all(line.as_bytes());
    }
}

/// Peak resident set of this process in bytes (`VmHWM`), 0 if unknown.
fn peak_rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        farmem_runtime::fault_log::flush();
        write("exit");
    });
    // Far memory may free this program's pages once it is gone (`exits.rs`).
    super::exits::release(true);
}

/// Whether the report is wanted at all (`farmem run --stats` or `--stats-json`).
pub(super) fn wanted() -> bool {
    PRINT.load(Ordering::Relaxed) || matches!(DIR.get(), Some(Some(_)))
}

/// Write this process's report: its line in the run's statistics file, and to stderr with
/// `FARMEM_STATS=1`. At `exit` on the exiting thread; at `_exit` on the control thread
/// (`Runtime::report_at_exit`: `_exit` may run in a signal handler). `ended` says which (a
/// shell ends with `_exit`: `farmem run` then shows the program it ran first).
fn write(ended: &str) {
    if super::STATE.load(Ordering::Acquire) != super::READY {
        return; // a forked child whose heap is ordinary memory: the parent reports
    }
    let Some(rt) = super::runtime() else { return };
    let s = rt.stats();
    if let Some(Some(dir)) = DIR.get() {
        let json = format!(
            "{{\"pid\":{},\"ended\":\"{ended}\",\"peak_rss_bytes\":{},\"backend\":\"{}\",\"stats\":{}}}\n",
            std::process::id(),
            peak_rss(),
            rt.backend_name().replace(['"', '\\'], "_"),
            s.to_json()
        );
        append(dir, &json);
    }
    if PRINT.load(Ordering::Relaxed) {
        eprintln!("{}", rt.report());
    }
}
