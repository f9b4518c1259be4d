//! `farmem bench` (the default measurement): page-scan throughput of far-memory regions
//! against a native array in the same run, at several local-memory fractions, unhinted and
//! hinted, on one or several backends measured in turn; plus the cost of the hint fast path
//! (ns per call natively, instructions per call under callgrind).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use farmem_proto::size::parse_size;
use farmem_runtime::{BackendSpec, Config, Runtime, PAGE_SIZE};

use super::median;
use super::spawn::LocalServer;
use super::swap::{SwapBaseline, SwapKind};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Pattern {
    Seq,
    Rand,
    /// Every page, in [`STRIDE`] passes of one page in `STRIDE` each (0, 5, 10, ..., then
    /// 1, 6, 11, ...): strided runs for the fault predictor.
    Stride,
}

/// The step of the `stride` pattern, in pages.
const STRIDE: usize = 5;

/// The page orders of the patterns over `npages` pages.
struct Orders {
    seq: Vec<u32>,
    rand: Vec<u32>,
    stride: Vec<u32>,
}

impl Orders {
    fn new(npages: usize) -> Orders {
        Orders {
            seq: (0..npages as u32).collect(),
            rand: permutation(npages, 0x1234_5678),
            stride: (0..STRIDE)
                .flat_map(|s| (s..npages).step_by(STRIDE))
                .map(|p| p as u32)
                .collect(),
        }
    }

    fn of(&self, p: Pattern) -> &[u32] {
        match p {
            Pattern::Seq => &self.seq,
            Pattern::Rand => &self.rand,
            Pattern::Stride => &self.stride,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    /// Plain loads; misses arrive as page faults.
    Unhinted,
    /// `hint(p)` before each page (no read-ahead).
    Hint,
    /// `hint_ex(p, 8, FM_SEQ, 63, 0)` before each page.
    HintRa63,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SwapChoice {
    Zram,
    File,
}

/// The child process of a Linux-swap measurement: scan a plain array, print the rates.
#[derive(clap::Args)]
pub struct NativeArgs {
    #[arg(long)]
    size: String,
    #[arg(long, value_delimiter = ',', value_enum)]
    patterns: Vec<Pattern>,
    #[arg(long)]
    repeat: usize,
}

#[derive(clap::Args)]
pub struct Args {
    /// Region (and native array) size.
    #[arg(long, default_value = "1G")]
    size: String,
    /// Local memory as percentages of the region size.
    #[arg(long, value_delimiter = ',', default_value = "100,50,25,10")]
    local: Vec<f64>,
    /// Access patterns: one read per page, in order, in a random permutation, or strided.
    #[arg(long, value_delimiter = ',', value_enum, default_value = "seq,rand")]
    patterns: Vec<Pattern>,
    /// Access modes.
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "unhinted,hint,hint-ra63"
    )]
    modes: Vec<Mode>,
    /// Runs per point; the median is reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Far-memory backends, measured in turn at every point: local://, local+lz4://,
    /// tcp://[TENANT@]HOST:PORT (secret in FARMEM_TOKEN), or tcp://auto to start a farmem
    /// server on loopback for the run.
    #[arg(long, value_delimiter = ',', default_value = "local://")]
    backend: Vec<String>,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also measure Linux swap, the baseline a user would otherwise pick: the same scan of a
    /// plain array, unmodified, in a memory cgroup limited to the local size (plus 8 MiB for
    /// the process itself), swapping to zram or to a swap file (set up and removed here;
    /// needs root).
    #[arg(long, value_delimiter = ',', value_enum)]
    swap: Vec<SwapChoice>,
    /// Skip the hint fast-path measurement (needs cc; valgrind for instruction counts).
    #[arg(long)]
    no_hint_cost: bool,
    /// Also measure each backend with the fault predictor off (FARMEM_FAULT_READAHEAD=0),
    /// named BACKEND/nopf, to show what unhinted prefetching gains.
    #[arg(long)]
    no_prefetch_too: bool,
}

fn value(page: usize) -> u64 {
    (page as u64 ^ 0x9E37_79B9_7F4A_7C15).wrapping_mul(0xBF58_476D_1CE4_E5B9) | 1
}

fn permutation(n: usize, seed: u64) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n as u32).collect();
    let mut x = seed | 1;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

