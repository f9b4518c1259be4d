//! The memory limit both sides of a comparison get.

/// Memory a program needs besides its data (binary, libraries, stacks, page tables, and under
/// farmem the runtime's own): added to the local share of its native peak to make the limit
/// both sides get, the memory cgroup's for Linux swap and `--local-mem` for farmem (whose
/// budget, like the cgroup's limit, covers all of the program's anonymous memory). Without
/// it a program at "100%" of its peak has less than it ever used under farmem: sort with a
/// 150.7 MiB budget (its peak resident set, of which 149.1 MiB anonymous) evicted and
/// refetched 5,400 pages and took 2.3 s against 1.5 s natively, and none at 156 MiB.
pub const PROCESS_ALLOWANCE: u64 = 8 << 20;

/// The limit of a run at `pct` percent of a native peak of `peak` bytes.
pub fn limit(peak: u64, pct: f64) -> u64 {
    (peak as f64 * pct / 100.0) as u64 + PROCESS_ALLOWANCE
}
