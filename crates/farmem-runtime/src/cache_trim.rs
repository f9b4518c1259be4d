//! Keeping a program's page cache within its budget, as a memory cgroup's limit does.
//!
//! The tree's budget covers what its cgroup is charged less the cold page cache (clean,
//! not used again: `cgroup_charge.rs`): the members cannot evict file pages, so they leave
//! out those the kernel can drop at once. But nothing drops them: the cgroup has no limit,
//! and the kernel reclaims only when the machine runs short. Under Linux's limit they are
//! the first to go, and dirty ones are written back so that they can go too. GNU sort
//! writing its 83 MiB output at half its peak held all of it dirty beside a full budget (its
//! tree peaked at 476 MiB, zram's at 433 with 2 MiB of page cache), and the pages of a file
//! read once stayed after.
//!
//! So `farmem run` watches the tree's cgroup every [`EVERY`]: when what it is charged, less
//! the far tiers' memory in the members (not charged under Linux either), exceeds the
//! budget, it asks the kernel to reclaim the excess from the cgroup's page cache; and while
//! the tree is at its budget with dirty pages, those too: a reclaim that meets only dirty
//! pages wakes the writeback threads, and once written they are clean and go at a later
//! round. The kernel chooses the pages, from the cold end of the cgroup's file LRU, as under
//! its limit. [`KEEP`] of page cache always stays.
//!
//! How the kernel is asked: cgroup v2 has `memory.reclaim`. v1 has only the limit: it is
//! lowered to the usage less the excess (the kernel reclaims until the usage fits and only
//! then sets it; the write fails when it cannot) and put back at once. Anonymous memory is
//! not taken (swappiness 0 meanwhile). An allocation in the moment the limit is low takes
//! from the page cache kept, or waits: the cgroup's OOM killer is disabled (it has no limit
//! of its own otherwise), and putting the limit back wakes the waiter.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use farmem_sys::mem::PAGE_SIZE;

use crate::cgroup_charge::{Counters, Counts};
use crate::tree_budget::TreeFile;

/// How often the cgroup is looked at: ~20 µs each time, 0.1% of a CPU. A file written at
/// 1 GB/s outgrows the budget by up to 20 MB in between.
pub const EVERY: Duration = Duration::from_millis(20);
/// Page cache never reclaimed: the hottest file pages stay (the program's own code among
/// them), and an allocation while v1's limit is low finds pages to take.
const KEEP: u64 = 4 << 20;
/// Dirty pages fewer than this are left to the writeback threads' own schedule.
const DIRTY_MIN: u64 = 4 << 20;
/// Reclaims smaller than this are not asked for.
const MIN_RECLAIM: u64 = 1 << 20;

/// Bytes of page cache to reclaim from a tree whose cgroup is charged `c`, given its budget
/// and the far tiers' memory in its members (bytes).
pub fn to_reclaim(c: Counts, budget: u64, far: u64) -> u64 {
    if budget == 0 {
        return 0;
    }
    let total = c.usage.saturating_sub(far);
    // Below its budget by more than 1/32: no pressure, as under a limit.
    if total + budget / 32 < budget {
        return 0;
    }
    let mut want = total.saturating_sub(budget);
    if c.dirty >= DIRTY_MIN {
        want += c.dirty;
    }
    let want = want.min(c.cache.saturating_sub(KEEP));
    if want < MIN_RECLAIM {
        0
    } else {
        want
    }
}

/// The trim of one tree's cgroup.
pub struct CacheTrim {
    dir: PathBuf,
    counters: Counters,
    tree: TreeFile,
    /// Rounds that asked for a reclaim, and the page cache they took (bytes).
    asked: AtomicU64,
    trimmed: AtomicU64,
}

impl CacheTrim {
    /// Watch the cgroup at `cgroup` of the tree whose budget file is `tree`.
    pub fn open(cgroup: &Path, tree: &Path) -> io::Result<CacheTrim> {
        let counters = Counters::open(cgroup)?;
        if counters.is_v1() {
            // See the module's comment: an allocation meeting the lowered limit waits.
            fs::write(cgroup.join("memory.oom_control"), "1")?;
        }
        Ok(CacheTrim {
            dir: cgroup.to_path_buf(),
            counters,
            tree: TreeFile::open(tree)?,
            asked: AtomicU64::new(0),
            trimmed: AtomicU64::new(0),
        })
    }

