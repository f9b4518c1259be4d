//! `farmem ctl PID`: change the local budget of a program running under `farmem run`, or
//! watch it, through its control socket (see `farmem_runtime::ctl`).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  farmem ctl 4242 --local-mem 256M\n  farmem ctl 4242 \
                        --watch 1\n\nOnly the program's own user and root may control it."
)]
pub struct Args {
    /// The process id of a program running under `farmem run`, or of a child it made with
    /// fork() (each forked worker answers for itself).
    pid: u32,
    /// Set its local budget (512M, 2G): shrinking evicts at once and returns when its
    /// resident set fits; growing stops evicting. Processes that share one budget (a
    /// program and the children it forks, unless run with --fork-local-mem) share the new
    /// one too, whichever of them is asked.
    #[arg(long, value_name = "SIZE")]
    local_mem: Option<String>,
    /// Print its statistics as JSON (the default when nothing else is asked).
    #[arg(long)]
    stats: bool,
    /// Print budget, resident memory, far store and fault rates every SECS seconds until
    /// the program ends (Ctrl-C to stop).
    #[arg(long, value_name = "SECS")]
    watch: Option<f64>,
}

fn ask(pid: u32, req: &str) -> Result<String> {
    let out = farmem_runtime::ctl::request(pid, req).with_context(|| {
        format!("process {pid} has no farmem control socket (not running under farmem run?)")
    })?;
    if let Some(e) = out.strip_prefix("error ") {
        bail!("process {pid}: {e}");
    }
    Ok(out)
}

fn stats(pid: u32) -> Result<serde_json::Value> {
    serde_json::from_str(&ask(pid, "stats")?).context("statistics from the program")
}

pub fn run(a: Args) -> Result<()> {
    if let Some(s) = &a.local_mem {
        let bytes = farmem_proto::size::parse_size(s).context("--local-mem")?;
        let t0 = Instant::now();
        ask(a.pid, &format!("local-mem {bytes}"))?;
        let s = stats(a.pid)?;
        eprintln!(
            "process {}: local budget {:.1} MiB, resident {:.1} MiB ({:.0} ms)",
            a.pid,
            mib(&s, "budget_bytes", 1),
            mib(&s, "resident_pages", 4096),
            t0.elapsed().as_secs_f64() * 1e3
        );
    }
    if let Some(secs) = a.watch {
        if !(secs > 0.0 && secs.is_finite()) {
            bail!("--watch {secs}: a positive number of seconds");
        }
        return watch(a.pid, Duration::from_secs_f64(secs));
    }
    if a.stats || a.local_mem.is_none() {
        println!("{}", stats(a.pid)?);
    }
    Ok(())
}

fn mib(s: &serde_json::Value, k: &str, unit: u64) -> f64 {
    (s[k].as_u64().unwrap_or(0) * unit) as f64 / (1u64 << 20) as f64
}

fn watch(pid: u32, every: Duration) -> Result<()> {
    // "other": the program's memory outside far memory that its budget covers (under
    // `farmem run`; the far heap gets the rest).
    println!(
        "{:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>8}",
        "time s",
        "budget MiB",
        "local MiB",
        "other MiB",
        "far MiB",
        "held MiB",
        "faults/s",
        "fetch/s",
        "pf acc"
    );
    let t0 = Instant::now();
    let mut last: Option<(Instant, serde_json::Value)> = None;
    loop {
        let s = match stats(pid) {
            Ok(s) => s,
            Err(_) if last.is_some() => return Ok(()), // the program ended
            Err(e) => return Err(e),
        };
        let now = Instant::now();
        let rate = |k: &str| match &last {
            Some((t, p)) => {
                let d = s[k].as_u64().unwrap_or(0) - p[k].as_u64().unwrap_or(0);
                d as f64 / now.duration_since(*t).as_secs_f64()
            }
            None => 0.0,
        };
        let (used, wasted) = (
            s["fault_prefetch_used"].as_u64().unwrap_or(0),
            s["fault_prefetch_wasted"].as_u64().unwrap_or(0),
        );
        let acc = if used + wasted > 0 {
            format!("{:.0}%", 100.0 * used as f64 / (used + wasted) as f64)
        } else {
            "-".into()
        };
        println!(
            "{:>9.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>9.0} {:>9.0} {:>8}",
            t0.elapsed().as_secs_f64(),
            mib(&s, "budget_bytes", 1),
            mib(&s, "resident_pages", 4096),
            mib(&s, "other_bytes", 1),
            mib(&s, "far_pages", 4096),
            mib(&s, "far_held_bytes", 1),
            rate("unhinted_faults"),
            rate("pages_fetched"),
            acc
        );
        last = Some((now, s));
        std::thread::sleep(every);
    }
}
