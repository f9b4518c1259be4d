//! `farmem bench server`: the memory server and the TCP backend alone, over loopback, the
//! server a separate process: batched sequential reads (1 and 2 client threads, one batch in
//! flight per thread or a pipeline of several), single-page demand-read latency, and how two
//! tenants share the server (weights 1:1 and 2:1).
//!
//! Fair sharing is measured twice: uncapped, where the server's one thread is the bottleneck
//! (its CPU), and with the server's bandwidth capped at half the uncapped total, as a slower
//! network link would cap it. Either way each tenant keeps a window of requests in flight and
//! the server's weighted fair queue decides who is served next.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use farmem_proto::size::parse_size;
use farmem_runtime::backend::tcp::TcpBackend;
use farmem_runtime::backend::{Backend, Completion, IoClass, PageBuf, PageKey};
use farmem_runtime::PAGE_SIZE;
use hdrhistogram::Histogram;

use super::median;
use super::spawn::LocalServer;

#[derive(clap::Args)]
pub struct Args {
    /// Seconds per throughput measurement.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Pages per batched read.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Batches in flight per client in the pipelined and fairness runs.
    #[arg(long, default_value_t = 8)]
    depth: usize,
    /// Data each client stores (and reads back) on the server.
    #[arg(long, default_value = "64M")]
    size: String,
    /// Single-page reads timed for the latency distribution.
    #[arg(long, default_value_t = 20_000)]
    latency_samples: usize,
    /// Runs per point; medians are reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// One client process of the fairness measurement (run by `farmem bench server`).
#[derive(clap::Args)]
pub struct LoadArgs {
    #[arg(long)]
    addr: String,
    #[arg(long)]
    tenant: String,
    #[arg(long)]
    size: String,
    #[arg(long)]
    batch: usize,
    #[arg(long)]
    depth: usize,
    #[arg(long)]
    seconds: f64,
}

fn keys(region: u32, first: u64, n: usize) -> Vec<PageKey> {
    (first..first + n as u64)
        .map(|page| PageKey { region, page })
        .collect()
}

/// Store `pages` pages (region 1) so that they can be read back.
fn preload(b: &TcpBackend, pages: usize, batch: usize) -> Result<()> {
    let mut first = 0;
    while first < pages {
        let n = batch.min(pages - first);
        let mut buf = PageBuf::new(n);
        buf.set_len(n);
        for (i, x) in buf.bytes_mut().iter_mut().enumerate() {
            *x = (i as u64 ^ first as u64) as u8;
        }
        b.submit_write(IoClass::WriteBack, keys(1, first as u64, n), buf)
            .wait(b.longest_wait())
            .map_err(|e| anyhow::anyhow!("preloading: {e}"))?;
        first += n;
    }
    Ok(())
}

/// Read batches of `batch` consecutive pages round the data set for `secs`, keeping `depth`
/// batches in flight. Returns pages read.
fn read_loop(
    b: &TcpBackend,
    pages: usize,
    batch: usize,
    depth: usize,
    secs: f64,
    class: IoClass,
) -> Result<u64> {
    let batches = (pages / batch).max(1);
    let mut next = 0usize;
    let mut inflight: VecDeque<Completion> = VecDeque::new();
    // Buffers are recycled, as the runtime does: a fresh one per read would measure page
    // faults on the buffer rather than the transfer.
    let mut spare: Vec<PageBuf> = (0..depth).map(|_| PageBuf::new(batch)).collect();
    let mut done = 0u64;
    let t = Instant::now();
    let end = Duration::from_secs_f64(secs);
    loop {
        while inflight.len() < depth && t.elapsed() < end {
            let first = (next % batches * batch) as u64;
            next += 1;
            let buf = spare.pop().unwrap_or_else(|| PageBuf::new(batch));
            inflight.push_back(b.submit_read(class, keys(1, first, batch), buf));
        }
        let Some(c) = inflight.pop_front() else {
            break;
        };
        let d = c
            .wait(b.longest_wait())
            .map_err(|e| anyhow::anyhow!("reading: {e}"))?;
        spare.push(d.buf);
        if t.elapsed() <= end {
            done += batch as u64;
        }
    }
    Ok(done)
}

/// Pages/s of `threads` clients, each with its own backend (connections).
fn throughput(
    srv: &LocalServer,
    a: &Args,
    pages: usize,
    threads: usize,
    depth: usize,
) -> Result<f64> {
    let backends: Vec<TcpBackend> = (0..threads)
        .map(|i| {
            let b = TcpBackend::connect(srv.spec(&format!("bench{i}")))?;
            preload(&b, pages, a.batch)?;
            Ok(b)
        })
        .collect::<Result<_>>()?;
    let t = Instant::now();
    let total: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = backends
            .iter()
            .map(|b| {
                s.spawn(move || read_loop(b, pages, a.batch, depth, a.seconds, IoClass::Prefetch))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("reader thread"))
            .sum::<Result<u64>>()
    })?;
    Ok(total as f64 / t.elapsed().as_secs_f64().max(a.seconds))
}

