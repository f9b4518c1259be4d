//! What the suite writes: every run as it ends (`runs.csv`), the medians per point
//! (`summary.csv`), everything as JSON (`results.json`) and the tables a person reads
//! (`summary.md`: normalized throughput per mode, and farmem against the best Linux swap).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::io::Write;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use super::measure::{Measured, Outcome};
use super::mode::Mode;
use super::workload::Workload;
use crate::median;

/// One run as measured.
#[derive(Debug)]
pub struct RunRecord {
    pub workload: Workload,
    pub mode: Mode,
    /// Local memory, % of the native peak (100 for native runs).
    pub local_pct: u32,
    pub rep: usize,
    pub outcome: Outcome,
}

impl RunRecord {
    pub fn throughput(&self) -> Option<f64> {
        match &self.outcome {
            Outcome::Done(m) => Some(m.ops as f64 / m.secs),
            _ => None,
        }
    }

    pub fn status(&self) -> &'static str {
        match self.outcome {
            Outcome::Done(_) => "ok",
            Outcome::OomKilled { .. } => "oom-killed",
            Outcome::Failed(_) => "failed",
        }
    }

    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "workload": self.workload.name(),
            "mode": self.mode.name(),
            "local_pct": self.local_pct,
            "rep": self.rep,
            "status": self.status(),
            "throughput": self.throughput(),
        });
        match &self.outcome {
            Outcome::Done(m) => {
                v["ops"] = json!(m.ops);
                v["secs"] = json!(m.secs);
                v["wall_s"] = json!(m.wall_s);
                v["peak_rss_bytes"] = json!(m.peak_rss);
                v["faults"] = json!(m.faults);
                v["bytes_moved"] = json!(m.bytes_moved);
                v["mem_used_bytes"] = json!(m.mem_used);
                v["result"] = json!(m.result);
                v["detail"] = m.detail.clone();
            }
            Outcome::OomKilled { wall_s } => v["wall_s"] = json!(wall_s),
            Outcome::Failed(why) => v["error"] = json!(why),
        }
        v
    }
}

const RUNS_HEADER: &str = "workload,mode,local_pct,rep,status,ops,secs,throughput,wall_s,\
                           peak_rss_bytes,faults,bytes_moved,mem_used_bytes";
/// The header of suites from before `mem_used_bytes`: still read, memory used unknown.
const RUNS_HEADER_V1: &str = "workload,mode,local_pct,rep,status,ops,secs,throughput,wall_s,\
                              peak_rss_bytes,faults,bytes_moved";

/// `runs.csv`, a line written (and flushed) as each run ends, so an interrupted suite keeps
/// what it measured.
pub struct RunsCsv(File);

impl RunsCsv {
    pub fn create(path: &Path) -> Result<RunsCsv> {
        let mut f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        writeln!(f, "{RUNS_HEADER}")?;
        Ok(RunsCsv(f))
    }

    pub fn append(&mut self, r: &RunRecord) -> Result<()> {
        let (ops, secs, wall, rss, faults, bytes, used) = match &r.outcome {
            Outcome::Done(m) => (
                m.ops.to_string(),
                format!("{:.6}", m.secs),
                format!("{:.3}", m.wall_s),
                m.peak_rss.to_string(),
                m.faults.to_string(),
                m.bytes_moved.to_string(),
                m.mem_used.to_string(),
            ),
            Outcome::OomKilled { wall_s } => (
                String::new(),
                String::new(),
                format!("{wall_s:.3}"),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ),
            Outcome::Failed(_) => Default::default(),
        };
        writeln!(
            self.0,
            "{},{},{},{},{},{ops},{secs},{},{wall},{rss},{faults},{bytes},{used}",
            r.workload,
            r.mode,
            r.local_pct,
            r.rep,
            r.status(),
            r.throughput()
                .map(|t| format!("{t:.1}"))
                .unwrap_or_default(),
        )?;
        self.0.flush()?;
        Ok(())
    }
}

