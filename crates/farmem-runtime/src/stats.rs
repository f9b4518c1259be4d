//! Runtime statistics: relaxed atomic counters plus latency histograms.
//!
//! The inline hint fast path (a present page) is deliberately not counted: counting would add
//! a store to every hint. "Hint hits" counts hints that reached the runtime and found their
//! pages present after all (another thread fetched them, or `FM_SEQ` repeated a page).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use hdrhistogram::Histogram;
use parking_lot::Mutex;

/// The file, in `FARMEM_STATS_DIR`, where each process of a `farmem run` appends its
/// statistics at exit: one JSON line (`pid`, `peak_rss_bytes`, `backend`, `stats`).
pub const STATS_FILE: &str = "stats.jsonl";

macro_rules! counters {
    ($($name:ident: $doc:literal),* $(,)?) => {
        /// Live counters of one runtime.
        #[derive(Default)]
        pub struct Counters { $(#[doc = $doc] pub $name: AtomicU64,)* }

        /// A copy of the counters and latency summaries (C: `struct fm_stats`).
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct StatsSnapshot {
            $(#[doc = $doc] pub $name: u64,)*
            /// Local memory budget, bytes.
            pub budget_bytes: u64,
            /// Pages resident (or reserved for an in-flight fetch) now.
            pub resident_pages: u64,
            /// Most pages ever resident at once.
            pub peak_resident_pages: u64,
            /// Bytes the backend uses for the pages it holds.
            pub backend_bytes: u64,
            /// Read-ahead windows in flight now.
            pub prefetch_inflight: u64,
            /// Fetch latency (lock to installed, one run of pages), nanoseconds.
            pub fetch_p50_ns: u64,
            pub fetch_p99_ns: u64,
            pub fetch_max_ns: u64,
            /// Eviction latency per batch (victims to unmapped), nanoseconds.
            pub evict_p50_ns: u64,
            pub evict_p99_ns: u64,
            pub evict_max_ns: u64,
            /// Pages the far tier holds (0 when it does not count them).
            pub far_pages: u64,
            /// Memory the far tier holds for them: stored bytes with slack and bookkeeping.
            pub far_held_bytes: u64,
            /// Bytes of them in a file on disk.
            pub far_file_bytes: u64,
            /// The process's anonymous memory outside far memory and the far tiers, counted
            /// within the budget ([`crate::BudgetScope::Process`]; else 0).
            pub other_bytes: u64,
            /// Memory the process tree's cgroup is charged that no process of the tree
            /// counts (page tables, processes farmem does not run, dirty file pages), taken
            /// from the tree's budget (`FARMEM_CGROUP`; else 0).
            pub tree_uncounted_bytes: u64,
            /// Pages the reclaim policy holds in protected bands now (`policy/dueling.rs`).
            pub protected_pages: u64,
        }

        impl Counters {
            /// Back to zero (a forked child counts its own work only).
            pub(crate) fn reset(&self) {
                $(self.$name.store(0, Ordering::Relaxed);)*
            }

            fn load_into(&self, s: &mut StatsSnapshot) {
                $(s.$name = self.$name.load(Ordering::Relaxed);)*
            }

            fn fields(s: &StatsSnapshot) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), s.$name),)*]
            }
        }
    };
}

