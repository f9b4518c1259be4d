//! The trace report: fault sites by share, the sites that cover 95% of faults, the access
//! pattern at each site and the hint it suggests, flame graphs, folded stacks and JSON.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use farmem_runtime::fault_log::{FaultKind, FaultRecord};

use super::symbolize::{Frame, Symbolizer};
use super::{Maps, TracedFault};

/// Share of faults the "sites that cover" count is computed for (Eden's 95%).
const COVER: f64 = 0.95;

/// A source location faults are attributed to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Site {
    function: String,
    /// `file:line`, or `module+0xoffset` without debug information.
    place: String,
}

impl Site {
    fn of(f: &Frame) -> Site {
        let function = f.function.clone().unwrap_or_else(|| "??".into());
        let place = match (&f.file, f.line) {
            (Some(file), Some(line)) => format!("{}:{line}", short_path(file)),
            (Some(file), None) => short_path(file).to_string(),
            _ => format!("{}+{:#x}", f.module, f.offset),
        };
        Site { function, place }
    }

    fn label(&self) -> String {
        format!("{} ({})", self.function, self.place)
    }
}

/// The last two components of a path (enough to recognize a file, short enough to read).
fn short_path(p: &str) -> &str {
    let mut cut = p.len();
    for _ in 0..2 {
        match p[..cut].rfind('/') {
            Some(i) => cut = i,
            None => return p,
        }
    }
    &p[cut + 1..]
}

/// Frames of the language runtime and system libraries: a fault there is charged to the
/// first caller in the program's own code (Eden does the same), e.g. a `memcpy` to the line
/// that copies.
fn is_runtime_frame(f: &Frame) -> bool {
    const LIBS: [&str; 9] = [
        "libc.so",
        "libc-",
        "ld-linux",
        "libstdc++",
        "libm.so",
        "libgcc_s",
        "libpthread",
        "libfarmem",
        "libmimalloc",
    ];
    const PREFIXES: [&str; 6] = [
        "std::",
        "__gnu_cxx::",
        "core::",
        "alloc::",
        "__memcpy",
        "__memset",
    ];
    LIBS.iter().any(|l| f.module.contains(l))
        || f.file
            .as_deref()
            .is_some_and(|p| p.contains("/include/c++/") || p.contains("/bits/"))
        || f.function
            .as_deref()
            .is_some_and(|n| PREFIXES.iter().any(|p| n.starts_with(p)))
}

/// How a site walks memory, from the pages it faulted on (per thread, in time order).
#[derive(Clone, Debug, PartialEq)]
pub enum Pattern {
    /// Forward (or backward) steps of at most a few read-ahead windows, mostly.
    Sequential { backward: bool, mean_run: f64 },
    /// One step size, not ±1 page, for most faults.
    Strided { pages: i64 },
    /// No pattern. `reuse`: share of its pages that faulted more than once.
    Random { reuse: f64 },
    /// Too few faults to tell.
    Unknown,
}

impl Pattern {
    /// From the steps between the faults of one site, seen one in `rate` (so a scan that
    /// faults on every page shows steps of about `rate` pages).
    fn of(steps: &[i64], reuse: f64, rate: u64) -> Pattern {
        let rate = rate.max(1) as i64;
        if steps.len() < 3 {
            return Pattern::Unknown;
        }
        let n = steps.len() as f64;
        // Faults of a sequential scan are a read-ahead window or so apart (the runtime reads
        // ahead of unhinted faults), so "sequential" allows steps up to a few windows.
        let near = |s: &i64, sign: i64| s.signum() == sign && s.abs() <= 1024;
        let fwd = steps.iter().filter(|s| near(s, 1)).count() as f64 / n;
        let bwd = steps.iter().filter(|s| near(s, -1)).count() as f64 / n;
        let mut counts: HashMap<i64, usize> = HashMap::new();
        for &s in steps {
            *counts.entry(s).or_default() += 1;
        }
        let (mode, mode_n) = counts
            .into_iter()
            .max_by_key(|&(s, c)| (c, -s.abs()))
            .unwrap_or((0, 0));
        let stride = mode / rate;
        if mode_n as f64 / n >= 0.6 && mode % rate == 0 && stride.abs() > 1 && stride.abs() <= 64 {
            return Pattern::Strided { pages: stride };
        }
        if fwd >= 0.7 || bwd >= 0.7 {
            let backward = bwd > fwd;
            let sign = if backward { -1 } else { 1 };
            let mut runs = 0usize;
            let mut in_run = false;
            for s in steps {
                let cont = near(s, sign);
                if cont && !in_run {
                    runs += 1;
                }
                in_run = cont;
            }
            let mean_run =
                (steps.iter().filter(|s| near(s, sign)).count() + runs) as f64 / runs.max(1) as f64;
            return Pattern::Sequential { backward, mean_run };
        }
        Pattern::Random { reuse }
    }

