//! Runtime configuration: one struct, sensible defaults, overridable from the environment so
//! that `farmem run` (and any launcher) can pass settings down to a preloaded library.

use farmem_sys::mem::{physical_memory, PAGE_SIZE};

use crate::backend::spec::BackendSpec;
pub use crate::env::parse_budget;
use crate::env::{env, env_num};
use crate::error::{Error, Result};

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
            "fifo" => Ok(PolicyKind::Fifo),
            "second-chance" | "clock" => Ok(PolicyKind::SecondChance),
            "lru" => Ok(PolicyKind::Lru),
            "priority" | "default" => Ok(PolicyKind::Priority),
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
    /// Reclaim policy (`FARMEM_POLICY`, default priority). Without `ev_prio` hints, priority
    /// is second chance: every page is at level 0, one clock ring, and with the working set's
    /// refault distances it keeps what a program comes back to, where FIFO evicts it in turn
    /// (sqlite at half its peak faulted 1.0M times under FIFO, 0.51M under second chance, as
    /// many as Linux swap at that limit); beside the ring, a protected band keeps part of a
    /// loop larger than the budget, where the program's own misses say it helps
    /// (`policy/dueling.rs`; `second-chance` is the ring alone). With hints, it evicts what
    /// they mark first: on `bench kv --sweep` it never fetched more pages than second chance
    /// or FIFO.
    pub policy: PolicyKind,
    /// Largest read-ahead window for sequential unhinted faults, in pages
    /// (`FARMEM_FAULT_READAHEAD`, default 256; 0 disables every read-ahead of unhinted
    /// faults, the next page of `neighbour.rs` too). A window only grows this far while
    /// faults keep following it.
    pub fault_readahead: usize,
    /// Largest read-ahead a hint may ask for, in pages (`FARMEM_MAX_READAHEAD`, default 256;
    /// the older name `FARMEM_MAX_RDAHEAD` is still read).
    pub max_readahead: usize,
    /// Read-ahead windows kept in flight ahead of a sequential hint (`FM_SEQ` with forward
    /// read-ahead), fetched asynchronously (`FARMEM_HINT_PIPELINE`, default 2; 0: off).
    pub hint_pipeline: usize,
    /// Install pages likely to be written (written during their last stay, and zero fills)
    /// writable, deciding at eviction whether they changed, instead of write-protected with
    /// a fault on their first write (`FARMEM_WRITABLE_INSTALL`, default on; `0`: off).
    pub writable_install: bool,
    /// Which far copies of local pages the far tier keeps (`FARMEM_FAR_COPIES`: `keep`,
    /// `clean` or `drop`; default: `drop` where forgetting frees memory, i.e. the
    /// in-process stores, else `keep`). See [`FarCopies`]. Measured on the suite at 25%
    /// local (local+lz4, scale 0.25): `drop` against `clean` used 178 against 205 MiB on
    /// dictgrow and 273 against 334 MiB on randscan, in the same time or less.
    pub far_copies: Option<FarCopies>,
    /// Local budget of a child made by `fork()` without exec, which keeps its far pages far
    /// with a runtime of its own (`FARMEM_FORK_LOCAL_MEM`, as `FARMEM_LOCAL_MEM`). Default:
    /// the parent's budget, or its share of the tree's (`tree`). A child given its own
    /// budget leaves the tree.
    pub fork_local_mem: Option<u64>,
    /// A file that makes the budget one for the whole process tree, as one cgroup's limit
    /// (`FARMEM_TREE`; `farmem run` makes it): every process that maps it (forked children
    /// inherit it, executed programs map it again) takes a share (`tree_budget.rs`). Only
    /// with [`BudgetScope::Process`]. None: each process has a budget of its own, so a parent
    /// and two workers hold up to three budgets locally.
    pub tree: Option<std::path::PathBuf>,
    /// The memory cgroup of the process tree (`FARMEM_CGROUP`; `farmem run` makes one when
    /// it runs as root): with `tree`, the budget also covers what the cgroup is charged that
    /// no process counts (`cgroup_charge.rs`), as a cgroup's limit does.
    pub cgroup: Option<std::path::PathBuf>,
    /// The compressor of the in-process compressed tiers (`FARMEM_COMPRESSOR`: `lz4`, the
    /// default, `zstd` or `zstd:LEVEL`).
    pub compressor: crate::backend::Codec,
    /// Threads reading the userfaultfd (`FARMEM_FAULT_THREADS`, default 1).
    pub fault_threads: usize,
    /// Busy-poll the userfaultfd this long after each event before sleeping in `poll`
    /// (`FARMEM_FAULT_SPIN_US`, default 50). A cross-thread wake-up costs ~20 µs here.
    pub fault_spin_us: u64,
    /// With one fault thread, pin it and a program thread that faults alone to that thread's
    /// CPU (`FARMEM_FAULT_FOLLOW`, default on; `0`: off). See `placement.rs`.
    pub fault_follow: bool,
    /// While the fault thread follows a program thread, the control thread hands eviction's
    /// write-protects to it, so that their TLB flushes stay on the program's CPU
    /// (`FARMEM_PROTECT_HANDOFF`, default on; `0`: off). See `protect_handoff.rs`.
    pub protect_handoff: bool,
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
    /// Longest wait for the backend's answer to one request, in seconds, after which the
    /// program stops with an error instead of waiting for ever (`FARMEM_IO_TIMEOUT_S`;
    /// default: what the backend needs at the most, for `tcp://` 90 s plus the reconnection
    /// window).
    pub io_timeout_s: Option<f64>,
    /// A page fault unserved this long is reported on stderr by the watchdog, in seconds
    /// (`FARMEM_WATCHDOG_S`, default 20; 0: no watchdog).
    pub watchdog_s: f64,
    /// The watchdog stops the program instead of only reporting (`FARMEM_WATCHDOG_ABORT=1`;
    /// for tests, where a stall is a failure to see, not to wait out).
    pub watchdog_abort: bool,
    /// Print statistics at exit (`FARMEM_STATS=1`).
    pub stats_at_exit: bool,
    /// What the local budget covers (`FARMEM_BUDGET_SCOPE`: `regions`, the default, or
    /// `process`, which `farmem run` uses). See [`BudgetScope`].
    pub budget_scope: BudgetScope,
}

