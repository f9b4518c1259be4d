//! `farmem bench kv`: a key-value service in the shape of the synthetic web front end of AIFM
//! (OSDI '20, Fig. 7) that Eden (§5.3.2) uses to show priority reclaim. One region holds a
//! hash table of small entries (key -> user id) and an array of 8 KiB user objects. A request
//! picks a request id from Zipf(s), looks up the 32 keys derived from it (each in its own
//! pseudo-random bucket), combines their values into a user id, and reads and checksums that
//! user's object. The index is small per access but touched 32 times per request; the objects
//! are large and touched once: an oblivious policy lets the objects push the index out, while
//! `priority` with the object hint's `ev_prio` evicts objects first and keeps the index local.
//!
//! Every point (policy, hint mode, local share) runs in a fresh runtime and region, filled the
//! same way, warmed up with the same requests and timed on the same requests; points of one
//! (local share, repetition) run in alternation and the median of the repetitions is reported.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use farmem_proto::size::parse_size;
use farmem_runtime::{
    BackendSpec, Config, PolicyKind, Runtime, StatsSnapshot, FM_WRITE, PAGE_SIZE,
};

use super::median;
use super::spawn::LocalServer;

/// Bytes of one hash-table entry: an 8-byte key, a 4-byte value (the user id part), 4 bytes
/// of padding (AIFM's entries are a 12-byte key and a 4-byte value).
const ENTRY: usize = 16;
/// Entries per bucket: a bucket is one 64-byte cache line, so it never straddles a page.
const BUCKET_ENTRIES: usize = 4;
const BUCKET: usize = ENTRY * BUCKET_ENTRIES;
/// Share of the table's entries that hold a key: high enough to be a real table, low enough
/// that almost every lookup ends in its first bucket.
const LOAD: f64 = 0.75;
/// Hash-table lookups per request (AIFM's `kNumKeysPerRequest`).
const LOOKUPS: usize = 32;
/// Bytes of one user object (AIFM's `kArrayEntrySize`): two pages.
const OBJECT: usize = 8192;
const OBJECT_WORDS: usize = OBJECT / 8;
/// The eviction priority of object pages in `prio` mode (the highest level: evicted first).
const EV_PRIO: u8 = 7;
/// Marks an empty entry (keys are below the number of keys).
const EMPTY: u64 = u64::MAX;

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

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    /// `hint(bucket)` before each bucket, `hint_ex(object, 8192, 0, 0, 7)` before the object:
    /// Eden's priority reclaim hint (objects are evicted first).
    Prio,
    /// The same two hints with eviction priority 0 for everything (Eden "NP").
    Hint,
    /// Plain loads; misses arrive as page faults.
    Unhinted,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Prio => "prio",
            Mode::Hint => "hint",
            Mode::Unhinted => "unhinted",
        }
    }

    /// `None`: no hints; else the `ev_prio` of the object hint.
    fn object_prio(self) -> Option<u8> {
        match self {
            Mode::Prio => Some(EV_PRIO),
            Mode::Hint => Some(0),
            Mode::Unhinted => None,
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// Total footprint: hash table plus objects, one region.
    #[arg(long, default_value = "384M")]
    size: String,
    /// Share of the footprint taken by the hash table, percent (AIFM's table is ~38% of its
    /// 26 GB).
    #[arg(long, default_value_t = 35.0)]
    table_pct: f64,
    /// Local memory as percentages of the footprint.
    #[arg(long, value_delimiter = ',', default_value = "100,40,25")]
    local: Vec<f64>,
    /// Reclaim policies.
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "fifo,second-chance,lru,priority"
    )]
    policies: Vec<Policy>,
    /// Hint modes.
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "prio,hint,unhinted"
    )]
    modes: Vec<Mode>,
    /// Timed requests per point.
    #[arg(long, default_value_t = 30_000)]
    requests: usize,
    /// Untimed requests before the timed ones, so that each policy reaches its steady state
    /// (default: as many as --requests).
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

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The user-id part stored under `key`.
fn value_of(key: u64, seed: u64) -> u32 {
    (splitmix(key ^ seed.rotate_left(32)) >> 32) as u32
}

