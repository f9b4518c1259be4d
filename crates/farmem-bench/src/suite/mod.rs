//! `farmem bench suite`: the project's performance evaluation in the shape of the Eden and
//! Fastswap papers' figures. Every workload runs natively, under Linux swap in a memory
//! cgroup limited to the local size (zram, and a swap file: what a user would otherwise
//! pick), and under farmem (transparent and hinted; embedded backend and a `farmem server`
//! on loopback), at several local-memory fractions of its native peak, each point repeated.
//! Every run's result is checked against the native one. Writes CSV, JSON, a Markdown summary
//! and a plot per workload of normalized throughput against local memory.

mod measure;
mod mode;
mod plot;
mod progress;
mod report;
mod workload;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::json;

use super::spawn::LocalServer;
use super::swap::install_cleanup_handler;
use measure::{Job, Outcome, Runner};
use mode::Mode;
use progress::Progress;
use report::{Point, RunRecord, RunsCsv};
use workload::{Programs, Workload};

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Needs root (userfaultfd, swapon, cgroups) and cc; memcached needs Debian's memcached.
Local memory is a percentage of each workload's native peak resident set, measured by its
first native run. Both sides get it plus 8 MiB (the program's own code and stacks, and the
runtime's memory under farmem) as their limit: Linux swap as the memory limit of the cgroup,
farmem as its local budget (--local-mem, which covers all of the program's anonymous memory
as the cgroup's limit does). The swap device (zram, or a swap file) is made for each run and
removed after it, and on Ctrl-C or SIGTERM.

Output in --out: runs.csv (every run, written as it ends), summary.csv and results.json
(medians per point), summary.md (the tables), <workload>.svg/.png (normalized throughput
against local memory, one line per mode) and overview.svg/.png (all workloads).")]
pub struct Args {
    /// Workloads to run. Also available by name: csrbuild and dictgrow (random writes
    /// building a large array; a growing hash table), the shapes where paging collapses.
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "seqscan,randscan,kvs,dataframe,psort,memcached"
    )]
    workloads: Vec<Workload>,
    /// Modes to run each workload in (native is always run: it is the reference).
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "native,swap-zram,swap-file,farmem,farmem-default,farmem-lz4,farmem-tcp,farmem-hinted,farmem-hinted-tcp"
    )]
    modes: Vec<Mode>,
    /// zram's compressor in the swap-zram mode (`default`: leave the kernel's choice); lz4
    /// meets farmem-lz4 like for like.
    #[arg(long, default_value = "lz4")]
    zram_comp: String,
    /// Local memory, in percent of each workload's native peak.
    #[arg(long, value_delimiter = ',', default_value = "100,75,50,25,10")]
    local: Vec<u32>,
    /// Runs per point; the median is reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Scales every workload's data size (1 = 1 GiB each, 2 GiB for dataframe: seconds to a
    /// minute natively). 0.03 makes a quick check.
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Output directory (created; existing result files in it are replaced).
    #[arg(long, default_value = "suite-results")]
    out: PathBuf,
    /// The swap file of the swap-file mode (created for each run, removed after; on a
    /// filesystem that supports swap files, such as ext4 or xfs).
    #[arg(long, value_name = "PATH")]
    swap_file: Option<PathBuf>,
    /// A run taking longer than this many seconds is killed and counted as failed.
    #[arg(long, default_value_t = 1200)]
    timeout: u64,
    /// Let the Linux-swap cgroup's OOM killer end a program whose limit is too tight, as
    /// Linux does by default (the point then reads OOM). By default it is off (cgroup v1
    /// `memory.oom_control`) and a thread of the benchmark ends each stall: a charge that
    /// fails parks the program's thread, the benchmark reclaims 128 KiB of the cgroup from
    /// outside and wakes it, so every point gets a time (the count is in the JSON and the
    /// run's line).
    #[arg(long)]
    oom_kill: bool,
    /// Run nothing: write the tables, JSON and plots again from the runs.csv in --out (of a
    /// suite that finished, or was interrupted). The workloads, modes, points and repeats
    /// are those in the file; give the --scale it ran with, for the data sizes in the titles.
    #[arg(long)]
    report_only: bool,
}