/// Latency of single-page demand reads, one at a time: (p50, p99, p999) in µs.
fn latency(srv: &LocalServer, a: &Args, pages: usize) -> Result<(f64, f64, f64)> {
    let b = TcpBackend::connect(srv.spec("latency"))?;
    preload(&b, pages, a.batch)?;
    let mut h = Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3)?;
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut buf = PageBuf::new(1);
    for i in 0..a.latency_samples + 200 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let t = Instant::now();
        buf = b
            .submit_read(IoClass::Demand, keys(1, x % pages as u64, 1), buf)
            .wait(b.longest_wait())
            .map_err(|e| anyhow::anyhow!("reading: {e}"))?
            .buf;
        if i >= 200 {
            h.record(t.elapsed().as_nanos() as u64)?;
        }
    }
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1e3;
    Ok((us(0.5), us(0.99), us(0.999)))
}

/// Two tenant processes saturating the server together; returns each one's pages/s.
fn fairness(srv: &LocalServer, a: &Args, tenants: [&str; 2]) -> Result<[f64; 2]> {
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for t in tenants {
        let child = Command::new(&exe)
            .args(["bench", "load", "--addr", &srv.addr, "--tenant", t])
            .args(["--size", &a.size, "--batch", &a.batch.to_string()])
            .args(["--depth", &(2 * a.depth).to_string()])
            .args(["--seconds", &a.seconds.to_string()])
            .env("FARMEM_TOKEN", srv.secret())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting a load process")?;
        children.push(child);
    }
    // Both store their data first; then they start reading at the same moment.
    let mut outs = Vec::new();
    for c in &mut children {
        let mut out = BufReader::new(c.stdout.take().expect("piped"));
        let mut line = String::new();
        out.read_line(&mut line)?;
        if line.trim() != "READY" {
            bail!("load process failed to start: {line:?}");
        }
        outs.push(out);
    }
    for c in &mut children {
        writeln!(c.stdin.as_mut().expect("piped"), "GO")?;
    }
    let mut rates = [0.0; 2];
    for (i, (mut c, mut out)) in children.into_iter().zip(outs).enumerate() {
        let mut line = String::new();
        out.read_line(&mut line)?;
        let st = c.wait()?;
        if !st.success() {
            bail!("load process for {} failed ({st})", tenants[i]);
        }
        rates[i] = line
            .trim()
            .parse()
            .with_context(|| format!("load process output {line:?}"))?;
    }
    Ok(rates)
}