/// Word `j` of object `id`: distinct per object and per position, so a page of another
/// object, a stale page or a zeroed page changes the checksum.
fn object_word(id: usize, j: usize) -> u64 {
    splitmix(((id as u64) << 10 | j as u64) ^ 0x0B1E_C7DA_7A00_0000)
}

fn checksum(words: &[u64]) -> u64 {
    words.iter().fold(0u64, |s, &w| s.wrapping_add(w))
}

/// Where everything is in the region.
struct Layout {
    nbuckets: usize,
    table_bytes: usize,
    nkeys: usize,
    /// Distinct request ids: each owns `LOOKUPS` consecutive keys.
    nreqs: usize,
    nobjects: usize,
    region_bytes: usize,
}

impl Layout {
    fn new(size: usize, table_pct: f64) -> Result<Layout> {
        let table_bytes = (size as f64 * table_pct / 100.0) as usize / PAGE_SIZE * PAGE_SIZE;
        let nbuckets = table_bytes / BUCKET;
        let nreqs = (nbuckets as f64 * BUCKET_ENTRIES as f64 * LOAD) as usize / LOOKUPS;
        let nobjects = (size - table_bytes) / OBJECT;
        if nreqs < 64 || nobjects < 64 {
            bail!(
                "--size of {} KiB with --table-pct {table_pct} leaves {nreqs} request ids and \
                 {nobjects} objects: make it larger (at least 1M)",
                size >> 10
            );
        }
        if u32::try_from(nobjects).is_err() || u32::try_from(nreqs).is_err() {
            bail!("--size is too large");
        }
        Ok(Layout {
            nbuckets,
            table_bytes,
            nkeys: nreqs * LOOKUPS,
            nreqs,
            nobjects,
            region_bytes: table_bytes + nobjects * OBJECT,
        })
    }

    /// The first bucket of `key`'s probe sequence.
    #[inline(always)]
    fn bucket_of(&self, key: u64) -> usize {
        ((splitmix(key) as u128 * self.nbuckets as u128) >> 64) as usize
    }
}

/// Everything shared by the points of a run: the layout, the table as it is written into
/// every region, the objects' checksums and the request sequence.
struct Workload {
    layout: Layout,
    /// The hash table's bytes, built once in ordinary memory and copied into each region
    /// (building it in place would measure random writes into far memory instead).
    table: Vec<[u64; 2]>,
    /// Expected checksum of each object.
    sums: Vec<u64>,
    /// (request id, the object its lookups must lead to): warm-up requests, then timed ones.
    reqs: Vec<(u32, u32)>,
    warmup: usize,
}

