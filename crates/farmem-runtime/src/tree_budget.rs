//! One budget for a whole process tree, as one memory cgroup's limit covers every process in
//! it (`farmem run`'s default).
//!
//! Without it each process had a budget of its own: a parent with two forked workers held
//! three budgets, and `bench programs`' python3 multiprocessing job used 1.9-2.7x the memory
//! Linux's cgroup allowed the same tree.
//!
//! The processes share a small file mapped `MAP_SHARED` (`FARMEM_TREE`, made by `farmem
//! run` in its private directory): a header with the tree's budget and a slot per process,
//! where each control thread publishes what the process is charged (its anonymous memory
//! less the far tiers', as in `process_budget.rs`) every time it measures, and reads the
//! others'. A forked child inherits the mapping; an executed program maps the file again.
//! A slot not refreshed for [`STALE_NS`] is ignored: its process ended, or executed a
//! program farmem does not run.
//!
//! Each process then takes a share of the budget ([`share`]): free room is split evenly
//! among the members, and when the tree is over its budget the members above a fair share
//! give back the excess in proportion; a member that is evicting (or waiting for room with
//! nothing it can evict) below its fair share claims room towards it. So a lone process has
//! the whole budget, as before.
//!
//! Pages a forked child shares copy-on-write with its parent are one page of memory, but
//! both processes' anonymous memory counts them. Members that forked measure how much of
//! their memory is shared (`Pss_Anon` of `/proc/self/smaps_rollup`, a walk of the page
//! tables: ~19 ms for 1 GiB resident here, so at most every [`ROLLUP_EVERY_COST`] times its
//! CPU cost near the budget, [`ROLLUP_ROOMY_COST`] times with room to spare) and count their
//! part of the shared pages. Between measurements the count lags, so a tree whose workers
//! start at once can go over its budget for a moment (four workers at 64 MiB: peaks of
//! 72-73 MiB without a cgroup). Pages shared since a fork are evicted last (`inherited.rs`): a
//! worker that evicts one frees nothing, and its charge only moves to the other side; with
//! them evicted in the policy's order the same tree peaked at 83-93 MiB.
//!
//! When the tree has a memory cgroup of its own (`FARMEM_CGROUP`, see `cgroup_charge.rs`),
//! what it is charged is known exactly: the members publish their far tiers' memory too, and
//! the cgroup's charge less the members' charges and far tiers is memory no member counts
//! (page tables, processes farmem does not run, the shared estimate's error). The budget
//! shared among the members is the tree's less that memory, as under a cgroup's limit.

use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

// CLOCK_MONOTONIC: one clock for every process of the tree.
use crate::fault_log::monotonic_ns;

/// File layout version (the first word is this magic).
const MAGIC: u64 = 0x6661_726d_7472_6502; // "farmtre", 2
/// Processes a tree file has room for; a process that finds none has a budget of its own.
pub const SLOTS: usize = 1024;
/// A slot older than this is not a member any more (its control thread refreshes it every
/// 10 ms while the process lives).
const STALE_NS: u64 = 1_000_000_000;
/// The shared-memory measurement runs at most every this many times its own CPU time (≤ 5%
/// of a CPU while the process shares memory and the tree is near its budget), and not more
/// often than every [`ROLLUP_MIN_NS`]: sharing falls fast after a fork (workers copy and
/// evict pages), and an estimate 0.3-0.5 s old counted python3's idle parent at half its
/// share. With room to spare (the tree under 3/4 of its budget) the estimate matters
/// little: every [`ROLLUP_ROOMY_COST`] times (0.5%); at 20x, python3's multiprocessing job
/// with all its memory local ran 8% slower, in system time.
const ROLLUP_EVERY_COST: u64 = 20;
const ROLLUP_ROOMY_COST: u64 = 200;
const ROLLUP_MIN_NS: u64 = 20_000_000;