/// Read one word per page in `order`; returns (pages/s, checksum).
fn scan(base: *const u8, order: &[u32], mode: Option<Mode>) -> (f64, u64) {
    let t = Instant::now();
    let mut sum = 0u64;
    for &pg in order {
        // SAFETY: every page index in `order` is inside the mapping at `base`.
        let p = unsafe { base.add(pg as usize * PAGE_SIZE) } as *const u64;
        match mode {
            Some(Mode::Hint) => farmem_runtime::hint(p),
            Some(Mode::HintRa63) => farmem_runtime::hint_ex(p, 8, farmem_runtime::FM_SEQ, 63, 0),
            _ => {}
        }
        // SAFETY: as above; volatile so the loop cannot be optimized away.
        sum = sum.wrapping_add(unsafe { p.read_volatile() });
    }
    (order.len() as f64 / t.elapsed().as_secs_f64(), sum)
}

/// Plain loads in `order`, each timed: the fault path's latency as the program sees it
/// (fault, fetch, install, wake-up) for the pages that miss. Returns (pages/s, checksum,
/// per-access nanoseconds).
fn scan_timed(base: *const u8, order: &[u32]) -> (f64, u64, Vec<u64>) {
    let mut lat = Vec::with_capacity(order.len());
    let t = Instant::now();
    let mut sum = 0u64;
    for &pg in order {
        // SAFETY: every page index in `order` is inside the mapping at `base`.
        let p = unsafe { base.add(pg as usize * PAGE_SIZE) } as *const u64;
        let t0 = Instant::now();
        // SAFETY: as above; volatile so the load is neither removed nor moved.
        sum = sum.wrapping_add(unsafe { p.read_volatile() });
        lat.push(t0.elapsed().as_nanos() as u64);
    }
    (order.len() as f64 / t.elapsed().as_secs_f64(), sum, lat)
}