counters! {
    hint_calls: "Hints that missed the inline fast path and entered the runtime.",
    hint_hits: "Of those, hints whose pages turned out present (no fetch).",
    hint_misses: "Hints that fetched or write-enabled at least one page.",
    unhinted_faults: "Page faults delivered through userfaultfd (missing or write-protect).",
    wp_faults: "Write-protect resolutions (first write to a page installed read-only).",
    stolen_faults: "Faults served by the control thread because the fault thread was busy.",
    spurious_faults: "Faults found already resolved when served (woken only).",
    zero_fills: "Pages materialized as zeros without backend I/O.",
    pages_fetched: "Pages read from the backend.",
    readahead_pages: "Pages installed beyond the one demanded (a hint's read-ahead or a fault's).",
    pages_installed: "Pages mapped (fetched plus zero-filled).",
    install_ioctls: "UFFDIO_COPY calls made to install pages.",
    unverified_installs: "Pages installed writable without write tracking (written last time, or zero fills): their first write costs no fault.",
    verified_unchanged: "Unverified pages found equal to their far copy at eviction (dropped without a write-back).",
    verified_zero: "Unverified pages found all zeros at eviction (dropped as never written).",
    pages_evicted: "Pages unmapped by reclaim.",
    pages_written_back: "Dirty pages written to the backend.",
    clean_drops: "Pages dropped without I/O (clean, or never written).",
    unmap_syscalls: "Syscalls made to unmap evicted pages.",
    direct_reclaims: "Reclaim batches run by a faulting thread because no budget was free.",
    backend_full: "Write-backs refused by a full far tier (pages kept local).",
    over_budget_pages: "Pages taken beyond the local budget because nothing could be evicted (the far tier refused pages, or no resident page could be evicted for 100 ms).",
    prefetch_batches: "Read-ahead windows fetched asynchronously ahead of sequential hints.",
    prefetch_pages: "Pages in those windows.",
    prefetch_late: "Windows reached before their data had arrived (the scan waited).",
    prefetch_swept: "Windows nobody came back for, installed by the control thread.",
    bytes_read: "Bytes read from the backend.",
    bytes_written: "Bytes written to the backend.",
    fetch_ns_total: "Total time spent fetching (all threads), nanoseconds.",
    pages_discarded: "Pages discarded (munmap, MADV_DONTNEED, allocator purge): read as zeros again.",
    fork_fetched_pages: "Far pages brought back before a fork so that the child sees them.",
    fault_predicted_pages: "Pages the fault predictor asked to read ahead.",
    fault_prefetch_used: "Of those, pages their stream then read without a fault (inferred).",
    fault_prefetch_wasted: "Of those, pages left behind by a broken run (inferred).",
    recent_refaults: "Pages a fault brought back less than one budget of evictions after their eviction (the working set: recency policies keep them a pass longer).",
    prefetch_dropped_late: "Read-ahead pages the far tier dropped unread: they could not arrive before their stream passed them.",
    watchdog_reports: "Page faults the watchdog reported as waiting longer than FARMEM_WATCHDOG_S.",
    fault_thread_moves: "Moves of the fault thread to the CPU of the thread whose faults it serves.",
    follow_pauses: "Times the fault thread stopped following the faulting threads (they fault on several CPUs, or it starved beside a busy thread).",
    protect_handoffs: "Evictions whose write-protects the fault thread made on the program's CPU for the control thread.",
    protect_handoffs_withdrawn: "Of those offered, the ones the fault thread did not take in time (the control thread made them).",
    neighbour_reads: "Next pages read with an unpredicted fault because, on sample faults, the next page faulted soon after (objects straddling pages).",
    blocks_compacted: "Blocks of the in-process store moved out of sparse chunks so that those could be given back (compaction).",
    room_waits: "Times a thread needing budget found none free and nothing it could evict, and waited (the process then counts as pressed in its tree's budget).",
}

pub(crate) struct Stats {
    pub c: Counters,
    fetch_ns: Mutex<Histogram<u64>>,
    evict_ns: Mutex<Histogram<u64>>,
    pub peak_resident: AtomicU64,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 2).expect("histogram bounds")
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            c: Counters::default(),
            fetch_ns: Mutex::new(histogram()),
            evict_ns: Mutex::new(histogram()),
            peak_resident: AtomicU64::new(0),
        }
    }
}

#[inline]
pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl Stats {
    /// Record a batch of fetch latencies (drained from the per-thread queues, `book.rs`).
    pub fn record_fetches(&self, ns: &[u64]) {
        if ns.is_empty() {
            return;
        }
        add(&self.c.fetch_ns_total, ns.iter().sum());
        let mut h = self.fetch_ns.lock();
        for &n in ns {
            let _ = h.record(n.max(1));
        }
    }

    pub fn record_evict(&self, ns: u64) {
        let _ = self.evict_ns.lock().record(ns.max(1));
    }

    pub fn note_resident(&self, now: u64) {
        self.peak_resident.fetch_max(now, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let mut s = StatsSnapshot::default();
        self.c.load_into(&mut s);
        s.peak_resident_pages = self.peak_resident.load(Ordering::Relaxed);
        {
            let h = self.fetch_ns.lock();
            if !h.is_empty() {
                s.fetch_p50_ns = h.value_at_quantile(0.5);
                s.fetch_p99_ns = h.value_at_quantile(0.99);
                s.fetch_max_ns = h.max();
            }
        }
        let h = self.evict_ns.lock();
        if !h.is_empty() {
            s.evict_p50_ns = h.value_at_quantile(0.5);
            s.evict_p99_ns = h.value_at_quantile(0.99);
            s.evict_max_ns = h.max();
        }
        s
    }
}

impl StatsSnapshot {
    /// Every counter by name, for tools that print or export them.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        Counters::fields(self)
    }

    /// Every field by name: the counters, then the gauges and latency summaries.
    pub fn fields(&self) -> Vec<(&'static str, u64)> {
        let mut v = self.counters();
        v.extend([
            ("budget_bytes", self.budget_bytes),
            ("resident_pages", self.resident_pages),
            ("peak_resident_pages", self.peak_resident_pages),
            ("backend_bytes", self.backend_bytes),
            ("prefetch_inflight", self.prefetch_inflight),
            ("fetch_p50_ns", self.fetch_p50_ns),
            ("fetch_p99_ns", self.fetch_p99_ns),
            ("fetch_max_ns", self.fetch_max_ns),
            ("evict_p50_ns", self.evict_p50_ns),
            ("evict_p99_ns", self.evict_p99_ns),
            ("evict_max_ns", self.evict_max_ns),
            ("far_pages", self.far_pages),
            ("far_held_bytes", self.far_held_bytes),
            ("far_file_bytes", self.far_file_bytes),
            ("other_bytes", self.other_bytes),
            ("tree_uncounted_bytes", self.tree_uncounted_bytes),
            ("protected_pages", self.protected_pages),
        ]);
        v
    }

    /// The fields as one flat JSON object (integers only, so no escaping is needed).
    pub fn to_json(&self) -> String {
        let body: Vec<String> = self
            .fields()
            .iter()
            .map(|(k, v)| format!("\"{k}\":{v}"))
            .collect();
        format!("{{{}}}", body.join(","))
    }
}

