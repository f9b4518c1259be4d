//! The public handles: a [`Runtime`] (one userfaultfd, one local-memory budget, one
//! backend, one reclaim policy and one set of threads: fault thread(s) and the control
//! thread, shared by all its regions) and its [`Region`]s. They own the shared [`State`]
//! and the threads; all the work happens in the modules the state is handed to.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use farmem_sys::mem::{Unmapper, PAGE_SHIFT, PAGE_SIZE};
use farmem_sys::uffd::{self, Uffd};
use parking_lot::Mutex;

use crate::backend::{self, BackendSpec};
use crate::config::{Config, FarCopies, PolicyKind};
use crate::error::{Error, Result};
use crate::page::table;
use crate::regions::{RegionInfo, Regions};
use crate::scope::{LockScope, RuntimeScope};
use crate::state::State;
use crate::stats::{Stats, StatsSnapshot};
use crate::workingset::WorkingSet;
use crate::{discard, fork, policy, process_budget, reclaim, region, registry, workers};

fn refuse_in_child() -> Result<()> {
    if registry::in_child() {
        return Err(Error::Config(
            "far memory is not available in a child forked from a far-memory process (the \
             runtime's threads do not survive fork; the child's memory is all local)"
                .into(),
        ));
    }
    Ok(())
}

/// The tree budget this runtime takes a share of, if its config names one it can map.
fn tree_membership(cfg: &Config) -> Option<crate::tree_budget::Membership> {
    let path = cfg.tree.as_ref()?;
    if cfg.budget_scope != crate::config::BudgetScope::Process {
        tracing::warn!("FARMEM_TREE needs FARMEM_BUDGET_SCOPE=process: ignored");
        return None;
    }
    match crate::tree_budget::TreeFile::open(path) {
        Ok(f) => Some(crate::tree_budget::Membership::new(f, tree_cgroup(cfg))),
        Err(e) => {
            tracing::warn!(
                "the tree budget file {} cannot be used ({e}): this process has a budget of \
                 its own",
                path.display()
            );
            None
        }
    }
}

/// The tree's cgroup counters, if the config names a cgroup this process is in.
fn tree_cgroup(cfg: &Config) -> Option<crate::cgroup_charge::CgroupCharge> {
    let dir = cfg.cgroup.as_ref()?;
    match crate::cgroup_charge::CgroupCharge::open(dir) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(
                "the tree's cgroup {} cannot be used ({e}): the budget covers the processes' \
                 own memory only",
                dir.display()
            );
            None
        }
    }
}

/// The runtime installed by [`Runtime::install_global`].
static INSTALLED: OnceLock<Runtime> = OnceLock::new();
/// The runtime [`Runtime::global`] started from the environment (or why it could not).
static GLOBAL: OnceLock<std::result::Result<Runtime, String>> = OnceLock::new();

/// What the last handle of a runtime owns: its state and its threads.
struct Owner {
    st: Arc<State>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.st.shutdown.store(true, Ordering::SeqCst);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to our own eventfd.
        unsafe {
            libc::write(
                std::os::fd::AsRawFd::as_raw_fd(&self.st.wake_fd),
                &one as *const u64 as *const libc::c_void,
                8,
            )
        };
        self.st.wake_all();
        if let Some(t) = &self.st.tree {
            t.leave();
        }
        let threads = std::mem::take(&mut *self.st.threads.lock());
        for t in threads {
            let _ = t.join();
        }
        // The program thread pinned beside the fault thread gets its own CPUs back.
        self.st.placement.release_program();
        if self.st.cfg.stats_at_exit {
            eprintln!("{}", self.st.report());
        }
    }
}

/// A far-memory runtime. Cheap to clone; its threads stop when the last clone and the last
/// of its regions are dropped.
#[derive(Clone)]
pub struct Runtime {
    owner: Arc<Owner>,
}

/// A runtime that does not keep it alive (for work the runtime's own state holds).
pub(crate) struct WeakRuntime(std::sync::Weak<Owner>);

impl WeakRuntime {
    pub(crate) fn upgrade(&self) -> Option<Runtime> {
        self.0.upgrade().map(|owner| Runtime { owner })
    }
}