/// Two tenants at weights 1:1, then 2:1; prints the first's share. Returns the median
/// total pages/s of the 1:1 runs.
fn fair_shares(
    srv: &LocalServer,
    a: &Args,
    what: &str,
    results: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<f64> {
    let mut total_1_1 = 0.0;
    for (pair, label, key) in [
        (["fair-a", "fair-b"], "weights 1:1", "1_1"),
        (["heavy", "light"], "weights 2:1", "2_1"),
    ] {
        let mut shares = Vec::new();
        let mut totals = Vec::new();
        for _ in 0..a.repeat {
            let r = fairness(srv, a, pair)?;
            shares.push(r[0] / (r[0] + r[1]));
            totals.push(r[0] + r[1]);
        }
        let share = median(shares.clone());
        let total = median(totals);
        if key == "1_1" {
            total_1_1 = total;
        }
        println!(
            "  two tenants, {what:<8} {label}: first gets {:>5.1}% of {total:>7.0} pages/s \
             (runs: {})",
            100.0 * share,
            shares
                .iter()
                .map(|s| format!("{:.1}%", 100.0 * s))
                .collect::<Vec<_>>()
                .join(", ")
        );
        results.insert(format!("share_of_first_{what}_{key}"), share.into());
        results.insert(format!("total_pages_per_s_{what}_{key}"), total.into());
    }
    Ok(total_1_1)
}

/// The body of a load process.
pub fn load(a: LoadArgs) -> Result<()> {
    let spec = match farmem_runtime::BackendSpec::parse(&format!("tcp://{}@{}", a.tenant, a.addr))?
    {
        farmem_runtime::BackendSpec::Tcp(t) => t,
        _ => unreachable!("a tcp url"),
    };
    let b = TcpBackend::connect(spec)?;
    let pages = parse_size(&a.size)? as usize / PAGE_SIZE;
    preload(&b, pages, a.batch)?;
    println!("READY");
    std::io::stdout().flush()?;
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    let t = Instant::now();
    let n = read_loop(&b, pages, a.batch, a.depth, a.seconds, IoClass::Prefetch)?;
    println!("{}", n as f64 / t.elapsed().as_secs_f64().max(a.seconds));
    Ok(())
}

pub fn run(a: Args) -> Result<()> {
    if a.repeat == 0 || a.batch == 0 || a.depth == 0 || a.seconds <= 0.0 {
        bail!("--repeat, --batch, --depth and --seconds must be positive");
    }
    let pages = parse_size(&a.size).context("--size")? as usize / PAGE_SIZE;
    if pages < a.batch {
        bail!("--size must hold at least one batch");
    }
    let srv = LocalServer::start(
        &[("fair-a", 1), ("fair-b", 1), ("heavy", 2), ("light", 1)],
        &["--capacity", "8G"],
    )?;
    println!(
        "farmem server at {} (pid {}); batches of {} pages, {} MiB per client, {} s per \
         point, median of {}",
        srv.addr,
        srv.pid(),
        a.batch,
        (pages * PAGE_SIZE) >> 20,
        a.seconds,
        a.repeat
    );
    let mut results = serde_json::Map::new();
    for (threads, depth, label) in [
        (1, 1, "1 thread, 1 batch in flight"),
        (2, 1, "2 threads, 1 batch in flight each"),
        (1, a.depth, "1 thread, pipelined"),
        (2, a.depth, "2 threads, pipelined"),
    ] {
        let runs: Vec<f64> = (0..a.repeat)
            .map(|_| throughput(&srv, &a, pages, threads, depth))
            .collect::<Result<_>>()?;
        let m = median(runs);
        println!("  batched sequential reads, {label:<34} {m:>10.0} pages/s");
        results.insert(
            format!("seq_reads_{threads}t_depth{depth}_pages_per_s"),
            m.into(),
        );
    }
    let (p50, p99, p999) = latency(&srv, &a, pages)?;
    println!(
        "  single-page demand read latency          p50 {p50:.1} µs  p99 {p99:.1} µs  p99.9 \
         {p999:.1} µs"
    );
    results.insert("demand_read_p50_us".into(), p50.into());
    results.insert("demand_read_p99_us".into(), p99.into());
    let uncapped = fair_shares(&srv, &a, "uncapped", &mut results)?;
    drop(srv);
    let cap_mib = (uncapped / 2.0 * PAGE_SIZE as f64 / 1048576.0).max(1.0) as u64;
    let capped = LocalServer::start(
        &[("fair-a", 1), ("fair-b", 1), ("heavy", 2), ("light", 1)],
        &[
            "--capacity",
            "8G",
            "--max-bandwidth",
            &format!("{cap_mib}M"),
        ],
    )?;
    println!(
        "  server capped at {cap_mib} MiB/s (half the uncapped total), as a slower link would"
    );
    results.insert("cap_mib_per_s".into(), cap_mib.into());
    fair_shares(&capped, &a, "capped", &mut results)?;
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&results)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}