impl Workload {
    fn new(layout: Layout, zipf: f64, seed: u64, warmup: usize, timed: usize) -> Workload {
        let l = &layout;
        // Open addressing over buckets with linear probing: a key goes into the first bucket
        // of its probe sequence with a free entry.
        let mut table = vec![[EMPTY, 0u64]; l.nbuckets * BUCKET_ENTRIES];
        for key in 0..l.nkeys as u64 {
            let mut b = l.bucket_of(key);
            'probe: loop {
                for e in &mut table[b * BUCKET_ENTRIES..(b + 1) * BUCKET_ENTRIES] {
                    if e[0] == EMPTY {
                        *e = [key, value_of(key, seed) as u64];
                        break 'probe;
                    }
                }
                b = (b + 1) % l.nbuckets;
            }
        }
        let sums = (0..l.nobjects)
            .map(|id| (0..OBJECT_WORDS).fold(0u64, |s, j| s.wrapping_add(object_word(id, j))))
            .collect();
        // Zipf(s) over request ids by inverse CDF: rank k (0 the most popular) has weight
        // 1 / (k + 1)^s. As in AIFM, the rank is the request id; its keys and its object are
        // spread over the table and the array by hashing, so popularity has no address order.
        let mut cdf = Vec::with_capacity(l.nreqs);
        let mut total = 0.0f64;
        for k in 0..l.nreqs {
            total += 1.0 / ((k + 1) as f64).powf(zipf);
            cdf.push(total);
        }
        let mut x = seed;
        let reqs = (0..warmup + timed)
            .map(|_| {
                x = x.wrapping_add(1);
                let u = (splitmix(x) >> 11) as f64 / (1u64 << 53) as f64 * total;
                let r = cdf.partition_point(|&c| c <= u).min(l.nreqs - 1);
                let uid = (0..LOOKUPS as u64).fold(0u32, |s, i| {
                    s.wrapping_add(value_of(r as u64 * LOOKUPS as u64 + i, seed))
                });
                (r as u32, (uid as usize % l.nobjects) as u32)
            })
            .collect();
        Workload {
            layout,
            table,
            sums,
            reqs,
            warmup,
        }
    }
}

/// Write the table and the objects into a fresh region, page runs at a time with write hints
/// (as a loader would). In `prio` mode the objects are written with their eviction priority
/// too: the program knows what its objects are from the start.
///
/// # Safety
/// `base` must point to `w.layout.region_bytes` writable bytes, 8-byte aligned, that nothing
/// else uses meanwhile (a far-memory region, or ordinary memory in tests).
unsafe fn fill(w: &Workload, base: *mut u8, mode: Mode) {
    let l = &w.layout;
    const CHUNK: usize = 64 * PAGE_SIZE;
    // Objects first, the index last: a service builds its index once the data is loaded, so
    // every policy starts with the index local and the warm-up decides what stays.
    let obj_base = l.table_bytes;
    let prio = mode.object_prio().unwrap_or(0);
    let mut words = vec![0u64; CHUNK / 8];
    for start in (0..l.nobjects * OBJECT).step_by(CHUNK) {
        let len = CHUNK.min(l.nobjects * OBJECT - start);
        for (i, wd) in words[..len / 8].iter_mut().enumerate() {
            let at = start / 8 + i;
            *wd = object_word(at / OBJECT_WORDS, at % OBJECT_WORDS);
        }
        // SAFETY: `obj_base + start + len` is within the region of `region_bytes`.
        let p = unsafe { base.add(obj_base + start) };
        farmem_runtime::hint_ex(p, len, FM_WRITE, 0, prio);
        // SAFETY: as above; `words` holds at least `len` bytes and is not in the region.
        unsafe { std::ptr::copy_nonoverlapping(words.as_ptr() as *const u8, p, len) };
    }
    let src = w.table.as_ptr() as *const u8;
    for start in (0..l.table_bytes).step_by(CHUNK) {
        let len = CHUNK.min(l.table_bytes - start);
        // SAFETY: the table occupies the first `table_bytes` of the region; the image has
        // exactly `table_bytes` bytes (nbuckets * BUCKET).
        let (from, to) = unsafe { (src.add(start), base.add(start)) };
        farmem_runtime::hint_ex(to, len, FM_WRITE, 0, 0);
        // SAFETY: as above; ordinary memory and the region do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(from, to, len) };
    }
}