impl Runtime {
    /// Start a runtime with its own budget, backend and threads.
    pub fn new(mut cfg: Config) -> Result<Runtime> {
        refuse_in_child()?;
        cfg.validate()?;
        cfg.evict_batch = cfg.effective_evict_batch();
        fork::install_handlers();
        table::init().map_err(|e| Error::sys("page table", e))?;
        let uffd = Uffd::open(uffd::FEATURE_PAGEFAULT_FLAG_WP | uffd::FEATURE_THREAD_ID)
            .map_err(|e| Error::sys("opening userfaultfd", e))?;
        // SAFETY: eventfd has no memory-safety preconditions.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(Error::sys("eventfd", std::io::Error::last_os_error()));
        }
        // SAFETY: fresh descriptor from the kernel.
        let wake_fd = farmem_sys::fds::keep(unsafe { OwnedFd::from_raw_fd(efd) });
        let backend = backend::from_spec(&cfg.backend, cfg.compressor).map_err(|e| {
            let name = match &cfg.backend {
                BackendSpec::Tcp(t) => t.url(),
                other => format!("{other:?}"),
            };
            Error::backend(name, None, e)
        })?;
        let io_timeout = cfg
            .io_timeout_s
            .map_or_else(|| backend.longest_wait(), Duration::from_secs_f64);
        let far_copies = match cfg.far_copies {
            Some(c) => c,
            None if backend.frees_on_forget() => FarCopies::Drop,
            None => FarCopies::Keep,
        };
        let tree = tree_membership(&cfg);
        let st = Arc::new(State {
            tree,
            far_copies,
            io_timeout,
            pid: AtomicU32::new(std::process::id()),
            threads: Mutex::new(Vec::new()),
            fault_thread_up: AtomicBool::new(false),
            budget: AtomicUsize::new(cfg.budget_pages()),
            asked_budget: AtomicUsize::new(cfg.budget_pages()),
            other_pages: AtomicUsize::new(0),
            protected: AtomicUsize::new(0),
            budget_checked_ns: AtomicU64::new(0),
            // Set from `cfg` below (`State::set_free_pool`), as when the budget changes.
            free_target: AtomicUsize::new(0),
            free_floor: AtomicUsize::new(0),
            free_target_now: AtomicUsize::new(0),
            readahead_seen: AtomicUsize::new(0),
            backend,
            policy: Mutex::new(policy::build(cfg.policy)),
            inherited: Default::default(),
            unreadable: Default::default(),
            inherited_since_ns: AtomicU64::new(0),
            book: Default::default(),
            // Recency policies put a fault's pages on probation unless they are refaults
            // of the working set.
            workingset: WorkingSet::new(cfg.policy != PolicyKind::Fifo, cfg.budget_pages()),
            write_guess: Default::default(),
            protect_handoff: Default::default(),
            placement: Default::default(),
            cfg,
            uffd,
            unmapper: Unmapper::new(),
            resident: AtomicUsize::new(0),
            stats: Stats::default(),
            shutdown: AtomicBool::new(false),
            control_lock: Default::default(),
            control_cv: Default::default(),
            control_sleeping: AtomicBool::new(false),
            watchdog_lock: Default::default(),
            watchdog_cv: Default::default(),
            wake_fd,
            fault_busy_since: AtomicU64::new(0),
            epoch: Instant::now(),
            regions: Regions::default(),
            next_region: AtomicU32::new(1),
            far_full_until: AtomicU64::new(0),
            far_full_backoff: AtomicU64::new(0),
            inflight: Default::default(),
            reclaim_paused: AtomicBool::new(false),
            over_budget_once: AtomicBool::new(false),
            stall_warned: AtomicBool::new(false),
            extents: Default::default(),
            evict_gate: Default::default(),
            release_hook: Default::default(),
            release_called_ns: AtomicU64::new(0),
            exit_report_hook: Default::default(),
            exit_report: AtomicU64::new(0),
            deferred: Default::default(),
            deferred_at_ns: AtomicU64::new(0),
        });
        st.set_free_pool(&st.cfg);
        let owner = Arc::new(Owner { st: st.clone() });
        workers::start(&st)?;
        tracing::debug!(
            budget_pages = st.budget(),
            backend = %st.backend.describe(),
            vectored_unmap = st.unmapper.is_vectored(),
            "farmem runtime started"
        );
        Ok(Runtime { owner })
    }

    /// The process-wide runtime configured from `FARMEM_*` environment variables (what the C
    /// API and the preloaded library use). Started on first use.
    pub fn global() -> Result<&'static Runtime> {
        refuse_in_child()?;
        // Under `farmem run` the transparent mode's runtime is the process's runtime: hints
        // and regions of the C API share its budget.
        if let Some(rt) = INSTALLED.get() {
            return Ok(rt);
        }
        let r = GLOBAL.get_or_init(|| {
            let rt = Config::from_env()
                .and_then(Runtime::new)
                .map_err(|e| e.to_string())?;
            // At exit: the statistics if asked, and far memory may free this program's
            // pages once its connections close (after every later destructor has run).
            extern "C" fn at_exit() {
                // No panic may unwind into libc.
                let _ = std::panic::catch_unwind(|| {
                    if let Some(rt) = Runtime::global_if_started() {
                        if rt.config().stats_at_exit {
                            eprintln!("{}", rt.report());
                        }
                        rt.release_at_exit(true);
                    }
                });
            }
            // SAFETY: registering a plain extern "C" function with no arguments.
            unsafe { libc::atexit(at_exit) };
            Ok(rt)
        });
        r.as_ref().map_err(|m| Error::Config(m.clone()))
    }

    /// The process-wide runtime if one was started (installed or made by [`Runtime::global`]),
    /// without starting one.
    pub fn global_if_started() -> Option<&'static Runtime> {
        if registry::in_child() {
            return None;
        }
        INSTALLED
            .get()
            .or_else(|| GLOBAL.get().and_then(|r| r.as_ref().ok()))
    }

    /// Make `rt` the process-wide runtime that [`Runtime::global`] returns (the transparent
    /// mode installs its runtime, so that hints and regions of the C API share its budget).
    /// The first installed runtime stays.
    pub fn install_global(rt: Runtime) {
        let _ = INSTALLED.set(rt);
    }

    pub(crate) fn downgrade(&self) -> WeakRuntime {
        WeakRuntime(Arc::downgrade(&self.owner))
    }

    pub(crate) fn state(&self) -> &Arc<State> {
        &self.owner.st
    }

    pub fn config(&self) -> &Config {
        &self.owner.st.cfg
    }

    /// The program is about to end (exit, `_exit`, or exec another image): ask far memory
    /// to free its pages as soon as its connections close, instead of keeping them for
    /// `--session-timeout` in case it comes back. Everything keeps working until then.
    /// `false` takes it back (an exec that failed). Does nothing in a child forked from the
    /// program, whose connections are its parent's.
    pub fn release_at_exit(&self, release: bool) {
        if registry::in_child() || std::process::id() != self.owner.st.pid.load(Ordering::Relaxed) {
            return;
        }
        // An exec keeps the thread's affinity: not the pin beside the fault thread.
        self.owner.st.placement.release_program();
        // On a program thread that may fault on far memory: what the wait allocates (its
        // first park's thread-local record) must stay local, or it faults holding the lock
        // its answer needs.
        let _scope = RuntimeScope::enter();
        self.owner.st.backend.release_at_exit(release);
        // The process ends or executes another program: its share of the tree is free.
        if let Some(t) = &self.owner.st.tree {
            t.leave();
        }
    }

    /// The calling thread is about to start a thread (`thread`) or a process, which would
    /// inherit its CPU affinity: if the runtime pinned it beside its fault thread
    /// (`FARMEM_FAULT_FOLLOW`), its own affinity comes back first. The transparent mode calls
    /// this from `pthread_create`, `posix_spawn`, `vfork`, `system` and `popen`; `fork` and
    /// the `exec` family are covered by the runtime itself.
    pub fn before_spawn(&self, thread: bool) {
        let st = &self.owner.st;
        st.placement.before_spawn(thread, st.now_ns(), &st.stats.c);
    }

    /// The CPU affinity thread `tid` (0: the caller) had before the runtime pinned it beside
    /// its fault thread, if it did: the transparent mode's `sched_getaffinity` reports it,
    /// so that the pin does not shrink what the program believes it may use (the threads
    /// `sort` or `nproc` count).
    pub fn own_affinity(&self, tid: u32) -> Option<libc::cpu_set_t> {
        self.owner.st.placement.own_affinity(tid)
    }

    /// The program is about to set the CPU affinity of thread `tid` (0: the caller): the
    /// runtime forgets its own pin of that thread, if any, and leaves it alone for a while.
    pub fn program_sets_affinity(&self, tid: u32) {
        let st = &self.owner.st;
        st.placement
            .program_sets_affinity(tid, st.now_ns(), &st.stats.c);
    }

    /// Have the control thread call `release` to get memory the embedding holds but no
    /// longer uses (an allocator's emptied slabs) back: with `true` when the budget is short
    /// (before it evicts pages in use), every 100 ms otherwise. `release` runs on the
    /// control thread outside the runtime's fork gate, as a program thread would; it may
    /// call [`Runtime::discard`]. Only the first hook set is kept.
    pub fn set_release_hook(&self, release: fn(bool)) {
        let _ = self.owner.st.release_hook.set(release);
    }

    /// Have the control thread call `report` when the process ends without its exit
    /// handlers ([`Runtime::report_at_exit`]). Only the first hook set is kept.
    pub fn set_exit_report_hook(&self, report: fn()) {
        let _ = self.owner.st.exit_report_hook.set(report);
    }

    /// Have the control thread run the exit report hook, and wait for it at most
    /// `timeout_us`: for `_exit`, which ends the process without its exit handlers (a
    /// forked worker's usual end: python3's multiprocessing, a shell's child) and may be
    /// called from a signal handler, so this takes no lock and allocates nothing, and the
    /// report runs on a thread that interrupted nothing. Whether the report was written (not
    /// in a `vfork` child, which shares its parent's runtime, nor without a hook or a
    /// control thread, nor when the control thread is busy past the timeout).
    pub fn report_at_exit(&self, timeout_us: u64) -> bool {
        let st = &self.owner.st;
        // SAFETY: getpid has no preconditions (std::process::id's cache is not needed).
        let pid = unsafe { libc::getpid() } as u32;
        if registry::in_child()
            || pid != st.pid.load(Ordering::Relaxed)
            || st.exit_report_hook.get().is_none()
            || st.shutdown.load(Ordering::Acquire)
        {
            return false;
        }
        if st
            .exit_report
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false; // another thread is ending the process too
        }
        // Without the control thread's mutex (the interrupted code may hold it): a wake-up
        // lost to the thread going to sleep just then costs one tick of its sleep.
        st.control_cv.notify_one();
        let deadline = crate::fault_log::monotonic_ns() + timeout_us * 1000;
        loop {
            if st.exit_report.load(Ordering::Acquire) == 2 {
                return true;
            }
            let now = crate::fault_log::monotonic_ns();
            if now >= deadline {
                return false;
            }
            farmem_sys::mem::futex_wait(&st.exit_report, 1, (deadline - now).div_ceil(1000));
        }
    }

    /// Change the local budget of the running program to `bytes`. Growing only stops
    /// evictions; shrinking evicts at once, and returns when the resident set fits the new
    /// budget (or after `deadline`, with an error, if pages in flight kept it from fitting).
    pub fn set_local_mem(&self, bytes: u64, deadline: Duration) -> Result<()> {
        let _scope = RuntimeScope::enter();
        let st = &self.owner.st;
        let cfg = Config {
            local_mem: bytes,
            ..st.cfg.clone()
        };
        cfg.validate()?;
        let pages = cfg.budget_pages();
        st.set_free_pool(&cfg);
        process_budget::set_asked(st, pages);
        // The regions' share of it (all of it unless the budget covers the whole process).
        let pages = st.budget();
        tracing::info!(budget_pages = pages, "local budget changed");
        if st.resident.load(Ordering::Acquire) <= pages {
            return Ok(());
        }
        // Over the new budget: the program has needed more than it once, so the control
        // thread reclaims ahead from now on; this thread evicts down to the budget.
        st.over_budget_once.store(true, Ordering::Relaxed);
        // The control thread evicts too (nothing is free): two threads halve the wait.
        st.kick_control();
        let t0 = Instant::now();
        while st.resident.load(Ordering::Acquire) > pages {
            let over = st.resident.load(Ordering::Acquire).saturating_sub(pages);
            if reclaim::evict_batch(st, over.clamp(1, 4096)) == 0 {
                if t0.elapsed() > deadline {
                    return Err(Error::Config(format!(
                        "the resident set ({} pages) did not shrink to the new budget ({pages} \
                         pages) within {:.1} s",
                        st.resident.load(Ordering::Relaxed),
                        deadline.as_secs_f64()
                    )));
                }
                std::thread::yield_now();
            }
        }
        st.kick_control();
        Ok(())
    }

    /// Statistics so far.
    pub fn stats(&self) -> StatsSnapshot {
        let _scope = RuntimeScope::enter();
        self.owner.st.snapshot()
    }

    /// Statistics and the backend's own counters as text for people.
    pub fn report(&self) -> String {
        let _scope = RuntimeScope::enter();
        self.owner.st.report()
    }

    /// Description of the backend in use.
    pub fn backend_name(&self) -> String {
        self.owner.st.backend.describe()
    }

    /// Name of the reclaim policy in use.
    pub fn policy_name(&self) -> &'static str {
        let _scope = LockScope::enter();
        self.owner.st.policy.lock().name()
    }

    /// Create a far-memory region of `size` bytes (rounded up to whole pages). The region
    /// may be far larger than the local budget; pages that were never written cost nothing.
    pub fn create_region(&self, size: usize) -> Result<Region> {
        self.create_region_impl(size, None)
    }

    /// Create a region over `[addr, addr+size)`, a page-aligned part of an inaccessible
    /// reservation (`PROT_NONE` mapping) that the caller owns; the transparent mode carves
    /// the program's heap this way. Dropping the region turns the range back into a
    /// reservation.
    ///
    /// # Safety
    /// The range must be the caller's reservation: whatever is mapped there is replaced.
    pub unsafe fn create_region_at(&self, addr: usize, size: usize) -> Result<Region> {
        if !addr.is_multiple_of(PAGE_SIZE) || !size.is_multiple_of(PAGE_SIZE) {
            return Err(Error::Invalid(format!(
                "region at {addr:#x} of {size} bytes is not page-aligned"
            )));
        }
        self.create_region_impl(size, Some(addr))
    }

    /// Put `[addr, addr+len)`, an existing anonymous private mapping that may hold data
    /// (a program's static arrays: `.bss`), in far memory for the rest of the process: its
    /// resident pages count against the budget and may be evicted like any other, its
    /// untouched pages read as zeros when touched. The range is never given back.
    ///
    /// # Safety
    /// The range must be anonymous private memory that no other thread touches during the
    /// call, that is never unmapped afterwards, and that the runtime itself never reads
    /// (its threads must not fault).
    pub unsafe fn adopt_range(&self, addr: usize, len: usize) -> Result<()> {
        let _scope = RuntimeScope::enter();
        refuse_in_child()?;
        if !addr.is_multiple_of(PAGE_SIZE) || !len.is_multiple_of(PAGE_SIZE) || len == 0 {
            return Err(Error::Invalid(format!(
                "range at {addr:#x} of {len} bytes is not whole pages"
            )));
        }
        let st = self.state();
        let id = st.next_region.fetch_add(1, Ordering::Relaxed);
        let info = region::adopt(st, id, addr, len)?;
        registry::insert(info, st);
        st.regions.insert(info);
        Ok(())
    }

    fn create_region_impl(&self, size: usize, at: Option<usize>) -> Result<Region> {
        let _scope = RuntimeScope::enter();
        refuse_in_child()?;
        let st = self.state();
        if size == 0 {
            return Err(Error::Invalid("region size must be positive".into()));
        }
        if size > 1 << 45 {
            return Err(Error::Invalid(format!(
                "region size {size} exceeds the 32 TiB limit"
            )));
        }
        let len = size.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let id = st.next_region.fetch_add(1, Ordering::Relaxed);
        let info = region::map(st, id, len, at)?;
        registry::insert(info, st);
        st.regions.insert(info);
        Ok(Region {
            rt: self.clone(),
            info,
        })
    }

    /// `[addr, addr+len)` is an allocation of the program (a large block, an anonymous
    /// mapping), as its allocator tells: a fault's read-ahead may zero-fill fresh pages up
    /// to its end, never past it (`extents.rs`). Allocators that say nothing get the small
    /// block around each fault.
    pub fn mark_allocated(&self, addr: usize, len: usize) {
        let _scope = LockScope::enter();
        let first = addr / PAGE_SIZE;
        self.state()
            .extents
            .note(first, addr.saturating_add(len).div_ceil(PAGE_SIZE));
    }

    /// `[addr, addr+len)` is no longer allocated (see [`Runtime::mark_allocated`]).
    pub fn mark_freed(&self, addr: usize, len: usize) {
        let _scope = LockScope::enter();
        let first = addr / PAGE_SIZE;
        self.state()
            .extents
            .forget(first, addr.saturating_add(len).div_ceil(PAGE_SIZE));
    }

    /// Set the protection of `[addr, addr+len)` (part of this runtime's far memory) to `prot`,
    /// as `mprotect` does. Pages that the program cannot read are not evicted while so (the
    /// runtime reads a page to evict it): use this rather than `mprotect` on far memory.
    /// Returns the errno of a failed `mprotect`.
    pub fn protect(&self, addr: usize, len: usize, prot: i32) -> std::result::Result<(), i32> {
        let _scope = LockScope::enter();
        self.state().unreadable.change(addr, len, prot, || {
            // SAFETY: the caller's own mapping; protections do not move or free memory.
            unsafe { farmem_sys::mem::sys_mprotect(addr, len, prot) }.map(|_| ())
        })
    }

    /// Discard the contents of the pages of `[addr, addr+len)` that belong to this runtime's
    /// regions (what `munmap` or `madvise(MADV_DONTNEED)` do to anonymous memory): local
    /// copies are dropped, far copies forgotten, and the pages read as zeros afterwards.
    /// Returns how many of them were local. Partial pages at the ends are included.
    pub fn discard(&self, addr: usize, len: usize) -> usize {
        let _pass = crate::gate::enter();
        let st = self.state();
        st.regions
            .page_runs(addr, addr.saturating_add(len))
            .into_iter()
            .map(|(first, end)| discard::discard_pages(st, first, end))
            .sum()
    }

    /// Lend `[addr, addr+len)` (page-aligned, part of this runtime's far memory) to the
    /// kernel: its contents are dropped, as `munmap` drops them, and the runtime stops
    /// serving it, so that the program can map there what the runtime cannot manage (a
    /// file, shared memory) with the kernel's `mmap(MAP_FIXED)`. See `lend.rs`.
    pub fn lend(&self, addr: usize, len: usize) -> Result<()> {
        let _pass = crate::gate::enter();
        crate::lend::lend(self.state(), addr, len)
    }

    /// Make `[addr, addr+len)`, lent with [`Runtime::lend`], far memory again: inaccessible
    /// (`PROT_NONE`) until the program commits it, reading as zeros.
    ///
    /// # Safety
    /// The range must be lent, and whatever the kernel mapped there the caller's to replace.
    pub unsafe fn take_back(&self, addr: usize, len: usize) -> Result<()> {
        let _pass = crate::gate::enter();
        // SAFETY: forwarded contract.
        unsafe { crate::lend::take_back(self.state(), addr, len) }
    }

    fn destroy_region(&self, info: &RegionInfo) {
        let _scope = RuntimeScope::enter();
        registry::remove(info.base);
        self.state().regions.remove(info.base);
        region::unmap(self.state(), info);
    }
}

