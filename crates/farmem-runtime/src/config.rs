//! Runtime configuration: one struct, sensible defaults, overridable from the environment so
//! that `farmem run` (and any launcher) can pass settings down to a preloaded library.

use std::time::Duration;

use crate::error::{Error, Result};
use farmem_proto::auth::Secret;
use farmem_proto::valid_tenant;
use farmem_sys::mem::{physical_memory, PAGE_SIZE};

/// Which far-memory backend to use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendSpec {
    /// Pages kept in this process, outside the regions (the embedded default).
    Local { lz4: bool },
    /// A `farmem server` over TCP.
    Tcp(TcpSpec),
}

/// Where a TCP backend connects and how it authenticates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpSpec {
    /// `host:port` of the server.
    pub addr: String,
    /// Tenant name (from `tcp://tenant@host:port`, else `FARMEM_TENANT`, else `default`).
    pub tenant: String,
    /// The secret; `None` means: from `FARMEM_TOKEN`, else from the file `FARMEM_TOKEN_FILE`.
    pub token: Option<Secret>,
    /// How long to keep trying to reconnect after the server is lost before stopping the
    /// program (`FARMEM_RECONNECT_S`, default 30 s).
    pub reconnect_window: Duration,
}

impl TcpSpec {
    pub fn url(&self) -> String {
        format!("tcp://{}@{}", self.tenant, self.addr)
    }
}

impl BackendSpec {
    /// Parse `local://`, `local+lz4://` (or without `://`), or `tcp://[tenant@]host:port`.
    pub fn parse(s: &str) -> Result<BackendSpec> {
        let s = s.trim();
        if let Some(rest) = s.strip_prefix("tcp://") {
            return parse_tcp(rest).map(BackendSpec::Tcp);
        }
        match s.trim_end_matches("://") {
            "" | "local" => Ok(BackendSpec::Local { lz4: false }),
            "local+lz4" => Ok(BackendSpec::Local { lz4: true }),
            other => Err(Error::Config(format!(
                "unknown backend '{other}': expected local://, local+lz4:// or \
                 tcp://[tenant@]host:port"
            ))),
        }
    }
}

fn parse_tcp(rest: &str) -> Result<TcpSpec> {
    let bad = |why: &str| {
        Error::Config(format!(
            "backend 'tcp://{rest}': {why} (expected tcp://[tenant@]host:port)"
        ))
    };
    let (tenant, addr) = match rest.split_once('@') {
        Some((t, a)) => (Some(t.to_string()), a),
        None => (None, rest),
    };
    let addr = addr.trim_end_matches('/');
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    if host.is_empty() {
        return Err(bad("no host"));
    }
    port.parse::<u16>()
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| bad("invalid port"))?;
    let tenant = tenant
        .or_else(|| env("FARMEM_TENANT"))
        .unwrap_or_else(|| "default".into());
    if !valid_tenant(&tenant) {
        return Err(bad(&format!(
            "tenant '{tenant}' must be 1-64 characters of A-Z a-z 0-9 . _ -"
        )));
    }
    let reconnect_s: f64 = env_num("FARMEM_RECONNECT_S")?.unwrap_or(30.0);
    if !(0.0..=86400.0).contains(&reconnect_s) {
        return Err(Error::Config(format!(
            "FARMEM_RECONNECT_S={reconnect_s} must be between 0 and 86400"
        )));
    }
    Ok(TcpSpec {
        addr: addr.to_string(),
        tenant,
        token: None,
        reconnect_window: Duration::from_secs_f64(reconnect_s),
    })
}

/// Reclaim policies available (one module each under `policy/`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyKind {
    Fifo,
    SecondChance,
    Lru,
    Priority,
}