#[repr(C)]
struct Header {
    magic: AtomicU64,
    /// The tree's budget in pages (0: not set yet; the first member sets it).
    budget: AtomicU64,
    /// One past the highest slot ever taken (readers scan up to it).
    used: AtomicU32,
    _pad: [u32; 11],
}

#[repr(C)]
struct Slot {
    pid: AtomicU32,
    /// Evicting at the last measurement (it wants more room).
    pressed: AtomicU32,
    /// Pages charged to the process.
    charged: AtomicU64,
    /// CLOCK_MONOTONIC of the last measurement.
    updated_ns: AtomicU64,
    /// Pages of the far tiers' memory in the process (not charged).
    far: AtomicU64,
    _pad: [u64; 4],
}

const FILE_BYTES: usize = std::mem::size_of::<Header>() + SLOTS * std::mem::size_of::<Slot>();
const _: () = assert!(std::mem::size_of::<Header>() == 64 && std::mem::size_of::<Slot>() == 64);

/// This thread's CPU time in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into valid memory.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The tree file, mapped.
pub struct TreeFile {
    base: *const u8,
}

// SAFETY: the mapping lives as long as the process (it is never unmapped: a forked child
// inherits it) and is only accessed through atomics.
unsafe impl Send for TreeFile {}
// SAFETY: as above.
unsafe impl Sync for TreeFile {}

/// Make an empty tree file at `path` (`farmem run`, before the program starts).
pub fn create(path: &Path, budget_pages: Option<u64>) -> std::io::Result<()> {
    let mut bytes = vec![0u8; FILE_BYTES];
    bytes[..8].copy_from_slice(&MAGIC.to_ne_bytes());
    bytes[8..16].copy_from_slice(&budget_pages.unwrap_or(0).to_ne_bytes());
    std::fs::write(path, bytes)
}

impl TreeFile {
    /// Map the tree file at `path`.
    pub fn open(path: &Path) -> std::io::Result<TreeFile> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)?;
        let len = f.metadata()?.len();
        if len != FILE_BYTES as u64 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: not a tree budget file ({len} bytes)", path.display()),
            ));
        }
        let base = farmem_sys::mem::sys_mmap(
            0,
            FILE_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
        )
        .map_err(std::io::Error::from_raw_os_error)? as *const u8;
        let t = TreeFile { base };
        if t.header().magic.load(Ordering::Relaxed) != MAGIC {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: not a tree budget file", path.display()),
            ));
        }
        Ok(t)
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping is FILE_BYTES long, page-aligned and lives for the process;
        // Header is made of atomics, valid for any bit pattern.
        unsafe { &*(self.base as *const Header) }
    }

    fn slot(&self, i: usize) -> &Slot {
        assert!(i < SLOTS);
        // SAFETY: slot i lies inside the mapping (checked above); atomics only.
        unsafe { &*(self.base.add(64 + 64 * i) as *const Slot) }
    }

    /// The tree's budget in pages, set to `mine` by the first member that finds none.
    pub fn budget(&self, mine: usize) -> usize {
        let h = &self.header().budget;
        match h.compare_exchange(0, mine as u64, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => mine,
            Err(b) => b as usize,
        }
    }

    /// Change the tree's budget (`farmem ctl PID --local-mem` on any member).
    pub fn set_budget(&self, pages: usize) {
        self.header().budget.store(pages as u64, Ordering::Release);
    }

    /// The slots of live members: taken and refreshed within [`STALE_NS`] of `now`.
    fn live_slots(&self, now: u64) -> impl Iterator<Item = (usize, &Slot)> {
        let used = (self.header().used.load(Ordering::Acquire) as usize).min(SLOTS);
        (0..used).map(|j| (j, self.slot(j))).filter(move |(_, s)| {
            s.pid.load(Ordering::Acquire) != 0
                && now.saturating_sub(s.updated_ns.load(Ordering::Acquire)) <= STALE_NS
        })
    }

    /// Live members other than `pid`.
    pub fn others_alive(&self, pid: u32) -> usize {
        self.live_slots(monotonic_ns())
            .filter(|(_, s)| s.pid.load(Ordering::Acquire) != pid)
            .count()
    }

    /// The tree's budget (0: none set yet) and the far tiers' pages its live members hold,
    /// for an observer that is not a member (`farmem run`'s page cache trim).
    pub fn budget_and_far(&self) -> (usize, usize) {
        let budget = self.header().budget.load(Ordering::Acquire) as usize;
        let far = self
            .live_slots(monotonic_ns())
            .map(|(_, s)| s.far.load(Ordering::Acquire) as usize)
            .sum();
        (budget, far)
    }

    /// Take a slot for `pid`: its own if it has one (a program executed by a member), else a
    /// free or stale one. None when the file is full.
    fn claim(&self, pid: u32, now: u64) -> Option<usize> {
        let h = self.header();
        let used = (h.used.load(Ordering::Acquire) as usize).min(SLOTS);
        if let Some(i) = (0..used).find(|&i| self.slot(i).pid.load(Ordering::Acquire) == pid) {
            return Some(i);
        }
        for i in 0..SLOTS {
            let s = self.slot(i);
            let p = s.pid.load(Ordering::Acquire);
            let free =
                p == 0 || now.saturating_sub(s.updated_ns.load(Ordering::Acquire)) > STALE_NS;
            if free
                && s.pid
                    .compare_exchange(p, pid, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                s.updated_ns.store(now, Ordering::Release);
                s.charged.store(0, Ordering::Release);
                s.far.store(0, Ordering::Release);
                h.used.fetch_max(i as u32 + 1, Ordering::AcqRel);
                return Some(i);
            }
        }
        None
    }
}