pub fn run(mut a: Args) -> Result<()> {
    if a.report_only {
        return report_again(a);
    }
    check(&mut a)?;
    crate::swap::use_zram_compressor((a.zram_comp != "default").then_some(a.zram_comp.as_str()));
    crate::swap::use_oom_killer(a.oom_kill);
    std::fs::create_dir_all(a.out.join("logs"))
        .with_context(|| format!("creating {}", a.out.display()))?;
    install_cleanup_handler()?;
    eprintln!("building the workloads with cc ...");
    let programs = Programs::build(&a.out.join("bin"), &a.workloads)?;
    let server = if a.modes.iter().any(|m| m.over_tcp()) {
        let s = LocalServer::start(&[("suite", 1)], &[])?;
        eprintln!("started farmem server on {} for the tcp modes", s.addr);
        Some(s)
    } else {
        None
    };
    let runner = Runner {
        farmem: std::env::current_exe().context("locating the farmem binary")?,
        server: server.as_ref(),
        swap_file: a.swap_file.clone().unwrap_or_else(|| {
            PathBuf::from(format!("/var/tmp/farmem-suite-{}.swap", std::process::id()))
        }),
        logs: a.out.join("logs"),
        timeout: Duration::from_secs(a.timeout),
    };
    let started = Instant::now();
    let mut suite = Suite {
        a: &a,
        programs: &programs,
        runner: &runner,
        progress: Progress::new(total_runs(&a)),
        csv: RunsCsv::create(&a.out.join("runs.csv"))?,
        runs: Vec::new(),
        sizes: Vec::new(),
    };
    for &w in &a.workloads {
        suite.workload(w)?;
    }
    suite.progress.finish();
    let failed: Vec<String> = suite
        .runs
        .iter()
        .filter_map(|r| match &r.outcome {
            Outcome::Failed(why) => Some(format!(
                "{} {} at {}% (run {}): {why}",
                r.workload,
                r.mode,
                r.local_pct,
                r.rep + 1
            )),
            _ => None,
        })
        .collect();
    let points = report::points(&suite.runs);
    let took = started.elapsed();
    write_results(
        &a,
        &suite.runs,
        &suite.sizes,
        &points,
        machine(),
        Some(took),
    )?;
    if !failed.is_empty() {
        bail!(
            "{} run(s) failed (results are in {} all the same):\n  {}",
            failed.len(),
            a.out.display(),
            failed.join("\n  ")
        );
    }
    Ok(())
}