impl PolicyKind {
    pub fn parse(s: &str) -> Result<PolicyKind> {
        match s.trim() {
            "fifo" | "default" => Ok(PolicyKind::Fifo),
            "second-chance" | "clock" => Ok(PolicyKind::SecondChance),
            "lru" => Ok(PolicyKind::Lru),
            "priority" => Ok(PolicyKind::Priority),
            other => Err(Error::Config(format!(
                "unknown reclaim policy '{other}': expected fifo, second-chance, lru or priority"
            ))),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    /// Local memory budget shared by all regions of a runtime, in bytes (`FARMEM_LOCAL_MEM`,
    /// bytes with optional K/M/G/T suffix, or a percentage of physical memory like `25%`).
    pub local_mem: u64,
    /// Far-memory backend (`FARMEM_BACKEND`).
    pub backend: BackendSpec,
    /// Pages evicted per reclaim batch (`FARMEM_EVICT_BATCH`, default 128, at most an eighth
    /// of the budget: see [`Config::effective_evict_batch`]). Each batch
    /// costs one TLB shootdown of the program's CPUs; 128 amortizes it (32 → 128: the
    /// unhinted sequential scan at 25% local went from ~340K to ~500K pages/s).
    pub evict_batch: usize,
    /// Free budget the control thread keeps, in percent of the budget (`FARMEM_FREE_PCT`,
    /// default 1; at least two read-ahead windows, see [`Config::free_target_pages`]).
    pub free_pct: f64,
    /// Reclaim policy (`FARMEM_POLICY`, default fifo).
    pub policy: PolicyKind,
    /// Largest read-ahead window for sequential unhinted faults, in pages
    /// (`FARMEM_FAULT_READAHEAD`, default 256; 0 disables). A window only grows this far
    /// while faults keep following it.
    pub fault_readahead: usize,
    /// Largest `rdahead` a hint may ask for, in pages (`FARMEM_MAX_RDAHEAD`, default 256).
    pub max_rdahead: usize,
    /// Read-ahead windows kept in flight ahead of a sequential hint (`FM_SEQ` with forward
    /// read-ahead), fetched asynchronously (`FARMEM_HINT_PIPELINE`, default 2; 0: off).
    pub hint_pipeline: usize,
    /// Threads reading the userfaultfd (`FARMEM_FAULT_THREADS`, default 1).
    pub fault_threads: usize,
    /// Busy-poll the userfaultfd this long after each event before sleeping in `poll`
    /// (`FARMEM_FAULT_SPIN_US`, default 50). A cross-thread wake-up costs ~20 µs here.
    pub fault_spin_us: u64,
    /// A fault left unserved this long because the fault thread is busy (a long fetch or a
    /// direct reclaim) is stolen and served by the control thread (`FARMEM_STEAL_US`,
    /// default 500).
    pub steal_after_us: u64,
    /// Shortest deadline of a read-ahead, in microseconds (`FARMEM_PREFETCH_DEADLINE_US`,
    /// default 20000). A read-ahead is useful until its stream (at its measured pace) passes
    /// its last page, but never less than this; a far-memory server that cannot start it in
    /// time drops it and its pages are read on demand. Small values drop windows that would
    /// still have saved faults (the pace of a prefetched stream is that of its hits).
    pub prefetch_deadline_us: u64,
    /// Print statistics at exit (`FARMEM_STATS=1`).
    pub stats_at_exit: bool,
}

/// The smallest local budget, in pages (768 KiB): room for a few eviction batches.
pub const MIN_BUDGET_PAGES: usize = 192;

impl Default for Config {
    fn default() -> Self {
        Config {
            local_mem: physical_memory() / 2,
            backend: BackendSpec::Local { lz4: false },
            evict_batch: 128,
            free_pct: 1.0,
            policy: PolicyKind::Fifo,
            fault_readahead: 256,
            max_rdahead: 256,
            hint_pipeline: 2,
            fault_threads: 1,
            fault_spin_us: 50,
            steal_after_us: 500,
            prefetch_deadline_us: 20_000,
            stats_at_exit: false,
        }
    }
}

/// Parse a size (`4096`, `512M`, `2G`; see [`farmem_proto::size`]).
fn parse_size(s: &str) -> Result<u64> {
    farmem_proto::size::parse_size(s).map_err(|e| Error::Config(e.to_string()))
}

/// Parse a budget: a size, or a percentage of physical memory (`25%`).
pub fn parse_budget(s: &str) -> Result<u64> {
    if let Some(p) = s.trim().strip_suffix('%') {
        let pct: f64 = p
            .trim()
            .parse()
            .map_err(|_| Error::Config(format!("invalid percentage '{s}'")))?;
        if !(0.0..=100.0).contains(&pct) || pct == 0.0 {
            return Err(Error::Config(format!(
                "percentage '{s}' must be in (0, 100]"
            )));
        }
        return Ok((physical_memory() as f64 * pct / 100.0) as u64);
    }
    parse_size(s)
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn env_num<T: std::str::FromStr>(name: &str) -> Result<Option<T>> {
    match env(name) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| Error::Config(format!("{name}='{v}' is not a valid number"))),
    }
}

impl Config {
    /// Defaults overridden by `FARMEM_*` environment variables.
    pub fn from_env() -> Result<Config> {
        let mut c = Config::default();
        if let Some(v) = env("FARMEM_LOCAL_MEM") {
            c.local_mem = parse_budget(&v)?;
        }
        if let Some(v) = env("FARMEM_BACKEND") {
            c.backend = BackendSpec::parse(&v)?;
        }
        if let Some(v) = env("FARMEM_POLICY") {
            c.policy = PolicyKind::parse(&v)?;
        }
        if let Some(v) = env_num("FARMEM_EVICT_BATCH")? {
            c.evict_batch = v;
        }
        if let Some(v) = env_num("FARMEM_FREE_PCT")? {
            c.free_pct = v;
        }
        if let Some(v) = env_num("FARMEM_FAULT_READAHEAD")? {
            c.fault_readahead = v;
        }
        if let Some(v) = env_num("FARMEM_MAX_RDAHEAD")? {
            c.max_rdahead = v;
        }
        if let Some(v) = env_num("FARMEM_HINT_PIPELINE")? {
            c.hint_pipeline = v;
        }
        if let Some(v) = env_num("FARMEM_PREFETCH_DEADLINE_US")? {
            c.prefetch_deadline_us = v;
        }
        if let Some(v) = env_num("FARMEM_FAULT_THREADS")? {
            c.fault_threads = v;
        }
        if let Some(v) = env_num("FARMEM_FAULT_SPIN_US")? {
            c.fault_spin_us = v;
        }
        if let Some(v) = env_num("FARMEM_STEAL_US")? {
            c.steal_after_us = v;
        }
        if let Some(v) = env("FARMEM_STATS") {
            c.stats_at_exit = !matches!(v.trim(), "0" | "false" | "no" | "off");
        }
        c.validate()?;
        Ok(c)
    }

