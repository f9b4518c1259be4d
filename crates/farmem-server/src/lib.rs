//! farmem-server: the memory server behind `farmem server`. It stores pages for many
//! clients at once (each program a session inside its tenant's namespace), authenticates
//! them by challenge-response, shares its service among tenants by weighted fair queuing and
//! exposes metrics.

// The engine is one struct (`state::Engine`) whose work is split by concept into `impl Engine`
// blocks. Each module uses only those listed before it:
//   state        the engine's state, the records it keeps, its construction
//   tenancy      tenants and sessions: creation, attach/detach, Goodbye, expiry, forgetting
//   closing      closing a connection (and all of them at shutdown), logged through `events`
//   output       replies and error replies sent, output flushed, frame bodies released
//   handshake    Hello, challenge, proof (with the address's back-off), Welcome
//   dispatch     what a request does when served: read, write, free; stats, goodbye
//   service      requests queued in the weighted fair queue; a turn of service
//   reading      frames read within each connection's window and each tenant's share
//   accepting    new connections admitted into the handshake pool, or refused
//   event_loop   the poll loop: accept, read frames, serve, flush, periodic work
// Below them all, not knowing of the engine: `conn` (a connection's framing and output
// queue), `store` (the page store), `wfq` (the fair queue), `bucket` (the bandwidth cap),
// `holdings` (memory held), `slab` (numbered slots reused), `source` (a client's address as
// limits see it), `backoff` (strikes of failed authentications), `admission` (the pool of
// connections in their handshake), `events` (rate-limited logging), `metrics` (counters) and
// `metrics_http` (their HTTP endpoint).
mod accepting;
mod admission;
mod backoff;
mod bucket;
mod closing;
mod conn;
mod dispatch;
mod event_loop;
mod events;
mod handshake;
mod holdings;
mod metrics;
mod metrics_http;
mod output;
mod reading;
mod service;
mod slab;
mod source;
mod state;
mod store;
mod tenancy;
mod wfq;

// For `run`: the command line's addresses and secrets, `--stats`, descriptors, and errors.
mod addr;
mod error;
mod fd_limit;
mod scrape;
mod tokens;

use std::net::TcpListener;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use farmem_proto::size::parse_size;
use farmem_proto::PAGE_SIZE;

pub use error::ServerError;

#[derive(clap::Args)]
#[command(after_help = "\
Authentication: every client proves it knows a secret (never sent) by challenge-response.
The token file holds either one bare secret shared by all tenants, or one line per tenant:

    # tenant  secret              options
    alice     3d7e0c9a41b2f6...   weight=2 quota=8G
    bob       a41b77e0d3c95a...

A line whose first non-blank character is # is a comment; a # anywhere else belongs to the
line (secrets may contain #, so there are no comments at the end of a line).

With a shared secret (a bare secret in the file, or FARMEM_TOKEN), tenants are NOT isolated
from each other: a tenant is only a name, and any client that knows the shared secret can
name any tenant (without a line of its own) and use its quota and its share of the server.
Give each tenant its own line and secret to keep tenants apart.

Clients use FARMEM_BACKEND=tcp://TENANT@HOST:PORT with FARMEM_TOKEN=SECRET (or
FARMEM_TOKEN_FILE=FILE). Make a secret with: head -c 32 /dev/urandom | base64

Before they authenticate, connections have their own small pool (--max-unauth-conns, and
--max-unauth-per-addr per address or IPv6 /64); when it is full the oldest handshake of the
address with the most is dropped, so idle connections cannot lock clients out. After a few
failed authentications an address is refused for a while (0.1 s, doubling up to 10 s).
Refusals, failed authentications and bad input are logged a few lines per 10 s, then summed.

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
    /// Keep the pages of a client that lost its connections this long for it to reconnect
    /// (a client that said Goodbye has its pages freed at once).
    #[arg(long, value_name = "SECONDS", default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    session_timeout: u64,
    /// Most authenticated client connections at once (each program uses three).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    max_conns: u32,
    /// Most connections at once that have not authenticated yet (apart from --max-conns).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    max_unauth_conns: u32,
    /// Most connections at once not authenticated yet from one address (IPv6: one /64).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    max_unauth_per_addr: u32,
    /// A connection must authenticate this soon after it is accepted.
    #[arg(long, value_name = "SECONDS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    handshake_timeout: u64,
    /// Pages one connection may have in flight (requests plus replies not yet sent).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(64..=65536))]
    window: u32,
    /// Cap on page data served per second, all tenants together (e.g. 1G for 1 GiB/s): the
    /// capacity of the link to emulate, or a limit on the server's network use. What the cap
    /// holds back is shared among tenants by their weights.
    #[arg(long, value_name = "SIZE_PER_S")]
    max_bandwidth: Option<String>,
    /// Disconnect a client that stops in the middle of a frame, or stops taking its
    /// replies, this long (it would hold server memory for nothing).
    #[arg(long, value_name = "SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    frame_timeout: u64,
    /// After serving, keep polling this long before sleeping (lower latency, more CPU).
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 0)]
    spin_us: u64,
    /// Print the metrics of a running server (its --metrics address) for a person, and exit.
    #[arg(long, value_name = "METRICS_ADDR")]
    stats: Option<String>,
}