/// One member's view, for [`share`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    pub charged: usize,
    /// Evicting, or waiting for room with nothing to evict (it wants more room than it has).
    pub pressed: bool,
}

/// The pages member `me` may be charged, given the tree's budget and every member's charge
/// (`me` included). Applied by every member to the same view, the shares add up to the
/// budget: free room is split evenly; over the budget, the members above their fair share
/// ([`fair_level`]) give back the excess in proportion to how far above they are (never
/// below it). A pressed member below its fair share also claims up to 1/8 of it per
/// measurement, which puts the tree over and so makes the larger members give room back.
pub fn share(budget: usize, members: &[Member], me: usize) -> usize {
    let n = members.len().max(1);
    let fair = fair_level(budget, members);
    let mine = members[me];
    let total: usize = members.iter().map(|m| m.charged).sum();
    let claim = if mine.pressed && mine.charged < fair {
        (fair - mine.charged).min((fair / 8).max(1))
    } else {
        0
    };
    if total <= budget {
        let grow = (budget - total) / n;
        return mine.charged + grow.max(claim);
    }
    if mine.charged <= fair {
        return mine.charged + claim;
    }
    let over = total - budget;
    let excess: usize = members.iter().map(|m| m.charged.saturating_sub(fair)).sum();
    let cut = (over as u128 * (mine.charged - fair) as u128).div_ceil(excess.max(1) as u128);
    mine.charged.saturating_sub(cut as usize).max(fair)
}

/// The fair share of the members that want more (max-min fairness, water-filling): a member
/// that is not evicting wants no more than it holds, and the budget it leaves is split
/// evenly among the others. Splitting the budget evenly among all members instead held a
/// compiler started beside another to an even share of a build's nine processes (make,
/// shells, drivers, assemblers: idle, a few MiB each): 5 MiB of 48, while the compiler
/// started first kept the rest. `usize::MAX` when every member has what it wants.
pub fn fair_level(budget: usize, members: &[Member]) -> usize {
    let mut wants: Vec<usize> = members
        .iter()
        .map(|m| if m.pressed { usize::MAX } else { m.charged })
        .collect();
    wants.sort_unstable();
    let mut left = budget;
    let mut k = wants.len();
    for w in wants {
        if w != usize::MAX && (w as u128) * (k as u128) <= left as u128 {
            left -= w;
            k -= 1;
        } else {
            return left / k;
        }
    }
    usize::MAX
}