/// The `q` quantile (0..=1) of a sample, in place.
fn quantile(v: &mut [u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    *v.select_nth_unstable(i).1
}

struct Row {
    backend: String,
    /// What Linux swap did during the run (swap rows only).
    swap: Option<serde_json::Value>,
    local_pct: f64,
    pattern: Pattern,
    mode: Option<Mode>,
    pages_per_s: f64,
    ratio: f64,
    faults: u64,
    fetched: u64,
    /// Unhinted prefetch (accuracy, coverage) over the point's runs, when it predicted.
    prefetch: Option<(f64, f64)>,
    /// Unhinted random scans: per-access latency of the misses (p50, p99 ns), i.e. the
    /// fault path end to end.
    miss_latency: Option<(u64, u64)>,
}

/// The backends to measure; `tcp://auto` starts a server for the run.
fn backends(list: &[String]) -> Result<(Vec<BackendSpec>, Option<LocalServer>)> {
    let mut server = None;
    let mut specs = Vec::new();
    for b in list {
        if b.trim() == "tcp://auto" {
            if server.is_none() {
                server = Some(LocalServer::start(&[], &["--capacity", "64G"])?);
            }
            let srv = server.as_ref().expect("started");
            specs.push(BackendSpec::Tcp(srv.spec("bench")));
        } else {
            specs.push(BackendSpec::parse(b)?);
        }
    }
    if specs.is_empty() {
        bail!("--backend needs at least one backend");
    }
    Ok((specs, server))
}

fn spec_name(s: &BackendSpec) -> String {
    match s {
        BackendSpec::Local { lz4: false } => "local".into(),
        BackendSpec::Local { lz4: true } => "local+lz4".into(),
        BackendSpec::File { .. } => "file".into(),
        BackendSpec::Tiered { .. } => "tiered".into(),
        BackendSpec::Tcp(_) => "tcp".into(),
    }
}

pub fn run(a: Args) -> Result<()> {
    if a.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    let size = parse_size(&a.size).context("--size")? as usize;
    let npages = size / PAGE_SIZE;
    if npages < 1024 {
        bail!("--size must be at least 4M");
    }
    for &pct in &a.local {
        if !(pct > 0.0 && pct <= 100.0) {
            bail!("local percentage {pct} must be in (0, 100]");
        }
    }
    let (specs, server) = backends(&a.backend)?;
    if let Some(s) = &server {
        eprintln!("started farmem server at {} for tcp://auto", s.addr);
    }
    // Other settings (FARMEM_EVICT_BATCH, FARMEM_FAULT_SPIN_US, ...) come from the environment.
    let base_cfg = Config::from_env().context("FARMEM_* settings")?;
    let orders = Orders::new(npages);
    let expect = (0..npages).fold(0u64, |s, p| s.wrapping_add(value(p)));
    let order = |p: Pattern| orders.of(p);

    // The native array: plain anonymous memory, populated before timing.
    let native = farmem_sys::mem::map_anon(size, libc::PROT_READ | libc::PROT_WRITE)?;
    for p in 0..npages {
        // SAFETY: p < npages, inside the mapping.
        unsafe { (native.add(p * PAGE_SIZE) as *mut u64).write(value(p)) };
    }
    let mut native_rate = Vec::new();
    for &pat in &a.patterns {
        let runs: Vec<f64> = (0..a.repeat)
            .map(|_| {
                let (r, s) = scan(native, order(pat), None);
                assert_eq!(s, expect, "native checksum");
                r
            })
            .collect();
        native_rate.push((pat, median(runs)));
    }
    let native_of = |p: Pattern| native_rate.iter().find(|(q, _)| *q == p).unwrap().1;

    let mut rows = Vec::new();
    let total = a.local.len() * a.patterns.len() * a.modes.len() * specs.len() * a.repeat;
    let started = Instant::now();
    let mut done = 0usize;
    for &pct in &a.local {
        // The control thread keeps `free_pct` (1%) of the budget free and read-ahead needs a
        // little room in flight: size the budget so that `pct`% of the data can be resident.
        let free = base_cfg.free_pct / 100.0;
        let budget = (size as f64 * pct / 100.0 / (1.0 - free)) as u64 + (256 * PAGE_SIZE) as u64;
        // One runtime and region per backend, all filled before any is timed.
        let mut setups = Vec::new();
        let variants: Vec<(&BackendSpec, bool)> = specs
            .iter()
            .flat_map(|s| {
                let off = a.no_prefetch_too.then_some((s, false));
                std::iter::once((s, true)).chain(off)
            })
            .collect();
        for (spec, prefetch) in variants {
            let mut cfg = Config {
                local_mem: budget,
                backend: spec.clone(),
                ..base_cfg.clone()
            };
            let mut name = spec_name(spec);
            if !prefetch {
                cfg.fault_readahead = 0;
                name.push_str("/nopf");
            }
            let rt = Runtime::new(cfg)?;
            let region = rt.create_region(size)?;
            let base = region.as_mut_ptr();
            for chunk in (0..npages).step_by(64) {
                let n = 64.min(npages - chunk);
                // SAFETY: inside the region.
                let p = unsafe { base.add(chunk * PAGE_SIZE) };
                farmem_runtime::hint_ex(p, n * PAGE_SIZE, farmem_runtime::FM_WRITE, 0, 0);
                for i in 0..n {
                    // SAFETY: inside the region.
                    unsafe { (p.add(i * PAGE_SIZE) as *mut u64).write(value(chunk + i)) };
                }
            }
            setups.push((name, rt, region));
        }
        for &pat in &a.patterns {
            for &mode in &a.modes {
                // Repetitions go round the backends, so that a noisy moment hits all alike.
                let mut runs = vec![Vec::new(); setups.len()];
                // Unhinted random reads miss on most pages and no prefetch hides them: their
                // timings are the fault path's latency.
                let timed = pat == Pattern::Rand && mode == Mode::Unhinted;
                let mut lats = vec![Vec::new(); setups.len()];
                let before: Vec<_> = setups.iter().map(|(_, rt, _)| rt.stats()).collect();
                for _ in 0..a.repeat {
                    for (i, (name, _, region)) in setups.iter().enumerate() {
                        eprint!(
                            "\r[{done}/{total}] local {pct}% {pat:?} {mode:?} {name} ({:.0} s \
                             elapsed)      ",
                            started.elapsed().as_secs_f64()
                        );
                        let (r, s) = if timed {
                            let (r, s, l) = scan_timed(region.as_mut_ptr(), order(pat));
                            lats[i].extend(l);
                            (r, s)
                        } else {
                            scan(region.as_mut_ptr(), order(pat), Some(mode))
                        };
                        assert_eq!(
                            s, expect,
                            "far-memory checksum ({name} {pct}% {pat:?} {mode:?})"
                        );
                        runs[i].push(r);
                        done += 1;
                    }
                }
                for (i, (name, rt, _)) in setups.iter().enumerate() {
                    let after = rt.stats();
                    let m = median(runs[i].clone());
                    rows.push(Row {
                        backend: name.clone(),
                        swap: None,
                        local_pct: pct,
                        pattern: pat,
                        mode: Some(mode),
                        pages_per_s: m,
                        ratio: m / native_of(pat),
                        faults: (after.unhinted_faults - before[i].unhinted_faults)
                            / a.repeat as u64,
                        fetched: (after.pages_fetched - before[i].pages_fetched) / a.repeat as u64,
                        prefetch: prefetch_quality(&before[i], &after),
                        miss_latency: miss_latency(&mut lats[i]),
                    });
                }
            }
        }
    }
    eprintln!("\r{:70}", "");

    println!(
        "page scans over {} MiB, median of {} (pages/s; ratio to the native array)",
        size >> 20,
        a.repeat
    );
    for (p, r) in &native_rate {
        println!("  native {p:?}: {r:.0} pages/s");
    }
    println!(
        "{:>12} {:>6} {:>6} {:>10} {:>12} {:>8} {:>10} {:>10} {:>10} {:>12}",
        "backend",
        "local",
        "scan",
        "mode",
        "pages/s",
        "ratio",
        "faults",
        "fetched",
        "acc cov",
        "miss p50/p99"
    );
    print_rows(&rows);
    drop(server);
    for &kind in &a.swap {
        for &pct in &a.local {
            let swapped = swap_rows(&a, kind, size, pct, &native_of)?;
            print_rows(&swapped);
            rows.extend(swapped);
        }
    }

    let hint_cost = if a.no_hint_cost {
        None
    } else {
        match hint_cost() {
            Ok(h) => {
                println!(
                    "hint fast path (present page): {:.2} ns per loop iteration with the hint, \
                     {:.2} without ({:+.2} ns/call); {} instructions/call",
                    h.ns_with,
                    h.ns_without,
                    h.ns_with - h.ns_without,
                    h.instructions
                        .map(|i| format!("{i:.1}"))
                        .unwrap_or_else(|| "? (valgrind missing)".into())
                );
                Some(h)
            }
            Err(e) => {
                println!("hint fast path: not measured: {e:#}");
                None
            }
        }
    };

    if let Some(path) = &a.json {
        let j = serde_json::json!({
            "size_bytes": size,
            "backends": a.backend,
            "repeat": a.repeat,
            "native": native_rate.iter().map(|(p, r)| serde_json::json!({
                "pattern": format!("{p:?}").to_lowercase(), "pages_per_s": r })).collect::<Vec<_>>(),
            "points": rows.iter().map(|r| serde_json::json!({
                "backend": r.backend,
                "local_pct": r.local_pct,
                "pattern": format!("{:?}", r.pattern).to_lowercase(),
                "mode": r.mode.map(mode_name).unwrap_or("native"),
                "pages_per_s": r.pages_per_s,
                "ratio_to_native": r.ratio,
                "unhinted_faults": r.faults,
                "pages_fetched": r.fetched,
                "prefetch_accuracy": r.prefetch.map(|p| p.0),
                "prefetch_coverage": r.prefetch.map(|p| p.1),
                "miss_latency_p50_ns": r.miss_latency.map(|l| l.0),
                "miss_latency_p99_ns": r.miss_latency.map(|l| l.1),
                "linux_swap": r.swap,
            })).collect::<Vec<_>>(),
            "hint_fast_path": hint_cost.map(|h| serde_json::json!({
                "ns_per_iteration_with_hint": h.ns_with,
                "ns_per_iteration_without_hint": h.ns_without, "instructions_per_call": h.instructions })),
        });
        std::fs::write(path, serde_json::to_string_pretty(&j)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    // SAFETY: the native array is no longer used.
    unsafe { farmem_sys::mem::unmap(native, size) };
    Ok(())
}

/// p50 and p99 of the accesses that missed: those slower than any local access can be
/// (a fault takes microseconds; a hit on a resident page, including a TLB miss, well under
/// one).
fn miss_latency(lat: &mut [u64]) -> Option<(u64, u64)> {
    const MISS_NS: u64 = 1_500;
    let mut misses: Vec<u64> = lat.iter().copied().filter(|&n| n >= MISS_NS).collect();
    if misses.is_empty() {
        return None;
    }
    Some((quantile(&mut misses, 0.5), quantile(&mut misses, 0.99)))
}

/// Accuracy and coverage of unhinted prefetching between two snapshots (see
/// `StatsSnapshot::prefetch_accuracy`).
fn prefetch_quality(
    before: &farmem_runtime::StatsSnapshot,
    after: &farmem_runtime::StatsSnapshot,
) -> Option<(f64, f64)> {
    let used = after.fault_prefetch_used - before.fault_prefetch_used;
    let wasted = after.fault_prefetch_wasted - before.fault_prefetch_wasted;
    let faults = after.unhinted_faults - before.unhinted_faults;
    (used + wasted > 0).then(|| {
        (
            used as f64 / (used + wasted) as f64,
            used as f64 / (used + faults).max(1) as f64,
        )
    })
}

fn print_rows(rows: &[Row]) {
    for r in rows {
        let pf = r
            .prefetch
            .map(|(a, c)| format!("{:.0}% {:.0}%", a * 100.0, c * 100.0))
            .unwrap_or_else(|| "-".into());
        let lat = r
            .miss_latency
            .map(|(p50, p99)| format!("{:.1}/{:.0} µs", p50 as f64 / 1e3, p99 as f64 / 1e3))
            .unwrap_or_default();
        println!(
            "{:>12} {:>5}% {:>6} {:>10} {:>12.0} {:>8.3} {:>10} {:>10} {:>10} {:>12}",
            r.backend,
            r.local_pct,
            format!("{:?}", r.pattern).to_lowercase(),
            r.mode.map(mode_name).unwrap_or("native"),
            r.pages_per_s,
            r.ratio,
            r.faults,
            r.fetched,
            pf,
            lat
        );
    }
}

/// Scan a plain array in a child process under Linux swap (zram or a file).
fn swap_rows(
    a: &Args,
    kind: SwapChoice,
    size: usize,
    pct: f64,
    native_of: &dyn Fn(Pattern) -> f64,
) -> Result<Vec<Row>> {
    let limit = crate::limits::limit(size as u64, pct);
    let (swap_kind, name) = match kind {
        SwapChoice::Zram => (SwapKind::Zram, "swap-zram"),
        SwapChoice::File => (
            SwapKind::File(std::path::PathBuf::from(format!(
                "/var/tmp/farmem-bench-swap-{}",
                std::process::id()
            ))),
            "swap-file",
        ),
    };
    eprint!("\rlocal {pct}% {name}: setting up Linux swap ...                    ");
    let base = SwapBaseline::setup(swap_kind, 2 * size as u64 + (64 << 20), limit)?;
    eprint!("\rlocal {pct}% {name}: {} ...", base.describe());
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["bench", "native-scan", "--size", &a.size, "--repeat"])
        .arg(a.repeat.to_string())
        .arg("--patterns")
        .arg(
            a.patterns
                .iter()
                .map(|p| format!("{p:?}").to_lowercase())
                .collect::<Vec<_>>()
                .join(","),
        );
    let out = base.run(cmd)?;
    let stats = base.stats();
    base.close()?;
    eprintln!("\r{:100}", "");
    if !out.status.success() {
        bail!(
            "the scan under {name} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let j: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("output of the scan under {name}"))?;
    if !stats.swapped_out() {
        eprintln!(
            "warning: nothing was swapped out under {name} at {pct}% local: the limit did not \
             bind, and this row measures plain memory"
        );
    }
    let swapped_in = stats.pages_swapped_in.unwrap_or(0);
    let mut rows = Vec::new();
    for &pat in &a.patterns {
        let key = format!("{pat:?}").to_lowercase();
        let runs: Vec<f64> = j[&key]
            .as_array()
            .context("rates in the scan output")?
            .iter()
            .filter_map(|v| v.as_f64())
            .collect();
        let m = median(runs);
        rows.push(Row {
            backend: name.into(),
            swap: Some(stats.to_json()),
            local_pct: pct,
            pattern: pat,
            mode: None,
            pages_per_s: m,
            ratio: m / native_of(pat),
            faults: 0,
            fetched: swapped_in / (a.repeat * a.patterns.len()) as u64,
            prefetch: None,
            miss_latency: j[format!("{key}_miss_ns")]
                .as_array()
                .and_then(|l| Some((l.first()?.as_u64()?, l.get(1)?.as_u64()?))),
        });
    }
    Ok(rows)
}

/// The body of the child process: fill a plain array, scan it, print `{"seq": [rates...]}`.
pub fn native_scan(a: NativeArgs) -> Result<()> {
    let size = parse_size(&a.size)? as usize;
    let npages = size / PAGE_SIZE;
    let native = farmem_sys::mem::map_anon(size, libc::PROT_READ | libc::PROT_WRITE)?;
    for p in 0..npages {
        // SAFETY: p < npages, inside the mapping.
        unsafe { (native.add(p * PAGE_SIZE) as *mut u64).write(value(p)) };
    }
    let expect = (0..npages).fold(0u64, |s, p| s.wrapping_add(value(p)));
    let orders = Orders::new(npages);
    let mut out = serde_json::Map::new();
    for &pat in &a.patterns {
        let order = orders.of(pat);
        let mut runs = Vec::new();
        let mut lats = Vec::new();
        for _ in 0..a.repeat {
            let (r, s) = if pat == Pattern::Rand {
                let (r, s, l) = scan_timed(native, order);
                lats.extend(l);
                (r, s)
            } else {
                scan(native, order, None)
            };
            if s != expect {
                bail!("checksum mismatch scanning under Linux swap");
            }
            runs.push(serde_json::Value::from(r));
        }
        let key = format!("{pat:?}").to_lowercase();
        if let Some((p50, p99)) = miss_latency(&mut lats) {
            out.insert(format!("{key}_miss_ns"), vec![p50, p99].into());
        }
        out.insert(key, runs.into());
    }
    println!("{}", serde_json::Value::Object(out));
    Ok(())
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Unhinted => "unhinted",
        Mode::Hint => "hint",
        Mode::HintRa63 => "hint-ra63",
    }
}

struct HintCost {
    /// ns per loop iteration with and without the hint.
    ns_with: f64,
    ns_without: f64,
    instructions: Option<f64>,
}

/// Where the repository's files are (the binary is run from a checkout).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn hint_cost() -> Result<HintCost> {
    let root = repo_root();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("hint_cost.c");
    let exe = std::env::current_exe()?;
    let libdir = exe.parent().context("binary directory")?;
    if !libdir.join("libfarmem.so").exists() {
        bail!("libfarmem.so not found next to {}", exe.display());
    }
    let tmp = std::env::temp_dir().join(format!("farmem-hint-cost-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let build = |with: u32| -> Result<PathBuf> {
        let out = tmp.join(format!("hint_cost_{with}"));
        let st = Command::new("cc")
            .args(["-O2", "-fPIE", "-pie"])
            .arg(format!("-DWITH_HINT={with}"))
            .arg("-I")
            .arg(root.join("include"))
            .arg(&src)
            .arg("-L")
            .arg(libdir)
            .arg(format!("-Wl,-rpath,{}", libdir.display()))
            .args(["-lfarmem", "-o"])
            .arg(&out)
            .status()
            .context("running cc")?;
        if !st.success() {
            bail!("compiling {} failed", src.display());
        }
        Ok(out)
    };
    let on = build(1)?;
    let off = build(0)?;
    let n: u64 = 200_000_000;
    let time = |bin: &Path| -> Result<f64> {
        let mut v = Vec::new();
        for _ in 0..5 {
            let o = Command::new(bin)
                .args(["region", &n.to_string()])
                .env("FARMEM_LOCAL_MEM", "64M")
                .output()?;
            if !o.status.success() {
                bail!("{}: {}", bin.display(), String::from_utf8_lossy(&o.stderr));
            }
            let s = String::from_utf8_lossy(&o.stdout);
            v.push(s.split_whitespace().next().unwrap_or("0").parse::<f64>()?);
        }
        Ok(median(v))
    };
    let ns_with = time(&on)?;
    let ns_without = time(&off)?;
    let instr = |bin: &Path| -> Option<f64> {
        let calls = 1_000_000u64;
        let o = Command::new("valgrind")
            .args(["--tool=callgrind", "--callgrind-out-file=/dev/null"])
            .arg(bin)
            .args(["plain", &calls.to_string()])
            .output()
            .ok()?;
        let err = String::from_utf8_lossy(&o.stderr);
        let line = err.lines().find(|l| l.contains("Collected :"))?;
        let total: f64 = line.rsplit(':').next()?.trim().parse().ok()?;
        Some(total / calls as f64)
    };
    let instructions = match (instr(&on), instr(&off)) {
        (Some(a), Some(b)) => Some(a - b),
        _ => None,
    };
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(HintCost {
        ns_with,
        ns_without,
        instructions,
    })
}