/// The runs in a `runs.csv` that `RunsCsv` wrote, for drawing the report again. Results,
/// error messages and mode details are not in it. A last line cut short (the suite killed
/// while writing it) is left out with a warning; any other unreadable line is an error.
pub fn read_runs_csv(path: &Path) -> Result<Vec<RunRecord>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut lines: Vec<&str> = text.lines().collect();
    let v1 = lines.first() == Some(&RUNS_HEADER_V1);
    if lines.first() != Some(&RUNS_HEADER) && !v1 {
        bail!(
            "{} is not a runs.csv of farmem bench suite (its first line is not {RUNS_HEADER:?})",
            path.display()
        );
    }
    if !text.ends_with('\n') && lines.len() > 1 {
        let cut = lines.pop().unwrap_or_default();
        tracing::warn!(
            "{}: leaving out its unfinished last line {cut:?}",
            path.display()
        );
    }
    lines
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            parse_run(l, v1).with_context(|| format!("{} line {}: {l:?}", path.display(), i + 1))
        })
        .collect()
}

fn parse_run(line: &str, v1: bool) -> Result<RunRecord> {
    use clap::ValueEnum;
    let header = if v1 { RUNS_HEADER_V1 } else { RUNS_HEADER };
    let names: Vec<&str> = header.split(',').collect();
    let f: Vec<&str> = line.split(',').collect();
    if f.len() != names.len() {
        bail!("{} fields, expected {}", f.len(), names.len());
    }
    let num = |i: usize| -> Result<f64> {
        f[i].parse::<f64>()
            .with_context(|| format!("{} is not a number: {:?}", names[i], f[i]))
    };
    let outcome = match f[4] {
        "ok" => Outcome::Done(Measured {
            result: String::new(),
            ops: num(5)? as u64,
            secs: num(6)?,
            wall_s: num(8)?,
            peak_rss: num(9)? as u64,
            faults: num(10)? as u64,
            bytes_moved: num(11)? as u64,
            mem_used: if v1 { 0 } else { num(12)? as u64 },
            detail: Value::Null,
        }),
        "oom-killed" => Outcome::OomKilled { wall_s: num(8)? },
        "failed" => Outcome::Failed("failed (the reason is in the suite's output)".into()),
        other => bail!("unknown status {other:?}"),
    };
    Ok(RunRecord {
        workload: Workload::from_str(f[0], false).map_err(|e| anyhow!("workload: {e}"))?,
        mode: Mode::from_str(f[1], false).map_err(|e| anyhow!("mode: {e}"))?,
        local_pct: num(2)? as u32,
        rep: num(3)? as usize,
        outcome,
    })
}

/// The median of the repeats at one (workload, mode, local %).
#[derive(Clone, Debug)]
pub struct Point {
    pub workload: Workload,
    pub mode: Mode,
    pub local_pct: u32,
    /// "ok" when every repeat ran; else why not (one failure or OOM kill marks the point).
    pub status: &'static str,
    pub throughput: Option<f64>,
    /// Throughput over the native median.
    pub normalized: Option<f64>,
    pub wall_s: Option<f64>,
    pub peak_rss: Option<f64>,
    pub faults: Option<f64>,
    pub bytes_moved: Option<f64>,
    /// Memory used at the peak (see `Measured::mem_used`); None when a run did not know it.
    pub mem_used: Option<f64>,
    pub runs: usize,
    /// When some repeats did not finish (an OOM kill): the median throughput of those that
    /// did, and how many they were.
    pub survivors: Option<(f64, usize)>,
}