/// `--report-only`: the report of the runs in `--out`/runs.csv, as the suite that made them
/// would have written it.
fn report_again(mut a: Args) -> Result<()> {
    let csv = a.out.join("runs.csv");
    let runs = report::read_runs_csv(&csv)?;
    if runs.is_empty() {
        bail!("{} has no runs to report", csv.display());
    }
    a.workloads = Vec::new();
    for r in &runs {
        if !a.workloads.contains(&r.workload) {
            a.workloads.push(r.workload);
        }
    }
    a.modes = runs.iter().map(|r| r.mode).collect();
    a.local = runs
        .iter()
        .filter(|r| r.mode != Mode::Native)
        .map(|r| r.local_pct)
        .collect();
    if a.local.is_empty() {
        a.local.push(100);
    }
    a.repeat = runs.iter().map(|r| r.rep + 1).max().unwrap_or(1);
    validate(&mut a)?;
    // As the suite sizes them: by the first native run that succeeded.
    let sizes: Vec<(Workload, u64, u64)> = a
        .workloads
        .iter()
        .filter_map(|&w| {
            let peak = runs.iter().find_map(|r| match &r.outcome {
                Outcome::Done(m) if r.workload == w && r.mode == Mode::Native => Some(m.peak_rss),
                _ => None,
            })?;
            Some((w, data_mib(w, a.scale), peak))
        })
        .collect();
    eprintln!("{} runs read from {}", runs.len(), csv.display());
    let points = report::points(&runs);
    // The machine the runs were made on, if the suite got as far as saying it.
    let earlier = std::fs::read_to_string(a.out.join("results.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .map(|j| j["machine"].clone())
        .filter(|m| m.is_object());
    write_results(
        &a,
        &runs,
        &sizes,
        &points,
        earlier.unwrap_or_else(machine),
        None,
    )
}

/// Data size of workload `w` at `--scale`, in MiB.
fn data_mib(w: Workload, scale: f64) -> u64 {
    ((w.default_mib() as f64 * scale).round() as u64).max(8)
}

/// `validate`, and root: the suite needs it to run anything.
fn check(a: &mut Args) -> Result<()> {
    validate(a)?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("farmem bench suite needs root: userfaultfd, swap devices and memory cgroups");
    }
    Ok(())
}

/// Check the arguments and put the lists in the order the suite and its report use:
/// points from the most local memory down, modes in their order with native first.
fn validate(a: &mut Args) -> Result<()> {
    if a.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    if a.local.is_empty() || a.local.iter().any(|&p| p == 0 || p > 100) {
        bail!("--local takes percentages in 1..=100, e.g. 100,50,25");
    }
    if !(a.scale > 0.0 && a.scale.is_finite()) {
        bail!("--scale must be a positive number");
    }
    if a.workloads.is_empty() {
        bail!("--workloads is empty");
    }
    a.local.sort_unstable_by(|x, y| y.cmp(x));
    a.local.dedup();
    a.workloads.dedup();
    if !a.modes.contains(&Mode::Native) {
        a.modes.insert(0, Mode::Native);
    }
    a.modes.sort();
    a.modes.dedup();
    Ok(())
}

fn total_runs(a: &Args) -> u64 {
    a.workloads
        .iter()
        .map(|&w| {
            let others = a
                .modes
                .iter()
                .filter(|&&m| m != Mode::Native && w.supports(m))
                .count();
            (a.repeat * (1 + others * a.local.len())) as u64
        })
        .sum()
}

struct Suite<'a> {
    a: &'a Args,
    programs: &'a Programs,
    runner: &'a Runner<'a>,
    progress: Progress,
    csv: RunsCsv,
    runs: Vec<RunRecord>,
    /// (workload, data MiB, native peak bytes)
    sizes: Vec<(Workload, u64, u64)>,
}

impl Suite<'_> {
    /// All runs of one workload: natively first until one succeeds (its peak sizes the local
    /// memory of the others, its result is the reference), then repeat by repeat the rest of
    /// the native runs and every point with the modes in turn, so that slow drift of the
    /// machine affects the reference and the others alike (at 100% local the ratio to native
    /// is the result, and this machine's native seqscan varies by 30% from run to run).
    fn workload(&mut self, w: Workload) -> Result<()> {
        let mib = data_mib(w, self.a.scale);
        let mut reference: Option<(String, u64)> = None;
        let mut native_runs = 0;
        while reference.is_none() && native_runs < self.a.repeat {
            let m = self.one(w, Mode::Native, mib, 100, 0, native_runs, None)?;
            native_runs += 1;
            reference = m.map(|m| (m.result.clone(), m.peak_rss));
        }
        let Some((result, peak)) = reference else {
            self.progress.note(&format!(
                "{w}: every native run failed; skipping its other modes"
            ));
            return Ok(());
        };
        self.sizes.push((w, mib, peak));
        let reference = Some((result, peak));
        for rep in 0..self.a.repeat {
            if rep >= native_runs {
                self.one(w, Mode::Native, mib, 100, 0, rep, reference.as_ref())?;
            }
            for &pct in &self.a.local {
                let local = peak * pct as u64 / 100;
                for &mode in &self.a.modes {
                    if mode != Mode::Native && w.supports(mode) {
                        self.one(w, mode, mib, pct, local, rep, reference.as_ref())?;
                    }
                }
            }
        }
        Ok(())
    }

    /// One run, recorded; returns its measurement if it succeeded. A result that differs
    /// from the native one makes it a failure.
    #[allow(clippy::too_many_arguments)]
    fn one(
        &mut self,
        w: Workload,
        mode: Mode,
        mib: u64,
        pct: u32,
        local: u64,
        rep: usize,
        reference: Option<&(String, u64)>,
    ) -> Result<Option<measure::Measured>> {
        let what = format!(
            "{w} {mode} at {pct}% ({} MiB of {mib} MiB data), run {}/{}",
            local >> 20,
            rep + 1,
            self.a.repeat
        );
        let what = if mode == Mode::Native {
            format!(
                "{w} native ({mib} MiB data), run {}/{}",
                rep + 1,
                self.a.repeat
            )
        } else {
            what
        };
        self.progress.begin(&what);
        let port = workload::free_port()?;
        let launch = self.programs.launch(w, mib, mode.hinted(), port);
        let job = Job {
            mode,
            argv: &launch.argv,
            client: launch.client.as_deref(),
            env: w.hinted_env(),
            local,
            peak: reference.map_or(0, |r| r.1),
            tag: format!("{w}-{mode}-{pct}-{rep}"),
        };
        let outcome = checked(self.runner.run(&job)?, reference.map(|r| r.0.as_str()));
        let how = match &outcome {
            Outcome::Done(m) => {
                let mut how = format!(
                    "{:.2} s, {:.0} {}/s, peak RSS {} MiB, {} faults, {} MiB moved",
                    m.secs,
                    m.ops as f64 / m.secs,
                    w.unit(),
                    m.peak_rss >> 20,
                    m.faults,
                    m.bytes_moved >> 20
                );
                if let Some(n) = m.detail["oom_stalls"].as_u64().filter(|&n| n > 0) {
                    let ms = m.detail["oom_parked_us"].as_u64().unwrap_or(0) as f64 / 1e3;
                    how += &format!(", {n} OOM stalls relieved ({ms:.0} ms parked)");
                }
                how
            }
            Outcome::OomKilled { wall_s } => format!("OOM-killed after {wall_s:.1} s"),
            Outcome::Failed(why) => format!("FAILED: {why}"),
        };
        self.progress.end(&what, &how);
        let rec = RunRecord {
            workload: w,
            mode,
            local_pct: pct,
            rep,
            outcome,
        };
        self.csv.append(&rec)?;
        let done = match &rec.outcome {
            Outcome::Done(m) => Some(m.clone()),
            _ => None,
        };
        self.runs.push(rec);
        Ok(done)
    }
}

