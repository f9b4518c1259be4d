//! `farmem bench`: measurements that put competitors side by side in one run (these machines
//! are shared and noisy: only same-run ratios and medians mean something).

mod kv;
mod limits;
mod memcached_client;
mod programs;
mod scan;
mod server;
mod spawn;
mod suite;
mod swap;

use anyhow::Result;
use clap::Subcommand;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    scan: scan::Args,
}

#[derive(Subcommand)]
enum Cmd {
    /// The memory server and TCP backend alone: batched read throughput (1 and 2 clients),
    /// demand-read latency, and fair sharing between two tenants (weights 1:1 and 2:1).
    Server(server::Args),
    /// Unmodified programs (python3, sort, sqlite3, memcached) natively, under `farmem run`
    /// at shares of their peak memory, and under Linux swap (zram, a swap file) with the same limit.
    Programs(programs::Args),
    /// A key-value service in the shape of AIFM's synthetic web front end (Eden §5.3.2): per
    /// request 32 hash-table lookups and one 8 KiB object, Zipf(0.8) requests. Requests/s
    /// under each reclaim policy (fifo, second-chance, lru, priority) with priority hints
    /// (objects evicted first), plain hints and no hints, at shares of the footprint; the
    /// headline is priority+prio against fifo+hint. `--sweep` varies the service's shape
    /// (table share, object size, lookups, load order, ev_prio) with only the objects hinted.
    Kv(kv::Args),
    /// The evaluation: seqscan, randscan, kvs, dataframe, psort and memcached, natively,
    /// under Linux swap (zram, swap file) in a memory cgroup, and under farmem (transparent
    /// and hinted, embedded and TCP backends) at several local-memory fractions; CSV, JSON,
    /// Markdown tables and plots of normalized throughput.
    Suite(suite::Args),
    /// (internal) The load client of the memcached workload.
    #[command(hide = true)]
    MemcachedClient(memcached_client::Args),
    /// (internal) One tenant's load process for `farmem bench server`.
    #[command(hide = true)]
    Load(server::LoadArgs),
    /// (internal) The plain-array scan run under Linux swap.
    #[command(hide = true)]
    NativeScan(scan::NativeArgs),
}

pub fn run(a: Args) -> Result<()> {
    match a.cmd {
        None => scan::run(a.scan),
        Some(Cmd::Server(s)) => server::run(s),
        Some(Cmd::Load(l)) => server::load(l),
        Some(Cmd::Programs(p)) => programs::run(p),
        Some(Cmd::Kv(k)) => kv::run(k),
        Some(Cmd::Suite(s)) => suite::run(s),
        Some(Cmd::MemcachedClient(m)) => memcached_client::run(m),
        Some(Cmd::NativeScan(n)) => scan::native_scan(n),
    }
}

/// Median of a non-empty sample.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