/// Serve `reqs`: 32 lookups, then the object, verified. Returns an error naming the request
/// when a key is missing or an object reads back wrong.
///
/// # Safety
/// `base` must point to `w.layout.region_bytes` readable bytes, 8-byte aligned, filled by
/// [`fill`] and not written meanwhile.
unsafe fn serve(w: &Workload, base: *const u8, reqs: &[(u32, u32)], mode: Mode) -> Result<()> {
    let l = &w.layout;
    let obj_prio = mode.object_prio();
    for (n, &(r, expect_obj)) in reqs.iter().enumerate() {
        let mut uid = 0u32;
        for i in 0..LOOKUPS as u64 {
            let key = r as u64 * LOOKUPS as u64 + i;
            let mut b = l.bucket_of(key);
            let mut probes = 0;
            let value = 'probe: loop {
                // SAFETY: b < nbuckets, so the bucket is inside the table at the start of the
                // region; the region stays mapped while `base` is used.
                let bucket = unsafe { base.add(b * BUCKET) } as *const [u64; 2];
                if obj_prio.is_some() {
                    farmem_runtime::hint(bucket);
                }
                for e in 0..BUCKET_ENTRIES {
                    // SAFETY: entry e < BUCKET_ENTRIES of an in-bounds bucket, 16-byte aligned
                    // (the region is page-aligned). Volatile: the loads are the workload.
                    let [k, v] = unsafe { bucket.add(e).read_volatile() };
                    if k == key {
                        break 'probe v as u32;
                    }
                    if k == EMPTY {
                        bail!("request {n}: key {key} not found in the hash table (bucket {b})");
                    }
                }
                b = (b + 1) % l.nbuckets;
                probes += 1;
                if probes > l.nbuckets {
                    bail!("request {n}: key {key} not found (the table has no empty entry)");
                }
            };
            uid = uid.wrapping_add(value);
        }
        let obj = uid as usize % l.nobjects;
        if obj != expect_obj as usize {
            bail!(
                "request {n}: the hash table led to object {obj}, expected {expect_obj} (a \
                 table page read back wrong)"
            );
        }
        // SAFETY: obj < nobjects: the object lies inside the region.
        let p = unsafe { base.add(l.table_bytes + obj * OBJECT) };
        if let Some(prio) = obj_prio {
            farmem_runtime::hint_ex(p, OBJECT, 0, 0, prio);
        }
        // SAFETY: the object's 8 KiB are inside the region, 8-byte aligned, and nothing
        // writes them while this request reads them (the runtime only moves whole pages
        // behind the program's back, preserving their contents).
        let words = unsafe { std::slice::from_raw_parts(p as *const u64, OBJECT_WORDS) };
        let sum = checksum(std::hint::black_box(words));
        if sum != w.sums[obj] {
            bail!(
                "request {n}: object {obj} read back wrong (checksum {sum:#018x}, expected \
                 {:#018x})",
                w.sums[obj]
            );
        }
    }
    Ok(())
}

/// What one timed pass measured.
struct Run {
    reqs_per_s: f64,
    delta: StatsSnapshot,
}

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
fn run_point(w: &Workload, cfg: Config, mode: Mode) -> Result<Run> {
    let rt = Runtime::new(cfg).context("starting a farmem runtime")?;
    let region = rt
        .create_region(w.layout.region_bytes)
        .context("creating the region")?;
    let base = region.as_mut_ptr();
    // SAFETY: the region has `region_bytes`, is page-aligned, lives until the end of this
    // function and is used by this thread only.
    unsafe { fill(w, base, mode) };
    // SAFETY: as above; filled just now.
    unsafe { serve(w, base, &w.reqs[..w.warmup], mode) }.context("during the warm-up")?;
    let before = rt.stats();
    let t = Instant::now();
    // SAFETY: as above.
    unsafe { serve(w, base, &w.reqs[w.warmup..], mode) }?;
    let secs = t.elapsed().as_secs_f64();
    let after = rt.stats();
    Ok(Run {
        reqs_per_s: (w.reqs.len() - w.warmup) as f64 / secs,
        delta: delta(&before, &after),
    })
}

