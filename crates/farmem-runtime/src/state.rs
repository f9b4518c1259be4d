//! The state a runtime's threads share: its configuration, userfaultfd, backend, policy,
//! budget, regions and read-ahead in flight. Every path (faults, hints, reclaim, the control
//! thread) works on a [`State`]; the public [`crate::Runtime`] handle owns one and its
//! threads. This module holds data and small accessors only: it calls none of the paths.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use farmem_sys::mem::{Unmapper, PAGE_SIZE};
use farmem_sys::uffd::Uffd;
use parking_lot::{Mutex, RwLock};

use crate::backend::io::Backend;
use crate::book::Book;
use crate::config::{Config, FarCopies};
use crate::fetch::batches::InFlightSet;
use crate::policy::Policy;
use crate::regions::{RegionInfo, Regions};
use crate::stats::{Stats, StatsSnapshot};
use crate::workingset::WorkingSet;

/// State shared by the runtime's threads and every thread that hints or faults.
/// Work left for a fault thread to do once the process has lived a while
/// (`deferred.rs`).
pub(crate) type Deferred = Box<dyn FnOnce(&Arc<State>) + Send>;

pub(crate) struct State {
    pub cfg: Config,
    pub uffd: Uffd,
    pub unmapper: Unmapper,
    pub backend: Arc<dyn Backend>,
    pub policy: Mutex<Box<dyn Policy>>,
    /// Pages that were resident when this process forked or was forked, in the policy's
    /// order then: evicted only once the policy has no other victim (`inherited.rs`).
    /// Entries may be stale (evicted, or their region gone): eviction checks each page.
    pub inherited: Mutex<std::collections::VecDeque<usize>>,
    /// Ranges the program made unreadable, which eviction leaves resident (`unreadable.rs`).
    pub unreadable: crate::unreadable::Unreadable,
    /// When pages were last set aside (`now_ns`), for their rejoin (`inherited.rs`).
    pub inherited_since_ns: AtomicU64,
    /// Bookkeeping deferred off the fetch path, drained into `policy` (see `book.rs`).
    pub book: Book,
    /// Budget and free target, in pages (changed while running by
    /// [`crate::Runtime::set_local_mem`]; read them with [`State::budget`] and
    /// [`State::free_target`]).
    pub budget: AtomicUsize,
    pub free_target: AtomicUsize,
    /// The free pool's floor (the most is `free_target`), and its size now: the control
    /// thread keeps room for twice the read-ahead asked for lately (`readahead_seen`, the
    /// largest since it last looked), never less than the floor (`control.rs`).
    pub free_floor: AtomicUsize,
    pub free_target_now: AtomicUsize,
    pub readahead_seen: AtomicUsize,
    /// The budget asked for, in pages; `budget` is its share left to the regions
    /// (`process_budget.rs`): all of it unless the budget covers the whole process.
    pub asked_budget: AtomicUsize,
    /// The process's other anonymous memory counted in the budget, in pages, and when it
    /// was last measured (`now_ns`).
    pub other_pages: AtomicUsize,
    pub budget_checked_ns: AtomicU64,
    /// Pages the policy holds in protected bands, as of its last pick of victims
    /// (`policy/dueling.rs`): the rest of the budget is where other pages stay.
    pub protected: AtomicUsize,
    /// The process tree's shared budget, when this process takes a share of one
    /// (`tree_budget.rs`, [`crate::Config::tree`]).
    pub tree: Option<crate::tree_budget::Membership>,
    /// Pages installed plus pages reserved by in-flight fetches.
    pub resident: AtomicUsize,
    pub stats: Stats,
    pub shutdown: AtomicBool,
    /// Control thread wake-up. The sleeps are the standard library's futex-based ones: they
    /// keep no queue of sleepers in memory, which a forked child would inherit (`gate.rs`).
    pub control_lock: std::sync::Mutex<()>,
    pub control_cv: std::sync::Condvar,
    pub control_sleeping: AtomicBool,
    /// The watchdog's sleep (woken at shutdown).
    pub watchdog_lock: std::sync::Mutex<()>,
    pub watchdog_cv: std::sync::Condvar,
    /// eventfd that wakes the fault threads out of poll() at shutdown.
    pub wake_fd: OwnedFd,
    /// Nanoseconds since `epoch` at which the fault thread began serving its current batch
    /// (0: idle). The control thread steals faults when this gets old.
    pub fault_busy_since: AtomicU64,
    pub epoch: Instant,
    pub regions: Regions,
    pub next_region: AtomicU32,
    /// Until when (`now_ns`) dirty pages are not offered to a far tier that refused some,
    /// and the current backoff (see `reclaim.rs`).
    pub far_full_until: AtomicU64,
    pub far_full_backoff: AtomicU64,
    /// Read-ahead batches in flight (see `fetch/readahead.rs`).
    pub inflight: InFlightSet,
    /// Reclaim is paused while a fork brings far pages back (see `fork.rs`); fetches may
    /// then exceed the budget.
    pub reclaim_paused: AtomicBool,
    /// Set the first time a reservation found the budget full. Until then the control
    /// thread does not reclaim ahead: a program that fits its budget (a budget of 100% of
    /// its peak) keeps every page, instead of losing the free target to evictions it never
    /// needed (a random scan at 100% ran at 0.1x native, refaulting the 1% kept free).
    pub over_budget_once: AtomicBool,
    /// Whether a thread has warned that no page could be evicted in time (once a process).
    pub stall_warned: AtomicBool,
    /// The program's allocations, as its allocator reports them (`extents.rs`).
    pub extents: crate::extents::Extents,
    /// Held shared by every eviction batch, exclusively by a fork in preparation, which so
    /// waits for the batches in flight.
    pub evict_gate: RwLock<()>,
    /// The eviction clock and the refault rules (see `workingset.rs`).
    pub workingset: WorkingSet,
    /// Which neighbourhoods write the pages they read (`write_guess.rs`).
    pub write_guess: crate::write_guess::WriteGuess,
    /// Eviction's write-protects handed to the fault thread (`protect_handoff.rs`).
    pub protect_handoff: crate::protect_handoff::ProtectHandoff,
    /// Where the fault thread runs (`placement.rs`).
    pub placement: crate::placement::Shared,
    /// Longest wait for one backend answer ([`Config::io_timeout_s`], or the backend's own).
    pub io_timeout: Duration,
    /// The process the runtime serves: the one that started it, or the forked child that
    /// took it over (`fork.rs`); a vforked child is another.
    pub pid: AtomicU32,
    /// A fault thread has started (a forked child serves its faults on the forking thread
    /// until then).
    pub fault_thread_up: AtomicBool,
    /// The runtime's threads (fault threads, control, watchdog), joined at shutdown.
    pub threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Which far copies of local pages are kept ([`crate::Config::far_copies`]).
    pub far_copies: FarCopies,
    /// The embedding's way to give back memory it holds unused (`release.rs`), and when
    /// the control thread last called it (`now_ns`).
    pub release_hook: std::sync::OnceLock<fn(bool)>,
    pub release_called_ns: AtomicU64,
    /// The embedding's report for a process that ends without its exit handlers (`_exit`),
    /// run by the control thread when asked ([`crate::Runtime::report_at_exit`]), and the
    /// request's state: 0 none, 1 asked, 2 written (a futex word).
    pub exit_report_hook: std::sync::OnceLock<fn()>,
    pub exit_report: AtomicU64,
    /// Work left for a fault thread once the process has lived a while (`deferred.rs`),
    /// and when (`State::now_ns`; 0: none waits).
    pub deferred: Mutex<Vec<Deferred>>,
    pub deferred_at_ns: AtomicU64,
}

