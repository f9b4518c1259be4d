//! `farmem bench kv`: a key-value service in the shape of the synthetic web front end of AIFM
//! (OSDI '20, Fig. 7) that Eden (§5.3.2) uses to show priority reclaim. One region holds a
//! hash table of small entries (key -> user id) and an array of user objects. A request
//! picks a request id from Zipf(s), looks up the keys derived from it (each in its own
//! pseudo-random bucket), combines their values into a user id, and reads and checksums that
//! user's object. The index is small per access but touched at every lookup; the objects
//! are large and touched once: an oblivious policy lets the objects push the index out, while
//! `priority` with the object hint's `ev_prio` evicts objects first and keeps the index local.
//!
//! The shape (the table's share, the object size, lookups per request) and the objects'
//! `ev_prio` can be swept (`--sweep`): priority hints must help on every shape, not only on
//! AIFM's.
//!
//! Every point (shape, policy, hint mode, local share) runs in a fresh runtime and region,
//! filled the same way, warmed up with the same requests and timed on the same requests;
//! points of one (shape, local share, repetition) run in alternation and the median of the
//! repetitions is reported.

mod workload;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use farmem_proto::size::parse_size;
use farmem_runtime::{BackendSpec, Config, PolicyKind, Runtime, StatsSnapshot, PAGE_SIZE};

use super::median;
use super::spawn::LocalServer;
use workload::{fill, serve, Layout, Load, Mode, Shape, Workload, BUCKET_ENTRIES};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Policy {
    /// Evict in the order pages arrived (Eden's default).
    Fifo,
    /// Clock over the use bits that hints and faults leave.
    SecondChance,
    /// Generations by recency epoch.
    Lru,
    /// Levels by the hints' `ev_prio`, highest evicted first; second chance inside a level.
    Priority,
}

impl Policy {
    fn kind(self) -> PolicyKind {
        match self {
            Policy::Fifo => PolicyKind::Fifo,
            Policy::SecondChance => PolicyKind::SecondChance,
            Policy::Lru => PolicyKind::Lru,
            Policy::Priority => PolicyKind::Priority,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Policy::Fifo => "fifo",
            Policy::SecondChance => "second-chance",
            Policy::Lru => "lru",
            Policy::Priority => "priority",
        }
    }
}

/// The grid of `--sweep` (issue 18's): tables of 10-40% of the footprint, 4-8 KiB objects,
/// `ev_prio` 1-7, 8-32 lookups, 25-50% local; objects hinted, the table never.
const SWEEP_TABLE_PCT: [f64; 3] = [10.0, 20.0, 40.0];
const SWEEP_OBJECT: [&str; 2] = ["4K", "8K"];
const SWEEP_LOOKUPS: [usize; 2] = [8, 32];
const SWEEP_EV_PRIO: [u8; 2] = [1, 7];
const SWEEP_LOAD: [Load; 2] = [Load::ObjectsFirst, Load::Interleaved];
const SWEEP_LOCAL: [f64; 3] = [50.0, 40.0, 25.0];

