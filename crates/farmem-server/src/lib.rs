//! farmem-server: the memory server behind `farmem server`. It stores pages for many clients at once (each
//! program a session inside its tenant's namespace), authenticates them by challenge-response,
//! shares its service among tenants by weighted fair queuing and exposes metrics.

mod conn;
mod engine;
pub mod metrics;
mod store;
mod wfq;

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use farmem_proto::auth::Secret;
use farmem_proto::size::parse_size;
use farmem_proto::tokens::{TokenEntry, TokenFile};
use farmem_proto::PAGE_SIZE;

#[derive(clap::Args)]
#[command(after_help = "\
Authentication: every client proves it knows a secret (never sent) by challenge-response.
The token file holds either one bare secret shared by all tenants, or one line per tenant:

    # tenant  secret              options
    alice     3d7e0c9a41b2f6...   weight=2 quota=8G
    bob       a41b77e0d3c95a...

Clients use FARMEM_BACKEND=tcp://TENANT@HOST:PORT with FARMEM_TOKEN=SECRET (or
FARMEM_TOKEN_FILE=FILE). Make a secret with: head -c 32 /dev/urandom | base64

Traffic is authenticated and checksummed, not encrypted: keep the server on a trusted
network (it listens on loopback unless told otherwise).")]
pub struct Args {
    /// Address to listen on (port 0 picks a free port; the address is printed on start).
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: String,
    /// Most page data stored for all tenants together (e.g. 16G). Memory is used only for
    /// pages written. Default: half of physical memory.
    #[arg(long)]
    capacity: Option<String>,
    /// Token file (see below). Without it, the environment variable FARMEM_TOKEN is the
    /// secret shared by all tenants.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Quota of tenants that have none in the token file (default: the capacity).
    #[arg(long, value_name = "SIZE")]
    default_quota: Option<String>,
    /// Fair-share weight of tenants that have none in the token file.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    default_weight: u32,
    /// Keep the pages of a client that lost its connections this long for it to reconnect.
    #[arg(long, value_name = "SECONDS", default_value_t = 120)]
    session_timeout: u64,
    /// Most client connections at once (each program uses three).
    #[arg(long, default_value_t = 1024)]
    max_conns: usize,
    /// Pages one connection may have in flight (requests plus replies not yet sent).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(64..=65536))]
    window: u32,
    /// Cap on page data served per second, all tenants together (e.g. 1G for 1 GiB/s): the
    /// capacity of the link to emulate, or a limit on the server's network use. What the cap
    /// holds back is shared among tenants by their weights.
    #[arg(long, value_name = "SIZE_PER_S")]
    max_bandwidth: Option<String>,
    /// Disconnect a client that stops in the middle of a frame this long (it would hold
    /// server memory for nothing).
    #[arg(long, value_name = "SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    frame_timeout: u64,
    /// After serving, keep polling this long before sleeping (lower latency, more CPU).
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 0)]
    spin_us: u64,
    /// Print the metrics of a running server (its --metrics address) for a person, and exit.
    #[arg(long, value_name = "METRICS_ADDR")]
    stats: Option<String>,
}

fn load_tokens(a: &Args) -> Result<(TokenFile, String)> {
    if let Some(path) = &a.token_file {
        let text = farmem_sys::secret_file::read(path).map_err(anyhow::Error::msg)?;
        let f = TokenFile::parse(&text)
            .map_err(|e| anyhow::anyhow!("token file {}: {e}", path.display()))?;
        let named = f.entries.iter().filter(|e| e.tenant.is_some()).count();
        let desc = match (named, f.shared().is_some()) {
            (0, _) => format!("one shared secret from {}", path.display()),
            (n, false) => format!("{n} tenant(s) from {}", path.display()),
            (n, true) => format!("{n} tenant(s) and a shared secret from {}", path.display()),
        };
        return Ok((f, desc));
    }
    match std::env::var("FARMEM_TOKEN")
        .ok()
        .and_then(|t| Secret::from_text(&t))
    {
        Some(secret) => Ok((
            TokenFile {
                entries: vec![TokenEntry {
                    tenant: None,
                    secret,
                    weight: None,
                    quota_bytes: None,
                }],
            },
            "one shared secret from FARMEM_TOKEN".into(),
        )),
        None => bail!(
            "no secret to authenticate clients with: give --token-file FILE, or set \
             FARMEM_TOKEN (make one with: head -c 32 /dev/urandom | base64)"
        ),
    }
}