/// Medians per point. The native point is repeated at every local % of the other modes'
/// lines only in the plots; here it is one point at 100%.
pub fn points(runs: &[RunRecord]) -> Vec<Point> {
    let mut groups: BTreeMap<(Workload, Mode, u32), Vec<&RunRecord>> = BTreeMap::new();
    for r in runs {
        groups
            .entry((r.workload, r.mode, r.local_pct))
            .or_default()
            .push(r);
    }
    let native: BTreeMap<Workload, f64> = groups
        .iter()
        .filter(|((_, m, _), _)| *m == Mode::Native)
        .filter_map(|((w, _, _), rs)| Some((*w, med(rs, |r| r.throughput())?)))
        .collect();
    groups
        .iter()
        .map(|(&(workload, mode, local_pct), rs)| {
            let status = rs
                .iter()
                .map(|r| r.status())
                .find(|&s| s != "ok")
                .unwrap_or("ok");
            let done = |f: fn(&super::measure::Measured) -> f64| {
                move |r: &RunRecord| match &r.outcome {
                    Outcome::Done(m) => Some(f(m)),
                    _ => None,
                }
            };
            let throughput = med(rs, |r| r.throughput());
            let finished: Vec<&RunRecord> = rs
                .iter()
                .copied()
                .filter(|r| r.throughput().is_some())
                .collect();
            let survivors = (status != "ok" && !finished.is_empty())
                .then(|| med(&finished, |r| r.throughput()).map(|t| (t, finished.len())))
                .flatten();
            Point {
                workload,
                mode,
                local_pct,
                status,
                throughput,
                normalized: throughput.zip(native.get(&workload)).map(|(t, n)| t / n),
                wall_s: med(rs, done(|m| m.wall_s)),
                peak_rss: med(rs, done(|m| m.peak_rss as f64)),
                faults: med(rs, done(|m| m.faults as f64)),
                bytes_moved: med(rs, done(|m| m.bytes_moved as f64)),
                mem_used: med(rs, |r| match &r.outcome {
                    Outcome::Done(m) if m.mem_used > 0 => Some(m.mem_used as f64),
                    _ => None,
                }),
                runs: rs.len(),
                survivors,
            }
        })
        .collect()
}

/// The median of `f` over the runs, None unless every run has it.
fn med(rs: &[&RunRecord], f: impl Fn(&RunRecord) -> Option<f64>) -> Option<f64> {
    let v: Option<Vec<f64>> = rs.iter().map(|r| f(r)).collect();
    v.filter(|v| !v.is_empty()).map(median)
}

pub fn write_summary_csv(path: &Path, points: &[Point]) -> Result<()> {
    let mut s = String::from(
        "workload,mode,local_pct,status,throughput,normalized,wall_s,peak_rss_bytes,faults,\
         bytes_moved,mem_used_bytes,runs\n",
    );
    let f = |v: Option<f64>, prec: usize| v.map(|x| format!("{x:.prec$}")).unwrap_or_default();
    for p in points {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{}",
            p.workload,
            p.mode,
            p.local_pct,
            p.status,
            f(p.throughput, 1),
            f(p.normalized, 4),
            f(p.wall_s, 3),
            f(p.peak_rss, 0),
            f(p.faults, 0),
            f(p.bytes_moved, 0),
            f(p.mem_used, 0),
            p.runs
        );
    }
    std::fs::write(path, s).with_context(|| format!("writing {}", path.display()))
}

pub fn point_json(p: &Point) -> Value {
    json!({
        "workload": p.workload.name(),
        "mode": p.mode.name(),
        "local_pct": p.local_pct,
        "status": p.status,
        "throughput": p.throughput,
        "normalized": p.normalized,
        "wall_s": p.wall_s,
        "peak_rss_bytes": p.peak_rss,
        "faults": p.faults,
        "bytes_moved": p.bytes_moved,
        "mem_used_bytes": p.mem_used,
        "runs": p.runs,
    })
}

/// The point of `mode` at `pct` (native: its one point, whatever `pct`).
pub fn find(points: &[Point], w: Workload, mode: Mode, pct: u32) -> Option<&Point> {
    points
        .iter()
        .find(|p| p.workload == w && p.mode == mode && (mode == Mode::Native || p.local_pct == pct))
}

/// A table cell: the normalized throughput, or why there is none.
fn cell(p: Option<&Point>) -> String {
    match p {
        None => "–".into(),
        Some(p) => match (p.status, p.normalized) {
            ("ok", Some(n)) => format!("{n:.3}"),
            ("oom-killed", _) => "OOM".into(),
            _ => "failed".into(),
        },
    }
}

