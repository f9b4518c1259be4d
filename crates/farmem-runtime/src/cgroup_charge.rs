//! What the memory cgroup of a process tree is charged for, read by every member of the
//! tree's budget (`FARMEM_CGROUP`; `farmem run` makes the cgroup when it can).
//!
//! The members' own counts (`tree_budget.rs`) miss what a cgroup's limit covers besides
//! their anonymous memory: page tables and other kernel memory, processes of the tree that
//! farmem does not run (a shell, a load client), and pages shared copy-on-write, which the
//! members can only estimate. Linux swap's cgroup counts all of it, so a budget that does not
//! leaves more memory local than the same limit does under Linux: memcached at half its peak
//! used 546 MiB where zram used 527 (3 MiB of page tables, a client, the runtime's memory).
//! The cgroup's count less its cold page cache and less the far tiers' memory in the
//! members (not charged, as zram's is not) is the tree's charge, exact and at once.
//!
//! Which page cache is cold: clean pages not used again since they came in (the kernel's
//! inactive file list), what a limit reclaims first. `farmem run` reclaims them once the
//! tree is over its budget (`cache_trim.rs`). Dirty file pages count: a file being written
//! (sqlite's sort spilling to a temporary file, 32 MiB of it dirty at a 63 MiB budget) holds
//! its memory until written back, and under Linux's limit that memory is taken from the
//! program's own; uncounted, it put sqlite's peak at 155-159 MiB where zram's was 140. So do
//! clean pages in use again (that temporary file read back): with them uncounted, the
//! program's own memory grew into their room while they stayed, and sqlite peaked 6-8 MiB
//! higher.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use farmem_sys::mem::PAGE_SIZE;

/// The cgroup's counters, open, read by a member of the tree.
pub struct CgroupCharge {
    counters: Counters,
}

/// A cgroup's memory counters, open (by a member, or by `farmem run` watching its tree).
pub struct Counters {
    /// `memory.usage_in_bytes` (v1) or `memory.current` (v2): everything charged.
    usage: File,
    /// `memory.stat`, for the page cache and its dirty part.
    stat: File,
    keys: &'static StatKeys,
}

/// What a cgroup is charged, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Everything charged.
    pub usage: u64,
    /// Its page cache, dirty or clean.
    pub cache: u64,
    /// Of the page cache, dirty or being written back.
    pub dirty: u64,
    /// Of the page cache, on the inactive list (not used again since it came in).
    pub inactive: u64,
}

impl Counts {
    /// Page cache that is clean (reclaimable at once).
    pub fn clean(&self) -> u64 {
        self.cache.saturating_sub(self.dirty)
    }

    /// Page cache that a limit would reclaim first: clean and not used again since it came
    /// in (at most; the kernel does not say which inactive pages are the dirty ones).
    pub fn cold(&self) -> u64 {
        self.clean().min(self.inactive)
    }
}

/// The names of the page cache's counters in `memory.stat`.
struct StatKeys {
    /// cgroup v1's names (v2's otherwise).
    v1: bool,
    cache: &'static str,
    dirty: &'static str,
    writeback: &'static str,
}

static V1_KEYS: StatKeys = StatKeys {
    v1: true,
    cache: "cache",
    dirty: "dirty",
    writeback: "writeback",
};
static V2_KEYS: StatKeys = StatKeys {
    v1: false,
    cache: "file",
    dirty: "file_dirty",
    writeback: "file_writeback",
};
/// The same name in both.
const INACTIVE_KEY: &str = "inactive_file";

impl Counters {
    /// Open the counters of the cgroup at `dir` (v1 or v2).
    pub fn open(dir: &Path) -> io::Result<Counters> {
        let (usage, keys) = match File::open(dir.join("memory.usage_in_bytes")) {
            Ok(f) => (f, &V1_KEYS),
            Err(_) => (File::open(dir.join("memory.current"))?, &V2_KEYS),
        };
        let stat = File::open(dir.join("memory.stat"))?;
        // Out of the program's way (it may close every descriptor it did not open).
        let c = Counters {
            usage: farmem_sys::fds::keep(usage),
            stat: farmem_sys::fds::keep(stat),
            keys,
        };
        c.read()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unreadable counters"))?;
        Ok(c)
    }