    /// One look at the cgroup, and a reclaim if it needs one.
    pub fn round(&self) -> io::Result<()> {
        let Some(c) = self.counters.read() else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "unreadable counters",
            ));
        };
        let (budget, far) = self.tree.budget_and_far();
        let page = PAGE_SIZE as u64;
        let want = to_reclaim(c, budget as u64 * page, far as u64 * page);
        if want == 0 {
            return Ok(());
        }
        self.asked.fetch_add(1, Ordering::Relaxed);
        if self.counters.is_v1() {
            self.reclaim_v1(want)?;
        } else {
            self.reclaim_v2(want)?;
        }
        if let Some(after) = self.counters.read() {
            let gone = c.cache.saturating_sub(after.cache);
            self.trimmed.fetch_add(gone, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Rounds that reclaimed, and the page cache that went (bytes).
    pub fn totals(&self) -> (u64, u64) {
        (
            self.asked.load(Ordering::Relaxed),
            self.trimmed.load(Ordering::Relaxed),
        )
    }

    fn reclaim_v1(&self, want: u64) -> io::Result<()> {
        let limit = self.dir.join("memory.limit_in_bytes");
        let swappiness = self.dir.join("memory.swappiness");
        let old_limit = fs::read_to_string(&limit)?;
        let old_swappiness = fs::read_to_string(&swappiness).ok();
        if old_swappiness.is_some() {
            fs::write(&swappiness, "0")?;
        }
        let usage = self.counters.read().map_or(0, |c| c.usage);
        // EBUSY: the kernel could not reclaim that much (dirty pages, which it has now
        // asked to be written). The limit stays as it was.
        let lowered = fs::write(&limit, usage.saturating_sub(want).to_string());
        let restored = fs::write(&limit, old_limit.trim());
        if let Some(s) = old_swappiness {
            let _ = fs::write(&swappiness, s.trim());
        }
        restored?;
        match lowered {
            Err(e) if e.raw_os_error() != Some(libc::EBUSY) => Err(e),
            _ => Ok(()),
        }
    }

    fn reclaim_v2(&self, want: u64) -> io::Result<()> {
        let reclaim = self.dir.join("memory.reclaim");
        // Kernels before 6.11 do not take the swappiness key.
        let r = match fs::write(&reclaim, format!("{want} swappiness=0")) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                fs::write(&reclaim, want.to_string())
            }
            r => r,
        };
        match r {
            // EAGAIN: less than asked could be reclaimed.
            Err(e) if e.raw_os_error() != Some(libc::EAGAIN) => Err(e),
            _ => Ok(()),
        }
    }
}

/// The trim running in a thread of its own, stopped (and joined) when dropped.
pub struct Trimming {
    trim: Arc<CacheTrim>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Trimming {
    pub fn start(trim: CacheTrim) -> io::Result<Trimming> {
        let trim = Arc::new(trim);
        let stop = Arc::new(AtomicBool::new(false));
        let (t, s) = (trim.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("farmem-trim".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    if let Err(e) = t.round() {
                        // The cgroup went (the program ended) or refuses: stop trying.
                        tracing::debug!("page cache trim of {}: {e}", t.dir.display());
                        return;
                    }
                    std::thread::sleep(EVERY);
                }
            })?;
        Ok(Trimming {
            trim,
            stop,
            thread: Some(thread),
        })
    }

    /// Rounds that reclaimed, and the page cache that went (bytes).
    pub fn totals(&self) -> (u64, u64) {
        self.trim.totals()
    }
}

impl Drop for Trimming {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn counts(usage: u64, cache: u64, dirty: u64) -> Counts {
        Counts {
            usage: usage * MIB,
            cache: cache * MIB,
            dirty: dirty * MIB,
            inactive: cache * MIB,
        }
    }

    #[test]
    fn page_cache_beyond_the_budget_is_reclaimed_and_some_always_stays() {
        // 100 MiB budget, 30 MiB far: 120 charged of which 20 is clean cache over it.
        assert_eq!(
            to_reclaim(counts(150, 20, 0), 100 * MIB, 30 * MIB),
            16 * MIB
        );
        assert_eq!(
            to_reclaim(counts(140, 20, 0), 100 * MIB, 30 * MIB),
            10 * MIB
        );
        // Within the budget: nothing, even with cache.
        assert_eq!(to_reclaim(counts(120, 20, 0), 100 * MIB, 30 * MIB), 0);
        // No budget known yet.
        assert_eq!(to_reclaim(counts(150, 20, 0), 0, 30 * MIB), 0);
        // Too little to bother.
        assert_eq!(to_reclaim(counts(130, 5, 0), 100 * MIB, 30 * MIB), 0);
    }

    #[test]
    fn dirty_pages_are_pushed_out_only_at_the_budget() {
        // At the budget with 40 MiB dirty: all of it asked for (the reclaim wakes the
        // writeback), less what is kept.
        assert_eq!(to_reclaim(counts(100, 40, 40), 100 * MIB, 0), 36 * MIB);
        // Within 1/32 of it: still at it.
        assert_eq!(to_reclaim(counts(98, 40, 40), 100 * MIB, 0), 36 * MIB);
        // Far below it: the writeback threads' own schedule.
        assert_eq!(to_reclaim(counts(80, 40, 40), 100 * MIB, 0), 0);
        // A few dirty pages are left alone.
        assert_eq!(to_reclaim(counts(100, 40, 3), 100 * MIB, 0), 0);
    }
}