/// A run that printed another result than the native one failed, however fast it was.
fn checked(outcome: Outcome, native: Option<&str>) -> Outcome {
    match (&outcome, native) {
        (Outcome::Done(m), Some(want)) if m.result != want => {
            Outcome::Failed(format!("wrong result: {:?}, natively {want:?}", m.result))
        }
        _ => outcome,
    }
}

/// Everything but runs.csv. `took` is the suite's time, unknown when reporting again.
fn write_results(
    a: &Args,
    runs: &[RunRecord],
    sizes: &[(Workload, u64, u64)],
    points: &[Point],
    machine: serde_json::Value,
    took: Option<Duration>,
) -> Result<()> {
    let out = &a.out;
    report::write_summary_csv(&out.join("summary.csv"), points)?;
    let config = json!({
        "workloads": a.workloads.iter().map(|w| w.name()).collect::<Vec<_>>(),
        "modes": a.modes.iter().map(|m| m.name()).collect::<Vec<_>>(),
        "local_pct": a.local,
        "repeat": a.repeat,
        "scale": a.scale,
        "process_allowance_bytes": crate::limits::PROCESS_ALLOWANCE,
        "took_s": took.map(|t| t.as_secs_f64()),
    });
    let sizes_json: Vec<_> = sizes
        .iter()
        .map(|&(w, mib, peak)| json!({"workload": w.name(), "data_mib": mib, "native_peak_rss_bytes": peak, "unit": w.unit()}))
        .collect();
    let j = json!({
        "machine": machine,
        "config": config,
        "workloads": sizes_json,
        "points": points.iter().map(report::point_json).collect::<Vec<_>>(),
        "runs": runs.iter().map(RunRecord::to_json).collect::<Vec<_>>(),
    });
    let results = out.join("results.json");
    std::fs::write(&results, serde_json::to_string_pretty(&j)? + "\n")
        .with_context(|| format!("writing {}", results.display()))?;

    let header = format!(
        "# farmem bench suite\n\n{} · {} · {} runs{} · {} repeat(s) per point, medians · \
         local memory in % of each workload's native peak\n",
        machine["summary"].as_str().unwrap_or(""),
        machine["farmem"].as_str().unwrap_or(""),
        runs.len(),
        took.map(|t| format!(" in {}", progress::clock(t)))
            .unwrap_or_default(),
        a.repeat
    );
    let md = report::markdown(&header, sizes, &a.modes, &a.local, points);
    std::fs::write(out.join("summary.md"), &md)
        .with_context(|| format!("writing {}", out.join("summary.md").display()))?;
    let drawn = draw(a, sizes, points)?;
    println!("{md}");
    println!(
        "Results in {}: runs.csv, summary.csv, results.json, summary.md{}",
        out.display(),
        drawn
    );
    Ok(())
}