struct Row {
    policy: Policy,
    mode: Mode,
    local_pct: f64,
    reqs_per_s: f64,
    runs: Vec<f64>,
    /// Requests/s over fifo's with the same mode and local share, in this run.
    ratio_to_fifo: Option<f64>,
    faults_per_req: f64,
    /// Hints that left the inline fast path: misses, object hints (two pages) and hints on
    /// pages a policy's hand had marked idle (the use bit is set again out of line).
    slow_hints_per_req: f64,
    hint_misses_per_req: f64,
    fetched_per_req: f64,
    evicted_per_req: f64,
}

pub fn run(a: Args) -> Result<()> {
    if a.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    if a.requests == 0 {
        bail!("--requests must be at least 1");
    }
    if !(a.table_pct > 0.0 && a.table_pct < 100.0) {
        bail!("--table-pct {} must be in (0, 100)", a.table_pct);
    }
    if !(a.zipf >= 0.0 && a.zipf.is_finite()) {
        bail!("--zipf {} must be a non-negative number", a.zipf);
    }
    for &pct in &a.local {
        if !(pct > 0.0 && pct <= 100.0) {
            bail!("local percentage {pct} must be in (0, 100]");
        }
    }
    if a.policies.is_empty() || a.modes.is_empty() || a.local.is_empty() {
        bail!("--policies, --modes and --local need at least one value each");
    }
    let size = parse_size(&a.size).context("--size")? as usize;
    let layout = Layout::new(size, a.table_pct)?;
    let warmup = a.warmup.unwrap_or(a.requests);

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

    eprint!("building the hash table and the request sequence ...");
    let t = Instant::now();
    let w = Workload::new(layout, a.zipf, a.seed, warmup, a.requests);
    eprintln!(" {:.1} s", t.elapsed().as_secs_f64());
    let l = &w.layout;
    println!(
        "key-value service over {} MiB: hash table {} MiB ({:.0}%, {} keys in {} buckets of \
         {BUCKET_ENTRIES}), {} objects of 8 KiB ({} MiB); {LOOKUPS} lookups + 1 object per \
         request, Zipf({}) over {} request ids; {warmup} warm-up + {} timed requests, median \
         of {}",
        l.region_bytes >> 20,
        l.table_bytes >> 20,
        l.table_bytes as f64 * 100.0 / l.region_bytes as f64,
        l.nkeys,
        l.nbuckets,
        l.nobjects,
        (l.nobjects * OBJECT) >> 20,
        a.zipf,
        l.nreqs,
        a.requests,
        a.repeat
    );

    let npol = a.policies.len();
    let total = a.local.len() * a.repeat * a.modes.len() * npol;
    let started = Instant::now();
    let mut done = 0usize;
    let mut rows = Vec::new();
    for &pct in &a.local {
        // The control thread keeps `free_pct` of the budget free and fetches need a little
        // room in flight: size the budget so that `pct`% of the data can be resident (as
        // `farmem bench` does).
        let free = base_cfg.free_pct / 100.0;
        let budget =
            (l.region_bytes as f64 * pct / 100.0 / (1.0 - free)) as u64 + (256 * PAGE_SIZE) as u64;
        // runs[mode][policy]
        let mut runs: Vec<Vec<Vec<Run>>> = (0..a.modes.len())
            .map(|_| (0..npol).map(|_| Vec::new()).collect())
            .collect();
        for rep in 0..a.repeat {
            for (mi, &mode) in a.modes.iter().enumerate() {
                // Rotate the order of the policies between repetitions, so that none always
                // runs first (or right after the same neighbour).
                for k in 0..npol {
                    let pi = (k + rep) % npol;
                    let policy = a.policies[pi];
                    eprint!(
                        "\r[{done}/{total}] local {pct}% run {}/{} {} {} ({:.0} s elapsed)      ",
                        rep + 1,
                        a.repeat,
                        policy.name(),
                        mode.name(),
                        started.elapsed().as_secs_f64()
                    );
                    let cfg = Config {
                        local_mem: budget,
                        backend: backend.clone(),
                        policy: policy.kind(),
                        ..base_cfg.clone()
                    };
                    let r = run_point(&w, cfg, mode).with_context(|| {
                        format!("{} {} at {pct}% local", policy.name(), mode.name())
                    })?;
                    runs[mi][pi].push(r);
                    done += 1;
                }
            }
        }
        let per_req = |v: &[Run], f: fn(&StatsSnapshot) -> u64| {
            median(
                v.iter()
                    .map(|r| f(&r.delta) as f64 / a.requests as f64)
                    .collect(),
            )
        };
        for (mi, &mode) in a.modes.iter().enumerate() {
            let fifo = a
                .policies
                .iter()
                .position(|&p| p == Policy::Fifo)
                .map(|fi| median(runs[mi][fi].iter().map(|r| r.reqs_per_s).collect()));
            for (pi, &policy) in a.policies.iter().enumerate() {
                let v = &runs[mi][pi];
                let rates: Vec<f64> = v.iter().map(|r| r.reqs_per_s).collect();
                let m = median(rates.clone());
                rows.push(Row {
                    policy,
                    mode,
                    local_pct: pct,
                    reqs_per_s: m,
                    runs: rates,
                    ratio_to_fifo: fifo.map(|f| m / f),
                    faults_per_req: per_req(v, |s| s.unhinted_faults),
                    slow_hints_per_req: per_req(v, |s| s.hint_calls),
                    hint_misses_per_req: per_req(v, |s| s.hint_misses),
                    fetched_per_req: per_req(v, |s| s.pages_fetched),
                    evicted_per_req: per_req(v, |s| s.pages_evicted),
                });
            }
        }
    }
    eprintln!("\r{:90}", "");
    drop(server);

    println!(
        "{:>14} {:>9} {:>6} {:>12} {:>7} {:>9} {:>9} {:>9} {:>9}",
        "policy",
        "mode",
        "local",
        "requests/s",
        "/fifo",
        "faults/r",
        "hslow/r",
        "hmiss/r",
        "fetched/r"
    );
    for r in &rows {
        println!(
            "{:>14} {:>9} {:>5}% {:>12.0} {:>7} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
            r.policy.name(),
            r.mode.name(),
            r.local_pct,
            r.reqs_per_s,
            r.ratio_to_fifo
                .map(|x| format!("{x:.2}"))
                .unwrap_or_else(|| "-".into()),
            r.faults_per_req,
            r.slow_hints_per_req,
            r.hint_misses_per_req,
            r.fetched_per_req
        );
    }
    // The headline: what priority reclaim hints buy over the default policy with plain hints.
    let rate = |pct: f64, p: Policy, m: Mode| {
        rows.iter()
            .find(|r| r.local_pct == pct && r.policy == p && r.mode == m)
            .map(|r| r.reqs_per_s)
    };
    let mut summary = Vec::new();
    for &pct in &a.local {
        if let (Some(pp), Some(fh)) = (
            rate(pct, Policy::Priority, Mode::Prio),
            rate(pct, Policy::Fifo, Mode::Hint),
        ) {
            println!(
                "local {pct}%: priority+prio {pp:.0} requests/s vs fifo+hint {fh:.0}: {:.2}x",
                pp / fh
            );
            summary.push(serde_json::json!({
                "local_pct": pct,
                "priority_prio_requests_per_s": pp,
                "fifo_hint_requests_per_s": fh,
                "priority_prio_vs_fifo_hint": pp / fh,
            }));
        }
    }

    if let Some(path) = &a.json {
        let j = serde_json::json!({
            "footprint_bytes": l.region_bytes,
            "table_bytes": l.table_bytes,
            "keys": l.nkeys,
            "buckets": l.nbuckets,
            "entry_bytes": ENTRY,
            "objects": l.nobjects,
            "object_bytes": OBJECT,
            "lookups_per_request": LOOKUPS,
            "request_ids": l.nreqs,
            "zipf": a.zipf,
            "seed": a.seed,
            "warmup_requests": warmup,
            "timed_requests": a.requests,
            "repeat": a.repeat,
            "backend": a.backend,
            "object_ev_prio": EV_PRIO,
            "points": rows.iter().map(|r| serde_json::json!({
                "policy": r.policy.name(),
                "mode": r.mode.name(),
                "local_pct": r.local_pct,
                "requests_per_s": r.reqs_per_s,
                "requests_per_s_runs": r.runs,
                "ratio_to_fifo": r.ratio_to_fifo,
                "unhinted_faults_per_request": r.faults_per_req,
                "slow_hints_per_request": r.slow_hints_per_req,
                "hint_misses_per_request": r.hint_misses_per_req,
                "pages_fetched_per_request": r.fetched_per_req,
                "pages_evicted_per_request": r.evicted_per_req,
            })).collect::<Vec<_>>(),
            "summary": summary,
        });
        std::fs::write(path, serde_json::to_string_pretty(&j)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small workload served from ordinary memory (hints outside a region do nothing), so
    /// that the checks can be shown to catch wrong data.
    fn plain(mode: Mode) -> (Workload, Vec<u64>) {
        let layout = Layout::new(2 << 20, 35.0).unwrap();
        let w = Workload::new(layout, 0.8, 7, 100, 400);
        let mut mem = vec![0u64; w.layout.region_bytes / 8];
        // SAFETY: `mem` has `region_bytes` bytes, 8-byte aligned, and is used only here.
        unsafe { fill(&w, mem.as_mut_ptr() as *mut u8, mode) };
        (w, mem)
    }

    /// Serve `reqs` from `mem`, filled by `plain`.
    fn serve_plain(w: &Workload, mem: &[u64], reqs: &[(u32, u32)], mode: Mode) -> Result<()> {
        assert_eq!(mem.len() * 8, w.layout.region_bytes);
        // SAFETY: `mem` has `region_bytes` bytes, 8-byte aligned, borrowed for the call.
        unsafe { serve(w, mem.as_ptr() as *const u8, reqs, mode) }
    }

    #[test]
    fn requests_are_served_and_wrong_data_is_caught() {
        for mode in [Mode::Prio, Mode::Hint, Mode::Unhinted] {
            let (w, mut mem) = plain(mode);
            serve_plain(&w, &mem, &w.reqs, mode).unwrap();
            // One word of the object the first request reads.
            let obj = w.reqs[0].1 as usize;
            let at = (w.layout.table_bytes + obj * OBJECT) / 8 + 100;
            mem[at] ^= 1;
            let e = serve_plain(&w, &mem, &w.reqs[..1], mode).unwrap_err();
            assert!(e.to_string().contains("read back wrong"), "{e}");
            mem[at] ^= 1;
            // A zeroed table page: its keys are not found.
            let page = w.layout.bucket_of(w.reqs[0].0 as u64 * LOOKUPS as u64) * BUCKET / PAGE_SIZE
                * PAGE_SIZE
                / 8;
            mem[page..page + PAGE_SIZE / 8].fill(0);
            assert!(serve_plain(&w, &mem, &w.reqs[..1], mode).is_err());
        }
    }

    #[test]
    fn zipf_requests_are_skewed_and_reproducible() {
        let l = || Layout::new(4 << 20, 35.0).unwrap();
        let a = Workload::new(l(), 0.8, 1, 0, 20_000);
        let b = Workload::new(l(), 0.8, 1, 0, 20_000);
        assert_eq!(a.reqs, b.reqs);
        let n = a.layout.nreqs as u32;
        let top = a.reqs.iter().filter(|r| r.0 < n / 100).count();
        // Zipf(0.8): the most popular 1% of request ids take far more than 1% of requests.
        assert!(top > 20_000 / 10, "{top}");
        assert!(a.reqs.iter().all(|r| r.0 < n));
    }
}