impl StatsSnapshot {
    /// Unhinted prefetch accuracy: predicted pages used / predicted pages whose fate is known
    /// (inferred from the fault streams; pages of runs still going are not counted yet).
    pub fn prefetch_accuracy(&self) -> Option<f64> {
        let known = self.fault_prefetch_used + self.fault_prefetch_wasted;
        (known > 0).then(|| self.fault_prefetch_used as f64 / known as f64)
    }

    /// Unhinted prefetch coverage: faults avoided by prefetching / faults there would have
    /// been without it (the avoided ones plus those that happened).
    pub fn prefetch_coverage(&self) -> Option<f64> {
        let all = self.fault_prefetch_used + self.unhinted_faults;
        (self.fault_predicted_pages > 0 && all > 0)
            .then(|| self.fault_prefetch_used as f64 / all as f64)
    }
}

impl StatsSnapshot {
    /// What the far tier holds against the pages' own size, in one line: `N pages (raw MiB)
    /// in stored MiB (ratio), memory held MiB, saving MiB`.
    pub fn far_store_line(&self) -> String {
        let raw = self.far_pages * 4096;
        let ratio = if self.backend_bytes > 0 {
            raw as f64 / self.backend_bytes as f64
        } else {
            0.0
        };
        format!(
            "{} pages ({:.1} MiB) kept in {:.1} MiB ({ratio:.2}:1), memory held {:.1} MiB, \
             saving {:.1} MiB",
            self.far_pages,
            mib(raw),
            mib(self.backend_bytes),
            mib(self.far_held_bytes),
            (raw as f64 - self.far_held_bytes as f64) / (1u64 << 20) as f64
        )
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

impl fmt::Display for StatsSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "farmem statistics")?;
        writeln!(
            f,
            "  local budget        {:>12.1} MiB   resident now {:.1} MiB, peak {:.1} MiB",
            mib(self.budget_bytes),
            mib(self.resident_pages * 4096),
            mib(self.peak_resident_pages * 4096)
        )?;
        if self.other_bytes > 0 {
            writeln!(
                f,
                "  of the budget, the process's other memory {:.1} MiB",
                mib(self.other_bytes)
            )?;
        }
        writeln!(
            f,
            "  backend holds       {:>12.1} MiB   read-ahead windows in flight {}",
            mib(self.backend_bytes),
            self.prefetch_inflight
        )?;
        if self.far_pages > 0 {
            writeln!(f, "  far store           {}", self.far_store_line())?;
        }
        for (name, v) in self.counters() {
            if name.ends_with("_ns_total") {
                writeln!(f, "  {:<20}{:>12.3} s", "fetch time", v as f64 / 1e9)?;
            } else if name.starts_with("bytes_") {
                writeln!(f, "  {:<20}{:>12.1} MiB", name, mib(v))?;
            } else {
                writeln!(f, "  {:<20}{:>12}", name, v)?;
            }
        }
        if let (Some(a), Some(c)) = (self.prefetch_accuracy(), self.prefetch_coverage()) {
            writeln!(
                f,
                "  unhinted prefetch   accuracy {:.1}%  coverage {:.1}%",
                a * 100.0,
                c * 100.0
            )?;
        }
        writeln!(
            f,
            "  fetch latency       p50 {:.1} µs  p99 {:.1} µs  max {:.1} µs",
            self.fetch_p50_ns as f64 / 1e3,
            self.fetch_p99_ns as f64 / 1e3,
            self.fetch_max_ns as f64 / 1e3
        )?;
        write!(
            f,
            "  evict batch latency p50 {:.1} µs  p99 {:.1} µs  max {:.1} µs",
            self.evict_p50_ns as f64 / 1e3,
            self.evict_p99_ns as f64 / 1e3,
            self.evict_max_ns as f64 / 1e3
        )
    }
}