/// What the local budget covers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BudgetScope {
    /// The resident pages of far-memory regions only (a library that manages some of a
    /// program's data).
    #[default]
    Regions,
    /// The whole process's anonymous memory, as a memory cgroup's limit counts it: the
    /// regions get the budget less the rest (the runtime, stacks, memory the runtime does not
    /// manage), measured while the program runs. The far tiers' own memory is not counted,
    /// as zram's is not charged to a cgroup.
    Process,
}

impl BudgetScope {
    pub fn parse(s: &str) -> Result<BudgetScope> {
        match s.trim() {
            "regions" => Ok(BudgetScope::Regions),
            "process" => Ok(BudgetScope::Process),
            other => Err(Error::Config(format!(
                "FARMEM_BUDGET_SCOPE={other}: expected regions or process"
            ))),
        }
    }
}

/// Which far copies of a local page the far tier keeps once the page is fetched back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FarCopies {
    /// Every copy, until the page is written back again: an unchanged page is dropped at its
    /// next eviction without a write, but a page held both locally and far costs twice.
    Keep,
    /// Only the copies of pages fetched for reading and not written since (what Linux keeps
    /// in its swap cache): a copy that is outdated, or about to be (a page fetched for
    /// writing, or written in its last stay), is forgotten at once.
    Clean,
    /// None: a page leaves the far tier when it is fetched (an exclusive tier, like zswap),
    /// and every eviction writes it back. Least memory, most write-backs.
    Drop,
}

impl FarCopies {
    pub fn parse(s: &str) -> Result<FarCopies> {
        match s.trim() {
            "keep" => Ok(FarCopies::Keep),
            "clean" => Ok(FarCopies::Clean),
            "drop" => Ok(FarCopies::Drop),
            other => Err(Error::Config(format!(
                "FARMEM_FAR_COPIES={other}: expected keep, clean or drop"
            ))),
        }
    }
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
            policy: PolicyKind::Priority,
            fault_readahead: 256,
            max_readahead: 256,
            hint_pipeline: 2,
            writable_install: true,
            far_copies: None,
            fork_local_mem: None,
            tree: None,
            cgroup: None,
            compressor: Default::default(),
            fault_threads: 1,
            fault_spin_us: 50,
            fault_follow: true,
            protect_handoff: true,
            steal_after_us: 500,
            prefetch_deadline_us: 20_000,
            io_timeout_s: None,
            watchdog_s: 20.0,
            watchdog_abort: false,
            stats_at_exit: false,
            budget_scope: BudgetScope::Regions,
        }
    }
}