/// A table cell: the median memory used, in MiB, or why there is none.
fn used_cell(p: Option<&Point>) -> String {
    match p {
        None => "–".into(),
        Some(p) => match (p.status, p.mem_used) {
            ("ok", Some(b)) => format!("{:.0}", b / (1u64 << 20) as f64),
            ("ok", None) => "?".into(),
            ("oom-killed", _) => "OOM".into(),
            _ => "failed".into(),
        },
    }
}

/// farmem mode ÷ the better Linux swap mode at the same point.
fn ratio(points: &[Point], w: Workload, mode: Mode, pct: u32) -> String {
    let thr = |m: Mode| {
        find(points, w, m, pct)
            .filter(|p| p.status == "ok")
            .and_then(|p| p.throughput)
    };
    let Some(f) = thr(mode) else {
        return "–".into();
    };
    let swaps: Vec<&Point> = [Mode::SwapZram, Mode::SwapFile]
        .iter()
        .filter_map(|&m| find(points, w, m, pct))
        .collect();
    let best = swaps
        .iter()
        .filter(|p| p.status == "ok")
        .filter_map(|p| p.throughput)
        .fold(None, |b: Option<f64>, t| Some(b.map_or(t, |b| b.max(t))));
    // A swap mode killed in some repeats and not others counts by its survivors: an OOM kill
    // is a win for farmem only where the runs that survived were slower too.
    let survived = swaps
        .iter()
        .filter(|p| p.status == "oom-killed")
        .filter_map(|p| p.survivors.map(|(t, n)| (t, n, p.runs)))
        .fold(None, |b: Option<(f64, usize, usize)>, s| match b {
            Some(b) if b.0 >= s.0 => Some(b),
            _ => Some(s),
        });
    match (best, survived) {
        (_, Some((t, n, of))) if best.is_none_or(|s| t > s) => format!(
            "{:.2}× (swap OOM-killed in {} of {of} runs; against the median of those that finished)",
            f / t,
            of - n
        ),
        (Some(s), _) => format!("{:.2}×", f / s),
        (None, _) if swaps.iter().any(|p| p.status == "oom-killed") => "∞ (swap OOM)".into(),
        (None, _) => "–".into(),
    }
}

/// The Markdown summary: one table of normalized throughput, one of farmem ÷ best swap.
pub fn markdown(
    header: &str,
    workloads: &[(Workload, u64, u64)],
    modes: &[Mode],
    pcts: &[u32],
    points: &[Point],
) -> String {
    let mut s = String::from(header);
    let other: Vec<Mode> = modes
        .iter()
        .copied()
        .filter(|&m| m != Mode::Native)
        .collect();
    let farmem: Vec<Mode> = modes.iter().copied().filter(|m| m.is_farmem()).collect();

    table(
        &mut s,
        "Normalized throughput (1 = native; median of the repeats)",
        workloads,
        pcts,
        &other,
        |w, m, pct| cell(find(points, w, m, pct)),
    );
    if !farmem.is_empty() && modes.iter().any(|m| m.is_swap()) {
        table(
            &mut s,
            "farmem ÷ Linux swap (throughput over the better of swap-zram and swap-file at the same point)",
            workloads,
            pcts,
            &farmem,
            |w, m, pct| ratio(points, w, m, pct),
        );
    }
    table(
        &mut s,
        "Memory used at the peak, MiB (the peak of a memory cgroup over the process tree, \
         farmem's in-process far pages in it; plus a server's share for farmem, zram's memory \
         for Linux)",
        workloads,
        pcts,
        &other,
        |w, m, pct| used_cell(find(points, w, m, pct)),
    );
    s += "\n## Native reference\n\n| workload | data | native peak RSS | native throughput |\n|---|---|---|---|\n";
    for &(w, mib, peak) in workloads {
        let t = find(points, w, Mode::Native, 100)
            .and_then(|p| p.throughput)
            .map(|t| format!("{} {}/s", si(t), w.unit()))
            .unwrap_or_else(|| "–".into());
        let _ = writeln!(s, "| {w} | {mib} MiB | {} MiB | {t} |", peak >> 20);
    }
    s
}