#[derive(clap::Args)]
pub struct Args {
    /// Total footprint: hash table plus objects, one region.
    #[arg(long, default_value = "384M")]
    size: String,
    /// Shares of the footprint taken by the hash table, percent (AIFM's table is ~38% of its
    /// 26 GB) [default: 35; with --sweep: 10,20,40].
    #[arg(long, value_delimiter = ',')]
    table_pct: Option<Vec<f64>>,
    /// Bytes of one object (a multiple of 8, 64 B to 1 MiB) [default: 8K, AIFM's
    /// `kArrayEntrySize`; with --sweep: 4K,8K].
    #[arg(long, value_delimiter = ',')]
    object_size: Option<Vec<String>>,
    /// Hash-table lookups per request [default: 32, AIFM's `kNumKeysPerRequest`; with
    /// --sweep: 8,32].
    #[arg(long, value_delimiter = ',')]
    lookups: Option<Vec<usize>>,
    /// The loader's orders: objects-first (then the index) or interleaved (the index grows
    /// with the data) [default: objects-first; with --sweep: both].
    #[arg(long, value_delimiter = ',', value_enum)]
    load: Option<Vec<Load>>,
    /// Eviction priorities (1..=7) of the object hints in the prio and objprio modes
    /// [default: 7; with --sweep: 1,7].
    #[arg(long, value_delimiter = ',')]
    ev_prio: Option<Vec<u8>>,
    /// Local memory as percentages of the footprint [default: 100,40,25; with --sweep:
    /// 50,40,25].
    #[arg(long, value_delimiter = ',')]
    local: Option<Vec<f64>>,
    /// Reclaim policies [default: all four; with --sweep: fifo,priority].
    #[arg(long, value_delimiter = ',', value_enum)]
    policies: Option<Vec<Policy>>,
    /// Hint modes [default: prio,hint,unhinted; with --sweep: objprio].
    #[arg(long, value_delimiter = ',', value_enum)]
    modes: Option<Vec<Mode>>,
    /// Sweep the service's shapes: tables of 10, 20 and 40% of the footprint, objects of 4
    /// and 8 KiB, 8 and 32 lookups, both load orders, ev_prio 1 and 7, at 50, 40 and 25%
    /// local, fifo against priority with only the objects hinted (objprio). Any list given explicitly replaces its part of
    /// the grid. Prints the worst and the geometric mean of priority over fifo per local
    /// share.
    #[arg(long)]
    sweep: bool,
    /// Timed requests per point [default: 30000; with --sweep: 50000].
    #[arg(long)]
    requests: Option<usize>,
    /// Most untimed requests before the timed ones, so that each policy reaches its steady
    /// state: the warm-up stops earlier, once it served at least --requests and the policy
    /// evicted as many pages as local memory holds (it turned local memory over once)
    /// [default: as many as --requests; with --sweep: eight times as many, as a hand that
    /// evicts a few pages per hundred requests needs that long].
    #[arg(long)]
    warmup: Option<usize>,
    /// Zipf exponent of the request distribution (AIFM and Eden: 0.8).
    #[arg(long, default_value_t = 0.8)]
    zipf: f64,
    /// Seed of the request sequence and of the values.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Runs per point; the median is reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Far-memory backend: local://, local+lz4://, tcp://[TENANT@]HOST:PORT (secret in
    /// FARMEM_TOKEN), or tcp://auto to start a farmem server on loopback for the run.
    #[arg(long, default_value = "local://")]
    backend: String,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// The lists of a run, defaults and `--sweep` applied, checked.
struct Grid {
    table_pct: Vec<f64>,
    objects: Vec<usize>,
    lookups: Vec<usize>,
    loads: Vec<Load>,
    ev_prio: Vec<u8>,
    local: Vec<f64>,
    policies: Vec<Policy>,
    modes: Vec<Mode>,
    requests: usize,
    warmup: usize,
}

impl Grid {
    fn of(a: &Args) -> Result<Grid> {
        let s = a.sweep;
        fn choose<T: Clone>(
            s: bool,
            given: &Option<Vec<T>>,
            plain: Vec<T>,
            sweep: Vec<T>,
        ) -> Vec<T> {
            match given {
                Some(v) => v.clone(),
                None if s => sweep,
                None => plain,
            }
        }
        let requests = a.requests.unwrap_or(if s { 50_000 } else { 30_000 });
        if requests == 0 {
            bail!("--requests must be at least 1");
        }
        let objects = choose(
            s,
            &a.object_size,
            vec!["8K".to_string()],
            SWEEP_OBJECT.iter().map(|s| s.to_string()).collect(),
        );
        let g = Grid {
            table_pct: choose(s, &a.table_pct, vec![35.0], SWEEP_TABLE_PCT.to_vec()),
            objects: objects
                .iter()
                .map(|o| {
                    let n = parse_size(o).with_context(|| format!("--object-size {o}"))?;
                    if n % 8 != 0 || !(64..=1 << 20).contains(&n) {
                        bail!("--object-size {o}: must be a multiple of 8 from 64 B to 1 MiB");
                    }
                    Ok(n as usize)
                })
                .collect::<Result<_>>()?,
            lookups: choose(s, &a.lookups, vec![32], SWEEP_LOOKUPS.to_vec()),
            loads: choose(s, &a.load, vec![Load::ObjectsFirst], SWEEP_LOAD.to_vec()),
            ev_prio: choose(s, &a.ev_prio, vec![7], SWEEP_EV_PRIO.to_vec()),
            local: choose(s, &a.local, vec![100.0, 40.0, 25.0], SWEEP_LOCAL.to_vec()),
            policies: choose(
                s,
                &a.policies,
                vec![
                    Policy::Fifo,
                    Policy::SecondChance,
                    Policy::Lru,
                    Policy::Priority,
                ],
                vec![Policy::Fifo, Policy::Priority],
            ),
            modes: choose(
                s,
                &a.modes,
                vec![Mode::Prio, Mode::Hint, Mode::Unhinted],
                vec![Mode::Objprio],
            ),
            requests,
            warmup: a.warmup.unwrap_or(if s { 8 * requests } else { requests }),
        };
        for &t in &g.table_pct {
            if !(t > 0.0 && t < 100.0) {
                bail!("--table-pct {t} must be in (0, 100)");
            }
        }
        for &pct in &g.local {
            if !(pct > 0.0 && pct <= 100.0) {
                bail!("local percentage {pct} must be in (0, 100]");
            }
        }
        if let Some(&l) = g.lookups.iter().find(|&&l| l == 0 || l > 1024) {
            bail!("--lookups {l} must be from 1 to 1024");
        }
        if let Some(&p) = g.ev_prio.iter().find(|&&p| p == 0 || p > 7) {
            bail!("--ev-prio {p} must be from 1 to 7 (0 is the hint mode)");
        }
        let lists = [
            g.table_pct.len(),
            g.objects.len(),
            g.lookups.len(),
            g.loads.len(),
            g.ev_prio.len(),
            g.local.len(),
            g.policies.len(),
            g.modes.len(),
        ];
        if lists.contains(&0) {
            bail!("every list (--table-pct, --object-size, --lookups, --ev-prio, --local, --policies, --modes) needs at least one value");
        }
        Ok(g)
    }