/// A yes/no variable: anything but `0`, `false`, `no`, `off` is yes.
fn flag(v: &str) -> bool {
    !matches!(v.trim(), "0" | "false" | "no" | "off")
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
        // One spelling, read-ahead; the variable's first name still works.
        if let Some(v) = env_num("FARMEM_MAX_READAHEAD")?.or(env_num("FARMEM_MAX_RDAHEAD")?) {
            c.max_readahead = v;
        }
        if let Some(v) = env_num("FARMEM_HINT_PIPELINE")? {
            c.hint_pipeline = v;
        }
        if let Some(v) = env_num("FARMEM_PREFETCH_DEADLINE_US")? {
            c.prefetch_deadline_us = v;
        }
        if let Some(v) = env("FARMEM_WRITABLE_INSTALL") {
            c.writable_install = flag(&v);
        }
        if let Some(v) = env("FARMEM_COMPRESSOR") {
            c.compressor = crate::backend::Codec::parse(&v)
                .map_err(|e| Error::Config(format!("FARMEM_COMPRESSOR: {e}")))?;
        }
        if let Some(v) = env("FARMEM_FORK_LOCAL_MEM") {
            c.fork_local_mem = Some(parse_budget(&v)?);
        }
        if let Some(v) = env("FARMEM_TREE").filter(|v| !v.is_empty()) {
            c.tree = Some(v.into());
        }
        if let Some(v) = env("FARMEM_CGROUP").filter(|v| !v.is_empty()) {
            c.cgroup = Some(v.into());
        }
        if let Some(v) = env("FARMEM_BUDGET_SCOPE") {
            c.budget_scope = BudgetScope::parse(&v)?;
        }
        if let Some(v) = env("FARMEM_FAR_COPIES") {
            c.far_copies = Some(FarCopies::parse(&v)?);
        }
        if let Some(v) = env_num("FARMEM_FAULT_THREADS")? {
            c.fault_threads = v;
        }
        if let Some(v) = env_num("FARMEM_FAULT_SPIN_US")? {
            c.fault_spin_us = v;
        }
        if let Some(v) = env("FARMEM_FAULT_FOLLOW") {
            c.fault_follow = flag(&v);
        }
        if let Some(v) = env("FARMEM_PROTECT_HANDOFF") {
            c.protect_handoff = flag(&v);
        }
        if let Some(v) = env_num("FARMEM_STEAL_US")? {
            c.steal_after_us = v;
        }
        if let Some(v) = env_num("FARMEM_IO_TIMEOUT_S")? {
            c.io_timeout_s = Some(v);
        }
        if let Some(v) = env_num("FARMEM_WATCHDOG_S")? {
            c.watchdog_s = v;
        }
        if let Some(v) = env("FARMEM_WATCHDOG_ABORT") {
            c.watchdog_abort = flag(&v);
        }
        if let Some(v) = env("FARMEM_STATS") {
            c.stats_at_exit = flag(&v);
        }
        c.validate()?;
        Ok(c)
    }

    /// Reject settings the runtime cannot work with, saying why.
    pub fn validate(&self) -> Result<()> {
        let min = MIN_BUDGET_PAGES * PAGE_SIZE;
        if let Some(f) = self.fork_local_mem.filter(|&f| (f as usize) < min) {
            return Err(Error::Config(format!(
                "local memory budget of forked children {f} bytes is too small: at least \
                 {min} bytes are needed"
            )));
        }
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
        if let Some(t) = self.io_timeout_s {
            if !(t > 0.0 && t <= 86400.0) {
                return Err(Error::Config(format!(
                    "I/O timeout {t} s must be more than 0 and at most 86400"
                )));
            }
        }
        if !(0.0..=86400.0).contains(&self.watchdog_s) {
            return Err(Error::Config(format!(
                "watchdog bound {} s must be between 0 (off) and 86400",
                self.watchdog_s
            )));
        }
        if self.max_readahead > 4096 || self.fault_readahead > 4096 {
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
        let want = self.free_floor_pages().max(2 * self.fault_readahead);
        want.min((self.budget_pages() / 4).max(self.effective_evict_batch()))
    }

    /// The free pages kept while no read-ahead window needs more: `free_pct` of the budget
    /// and one eviction batch (the control thread sizes the pool between this and
    /// [`Config::free_target_pages`] by the read-ahead asked for lately).
    pub fn free_floor_pages(&self) -> usize {
        let pct = (self.budget_pages() as f64 * self.free_pct / 100.0) as usize;
        pct.max(self.effective_evict_batch())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_budget_rejected() {
        let c = Config {
            local_mem: 4096,
            ..Config::default()
        };
        assert!(c.validate().is_err());
    }
}