/// A table with a row per (workload, local %) and a column per mode; `n/a` where the
/// workload does not run in the mode.
fn table(
    s: &mut String,
    title: &str,
    workloads: &[(Workload, u64, u64)],
    pcts: &[u32],
    modes: &[Mode],
    cell: impl Fn(Workload, Mode, u32) -> String,
) {
    let _ = write!(s, "\n## {title}\n\n| workload | local |");
    for m in modes {
        let _ = write!(s, " {m} |");
    }
    let _ = writeln!(s, "\n|---|---|{}", "---|".repeat(modes.len()));
    for &(w, _, _) in workloads {
        for &pct in pcts {
            let _ = write!(s, "| {w} | {pct}% |");
            for &m in modes {
                let c = if w.supports(m) {
                    cell(w, m, pct)
                } else {
                    "n/a".into()
                };
                let _ = write!(s, " {c} |");
            }
            s.push('\n');
        }
    }
}

/// 1234567 -> "1.23 M"
fn si(v: f64) -> String {
    match v {
        v if v >= 1e9 => format!("{:.2} G", v / 1e9),
        v if v >= 1e6 => format!("{:.2} M", v / 1e6),
        v if v >= 1e3 => format!("{:.2} k", v / 1e3),
        v => format!("{v:.1}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(w: Workload, mode: Mode, pct: u32, rep: usize, ops: u64, secs: f64) -> RunRecord {
        RunRecord {
            workload: w,
            mode,
            local_pct: pct,
            rep,
            outcome: Outcome::Done(Measured {
                result: "r".into(),
                ops,
                secs,
                wall_s: secs,
                peak_rss: 1 << 20,
                faults: 10,
                bytes_moved: 4096,
                mem_used: 3 << 20,
                detail: Value::Null,
            }),
        }
    }

    fn oom(w: Workload, mode: Mode, pct: u32, rep: usize) -> RunRecord {
        RunRecord {
            workload: w,
            mode,
            local_pct: pct,
            rep,
            outcome: Outcome::OomKilled { wall_s: 1.0 },
        }
    }

    #[test]
    fn medians_are_normalized_to_native_and_failures_mark_their_point() {
        let w = Workload::Kvs;
        let runs = vec![
            done(w, Mode::Native, 100, 0, 1000, 1.0),
            done(w, Mode::Native, 100, 1, 1000, 2.0),
            done(w, Mode::Native, 100, 2, 1000, 0.5),
            done(w, Mode::Farmem, 50, 0, 1000, 2.0),
            done(w, Mode::Farmem, 50, 1, 1000, 4.0),
            done(w, Mode::Farmem, 50, 2, 1000, 8.0),
            done(w, Mode::SwapZram, 50, 0, 1000, 10.0),
            done(w, Mode::SwapFile, 50, 0, 1000, 20.0),
            oom(w, Mode::SwapFile, 50, 1),
        ];
        let pts = points(&runs);
        let native = find(&pts, w, Mode::Native, 50).unwrap();
        assert_eq!(native.throughput, Some(1000.0));
        assert_eq!(native.normalized, Some(1.0));
        let f = find(&pts, w, Mode::Farmem, 50).unwrap();
        assert_eq!(f.throughput, Some(250.0));
        assert_eq!(f.normalized, Some(0.25));
        assert_eq!(f.status, "ok");
        // One OOM kill among the repeats marks the point: no median of the survivors.
        let sf = find(&pts, w, Mode::SwapFile, 50).unwrap();
        assert_eq!((sf.status, sf.throughput), ("oom-killed", None));
        // farmem ÷ the better swap mode that ran: swap-zram, 100/s.
        assert_eq!(ratio(&pts, w, Mode::Farmem, 50), "2.50×");
        let md = markdown(
            "# t\n",
            &[(w, 16, 1 << 24)],
            &[Mode::Native, Mode::SwapZram, Mode::SwapFile, Mode::Farmem],
            &[50],
            &pts,
        );
        assert!(md.contains("| kvs | 50% | 0.100 | OOM | 0.250 |"), "{md}");
        assert!(md.contains("| kvs | 50% | 2.50× |"), "{md}");
    }

    #[test]
    fn swap_killed_in_some_runs_counts_by_the_runs_that_finished() {
        let w = Workload::Memcached;
        let runs = vec![
            done(w, Mode::Native, 100, 0, 100, 1.0),
            done(w, Mode::FarmemDefault, 25, 0, 100, 57.0),
            done(w, Mode::FarmemDefault, 25, 1, 100, 57.0),
            oom(w, Mode::SwapFile, 25, 0),
            done(w, Mode::SwapFile, 25, 1, 100, 49.0),
        ];
        let pts = points(&runs);
        let sf = find(&pts, w, Mode::SwapFile, 25).unwrap();
        assert_eq!(sf.status, "oom-killed");
        assert_eq!(sf.survivors.map(|(_, n)| n), Some(1));
        let r = ratio(&pts, w, Mode::FarmemDefault, 25);
        assert!(
            r.starts_with("0.86× (swap OOM-killed in 1 of 2 runs"),
            "{r}"
        );
    }

    #[test]
    fn swap_that_never_fits_makes_an_infinite_ratio() {
        let w = Workload::Psort;
        let runs = vec![
            done(w, Mode::Native, 100, 0, 100, 1.0),
            done(w, Mode::Farmem, 25, 0, 100, 4.0),
            oom(w, Mode::SwapZram, 25, 0),
        ];
        let pts = points(&runs);
        assert_eq!(ratio(&pts, w, Mode::Farmem, 25), "∞ (swap OOM)");
    }

    #[test]
    fn runs_csv_reads_back_what_it_wrote() {
        let dir = std::env::temp_dir().join(format!("farmem-runs-csv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("runs.csv");
        let w = Workload::Seqscan;
        let written = vec![
            done(w, Mode::Native, 100, 0, 1000, 0.25),
            done(w, Mode::FarmemTcp, 25, 2, 777, 3.5),
            oom(w, Mode::SwapZram, 25, 1),
            RunRecord {
                workload: Workload::Memcached,
                mode: Mode::SwapFile,
                local_pct: 10,
                rep: 0,
                outcome: Outcome::Failed("timed out".into()),
            },
        ];
        let mut csv = RunsCsv::create(&path).unwrap();
        for r in &written {
            csv.append(r).unwrap();
        }
        drop(csv);
        let read = read_runs_csv(&path).unwrap();
        assert_eq!(read.len(), written.len());
        for (a, b) in written.iter().zip(&read) {
            assert_eq!(
                (a.workload, a.mode, a.local_pct, a.rep, a.status()),
                (b.workload, b.mode, b.local_pct, b.rep, b.status())
            );
            assert_eq!(a.throughput(), b.throughput());
        }
        match (&written[1].outcome, &read[1].outcome) {
            (Outcome::Done(a), Outcome::Done(b)) => assert_eq!(
                (a.ops, a.peak_rss, a.faults, a.bytes_moved, a.mem_used),
                (b.ops, b.peak_rss, b.faults, b.bytes_moved, b.mem_used)
            ),
            o => panic!("{o:?}"),
        }

        // A line cut short at the end is left out; one in the middle is an error.
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, format!("{text}seqscan,farmem,50,0,o")).unwrap();
        assert_eq!(read_runs_csv(&path).unwrap().len(), written.len());
        std::fs::write(&path, format!("{text}seqscan,farmem,50,0,o\n")).unwrap();
        let e = format!("{:#}", read_runs_csv(&path).unwrap_err());
        assert!(e.contains("line 6"), "{e}");
        std::fs::write(&path, "workload,mode\n").unwrap();
        assert!(read_runs_csv(&path).is_err());
        // A runs.csv from before memory used was recorded is still read, memory unknown.
        std::fs::write(
            &path,
            format!(
                "{RUNS_HEADER_V1}\nseqscan,farmem,50,0,ok,10,2.000000,5.0,2.100,1048576,10,4096\n"
            ),
        )
        .unwrap();
        let old = read_runs_csv(&path).unwrap();
        let p = points(&old);
        assert_eq!((p.len(), p[0].mem_used, p[0].faults), (1, None, Some(10.0)));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
