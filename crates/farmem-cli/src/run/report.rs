//! The summary of a `farmem run`: what the program cost in local memory, faults and moves.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Map, Value};

pub struct Report {
    pid: i32,
    status: i32,
    wall: Duration,
    /// Peak resident set of the program's main process (from wait4), bytes.
    peak_rss: u64,
    local_mem: Option<u64>,
    /// The main process's statistics, if it exited (the library writes them at `exit`, and
    /// its control thread at `_exit`); else those of the largest process it executed, if any
    /// did (`stand_in`).
    main: Option<Map<String, Value>>,
    /// The process whose statistics stand in for the main process's: the largest other
    /// process, when the main one wrote none (killed) or ended with `_exit` (a shell's end:
    /// `sh -c 'prog < file'` is how programs are run).
    stand_in: Option<i32>,
    /// Other processes of the program (forked or executed children), summed.
    others: BTreeMap<String, u64>,
    n_others: usize,
    backend: String,
    /// Reclaims of the tree's page cache and the bytes they took (`cache_trim`).
    pub trimmed: Option<(u64, u64)>,
}

fn stat(m: &Map<String, Value>, k: &str) -> u64 {
    m.get(k).and_then(Value::as_u64).unwrap_or(0)
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

impl Report {
    pub fn collect(
        dir: &Path,
        pid: i32,
        status: i32,
        wall: Duration,
        ru: &libc::rusage,
        local_mem: Option<u64>,
    ) -> Report {
        let mut r = Report {
            pid,
            status,
            wall,
            peak_rss: ru.ru_maxrss as u64 * 1024,
            local_mem,
            main: None,
            stand_in: None,
            others: BTreeMap::new(),
            n_others: 0,
            backend: String::new(),
            trimmed: None,
        };
        let Ok(text) = std::fs::read_to_string(dir.join(farmem_runtime::STATS_FILE)) else {
            return r;
        };
        // Each process's line, the last one where a process id wrote twice (one reused).
        let mut lines: BTreeMap<i32, Map<String, Value>> = BTreeMap::new();
        for line in text.lines() {
            // A line cut short (a process killed in its write) is not JSON: skipped.
            let Ok(Value::Object(v)) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            if let Some(p) = v.get("pid").and_then(Value::as_i64) {
                lines.insert(p as i32, v);
            }
        }
        // (pid, peak resident set, backend, statistics) of the other processes.
        let mut others = Vec::new();
        // The main process's line when it ended with `_exit`: a shell's end, whose statistics
        // say little about the program it ran (`sh -c 'prog < file'`).
        let mut main_at_underscore_exit = None;
        for (p, v) in lines {
            let stats = v
                .get("stats")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let backend: String = v
                .get("backend")
                .and_then(Value::as_str)
                .unwrap_or("")
                .into();
            let peak = v.get("peak_rss_bytes").and_then(Value::as_u64).unwrap_or(0);
            if p == pid && v.get("ended").and_then(Value::as_str) == Some("_exit") {
                main_at_underscore_exit = Some((p, peak, backend, stats));
            } else if p == pid {
                r.backend = backend;
                r.main = Some(stats);
            } else {
                others.push((p, peak, backend, stats));
            }
        }
        if r.main.is_none() {
            // The largest other process stands in for a main process that wrote nothing or
            // ended with `_exit` (which then counts among the others).
            if let Some(i) = (0..others.len()).max_by_key(|&i| (others[i].1, -others[i].0)) {
                let (p, _, backend, stats) = others.swap_remove(i);
                r.stand_in = Some(p);
                r.backend = backend;
                r.main = Some(stats);
                others.extend(main_at_underscore_exit.take());
            } else if let Some((_, _, backend, stats)) = main_at_underscore_exit.take() {
                r.backend = backend;
                r.main = Some(stats);
            }
        }
        r.n_others = others.len();
        for (_, _, _, stats) in others {
            for (k, val) in stats {
                let val = val.as_u64().unwrap_or(0);
                let e = r.others.entry(k.clone()).or_default();
                *e = if summed_over_processes(&k) {
                    *e + val
                } else {
                    (*e).max(val)
                };
            }
        }
        r
    }

    fn outcome(&self) -> String {
        if libc::WIFEXITED(self.status) {
            format!("exit status {}", libc::WEXITSTATUS(self.status))
        } else if libc::WIFSIGNALED(self.status) {
            format!("killed by signal {}", libc::WTERMSIG(self.status))
        } else {
            format!("wait status {:#x}", self.status)
        }
    }

    pub fn human(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "farmem run: {} after {:.2} s",
            self.outcome(),
            self.wall.as_secs_f64()
        );
        let Some(m) = &self.main else {
            let _ = writeln!(
                o,
                "  no statistics: the program was killed, or its runtime was too busy to \
                 write them at _exit"
            );
            let _ = writeln!(
                o,
                "  peak resident set      {:>10.1} MiB",
                mib(self.peak_rss)
            );
            return o;
        };
        let pages = |k: &str| stat(m, k);
        if let Some(p) = self.stand_in {
            let _ = writeln!(
                o,
                "  statistics of process {p}, the largest the program ran: the program itself \
                 ended with _exit (a shell's end) or was killed"
            );
        }
        let _ = writeln!(
            o,
            "  local budget           {:>10.1} MiB   backend {}",
            mib(stat(m, "budget_bytes")),
            self.backend
        );
        let _ = writeln!(
            o,
            "  peak far-heap resident {:>10.1} MiB   peak resident set (whole process) {:.1} MiB",
            mib(pages("peak_resident_pages") * 4096),
            mib(self.peak_rss)
        );
        if stat(m, "other_bytes") > 0 {
            let _ = writeln!(
                o,
                "  of the budget, the program's other memory at the end {:.1} MiB (stacks, the \
                 runtime, memory it does not manage)",
                mib(stat(m, "other_bytes"))
            );
        }
        if stat(m, "tree_uncounted_bytes") > 0 {
            let _ = writeln!(
                o,
                "  of the budget, the tree's memory no process counts {:.1} MiB (its cgroup's \
                 page tables, processes farmem does not run, files written and not yet on disk)",
                mib(stat(m, "tree_uncounted_bytes"))
            );
        }
        if stat(m, "protected_pages") > 0 {
            let _ = writeln!(
                o,
                "  protected band at the end {:>7.1} MiB (the program sweeps more than its budget: \
                 part of what it sweeps stays local)",
                mib(stat(m, "protected_pages") * 4096)
            );
        }
        if let Some((n, bytes)) = self.trimmed.filter(|t| t.0 > 0) {
            let _ = writeln!(
                o,
                "  page cache reclaimed   {:>10.1} MiB in {n} rounds (the tree's files beyond its budget)",
                mib(bytes)
            );
        }
        let far = pages("far_pages");
        if far > 0 {
            let (stored, held) = (pages("backend_bytes"), pages("far_held_bytes"));
            let _ = writeln!(
                o,
                "  far store at the end   {:>10.1} MiB of pages kept in {:.1} MiB ({:.2}:1), \
                 memory held {:.1} MiB: {:.1} MiB saved",
                mib(far * 4096),
                mib(stored),
                (far * 4096) as f64 / stored.max(1) as f64,
                mib(held),
                mib(far * 4096) - mib(held)
            );
        }
        let _ = writeln!(
            o,
            "  faults                 {:>10} unhinted  {} hinted (hints that fetched)",
            pages("unhinted_faults"),
            pages("hint_misses")
        );
        let _ = writeln!(
            o,
            "  pages                  {:>10} fetched  {} zero-filled  {} evicted  {} written back",
            pages("pages_fetched"),
            pages("zero_fills"),
            pages("pages_evicted"),
            pages("pages_written_back")
        );
        let _ = writeln!(
            o,
            "  bytes moved            {:>10.1} MiB read  {:.1} MiB written",
            mib(pages("bytes_read")),
            mib(pages("bytes_written"))
        );
        let _ = writeln!(
            o,
            "  time in faults         {:>10.3} s (fetching, all threads)",
            pages("fetch_ns_total") as f64 / 1e9
        );
        let (used, wasted) = (pages("fault_prefetch_used"), pages("fault_prefetch_wasted"));
        if used + wasted > 0 {
            let faults = pages("unhinted_faults");
            let _ = writeln!(
                o,
                "  unhinted prefetch      {:>10} pages predicted  accuracy {:.1}%  coverage {:.1}%",
                pages("fault_predicted_pages"),
                100.0 * used as f64 / (used + wasted) as f64,
                100.0 * used as f64 / (used + faults).max(1) as f64
            );
        }
        if pages("fork_fetched_pages") > 0 {
            let _ = writeln!(
                o,
                "  fork                   {:>10} far pages brought back for forked children",
                pages("fork_fetched_pages")
            );
        }
        if pages("over_budget_pages") > 0 {
            let _ = writeln!(
                o,
                "  beyond the budget      {:>10} pages kept local (far memory refused them, or \
                 nothing could be evicted for 100 ms)",
                pages("over_budget_pages")
            );
        }
        if self.n_others > 0 {
            let _ = writeln!(
                o,
                "  + {} other process(es) it forked or executed: {} faults, {} pages evicted, \
                 {:.1} MiB moved",
                self.n_others,
                self.others.get("unhinted_faults").copied().unwrap_or(0),
                self.others.get("pages_evicted").copied().unwrap_or(0),
                mib(self.others.get("bytes_read").copied().unwrap_or(0)
                    + self.others.get("bytes_written").copied().unwrap_or(0))
            );
        }
        o
    }

    pub fn json(&self) -> String {
        let v = json!({
            "pid": self.pid,
            "outcome": self.outcome(),
            "exit_code": libc::WIFEXITED(self.status).then(|| libc::WEXITSTATUS(self.status)),
            "signal": libc::WIFSIGNALED(self.status).then(|| libc::WTERMSIG(self.status)),
            "wall_s": self.wall.as_secs_f64(),
            "local_mem_bytes": self.local_mem,
            "peak_rss_bytes": self.peak_rss,
            "backend": self.backend,
            "stats": self.main,
            "stats_pid": self.stand_in.unwrap_or(self.pid),
            "other_processes": self.n_others,
            "other_stats": self.others,
            "page_cache_trims": self.trimmed.map(|t| t.0),
            "page_cache_trimmed_bytes": self.trimmed.map(|t| t.1),
        });
        serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
    }
}

/// Whether the other processes' values of statistic `key` add up (counts) or not: a
/// latency's quantiles and maximum, a budget, and what the whole tree holds are the
/// largest over the processes (the sum of 91 compilers' median fetch times is no time).
fn summed_over_processes(key: &str) -> bool {
    !(key.ends_with("_p50_ns")
        || key.ends_with("_p99_ns")
        || key.ends_with("_max_ns")
        || key == "budget_bytes"
        || key == "tree_uncounted_bytes")
}