/// What a member's measurement found, in pages.
pub struct Measured {
    /// The tree's budget (`asked` if the tree had none yet; another member may change it).
    pub budget: usize,
    /// Of the process's memory, what others are charged for (shared copy-on-write).
    pub shared: usize,
    /// The process's share of the budget.
    pub mine: usize,
}

/// A process's membership: its slot and its measurement of shared memory.
pub struct Membership {
    file: TreeFile,
    /// usize::MAX: no slot yet (or not a member: see `left`).
    slot: AtomicUsize,
    /// Left the tree for a budget of its own (a forked child with `fork_local_mem`).
    left: std::sync::atomic::AtomicBool,
    /// Pages of the process's memory that others are charged for (it shares them
    /// copy-on-write after a fork: each sharer counts a part), and its memory then.
    /// Between measurements the shared pages are taken to fall in proportion when the
    /// process shrinks (it evicts shared and private pages alike: kept as a count, they made
    /// python3's multiprocessing workers count half their memory) and to stay when it grows
    /// (new pages are its own: kept as a fraction, they made workers that allocate after
    /// the fork count a third of theirs).
    shared_then: AtomicUsize,
    unshared_then: AtomicUsize,
    /// When the shared pages were last measured (CLOCK_MONOTONIC; 0: at the next
    /// measurement, after a fork), and what that cost in CPU time.
    rollup_ns: AtomicU64,
    rollup_cost_ns: AtomicU64,
    /// The process may share memory with others (it forked or was forked).
    may_share: std::sync::atomic::AtomicBool,
    /// The part of its far tiers' memory that is this process's (per mille), measured with
    /// the shared pages: after a fork the in-process store is shared copy-on-write like the
    /// rest, and counted whole by each sharer it made the members count hundreds of MiB
    /// twice, which the cgroup's charge then read as room (the budget rose towards twice
    /// the tree's: the C fork program at 137M peaked at 995 MiB against Linux's 783).
    far_permille: AtomicUsize,
    /// The pressure count (pages evicted plus waits for room) at the last measurement: a
    /// member whose count moved since is pressed.
    pressure_seen: AtomicU64,
    /// The tree's cgroup, when it has one this process is in.
    cgroup: Option<crate::cgroup_charge::CgroupCharge>,
    /// Pages the cgroup is charged that no member counts (negative: members count pages
    /// twice), smoothed as `process_budget` smooths the other memory: up at once, down
    /// slowly, so that members' charges published up to a measurement apart do not make
    /// the budget swing.
    unattributed: std::sync::atomic::AtomicIsize,
}

impl Membership {
    pub fn new(file: TreeFile, cgroup: Option<crate::cgroup_charge::CgroupCharge>) -> Membership {
        Membership {
            file,
            slot: AtomicUsize::new(usize::MAX),
            left: Default::default(),
            shared_then: AtomicUsize::new(0),
            unshared_then: AtomicUsize::new(0),
            rollup_ns: AtomicU64::new(0),
            rollup_cost_ns: AtomicU64::new(0),
            may_share: Default::default(),
            far_permille: AtomicUsize::new(1000),
            pressure_seen: AtomicU64::new(0),
            cgroup,
            unattributed: Default::default(),
        }
    }

    pub fn file(&self) -> &TreeFile {
        &self.file
    }

    pub fn is_member(&self) -> bool {
        !self.left.load(Ordering::Relaxed)
    }

    /// In a forked child: a new member (its own slot; what it shares with its parent is
    /// measured first), or none with a budget of its own.
    pub fn after_fork_in_child(&self, own_budget: bool) {
        self.slot.store(usize::MAX, Ordering::Relaxed);
        self.left.store(own_budget, Ordering::Relaxed);
        self.pressure_seen.store(0, Ordering::Relaxed);
        self.rollup_ns.store(0, Ordering::Relaxed);
        self.may_share.store(true, Ordering::Relaxed);
    }