/// Run `farmem server` with these arguments: serve until SIGINT or SIGTERM, or with
/// `--stats`, print a running server's metrics.
pub fn run(a: Args) -> Result<(), ServerError> {
    if let Some(addr) = &a.stats {
        let text = scrape::scrape(addr)?;
        print!("{}", scrape::human_report(addr, &text));
        return Ok(());
    }
    let (tokens, auth_desc) = tokens::load_tokens(a.token_file.as_deref())?;
    let capacity_bytes = match &a.capacity {
        Some(c) => parse_size(c).map_err(ServerError::size("--capacity"))?,
        None => farmem_sys::mem::physical_memory() / 2,
    };
    let capacity_pages = (capacity_bytes / PAGE_SIZE as u64) as usize;
    if capacity_pages == 0 {
        return Err(ServerError::BadOption(
            "--capacity must be at least one page (4K)",
        ));
    }
    if capacity_bytes > farmem_sys::mem::physical_memory() {
        tracing::warn!(
            "capacity {} MiB exceeds this machine's memory; the server may run out of memory \
             before its capacity",
            capacity_bytes >> 20
        );
    }
    let default_quota_pages = match &a.default_quota {
        Some(q) => parse_size(q).map_err(ServerError::size("--default-quota"))? / PAGE_SIZE as u64,
        None => capacity_pages as u64,
    };
    if default_quota_pages == 0 {
        return Err(ServerError::BadOption(
            "--default-quota must be at least one page (4K)",
        ));
    }
    let max_pages_per_s = match &a.max_bandwidth {
        Some(b) => {
            let bytes = parse_size(b.trim_end_matches("/s"))
                .map_err(ServerError::size("--max-bandwidth"))?;
            if bytes < PAGE_SIZE as u64 {
                return Err(ServerError::BadOption(
                    "--max-bandwidth must be at least one page (4K) per second",
                ));
            }
            Some(bytes as f64 / PAGE_SIZE as f64)
        }
        None => None,
    };
    let listen = addr::resolve(&a.listen, "--listen")?;
    if !listen.ip().is_loopback() {
        tracing::warn!(
            "listening on {listen}, reachable from other machines: traffic is authenticated \
             but not encrypted"
        );
    }
    let listener =
        TcpListener::bind(listen).map_err(ServerError::sys(format!("binding {listen}")))?;
    let bound = listener.local_addr()?;
    let m = Arc::new(metrics::Metrics::new(capacity_pages as u64));
    let metrics_desc = match &a.metrics {
        Some(addr) => {
            let maddr = addr::resolve(addr, "--metrics")?;
            let l =
                TcpListener::bind(maddr).map_err(ServerError::sys(format!("binding {maddr}")))?;
            let bound = l.local_addr()?;
            let m2 = m.clone();
            std::thread::Builder::new()
                .name("farmem-metrics".into())
                .spawn(move || {
                    if let Err(e) = metrics_http::serve_http(l, m2) {
                        tracing::error!("the metrics endpoint stopped: {e}");
                    }
                })?;
            format!("http://{bound}/metrics")
        }
        None => "off".into(),
    };
    let (sig_read, sig_write) = UnixStream::pair()?;
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::low_level::pipe::register(sig, sig_write.try_clone()?)
            .map_err(ServerError::sys("installing signal handlers"))?;
    }
    // Every connection is a descriptor: authenticated ones, handshakes, metrics, the store.
    let wanted = a.max_conns as u64 + a.max_unauth_conns as u64 + 128;
    match fd_limit::raise_to_hard() {
        Ok(n) if n < wanted => tracing::warn!(
            "this process may open {n} descriptors, fewer than --max-conns and \
             --max-unauth-conns allow ({wanted} with a margin): connections beyond are not \
             accepted until others close"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!("raising the descriptor limit failed: {e}"),
    }
    let cfg = state::Config {
        capacity_pages,
        tokens,
        default_quota_pages,
        default_weight: a.default_weight,
        session_timeout: Duration::from_secs(a.session_timeout),
        max_conns: a.max_conns as usize,
        max_unauth: a.max_unauth_conns as usize,
        max_unauth_per_addr: a.max_unauth_per_addr as usize,
        handshake_timeout: Duration::from_secs(a.handshake_timeout),
        window_pages: a.window,
        global_limit: 512 << 20,
        frame_timeout: Duration::from_secs(a.frame_timeout),
        spin: Duration::from_micros(a.spin_us),
        max_pages_per_s,
    };
    let mut engine = state::Engine::new(cfg, listener, sig_read, m).map_err(ServerError::sys(
        "starting the server (reserving the page store)",
    ))?;
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
    engine.run().map_err(ServerError::sys("server loop"))?;
    eprintln!("farmem server: stopped");
    Ok(())
}