/// The plots; says which were drawn.
fn draw(a: &Args, sizes: &[(Workload, u64, u64)], points: &[Point]) -> Result<String> {
    let png_ok = plot::font_ready();
    if !png_ok {
        eprintln!(
            "no TrueType font found (install fonts-dejavu-core): drawing SVG plots only, no PNG"
        );
    }
    let mut panels = Vec::new();
    for &(w, mib, peak) in sizes {
        let series = series_of(a, w, points);
        let title = format!("{w}: throughput against local memory");
        let sub = format!(
            "{mib} MiB of data, native peak {} MiB; {} per point, median",
            peak >> 20,
            if a.repeat == 1 {
                "1 run".to_string()
            } else {
                format!("{} runs", a.repeat)
            }
        );
        let svg = a.out.join(format!("{w}.svg"));
        let png = a.out.join(format!("{w}.png"));
        plot::workload_plot(&title, &sub, &series, &svg, png_ok.then_some(png.as_path()))?;
        panels.push((w.name().to_string(), series));
    }
    if !panels.is_empty() {
        let png = a.out.join("overview.png");
        plot::overview_plot(
            "farmem against Linux swap: throughput normalized to native",
            &panels,
            &a.out.join("overview.svg"),
            png_ok.then_some(png.as_path()),
        )?;
    }
    Ok(if png_ok {
        ", <workload>.svg/.png, overview.svg/.png".into()
    } else {
        ", <workload>.svg, overview.svg".into()
    })
}

/// One line per mode; native is flat at 1 across the x range.
fn series_of(a: &Args, w: Workload, points: &[Point]) -> Vec<plot::Series> {
    a.modes
        .iter()
        .filter(|&&m| w.supports(m))
        .map(|&m| plot::Series {
            mode: m.name().to_string(),
            points: a
                .local
                .iter()
                .map(|&pct| {
                    let p = report::find(points, w, m, pct);
                    (
                        pct as f64,
                        p.filter(|p| p.status == "ok").and_then(|p| p.normalized),
                    )
                })
                .collect(),
        })
        .collect()
}

/// What the results were measured on.
fn machine() -> serde_json::Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_string();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_kib = farmem_sys::host::meminfo_kib("MemTotal").unwrap_or(0);
    let model = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|v| v.split_once(':').map(|x| x.1.trim().to_string()))
        .unwrap_or_default();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let farmem = format!("farmem {}", env!("CARGO_PKG_VERSION"));
    json!({
        "kernel": kernel,
        "cpus": cpus,
        "mem_bytes": mem_kib * 1024,
        "cpu_model": model,
        "unix_time": now,
        "farmem": farmem,
        "summary": format!("Linux {kernel}, {cpus} CPUs ({model}), {} GiB RAM", mem_kib >> 20),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(result: &str) -> Outcome {
        Outcome::Done(measure::Measured {
            result: result.into(),
            ops: 1,
            secs: 1.0,
            wall_s: 1.0,
            peak_rss: 1,
            faults: 0,
            bytes_moved: 0,
            mem_used: 1,
            detail: json!({}),
        })
    }

    #[test]
    fn a_result_unlike_the_native_one_fails_the_run() {
        assert!(matches!(checked(done("a"), Some("a")), Outcome::Done(_)));
        assert!(matches!(checked(done("a"), None), Outcome::Done(_)));
        match checked(done("b"), Some("a")) {
            Outcome::Failed(why) => assert!(why.contains("wrong result"), "{why}"),
            o => panic!("{o:?}"),
        }
        let oom = checked(Outcome::OomKilled { wall_s: 1.0 }, Some("a"));
        assert!(matches!(oom, Outcome::OomKilled { .. }));
    }
}