    /// A cgroup v1 (`memory.usage_in_bytes`), not v2.
    pub fn is_v1(&self) -> bool {
        self.keys.v1
    }

    /// The counters now: ~10 µs, two reads.
    pub fn read(&self) -> Option<Counts> {
        let usage: u64 = read_at_start(&self.usage)?.trim().parse().ok()?;
        let stat = read_at_start(&self.stat)?;
        let field = |key: &str| -> Option<u64> {
            stat.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse().ok())?
            })
        };
        let cache = field(self.keys.cache)?;
        // A kernel without the dirty counters: all of the cache is taken as clean.
        let dirty = field(self.keys.dirty).unwrap_or(0) + field(self.keys.writeback).unwrap_or(0);
        // A kernel without it: all of the cache is taken as inactive.
        let inactive = field(INACTIVE_KEY).unwrap_or(cache);
        Some(Counts {
            usage,
            cache,
            dirty: dirty.min(cache),
            inactive: inactive.min(cache),
        })
    }
}

impl CgroupCharge {
    /// Open the counters of the cgroup at `dir`, which must hold this process: a cgroup the
    /// process is not in would count others' memory (or none) as the tree's.
    pub fn open(dir: &Path) -> io::Result<CgroupCharge> {
        let me = std::process::id().to_string();
        let procs = std::fs::read_to_string(dir.join("cgroup.procs"))?;
        if !procs.lines().any(|l| l.trim() == me) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("this process ({me}) is not in the cgroup"),
            ));
        }
        Ok(CgroupCharge {
            counters: Counters::open(dir)?,
        })
    }

    /// Pages charged to the cgroup less its cold page cache (what a budget of anonymous
    /// memory and of file pages in use compares with): ~10 µs, two reads.
    pub fn pages(&self) -> Option<usize> {
        let c = self.counters.read()?;
        Some((c.usage.saturating_sub(c.cold()) / PAGE_SIZE as u64) as usize)
    }
}

/// The file's text from its start (a cgroup file is generated again at each read from 0).
fn read_at_start(f: &File) -> Option<String> {
    let mut buf = vec![0u8; 4096];
    let mut n = 0;
    loop {
        let got = f.read_at(&mut buf[n..], n as u64).ok()?;
        if got == 0 {
            break;
        }
        n += got;
        if n == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
    }
    buf.truncate(n);
    String::from_utf8(buf).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_of_a_cgroup_this_process_is_not_in_are_refused() {
        // A directory shaped like a v1 cgroup, without this process in it.
        let d = std::env::temp_dir().join(format!("farmem-cg-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("memory.usage_in_bytes"), "104857600\n").unwrap();
        std::fs::write(d.join("memory.stat"), "cache 4096\nrss 104853504\n").unwrap();
        std::fs::write(d.join("cgroup.procs"), "1\n").unwrap();
        assert!(CgroupCharge::open(&d).is_err());
        std::fs::write(
            d.join("cgroup.procs"),
            format!("1\n{}\n", std::process::id()),
        )
        .unwrap();
        let c = CgroupCharge::open(&d).unwrap();
        assert_eq!(c.pages(), Some((104857600 - 4096) / PAGE_SIZE));
        // Dirty and written-back file pages count; clean ones do not.
        std::fs::write(
            d.join("memory.stat"),
            "cache 40960\nrss 104816640\ndirty 8192\nwriteback 4096\ntotal_dirty 4096\n",
        )
        .unwrap();
        assert_eq!(c.pages(), Some((104857600 - 28672) / PAGE_SIZE));
        // Clean pages in use again (on the active list) count too: 8 KiB of the clean
        // 28 are inactive.
        std::fs::write(
            d.join("memory.stat"),
            "cache 40960\nrss 104816640\ndirty 8192\nwriteback 4096\ninactive_file 8192\n",
        )
        .unwrap();
        assert_eq!(c.pages(), Some((104857600 - 8192) / PAGE_SIZE));
        // v2's names.
        std::fs::remove_file(d.join("memory.usage_in_bytes")).unwrap();
        std::fs::write(d.join("memory.current"), "16384\n").unwrap();
        std::fs::write(
            d.join("memory.stat"),
            "anon 4096\nfile 12288\nfile_dirty 4096\nfile_writeback 0\n",
        )
        .unwrap();
        assert_eq!(CgroupCharge::open(&d).unwrap().pages(), Some(2));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
