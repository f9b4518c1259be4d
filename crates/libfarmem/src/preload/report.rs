//! The report at exit of the transparent mode.
//!
//! `farmem run` reads it: with `FARMEM_STATS_DIR` set, every process of the program (the
//! program itself and whatever it executes under farmem) writes `DIR/PID.json` when it
//! exits normally: the runtime's statistics plus the process's peak resident set. With
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
        if super::STATE.load(Ordering::Acquire) != super::READY {
            return; // a forked child: the parent reports
        }
        let Some(rt) = super::runtime() else { return };
        let s = rt.stats();
        if let Some(Some(dir)) = DIR.get() {
            let json = format!(
                "{{\"pid\":{},\"peak_rss_bytes\":{},\"backend\":\"{}\",\"stats\":{}}}\n",
                std::process::id(),
                peak_rss(),
                rt.backend_name().replace(['"', '\\'], "_"),
                s.to_json()
            );
            let path = format!("{dir}/{}.json", std::process::id());
            let tmp = format!("{path}.tmp");
            if std::fs::write(&tmp, json).is_ok() {
                let _ = std::fs::rename(&tmp, &path);
            }
        }
        if PRINT.load(Ordering::Relaxed) {
            eprintln!("{}", rt.report());
        }
    });
    // Far memory may free this program's pages once it is gone (`exits.rs`).
    super::exits::release(true);
}