    fn describe(&self) -> String {
        match self {
            Pattern::Sequential { backward, mean_run } => format!(
                "sequential {} (runs of {:.0} faults)",
                if *backward { "backward" } else { "forward" },
                mean_run
            ),
            Pattern::Strided { pages } => format!("strided ({pages} pages)"),
            Pattern::Random { reuse } => {
                format!("random ({:.0}% of its pages fault again)", reuse * 100.0)
            }
            Pattern::Unknown => "too few faults to tell".into(),
        }
    }
}

/// The hint a site's pattern calls for, as a line of C.
fn suggest(p: &Pattern, zero_fill_share: f64, write_share: f64) -> String {
    if zero_fill_share >= 0.5 {
        return match p {
            Pattern::Sequential { backward: false, .. } => {
                "fm_hint_ex(p, len, FM_WRITE | FM_SEQ, 63, 0);  /* new memory written in order: fetch-free, read ahead */".into()
            }
            _ => "fm_hint_ex(p, len, FM_WRITE, 0, 0);  /* first touch of new memory (or farmem run --prefault) */".into(),
        };
    }
    let write = write_share >= 0.5;
    let flags = |seq: bool| match (write, seq) {
        (true, true) => "FM_WRITE | FM_SEQ",
        (true, false) => "FM_WRITE",
        (false, true) => "FM_SEQ",
        (false, false) => "0",
    };
    match p {
        Pattern::Sequential { backward, .. } => {
            let r = if *backward { -63 } else { 63 };
            format!("fm_hint_ex(p, len, {}, {r}, 0);  /* a scan: read ahead of it */", flags(true))
        }
        Pattern::Strided { pages } => format!(
            "fm_hint_ex(p + {} * PAGE, len, {}, 0, 0);  /* stride of {pages} pages: hint a few elements ahead */",
            pages * 4,
            flags(false)
        ),
        Pattern::Random { reuse } if *reuse < 0.1 => format!(
            "fm_hint_ex(p, len, {}, 0, 7);  /* random, touched once: fetch on this thread, evict first */",
            flags(false)
        ),
        Pattern::Random { .. } => format!(
            "fm_hint_ex(p, len, {}, 0, 0);  /* random: no read-ahead; fetching on this thread is cheaper than a fault */",
            flags(false)
        ),
        Pattern::Unknown => "(too few faults to suggest a hint)".into(),
    }
}

#[derive(Default)]
struct SiteStats {
    samples: u64,
    reads: u64,
    writes: u64,
    kinds: [u64; 4],
    /// (thread, time, page) of its faults, for the pattern.
    faults: Vec<(u32, u64, u64)>,
}

/// One ranked site in the report.
pub struct Row {
    site: Site,
    stats: SiteStats,
    share: f64,
    cumulative: f64,
    pattern: Pattern,
    suggestion: String,
}