fn resolve(addr: &str, what: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .with_context(|| format!("{what} '{addr}'"))?
        .next()
        .with_context(|| format!("{what} '{addr}' resolves to no address"))
}

pub fn run(a: Args) -> Result<()> {
    if let Some(addr) = &a.stats {
        let text = metrics::scrape(addr)?;
        print!("{}", metrics::human_report(addr, &text));
        return Ok(());
    }
    let (tokens, auth_desc) = load_tokens(&a)?;
    let capacity_bytes = match &a.capacity {
        Some(c) => parse_size(c).context("--capacity")?,
        None => farmem_sys::mem::physical_memory() / 2,
    };
    let capacity_pages = (capacity_bytes / PAGE_SIZE as u64) as usize;
    if capacity_pages == 0 {
        bail!("--capacity must be at least one page (4K)");
    }
    if capacity_bytes > farmem_sys::mem::physical_memory() {
        tracing::warn!(
            "capacity {} MiB exceeds this machine's memory; the server may run out of memory \
             before its capacity",
            capacity_bytes >> 20
        );
    }
    let default_quota_pages = match &a.default_quota {
        Some(q) => parse_size(q).context("--default-quota")? / PAGE_SIZE as u64,
        None => capacity_pages as u64,
    };
    let max_pages_per_s = match &a.max_bandwidth {
        Some(b) => {
            let bytes = parse_size(b.trim_end_matches("/s")).context("--max-bandwidth")?;
            if bytes < PAGE_SIZE as u64 {
                bail!("--max-bandwidth must be at least one page (4K) per second");
            }
            Some(bytes as f64 / PAGE_SIZE as f64)
        }
        None => None,
    };
    let listen = resolve(&a.listen, "--listen")?;
    if !listen.ip().is_loopback() {
        tracing::warn!(
            "listening on {listen}, reachable from other machines: traffic is authenticated \
             but not encrypted"
        );
    }
    let listener = TcpListener::bind(listen).with_context(|| format!("binding {listen}"))?;
    let bound = listener.local_addr()?;
    let m = Arc::new(metrics::Metrics::new(capacity_pages as u64));
    let metrics_desc = match &a.metrics {
        Some(addr) => {
            let maddr = resolve(addr, "--metrics")?;
            let l = TcpListener::bind(maddr).with_context(|| format!("binding {maddr}"))?;
            let bound = l.local_addr()?;
            let m2 = m.clone();
            std::thread::Builder::new()
                .name("farmem-metrics".into())
                .spawn(move || metrics::serve_http(l, m2))?;
            format!("http://{bound}/metrics")
        }
        None => "off".into(),
    };
    let (sig_read, sig_write) = UnixStream::pair()?;
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::low_level::pipe::register(sig, sig_write.try_clone()?)
            .context("installing signal handlers")?;
    }
    let cfg = engine::Config {
        capacity_pages,
        tokens,
        default_quota_pages,
        default_weight: a.default_weight,
        session_timeout: Duration::from_secs(a.session_timeout),
        max_conns: a.max_conns.max(1),
        window_pages: a.window,
        global_limit: 512 << 20,
        frame_timeout: Duration::from_secs(a.frame_timeout),
        spin: Duration::from_micros(a.spin_us),
        max_pages_per_s,
    };
    let mut engine = engine::Engine::new(cfg, listener, sig_read, m)
        .context("starting the server (reserving the page store)")?;
    // The first line is for scripts and tests: the address actually bound.
    let cap = match max_pages_per_s {
        Some(r) => format!(
            "; bandwidth cap {:.0} MiB/s",
            r * PAGE_SIZE as f64 / 1048576.0
        ),
        None => String::new(),
    };
    println!(
        "farmem server listening on {bound} (capacity {} MiB; auth: {auth_desc}; metrics: \
         {metrics_desc}{cap})",
        capacity_bytes >> 20
    );
    use std::io::Write;
    std::io::stdout().flush()?;
    engine.run().context("server loop")?;
    eprintln!("farmem server: stopped");
    Ok(())
}