impl State {
    /// Are page digests worth taking (at unverified installs, to compare at eviction)? They
    /// tell an unverified page that equals its far copy, which is then dropped without a
    /// write-back; where fetched pages lose
    /// their far copy (`FarCopies::Drop`) every evicted page is written back, but the digest
    /// still tells whether the page was written during its stay: whether its next fetch
    /// should install it writable (`WROTE_LAST`, `write_guess.rs`). XXH3 of a page costs
    /// ~0.3 us, against the write-protect ioctl a needless writable install costs.
    pub(crate) fn keeps_digests(&self) -> bool {
        self.cfg.writable_install
    }

    pub fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64 + 1
    }

    /// The region of this runtime containing `addr`.
    pub fn region_of(&self, addr: usize) -> Option<RegionInfo> {
        self.regions.containing(addr)
    }

    /// The local budget now, in pages.
    #[inline]
    pub fn budget(&self) -> usize {
        self.budget.load(Ordering::Relaxed)
    }

    /// The budget less the pages in protected bands: how many pages others get to stay.
    #[inline]
    pub fn unprotected_budget(&self) -> usize {
        self.budget()
            .saturating_sub(self.protected.load(Ordering::Relaxed))
    }

    /// Free pages the control thread keeps available now.
    #[inline]
    pub fn free_target(&self) -> usize {
        self.free_target_now
            .load(Ordering::Relaxed)
            .min(self.free_target.load(Ordering::Relaxed))
    }

    /// Set the free pool's bounds for a budget of `cfg` (the pool starts at its most).
    pub fn set_free_pool(&self, cfg: &crate::config::Config) {
        let most = cfg.free_target_pages();
        self.free_floor
            .store(cfg.free_floor_pages().min(most), Ordering::Relaxed);
        self.free_target.store(most, Ordering::Relaxed);
        self.free_target_now.store(most, Ordering::Relaxed);
    }

    pub fn free_pages(&self) -> usize {
        self.budget()
            .saturating_sub(self.resident.load(Ordering::Relaxed))
    }

    /// Whether the control thread should evict ahead of demand now: the program has needed
    /// more than its budget once, and fewer than `free_target` pages are free.
    pub fn wants_free_pages(&self) -> bool {
        self.free_pages() < self.free_target() && self.over_budget_once.load(Ordering::Relaxed)
    }

    /// What `protect_handoff` needs of this state.
    pub(crate) fn handoff_cx(&self) -> crate::protect_handoff::Context<'_> {
        crate::protect_handoff::Context {
            uffd: &self.uffd,
            wake_fd: std::os::fd::AsRawFd::as_raw_fd(&self.wake_fd),
            shutdown: &self.shutdown,
            stats: &self.stats.c,
            enabled: self.cfg.protect_handoff,
        }
    }

    /// Ask the control thread to reclaim (cheap when it is already awake).
    pub fn kick_control(&self) {
        if self.control_sleeping.load(Ordering::Relaxed) {
            let _g = self.control_lock.lock();
            self.control_cv.notify_one();
        }
    }

    /// Wake every runtime thread (shutdown).
    pub fn wake_all(&self) {
        {
            let _g = self.control_lock.lock();
            self.control_cv.notify_all();
        }
        let _g = self.watchdog_lock.lock();
        self.watchdog_cv.notify_all();
    }

    /// The reclaim policy, with every page fetched so far handed to it.
    pub fn policy(&self) -> parking_lot::MutexGuard<'_, Box<dyn Policy>> {
        let mut p = self.policy.lock();
        self.book.drain(p.as_mut(), &self.stats);
        p
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        // Latencies still queued belong in the histogram.
        let protected = self.policy().protected();
        let mut s = self.stats.snapshot();
        // Entries of pages discarded since (at exit, the program's frees) are not resident.
        s.protected_pages = protected.min(self.resident.load(Ordering::Relaxed)) as u64;
        s.budget_bytes = (self.asked_budget.load(Ordering::Relaxed) * PAGE_SIZE) as u64;
        s.other_bytes = (self.other_pages.load(Ordering::Relaxed) * PAGE_SIZE) as u64;
        s.tree_uncounted_bytes = self
            .tree
            .as_ref()
            .map_or(0, |t| (t.unattributed().max(0) as usize * PAGE_SIZE) as u64);
        s.resident_pages = self.resident.load(Ordering::Relaxed) as u64;
        let far = self.backend.usage();
        s.backend_bytes = far.stored_bytes;
        s.far_pages = far.pages;
        s.far_held_bytes = far.held_bytes;
        s.far_file_bytes = far.file_bytes;
        s.prefetch_inflight = self.inflight.len() as u64;
        s
    }

    /// Statistics followed by the backend's own counters, for people.
    pub fn report(&self) -> String {
        let mut out = self.snapshot().to_string();
        for (name, v) in self.backend.counters() {
            out.push_str(&format!("\n  {name:<20}{v:>12}"));
        }
        out
    }
}