    /// In a parent after a fork: its memory is now shared with the child; measure it.
    pub fn after_fork_in_parent(&self) {
        self.rollup_ns.store(0, Ordering::Relaxed);
        self.may_share.store(true, Ordering::Relaxed);
    }

    /// Leave the tree (the process ends): its slot is free at once.
    pub fn leave(&self) {
        let i = self.slot.swap(usize::MAX, Ordering::AcqRel);
        if i != usize::MAX {
            let s = self.file.slot(i);
            let _ =
                s.pid
                    .compare_exchange(std::process::id(), 0, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// Publish this process's charge (`unshared`: its anonymous pages less the far tiers'
    /// `far`, before the shared correction; `store`: the address range holding the far
    /// tiers' blocks, if one does; `pressure`: a count that moves while it wants more room)
    /// and return what its budget follows from, or None when the process is not a member (no
    /// room in the file).
    pub fn measure(
        &self,
        asked: usize,
        unshared: usize,
        far: usize,
        store: Option<(usize, usize)>,
        pressure: u64,
    ) -> Option<Measured> {
        if !self.is_member() {
            return None;
        }
        let now = monotonic_ns();
        let pid = std::process::id();
        let mut i = self.slot.load(Ordering::Relaxed);
        if i == usize::MAX || self.file.slot(i).pid.load(Ordering::Acquire) != pid {
            i = self.file.claim(pid, now)?;
            self.slot.store(i, Ordering::Relaxed);
        }
        let (mut members, others_far) = self.others(i, now);
        let budget = self.file.budget(asked);
        let others: usize = members.iter().map(|m| m.charged).sum();
        let roomy = others + unshared - self.shared_now(unshared) < budget / 4 * 3;
        self.refresh_shared(now, unshared, !members.is_empty(), roomy, store);
        let charged = unshared - self.shared_now(unshared);
        let far = far * self.far_permille.load(Ordering::Relaxed) / 1000;
        let seen = self.pressure_seen.swap(pressure, Ordering::Relaxed);
        let pressed = pressure != seen;
        let s = self.file.slot(i);
        s.charged.store(charged as u64, Ordering::Release);
        s.pressed.store(pressed as u32, Ordering::Release);
        s.far.store(far as u64, Ordering::Release);
        s.updated_ns.store(now, Ordering::Release);
        let counted = others + charged + others_far + far;
        let shared_out = self.budget_less_unattributed(budget, counted);
        members.push(Member { charged, pressed });
        let me = members.len() - 1;
        Some(Measured {
            budget,
            shared: unshared - charged,
            mine: share(shared_out, &members, me),
        })
    }

    /// The budget the members share: the tree's, less what its cgroup is charged beyond the
    /// `counted` pages the members account for (their charges and far tiers). Kept within
    /// half and twice the budget, so a wrong count cannot starve or flood the members.
    fn budget_less_unattributed(&self, budget: usize, counted: usize) -> usize {
        let Some(cg) = self.cgroup.as_ref().and_then(|c| c.pages()) else {
            return budget;
        };
        let now = cg as isize - counted as isize;
        let u = follow_unattributed(self.unattributed.load(Ordering::Relaxed), now);
        self.unattributed.store(u, Ordering::Relaxed);
        let b = budget as isize;
        (b - u).clamp(b / 2, b * 2) as usize
    }

    /// Pages the tree's cgroup is charged that no member counts (0 without a cgroup).
    pub fn unattributed(&self) -> isize {
        self.unattributed.load(Ordering::Relaxed)
    }

    /// The other live members' views, and the far tiers' pages in them.
    fn others(&self, mine: usize, now: u64) -> (Vec<Member>, usize) {
        let mut far = 0;
        let members = self
            .file
            .live_slots(now)
            .filter(|&(j, _)| j != mine)
            .map(|(_, s)| {
                far += s.far.load(Ordering::Acquire) as usize;
                Member {
                    charged: s.charged.load(Ordering::Acquire) as usize,
                    pressed: s.pressed.load(Ordering::Acquire) != 0,
                }
            })
            .collect();
        (members, far)
    }

    /// The pages of `unshared` others are charged for, estimated from the last measurement.
    fn shared_now(&self, unshared: usize) -> usize {
        let shared = self.shared_then.load(Ordering::Relaxed);
        let then = self.unshared_then.load(Ordering::Relaxed);
        if unshared >= then || then == 0 {
            shared.min(unshared)
        } else {
            (shared as u128 * unshared as u128 / then as u128) as usize
        }
    }

    /// Measure the shared part of the process's memory if it is due: only in a process that
    /// forked or was forked, while other members live.
    fn refresh_shared(
        &self,
        now: u64,
        unshared: usize,
        others_live: bool,
        roomy: bool,
        store: Option<(usize, usize)>,
    ) {
        if !self.may_share.load(Ordering::Relaxed) {
            return;
        }
        let last = self.rollup_ns.load(Ordering::Relaxed);
        let every = if roomy {
            ROLLUP_ROOMY_COST
        } else {
            ROLLUP_EVERY_COST
        };
        let wait = (self.rollup_cost_ns.load(Ordering::Relaxed) * every).max(ROLLUP_MIN_NS);
        if last != 0 && now < last + wait {
            return;
        }
        self.rollup_ns.store(now, Ordering::Relaxed);
        if !others_live {
            // Nobody to share with now.
            self.shared_then.store(0, Ordering::Relaxed);
            self.far_permille.store(1000, Ordering::Relaxed);
            return;
        }
        // Its cost in CPU time: with more processes than CPUs the wall time is mostly waiting.
        let t0 = thread_cpu_ns();
        let Some((mut anon_kib, mut pss_anon_kib)) = anon_and_pss() else {
            self.may_share.store(false, Ordering::Relaxed);
            self.far_permille.store(1000, Ordering::Relaxed);
            return;
        };
        // The far tiers' blocks are measured apart: they are shared (or not) on their own.
        // Elsewhere they are assumed shared as much as the rest. (A second read: per mapping,
        // `smaps` has no `Pss_Anon`, which only its rollup sums.)
        if let Some((store_rss, store_pss)) = store.and_then(range_rss_pss) {
            anon_kib = anon_kib.saturating_sub(store_rss);
            pss_anon_kib = pss_anon_kib.saturating_sub(store_pss);
            let permille = (store_pss * 1000)
                .checked_div(store_rss)
                .map_or(1000, |p| p.min(1000) as usize);
            self.far_permille.store(permille, Ordering::Relaxed);
        }
        let cost = thread_cpu_ns().saturating_sub(t0);
        self.rollup_cost_ns.store(cost, Ordering::Relaxed);
        let shared_kib = anon_kib.saturating_sub(pss_anon_kib);
        let shared = if anon_kib == 0 {
            0
        } else {
            (unshared as u128 * shared_kib as u128 / anon_kib as u128) as usize
        };
        self.shared_then.store(shared, Ordering::Relaxed);
        self.unshared_then.store(unshared, Ordering::Relaxed);
        tracing::debug!(
            anon_kib,
            pss_anon_kib,
            shared,
            cost,
            "tree budget: shared memory measured"
        );
        if shared == 0 && self.far_permille.load(Ordering::Relaxed) == 1000 {
            // Nothing shared any more (a child that executed, or one that rewrote all).
            self.may_share.store(false, Ordering::Relaxed);
        }
    }
}

/// Pages within which a new measurement of the unattributed charge leaves the old one as it
/// is. The kernel charges a cgroup in batches of 64 pages per CPU (`MEMCG_CHARGE_BATCH`), so
/// its count moves by that much while the program does nothing: following it would move the
/// budget, and evict, while the program is idle.
const UNATTRIBUTED_DEAD_BAND: isize = 2 * 64;

/// The unattributed charge after measuring `now` where it was `before`: a rise beyond the
/// dead band is taken at once (memory the members must make room for), a fall is followed
/// by 1/16 of the gap per measurement (a freed page cache or an exited helper may return).
fn follow_unattributed(before: isize, now: isize) -> isize {
    if now > before + UNATTRIBUTED_DEAD_BAND {
        now
    } else if now < before - UNATTRIBUTED_DEAD_BAND {
        before - ((before - now) >> 4).max(1)
    } else {
        before
    }
}

/// `Anonymous` and `Pss_Anon` of `/proc/self/smaps_rollup`, KiB.
fn anon_and_pss() -> Option<(u64, u64)> {
    let s = farmem_sys::proc_file::SMAPS_ROLLUP.read().ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = s.lines().find(|l| l.starts_with(name))?;
        line[name.len()..].split_whitespace().next()?.parse().ok()
    };
    Some((field("Anonymous:")?, field("Pss_Anon:")?))
}

/// `Rss` and `Pss` of this process's mappings inside `[start, start + len)` (`/proc/self/
/// smaps`), KiB.
fn range_rss_pss((start, len): (usize, usize)) -> Option<(u64, u64)> {
    let s = farmem_sys::proc_file::SMAPS.read().ok()?;
    let end = start + len;
    let (mut inside, mut rss, mut pss) = (false, 0u64, 0u64);
    for line in s.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                inside = a < end && b > start;
                continue;
            }
        }
        if !inside {
            continue;
        }
        let value = || line.split_whitespace().nth(1)?.parse::<u64>().ok();
        if line.starts_with("Rss:") {
            rss += value()?;
        } else if line.starts_with("Pss:") {
            pss += value()?;
        }
    }
    Some((rss, pss))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mapping's resident pages show in its range's Rss and Pss; another range's do not.
    #[test]
    fn a_range_is_measured_apart() {
        let len = 64 * 4096;
        // Inaccessible on both sides: a neighbouring mapping of another test's, merged with
        // this one, would add its pages to the range's (seen once: 268 KiB).
        let guarded = farmem_sys::mem::map_anon(3 * len, libc::PROT_NONE).unwrap();
        // SAFETY: the middle of the mapping just made.
        let p = unsafe { guarded.add(len) };
        farmem_sys::mem::mprotect(p, len, libc::PROT_READ | libc::PROT_WRITE).unwrap();
        for i in 0..32 {
            // SAFETY: inside the mapping just made.
            unsafe { p.add(i * 4096).write(1) };
        }
        let (rss, pss) = range_rss_pss((p as usize, len)).expect("smaps");
        assert!((128..=256).contains(&rss), "32 pages written: {rss} KiB");
        assert_eq!(pss, rss, "not shared");
        // SAFETY: the mapping made above.
        unsafe { farmem_sys::mem::unmap(guarded, 3 * len) };
        let (rss, _) = range_rss_pss((p as usize, len)).expect("smaps");
        assert_eq!(rss, 0, "unmapped");
    }

    fn m(charged: usize, pressed: bool) -> Member {
        Member { charged, pressed }
    }

    #[test]
    fn a_lone_member_has_the_whole_budget() {
        assert_eq!(share(1000, &[m(0, false)], 0), 1000);
        assert_eq!(share(1000, &[m(1500, true)], 0), 1000);
    }

    #[test]
    fn shares_from_one_view_add_up_to_the_budget() {
        let views: [&[Member]; 4] = [
            &[m(100, false), m(200, true), m(50, false)],
            &[m(900, false), m(300, true), m(10, true)],
            &[m(600, true), m(600, true)],
            &[m(999, false), m(1, true), m(0, false), m(0, false)],
        ];
        for v in views {
            let total: usize = (0..v.len()).map(|i| share(1000, v, i)).sum();
            let fair = fair_level(1000, v);
            let claims: usize = v
                .iter()
                .filter(|x| x.pressed && x.charged < fair)
                .map(|x| (fair - x.charged).min(fair / 8))
                .sum();
            assert!(total <= 1000 + claims, "{v:?}: {total}");
            assert!(total >= 1000 - v.len(), "{v:?}: {total}");
        }
    }

    #[test]
    fn members_over_an_even_share_give_back_and_a_pressed_one_claims() {
        // A parent holding the whole budget and a new child that needs room.
        let v = [m(1000, false), m(0, true)];
        assert_eq!(share(1000, &v, 0), 1000, "nothing over yet");
        assert_eq!(
            share(1000, &v, 1),
            62,
            "the child claims an eighth of its share"
        );
        let v = [m(1000, false), m(62, true)];
        assert_eq!(share(1000, &v, 0), 938, "the parent gives the excess back");
        assert_eq!(share(1000, &v, 1), 124);
        // Never below the even share.
        let v = [m(600, false), m(900, true)];
        assert_eq!(share(1000, &v, 0), 500);
        assert_eq!(share(1000, &v, 1), 500);
    }

    #[test]
    fn idle_members_leave_the_rest_to_the_ones_that_evict() {
        // A build: make, two shells, two drivers (idle, small) and two compilers, one holding
        // most of the budget, one just started and evicting.
        let mut v = vec![
            m(20, false),
            m(10, false),
            m(10, false),
            m(20, false),
            m(20, false),
        ];
        v.push(m(900, true));
        v.push(m(0, true));
        assert_eq!(fair_level(1000, &v), 460, "(1000 - 80) / 2, not 1000 / 7");
        let new = v.len() - 1;
        assert_eq!(share(1000, &v, new), 57, "claims an eighth of 460");
        // Claiming puts the tree over: the old compiler gives back down to its fair share.
        v[new].charged = 400;
        assert_eq!(share(1000, &v, 5), 520);
        assert_eq!(share(1000, &v, new), 457);
        v[new].charged = 460;
        v[5].charged = 460;
        assert_eq!(share(1000, &v, 5), 460, "both at the fair share");
        assert_eq!(share(1000, &v, 0), 20, "the idle keep what they hold");
        // Nobody evicting: every member has what it wants.
        assert_eq!(fair_level(1000, &[m(10, false), m(20, false)]), usize::MAX);
        // An idle member above the level still gives back, down to it.
        let v = [m(700, false), m(500, true)];
        assert_eq!(fair_level(1000, &v), 500);
        assert_eq!(share(1000, &v, 0), 500);
    }

    #[test]
    fn the_file_holds_members_and_forgets_stale_ones() {
        let dir = std::env::temp_dir().join(format!("farmem-tree-test-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        create(&dir, None).unwrap();
        let f = TreeFile::open(&dir).unwrap();
        assert_eq!(f.budget(500), 500);
        assert_eq!(f.budget(700), 500, "the first member sets it");
        let now = monotonic_ns();
        let a = f.claim(11, now).unwrap();
        let b = f.claim(12, now).unwrap();
        assert_ne!(a, b);
        assert_eq!(f.claim(11, now), Some(a), "the same process, the same slot");
        // Stale: another process takes it.
        let c = f.claim(13, now + 2 * STALE_NS).unwrap();
        assert!(c == a || c == b);
        let _ = std::fs::remove_file(&dir);
        std::fs::write(&dir, b"short").unwrap();
        assert!(TreeFile::open(&dir).is_err());
        let _ = std::fs::remove_file(&dir);
    }

    #[test]
    fn the_unattributed_charge_ignores_batching_noise_rises_at_once_and_falls_slowly() {
        // Within the kernel's charge batches: no change, so an idle program's budget holds.
        assert_eq!(follow_unattributed(1000, 1000 + 100), 1000);
        assert_eq!(follow_unattributed(1000, 1000 - 100), 1000);
        // A real rise is taken whole.
        assert_eq!(follow_unattributed(1000, 5000), 5000);
        // A real fall is followed by 1/16 of the gap per measurement.
        assert_eq!(follow_unattributed(5000, 1000), 5000 - 250);
        let mut u = 5000;
        for _ in 0..200 {
            u = follow_unattributed(u, 1000);
        }
        assert!((1000..=1000 + UNATTRIBUTED_DEAD_BAND).contains(&u), "{u}");
    }
}