    fn shapes(&self) -> Vec<Shape> {
        let mut v = Vec::new();
        for &table_pct in &self.table_pct {
            for &object in &self.objects {
                for &lookups in &self.lookups {
                    for &load in &self.loads {
                        v.push(Shape {
                            table_pct,
                            object,
                            lookups,
                            load,
                        });
                    }
                }
            }
        }
        v
    }

    /// (mode, ev_prio) pairs: modes without a priority run once per shape.
    fn variants(&self) -> Vec<(Mode, u8)> {
        let mut v = Vec::new();
        for &m in &self.modes {
            if m.uses_prio() {
                v.extend(self.ev_prio.iter().map(|&p| (m, p)));
            } else {
                v.push((m, 0));
            }
        }
        v
    }
}

/// What one timed pass measured.
struct Run {
    reqs_per_s: f64,
    delta: StatsSnapshot,
    /// Warm-up requests served.
    warmed: usize,
}

/// Warm-up requests between two looks at the eviction count.
const WARMUP_STEP: usize = 10_000;

fn delta(a: &StatsSnapshot, b: &StatsSnapshot) -> StatsSnapshot {
    StatsSnapshot {
        unhinted_faults: b.unhinted_faults - a.unhinted_faults,
        hint_calls: b.hint_calls - a.hint_calls,
        hint_misses: b.hint_misses - a.hint_misses,
        pages_fetched: b.pages_fetched - a.pages_fetched,
        pages_evicted: b.pages_evicted - a.pages_evicted,
        ..StatsSnapshot::default()
    }
}

/// One point: a fresh runtime and region, filled, warmed up, timed.
fn run_point(w: &Workload, cfg: Config, mode: Mode, ev_prio: u8, timed: usize) -> Result<Run> {
    let local_pages = cfg.local_mem / PAGE_SIZE as u64;
    let rt = Runtime::new(cfg).context("starting a farmem runtime")?;
    let region = rt
        .create_region(w.layout.region_bytes)
        .context("creating the region")?;
    let base = region.as_mut_ptr();
    // SAFETY: the region has `region_bytes`, is page-aligned, lives until the end of this
    // function and is used by this thread only.
    unsafe { fill(w, base, mode, ev_prio) };
    // Warm up in steps, until local memory has been turned over once (or the warm-up
    // requests run out), but never for fewer requests than are timed.
    let filled = rt.stats().pages_evicted;
    let mut warmed = 0;
    for chunk in w.reqs[..w.warmup].chunks(WARMUP_STEP) {
        // SAFETY: as above; filled just now.
        unsafe { serve(w, base, chunk, mode, ev_prio) }.context("during the warm-up")?;
        warmed += chunk.len();
        if warmed >= timed && rt.stats().pages_evicted - filled >= local_pages {
            break;
        }
    }
    let before = rt.stats();
    let t = Instant::now();
    // SAFETY: as above.
    unsafe { serve(w, base, &w.reqs[w.warmup..], mode, ev_prio) }?;
    let secs = t.elapsed().as_secs_f64();
    let after = rt.stats();
    Ok(Run {
        reqs_per_s: timed as f64 / secs,
        delta: delta(&before, &after),
        warmed,
    })
}

struct Row {
    shape: Shape,
    policy: Policy,
    mode: Mode,
    /// The objects' `ev_prio` (0 in modes without one).
    ev_prio: u8,
    local_pct: f64,
    reqs_per_s: f64,
    runs: Vec<f64>,
    /// Requests/s over fifo's at the same shape, mode, ev_prio and local share, in this run.
    ratio_to_fifo: Option<f64>,
    faults_per_req: f64,
    /// Hints that left the inline fast path: misses, object hints (two pages) and hints on
    /// pages a policy's hand had marked idle (the use bit is set again out of line).
    slow_hints_per_req: f64,
    hint_misses_per_req: f64,
    fetched_per_req: f64,
    evicted_per_req: f64,
    /// Median warm-up requests served.
    warmed: f64,
}

/// The budget that lets `pct`% of `bytes` be resident.
fn budget_for(bytes: usize, pct: f64, cfg: &Config) -> u64 {
    // The control thread keeps `free_pct` of the budget free and fetches need a little room
    // in flight (as `farmem bench` sizes it).
    let free = cfg.free_pct / 100.0;
    (bytes as f64 * pct / 100.0 / (1.0 - free)) as u64 + (256 * PAGE_SIZE) as u64
}

/// Run every point of one shape; rows in (local, variant, policy) order.
fn run_shape(
    w: &Workload,
    g: &Grid,
    a: &Args,
    base_cfg: &Config,
    backend: &BackendSpec,
    progress: &mut Progress,
) -> Result<Vec<Row>> {
    let l = &w.layout;
    let npol = g.policies.len();
    let variants = g.variants();
    let mut rows = Vec::new();
    for &pct in &g.local {
        let budget = budget_for(l.region_bytes, pct, base_cfg);
        // runs[variant][policy]
        let mut runs: Vec<Vec<Vec<Run>>> = (0..variants.len())
            .map(|_| (0..npol).map(|_| Vec::new()).collect())
            .collect();
        for rep in 0..a.repeat {
            for (vi, &(mode, ev_prio)) in variants.iter().enumerate() {
                // Rotate the order of the policies between repetitions, so that none always
                // runs first (or right after the same neighbour).
                for k in 0..npol {
                    let pi = (k + rep) % npol;
                    let policy = g.policies[pi];
                    progress.show(&format!(
                        "{} local {pct}% run {}/{} {} {}{}",
                        l.shape,
                        rep + 1,
                        a.repeat,
                        policy.name(),
                        mode.name(),
                        if mode.uses_prio() {
                            format!(" ev_prio {ev_prio}")
                        } else {
                            String::new()
                        }
                    ));
                    let cfg = Config {
                        local_mem: budget,
                        backend: backend.clone(),
                        policy: policy.kind(),
                        ..base_cfg.clone()
                    };
                    let r = run_point(w, cfg, mode, ev_prio, g.requests).with_context(|| {
                        format!(
                            "{} {} at {pct}% local ({})",
                            policy.name(),
                            mode.name(),
                            l.shape
                        )
                    })?;
                    runs[vi][pi].push(r);
                    progress.done += 1;
                }
            }
        }
        let per_req = |v: &[Run], f: fn(&StatsSnapshot) -> u64| {
            median(
                v.iter()
                    .map(|r| f(&r.delta) as f64 / g.requests as f64)
                    .collect(),
            )
        };
        for (vi, &(mode, ev_prio)) in variants.iter().enumerate() {
            let fifo = g
                .policies
                .iter()
                .position(|&p| p == Policy::Fifo)
                .map(|fi| median(runs[vi][fi].iter().map(|r| r.reqs_per_s).collect()));
            for (pi, &policy) in g.policies.iter().enumerate() {
                let v = &runs[vi][pi];
                let rates: Vec<f64> = v.iter().map(|r| r.reqs_per_s).collect();
                let m = median(rates.clone());
                rows.push(Row {
                    shape: l.shape,
                    policy,
                    mode,
                    ev_prio,
                    local_pct: pct,
                    reqs_per_s: m,
                    runs: rates,
                    ratio_to_fifo: fifo.map(|f| m / f),
                    faults_per_req: per_req(v, |s| s.unhinted_faults),
                    slow_hints_per_req: per_req(v, |s| s.hint_calls),
                    hint_misses_per_req: per_req(v, |s| s.hint_misses),
                    fetched_per_req: per_req(v, |s| s.pages_fetched),
                    evicted_per_req: per_req(v, |s| s.pages_evicted),
                    warmed: median(v.iter().map(|r| r.warmed as f64).collect()),
                });
            }
        }
    }
    Ok(rows)
}

/// The progress line on stderr.
struct Progress {
    done: usize,
    total: usize,
    started: Instant,
}

impl Progress {
    fn show(&self, what: &str) {
        eprint!(
            "\r[{}/{}] {what} ({:.0} s elapsed)      ",
            self.done,
            self.total,
            self.started.elapsed().as_secs_f64()
        );
    }
}

pub fn run(a: Args) -> Result<()> {
    if a.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    if !(a.zipf >= 0.0 && a.zipf.is_finite()) {
        bail!("--zipf {} must be a non-negative number", a.zipf);
    }
    let g = Grid::of(&a)?;
    let size = parse_size(&a.size).context("--size")? as usize;
    // Every shape must fit before anything runs.
    let layouts = g
        .shapes()
        .into_iter()
        .map(|s| Layout::new(size, s))
        .collect::<Result<Vec<_>>>()?;
    let (warmup, requests) = (g.warmup, g.requests);

    let server = if a.backend.trim() == "tcp://auto" {
        let s = LocalServer::start(&[], &["--capacity", "64G"])?;
        eprintln!("started farmem server at {} for tcp://auto", s.addr);
        Some(s)
    } else {
        None
    };
    let backend = match &server {
        Some(s) => BackendSpec::Tcp(s.spec("bench")),
        None => BackendSpec::parse(&a.backend).context("--backend")?,
    };
    // Other settings (FARMEM_EVICT_BATCH, FARMEM_FAULT_READAHEAD, ...) come from the
    // environment; the policy and the budget are set per point.
    let base_cfg = Config::from_env().context("FARMEM_* settings")?;

    let mut progress = Progress {
        done: 0,
        total: layouts.len() * g.local.len() * a.repeat * g.variants().len() * g.policies.len(),
        started: Instant::now(),
    };
    let mut rows = Vec::new();
    for layout in layouts {
        let t = Instant::now();
        let w = Workload::new(layout, a.zipf, a.seed, warmup, requests);
        let l = &w.layout;
        eprintln!(
            "\rkey-value service over {} MiB: hash table {} MiB ({:.0}%, {} keys in {} buckets \
             of {BUCKET_ENTRIES}), {} objects of {} bytes ({} MiB); {} lookups + 1 object per \
             request, {} load, Zipf({}) over {} request ids; up to {warmup} warm-up + {} timed \
             requests, median of {} (built in {:.1} s)",
            l.region_bytes >> 20,
            l.table_bytes >> 20,
            l.table_bytes as f64 * 100.0 / l.region_bytes as f64,
            l.nkeys,
            l.nbuckets,
            l.nobjects,
            l.shape.object,
            (l.nobjects * l.shape.object) >> 20,
            l.shape.lookups,
            l.shape.load.name(),
            a.zipf,
            l.nreqs,
            requests,
            a.repeat,
            t.elapsed().as_secs_f64()
        );
        rows.extend(run_shape(&w, &g, &a, &base_cfg, &backend, &mut progress)?);
    }
    eprintln!("\r{:110}", "");
    drop(server);

    print_rows(&rows);
    let summary = summarize(&rows, &g);
    if let Some(path) = &a.json {
        let j = serde_json::json!({
            "footprint_bytes": size,
            "entry_bytes": 16,
            "zipf": a.zipf,
            "seed": a.seed,
            "warmup_requests_at_most": warmup,
            "timed_requests": requests,
            "repeat": a.repeat,
            "backend": a.backend,
            "points": rows.iter().map(|r| serde_json::json!({
                "table_pct": r.shape.table_pct,
                "object_bytes": r.shape.object,
                "lookups_per_request": r.shape.lookups,
                "load": r.shape.load.name(),
                "policy": r.policy.name(),
                "mode": r.mode.name(),
                "ev_prio": r.ev_prio,
                "local_pct": r.local_pct,
                "requests_per_s": r.reqs_per_s,
                "requests_per_s_runs": r.runs,
                "ratio_to_fifo": r.ratio_to_fifo,
                "unhinted_faults_per_request": r.faults_per_req,
                "slow_hints_per_request": r.slow_hints_per_req,
                "hint_misses_per_request": r.hint_misses_per_req,
                "pages_fetched_per_request": r.fetched_per_req,
                "pages_evicted_per_request": r.evicted_per_req,
                "warmup_requests_served": r.warmed,
            })).collect::<Vec<_>>(),
            "summary": summary,
        });
        std::fs::write(path, serde_json::to_string_pretty(&j)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn print_rows(rows: &[Row]) {
    println!(
        "{:>6} {:>7} {:>7} {:>13} {:>14} {:>9} {:>4} {:>6} {:>11} {:>6} {:>8} {:>8} {:>8} {:>9} {:>7}",
        "table",
        "object",
        "lookups",
        "load",
        "policy",
        "mode",
        "prio",
        "local",
        "requests/s",
        "/fifo",
        "faults/r",
        "hslow/r",
        "hmiss/r",
        "fetched/r",
        "warm-up"
    );
    for r in rows {
        println!(
            "{:>5}% {:>7} {:>7} {:>13} {:>14} {:>9} {:>4} {:>5}% {:>11.0} {:>6} {:>8.2} {:>8.2} \
             {:>8.2} {:>9.2} {:>6.0}K",
            r.shape.table_pct,
            r.shape.object,
            r.shape.lookups,
            r.shape.load.name(),
            r.policy.name(),
            r.mode.name(),
            if r.mode.uses_prio() {
                r.ev_prio.to_string()
            } else {
                "-".into()
            },
            r.local_pct,
            r.reqs_per_s,
            r.ratio_to_fifo
                .map(|x| format!("{x:.2}"))
                .unwrap_or_else(|| "-".into()),
            r.faults_per_req,
            r.slow_hints_per_req,
            r.hint_misses_per_req,
            r.fetched_per_req,
            r.warmed / 1000.0
        );
    }
}

/// The headlines, printed and returned for the JSON: per shape and local share,
/// priority+prio against fifo+hint (Eden's comparison); per mode and local share, the worst
/// and the geometric mean of priority over fifo across the shapes and priorities.
fn summarize(rows: &[Row], g: &Grid) -> serde_json::Value {
    let mut eden = Vec::new();
    for r in rows
        .iter()
        .filter(|r| r.policy == Policy::Priority && r.mode == Mode::Prio)
    {
        let fh = rows.iter().find(|f| {
            f.shape == r.shape
                && f.local_pct == r.local_pct
                && f.policy == Policy::Fifo
                && f.mode == Mode::Hint
        });
        if let Some(fh) = fh {
            let x = r.reqs_per_s / fh.reqs_per_s;
            println!(
                "{}, local {}%: priority+prio (ev_prio {}) {:.0} requests/s vs fifo+hint \
                 {:.0}: {x:.2}x",
                r.shape, r.local_pct, r.ev_prio, r.reqs_per_s, fh.reqs_per_s
            );
            eden.push(serde_json::json!({
                "table_pct": r.shape.table_pct,
                "object_bytes": r.shape.object,
                "lookups_per_request": r.shape.lookups,
                "load": r.shape.load.name(),
                "ev_prio": r.ev_prio,
                "local_pct": r.local_pct,
                "priority_prio_requests_per_s": r.reqs_per_s,
                "fifo_hint_requests_per_s": fh.reqs_per_s,
                "priority_prio_vs_fifo_hint": x,
            }));
        }
    }
    let mut sweep = Vec::new();
    for &mode in &g.modes {
        for &pct in &g.local {
            let ratios: Vec<(f64, &Row)> = rows
                .iter()
                .filter(|r| r.policy == Policy::Priority && r.mode == mode && r.local_pct == pct)
                .filter_map(|r| r.ratio_to_fifo.map(|x| (x, r)))
                .collect();
            if ratios.is_empty() {
                continue;
            }
            let geo = (ratios.iter().map(|(x, _)| x.ln()).sum::<f64>() / ratios.len() as f64).exp();
            let (worst, at) = ratios
                .iter()
                .min_by(|a, b| a.0.total_cmp(&b.0))
                .copied()
                .expect("not empty");
            println!(
                "{} at {pct}% local, priority over fifo across {} points: geometric mean \
                 {geo:.2}x, worst {worst:.2}x ({}, ev_prio {})",
                mode.name(),
                ratios.len(),
                at.shape,
                at.ev_prio
            );
            sweep.push(serde_json::json!({
                "mode": mode.name(),
                "local_pct": pct,
                "points": ratios.len(),
                "priority_vs_fifo_geomean": geo,
                "priority_vs_fifo_worst": worst,
            }));
        }
    }
    serde_json::json!({ "priority_prio_vs_fifo_hint": eden, "priority_vs_fifo": sweep })
}