/// A far-memory region. Its memory is ordinary memory to the program: read and write it
/// through [`Region::as_mut_ptr`]; hints make accesses cheaper but are never required.
/// Dropping the region frees it (all its pages, local and far).
pub struct Region {
    rt: Runtime,
    info: RegionInfo,
}

impl Region {
    pub fn as_ptr(&self) -> *const u8 {
        self.info.base as *const u8
    }

    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.info.base as *mut u8
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.info.npages * PAGE_SIZE
    }

    pub fn is_empty(&self) -> bool {
        self.info.npages == 0
    }

    pub fn id(&self) -> u32 {
        self.info.id
    }

    pub fn runtime(&self) -> &Runtime {
        &self.rt
    }

    /// Whether the page holding `offset` is local right now (for tests and tools).
    pub fn is_resident(&self, offset: usize) -> bool {
        assert!(offset < self.len(), "offset out of region");
        // A thread woken by a page's install can get here before the installer marks it
        // present (the installer may even be preempted in between): answer for after the
        // transition.
        table::slot((self.info.base + offset) >> PAGE_SHIFT)
            .load_settled()
            .is_present()
    }

    /// The region's memory as a byte slice.
    ///
    /// # Safety
    /// The caller must make sure no other thread writes the region while the slice lives
    /// (the usual aliasing rules; the runtime itself never changes page contents).
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping spans len() bytes for the region's life; aliasing is the
        // caller's promise.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len()) }
    }

    /// The region's memory as a mutable byte slice.
    ///
    /// # Safety
    /// As [`Region::as_slice`], and no other reference to the memory may be used meanwhile.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        // SAFETY: as above; exclusivity is the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), self.len()) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.rt.destroy_region(&self.info);
    }
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("id", &self.info.id)
            .field("base", &format_args!("{:#x}", self.info.base))
            .field("len", &self.len())
            .finish()
    }
}