pub struct Report {
    pub text: String,
    json: serde_json::Value,
    folded: [(&'static str, String); 2],
}

impl Report {
    pub fn build(
        faults: &[TracedFault],
        records: &[FaultRecord],
        maps: &Maps,
        sample_rate: u64,
        lost: u64,
        top: usize,
    ) -> Report {
        let mut sym = Symbolizer::new();
        let mut cache: HashMap<(u32, u64, bool), Vec<Frame>> = HashMap::new();
        let mut inner: HashMap<Site, SiteStats> = HashMap::new();
        let mut own: HashMap<Site, SiteStats> = HashMap::new();
        let mut folded: [HashMap<String, u64>; 2] = [HashMap::new(), HashMap::new()];
        for f in faults {
            let frames: Vec<Frame> = f
                .pcs
                .iter()
                .enumerate()
                .flat_map(|(i, &pc)| {
                    cache
                        .entry((f.pid, pc, i > 0))
                        .or_insert_with(|| sym.symbolize(maps.of(f.pid), pc, i > 0))
                        .clone()
                })
                .collect();
            let Some(first) = frames.first() else {
                continue;
            };
            let mine = frames
                .iter()
                .find(|fr| !is_runtime_frame(fr))
                .unwrap_or(first);
            for (table, site) in [(&mut inner, Site::of(first)), (&mut own, Site::of(mine))] {
                let s = table.entry(site).or_default();
                s.samples += 1;
                if f.write {
                    s.writes += 1;
                } else {
                    s.reads += 1;
                }
                s.kinds[f.kind as usize] += 1;
                s.faults.push((f.tid, f.time_ns, f.page));
            }
            let stack: Vec<String> = frames
                .iter()
                .rev()
                .map(|fr| Site::of(fr).function)
                .collect();
            let which = usize::from(f.kind == FaultKind::ZeroFill);
            *folded[which].entry(stack.join(";")).or_default() += 1;
        }
        let rank = |table: HashMap<Site, SiteStats>| -> Vec<Row> {
            let total: u64 = table.values().map(|s| s.samples).sum();
            let mut rows: Vec<(Site, SiteStats)> = table.into_iter().collect();
            rows.sort_by(|a, b| {
                b.1.samples
                    .cmp(&a.1.samples)
                    .then_with(|| a.0.place.cmp(&b.0.place))
            });
            let mut cum = 0u64;
            rows.into_iter()
                .map(|(site, mut stats)| {
                    cum += stats.samples;
                    stats.faults.sort_unstable();
                    let steps: Vec<i64> = stats
                        .faults
                        .windows(2)
                        .filter(|w| w[0].0 == w[1].0)
                        .map(|w| (w[1].2 as i64 - w[0].2 as i64) / farmem_runtime::PAGE_SIZE as i64)
                        .filter(|&d| d != 0)
                        .collect();
                    // Reuse at this site: of the pages it faulted on, how many it faulted on
                    // again (an evicted page it came back to).
                    let mut pages: Vec<u64> = stats.faults.iter().map(|f| f.2).collect();
                    pages.sort_unstable();
                    let distinct = pages.chunk_by(|a, b| a == b).count();
                    let again = pages
                        .chunk_by(|a, b| a == b)
                        .filter(|g| g.len() > 1)
                        .count();
                    let reuse = again as f64 / distinct.max(1) as f64;
                    let pattern = Pattern::of(&steps, reuse, sample_rate);
                    let n = stats.samples.max(1) as f64;
                    let suggestion = suggest(
                        &pattern,
                        stats.kinds[FaultKind::ZeroFill as usize] as f64 / n,
                        stats.writes as f64 / n,
                    );
                    Row {
                        share: stats.samples as f64 / total.max(1) as f64,
                        cumulative: cum as f64 / total.max(1) as f64,
                        site,
                        stats,
                        pattern,
                        suggestion,
                    }
                })
                .collect()
        };
        let inner = rank(inner);
        let own = rank(own);
        let cover = |rows: &[Row]| {
            rows.iter()
                .position(|r| r.cumulative >= COVER - 1e-9)
                .map_or(rows.len(), |i| i + 1)
        };
        let (n_inner, n_own) = (cover(&inner), cover(&own));

        let mut kinds = [0u64; 4];
        for r in records {
            kinds[r.kind as usize] += 1;
        }
        let mut text = String::new();
        let _ = writeln!(
            text,
            "far-memory faults: {} ({} fetch, {} zero-fill, {} write-protect, {} already resolved); {} sampled (one in {sample_rate}) and attributed",
            records.len(),
            kinds[1],
            kinds[0],
            kinds[2],
            kinds[3],
            faults.len()
        );
        if lost > 0 {
            let _ = writeln!(
                text,
                "warning: {lost} samples lost (the program faulted faster than they were read): \
                 the fastest bursts of faults are under-counted; --sample-rate 10 keeps up"
            );
        }
        let _ = writeln!(
            text,
            "{} site(s) cover {:.0}% of the faults at the faulting line; {} in the program's own code",
            n_inner,
            COVER * 100.0,
            n_own
        );
        for (title, rows) in [
            ("at the faulting line", &inner),
            (
                "in the program's own code (first caller outside libc, the C++ library and farmem)",
                &own,
            ),
        ] {
            let _ = writeln!(text, "\ntop fault sites {title}:");
            let _ = writeln!(
                text,
                "  {:>6} {:>6} {:>7} {:>7}  site",
                "share", "cum", "w/r", "zero"
            );
            for r in rows.iter().take(top) {
                let n = r.stats.samples.max(1) as f64;
                let _ = writeln!(
                    text,
                    "  {:>5.1}% {:>5.1}% {:>3.0}/{:<3.0} {:>6.0}%  {}",
                    r.share * 100.0,
                    r.cumulative * 100.0,
                    r.stats.writes as f64 / n * 100.0,
                    r.stats.reads as f64 / n * 100.0,
                    r.stats.kinds[FaultKind::ZeroFill as usize] as f64 / n * 100.0,
                    r.site.label()
                );
                let _ = writeln!(text, "{:>32}pattern: {}", "", r.pattern.describe());
                let _ = writeln!(text, "{:>32}hint:    {}", "", r.suggestion);
            }
            if rows.len() > top {
                let _ = writeln!(
                    text,
                    "  ... {} more site(s) in trace.json",
                    rows.len() - top
                );
            }
        }

        let rows_json = |rows: &[Row]| -> serde_json::Value {
            rows.iter()
                .map(|r| {
                    serde_json::json!({
                        "function": r.site.function,
                        "place": r.site.place,
                        "samples": r.stats.samples,
                        "share": r.share,
                        "cumulative": r.cumulative,
                        "reads": r.stats.reads,
                        "writes": r.stats.writes,
                        "zero_fill": r.stats.kinds[FaultKind::ZeroFill as usize],
                        "fetch": r.stats.kinds[FaultKind::Fetch as usize],
                        "write_protect": r.stats.kinds[FaultKind::WriteProtect as usize],
                        "pattern": r.pattern.describe(),
                        "hint": r.suggestion,
                    })
                })
                .collect()
        };
        let json = serde_json::json!({
            "far_faults": records.len(),
            "by_kind": {"zero_fill": kinds[0], "fetch": kinds[1], "write_protect": kinds[2], "resolved": kinds[3]},
            "sample_rate": sample_rate,
            "sampled_far_faults": faults.len(),
            "samples_lost": lost,
            "cover_share": COVER,
            "sites_covering": {"innermost": n_inner, "own_code": n_own},
            "sites_innermost": rows_json(&inner),
            "sites_own_code": rows_json(&own),
        });
        let fold = |m: &HashMap<String, u64>| {
            let mut v: Vec<_> = m.iter().collect();
            v.sort();
            v.into_iter()
                .map(|(k, n)| format!("{k} {n}\n"))
                .collect::<String>()
        };
        Report {
            text,
            json,
            folded: [("fetch", fold(&folded[0])), ("zero-fill", fold(&folded[1]))],
        }
    }

    /// report.txt, trace.json, and per kind a folded-stacks file and a flame graph.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let put = |name: &str, data: &[u8]| {
            let p = dir.join(name);
            std::fs::write(&p, data).with_context(|| format!("writing {}", p.display()))
        };
        put("report.txt", self.text.as_bytes())?;
        put(
            "trace.json",
            serde_json::to_string_pretty(&self.json)?.as_bytes(),
        )?;
        for (kind, folded) in &self.folded {
            put(&format!("{kind}.folded"), folded.as_bytes())?;
            put(
                &format!("{kind}.svg"),
                super::flame::svg(kind, folded).as_bytes(),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_from_fault_steps() {
        // A scan faulting once per read-ahead window.
        let seq: Vec<i64> = vec![256; 20];
        assert!(matches!(
            Pattern::of(&seq, 0.0, 1),
            Pattern::Sequential {
                backward: false,
                ..
            }
        ));
        let back: Vec<i64> = vec![-1; 20];
        assert!(matches!(
            Pattern::of(&back, 0.0, 1),
            Pattern::Sequential { backward: true, .. }
        ));
        let strided: Vec<i64> = vec![5; 20];
        assert_eq!(Pattern::of(&strided, 0.0, 1), Pattern::Strided { pages: 5 });
        let mut x = 12345i64;
        let random: Vec<i64> = (0..50)
            .map(|_| {
                x = (x * 1103515245 + 12345) % 2147483648;
                x % 20000 - 10000
            })
            .collect();
        assert!(matches!(
            Pattern::of(&random, 0.5, 1),
            Pattern::Random { .. }
        ));
        assert_eq!(Pattern::of(&[1, 2], 0.0, 1), Pattern::Unknown);
        // Seen one fault in 10: a page-by-page scan steps 10 pages, a stride of 4 steps 40.
        let sampled_scan: Vec<i64> = vec![10; 20];
        assert!(matches!(
            Pattern::of(&sampled_scan, 0.0, 10),
            Pattern::Sequential { .. }
        ));
        let sampled_stride: Vec<i64> = vec![40; 20];
        assert_eq!(
            Pattern::of(&sampled_stride, 0.0, 10),
            Pattern::Strided { pages: 4 }
        );
    }

    #[test]
    fn suggestions_read_ahead_only_for_scans() {
        let seq = Pattern::Sequential {
            backward: false,
            mean_run: 10.0,
        };
        assert!(suggest(&seq, 0.0, 0.0).contains("FM_SEQ, 63"));
        let rnd = Pattern::Random { reuse: 0.5 };
        assert!(!suggest(&rnd, 0.0, 0.0).contains("FM_SEQ"));
        assert!(suggest(&Pattern::Random { reuse: 0.0 }, 0.0, 0.0).contains(", 7)"));
        assert!(suggest(&seq, 0.9, 0.9).contains("FM_WRITE | FM_SEQ"));
    }

    #[test]
    fn short_paths_keep_the_last_two_components() {
        assert_eq!(short_path("/a/b/c/d.c"), "c/d.c");
        assert_eq!(short_path("d.c"), "d.c");
        assert_eq!(short_path("c/d.c"), "c/d.c");
    }
}