    /// Reject settings the runtime cannot work with, saying why.
    pub fn validate(&self) -> Result<()> {
        let min = MIN_BUDGET_PAGES * PAGE_SIZE;
        if (self.local_mem as usize) < min {
            return Err(Error::Config(format!(
                "local memory budget {} bytes is too small: at least {} bytes ({} pages) are \
                 needed",
                self.local_mem,
                min,
                min / PAGE_SIZE,
            )));
        }
        if self.evict_batch == 0 || self.evict_batch > 4096 {
            return Err(Error::Config(format!(
                "eviction batch {} must be between 1 and 4096 pages",
                self.evict_batch
            )));
        }
        if !(0.0..=50.0).contains(&self.free_pct) {
            return Err(Error::Config(format!(
                "free threshold {}% must be between 0 and 50",
                self.free_pct
            )));
        }
        if self.fault_threads == 0 || self.fault_threads > 64 {
            return Err(Error::Config(format!(
                "fault threads {} must be between 1 and 64",
                self.fault_threads
            )));
        }
        if self.hint_pipeline > 16 {
            return Err(Error::Config(format!(
                "hint pipeline depth {} must be at most 16 windows",
                self.hint_pipeline
            )));
        }
        if self.max_rdahead > 4096 || self.fault_readahead > 4096 {
            return Err(Error::Config(
                "read-ahead windows are limited to 4096 pages".into(),
            ));
        }
        Ok(())
    }

    /// The eviction batch the runtime uses: the configured one, but at most an eighth of the
    /// budget (a small budget cannot free 128 pages at a time and still hold a working set).
    pub fn effective_evict_batch(&self) -> usize {
        self.evict_batch.min(self.budget_pages() / 8).max(1)
    }

    /// Budget in pages.
    pub fn budget_pages(&self) -> usize {
        self.local_mem as usize / PAGE_SIZE
    }

    /// Free pages the control thread keeps available: `free_pct` of the budget, and at
    /// least two of the largest unhinted read-ahead windows (read-ahead only takes budget
    /// that is free, so a smaller pool cuts windows short and the pages cut off fault one
    /// by one), but never more than a quarter of the budget.
    pub fn free_target_pages(&self) -> usize {
        let pct = (self.budget_pages() as f64 * self.free_pct / 100.0) as usize;
        let batch = self.effective_evict_batch();
        let want = pct.max(batch).max(2 * self.fault_readahead);
        want.min((self.budget_pages() / 4).max(batch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_budget("512M").unwrap(), 512 << 20);
        assert!(parse_budget("lots").is_err());
        assert!(parse_budget("0%").is_err());
        assert!(parse_budget("25%").unwrap() > 0);
    }

    #[test]
    fn backends_parse() {
        assert_eq!(
            BackendSpec::parse("local://").unwrap(),
            BackendSpec::Local { lz4: false }
        );
        assert_eq!(
            BackendSpec::parse("local+lz4://").unwrap(),
            BackendSpec::Local { lz4: true }
        );
        assert!(BackendSpec::parse("nfs://x").is_err());
        let BackendSpec::Tcp(t) = BackendSpec::parse("tcp://alice@127.0.0.1:7070").unwrap() else {
            panic!("not tcp")
        };
        assert_eq!(
            (t.tenant.as_str(), t.addr.as_str()),
            ("alice", "127.0.0.1:7070")
        );
        assert_eq!(t.url(), "tcp://alice@127.0.0.1:7070");
        let BackendSpec::Tcp(t) = BackendSpec::parse("tcp://[::1]:9/").unwrap() else {
            panic!("not tcp")
        };
        assert_eq!(t.addr, "[::1]:9");
        for bad in [
            "tcp://host",
            "tcp://:80",
            "tcp://h:0",
            "tcp://h:x",
            "tcp://a b@h:1",
        ] {
            assert!(BackendSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tiny_budget_rejected() {
        let c = Config {
            local_mem: 4096,
            ..Config::default()
        };
        assert!(c.validate().is_err());
    }
}
