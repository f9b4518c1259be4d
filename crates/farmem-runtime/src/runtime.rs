//! The runtime: one userfaultfd, one local-memory budget, one backend, one reclaim policy and
//! one set of threads (fault thread(s) and the control thread), shared by all its regions.

use std::collections::BTreeMap;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::{Condvar, Mutex, RwLock};

use crate::backend::{self, Backend};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::policy::{self, Policy};
use crate::region::{Region, RegionInfo};
use crate::stats::{Stats, StatsSnapshot};
use crate::{fault, page_table, reclaim};
use farmem_sys::mem::{Unmapper, PAGE_SIZE};
use farmem_sys::uffd::{self, Uffd};

/// State shared by the runtime's threads and every thread that hints or faults.
pub(crate) struct Inner {
    pub cfg: Config,
    pub uffd: Uffd,
    pub unmapper: Unmapper,
    pub backend: Arc<dyn Backend>,
    pub policy: Mutex<Box<dyn Policy>>,
    /// Bookkeeping deferred off the fetch path, drained into `policy` (see `book.rs`).
    pub book: crate::book::Book,
    /// Budget and free target, in pages.
    pub budget: usize,
    pub free_target: usize,
    /// Pages installed plus pages reserved by in-flight fetches.
    pub resident: AtomicUsize,
    pub stats: Stats,
    pub shutdown: AtomicBool,
    /// Control thread wake-up.
    pub control_lock: Mutex<()>,
    pub control_cv: Condvar,
    pub control_sleeping: AtomicBool,
    /// eventfd that wakes the fault threads out of poll() at shutdown.
    pub wake_fd: OwnedFd,
    /// Nanoseconds since `epoch` at which the fault thread began serving its current batch
    /// (0: idle). The control thread steals faults when this gets old.
    pub fault_busy_since: AtomicU64,
    pub epoch: Instant,
    pub regions: RwLock<BTreeMap<usize, RegionInfo>>,
    next_region: AtomicU32,
    /// Until when (`now_ns`) dirty pages are not offered to a far tier that refused some,
    /// and the current backoff (see `reclaim.rs`).
    pub far_full_until: AtomicU64,
    pub far_full_backoff: AtomicU64,
    /// Read-ahead batches in flight (see `prefetch.rs`).
    pub inflight: crate::prefetch::InFlightSet,
    /// Reclaim is paused while a fork brings far pages back (see `fork.rs`); fetches may
    /// then exceed the budget.
    pub reclaim_paused: AtomicBool,
    /// Held shared by every eviction batch, exclusively by a fork in preparation, which so
    /// waits for the batches in flight.
    pub evict_gate: RwLock<()>,
    /// Pages evicted so far: the clock of the pages' shadows (see `page_table::SHADOW_SHIFT`).
    pub evict_clock: AtomicU64,
    /// The policy orders by recency: pages a fault brings in start idle ("on probation")
    /// unless their refault distance says they belong to the working set.
    pub probation: bool,
}

impl Inner {
    pub fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64 + 1
    }

    /// The region of this runtime containing `addr`.
    pub fn region_of(&self, addr: usize) -> Option<RegionInfo> {
        let regions = self.regions.read();
        let (_, r) = regions.range(..=addr).next_back()?;
        (addr < r.end()).then_some(*r)
    }

    pub fn free_pages(&self) -> usize {
        self.budget
            .saturating_sub(self.resident.load(Ordering::Relaxed))
    }

    /// Ask the control thread to reclaim (cheap when it is already awake).
    pub fn kick_control(&self) {
        if self.control_sleeping.load(Ordering::Relaxed) {
            let _g = self.control_lock.lock();
            self.control_cv.notify_one();
        }
    }

    /// The reclaim policy, with every page fetched so far handed to it.
    pub fn policy(&self) -> parking_lot::MutexGuard<'_, Box<dyn Policy>> {
        let mut p = self.policy.lock();
        self.book.drain(p.as_mut(), &self.stats);
        p
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        // Latencies still queued belong in the histogram.
        drop(self.policy());
        let mut s = self.stats.snapshot();
        s.budget_bytes = (self.budget * PAGE_SIZE) as u64;
        s.resident_pages = self.resident.load(Ordering::Relaxed) as u64;
        s.backend_bytes = self.backend.stored_bytes();
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

/// Process-wide index of all regions of all runtimes, for the hint slow path (which knows
/// only an address).
struct RegistryEntry {
    end: usize,
    info: RegionInfo,
    rt: Weak<Inner>,
}

static REGISTRY: RwLock<BTreeMap<usize, RegistryEntry>> = RwLock::new(BTreeMap::new());

/// Find the runtime and region holding `addr`. None in a forked child, whose runtime threads
/// did not survive the fork (its memory is all local there).
pub(crate) fn lookup(addr: usize) -> Option<(Arc<Inner>, RegionInfo)> {
    if crate::fork::in_child() {
        return None;
    }
    let reg = REGISTRY.read();
    let (_, e) = reg.range(..=addr).next_back()?;
    if addr >= e.end {
        return None;
    }
    Some((e.rt.upgrade()?, e.info))
}

/// Every runtime that has at least one region.
pub(crate) fn live_runtimes() -> Vec<Arc<Inner>> {
    let mut out: Vec<Arc<Inner>> = Vec::new();
    for e in REGISTRY.read().values() {
        if let Some(rt) = e.rt.upgrade() {
            if !out.iter().any(|o| Arc::ptr_eq(o, &rt)) {
                out.push(rt);
            }
        }
    }
    out
}

fn refuse_in_child() -> Result<()> {
    if crate::fork::in_child() {
        return Err(Error::Config(
            "far memory is not available in a child forked from a far-memory process (the \
             runtime's threads do not survive fork; the child's memory is all local)"
                .into(),
        ));
    }
    Ok(())
}

/// The runtime installed by [`Runtime::install_global`].
static INSTALLED: OnceLock<Runtime> = OnceLock::new();

struct Shared {
    inner: Arc<Inner>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Ordering::SeqCst);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to our own eventfd.
        unsafe {
            libc::write(
                std::os::fd::AsRawFd::as_raw_fd(&self.inner.wake_fd),
                &one as *const u64 as *const libc::c_void,
                8,
            )
        };
        {
            let _g = self.inner.control_lock.lock();
            self.inner.control_cv.notify_all();
        }
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
        if self.inner.cfg.stats_at_exit {
            eprintln!("{}", self.inner.report());
        }
    }
}

/// A far-memory runtime. Cheap to clone; its threads stop when the last clone and the last
/// of its regions are dropped.
#[derive(Clone)]
pub struct Runtime {
    shared: Arc<Shared>,
}

impl Runtime {
    /// Start a runtime with its own budget, backend and threads.
    pub fn new(mut cfg: Config) -> Result<Runtime> {
        refuse_in_child()?;
        cfg.validate()?;
        cfg.evict_batch = cfg.effective_evict_batch();
        crate::fork::install_handlers();
        page_table::init().map_err(|e| Error::sys("page table", e))?;
        let uffd = Uffd::open(uffd::FEATURE_PAGEFAULT_FLAG_WP | uffd::FEATURE_THREAD_ID)
            .map_err(|e| Error::sys("opening userfaultfd", e))?;
        // SAFETY: eventfd has no memory-safety preconditions.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(Error::sys("eventfd", std::io::Error::last_os_error()));
        }
        // SAFETY: fresh descriptor from the kernel.
        let wake_fd = unsafe { OwnedFd::from_raw_fd(efd) };
        let backend = backend::from_spec(&cfg.backend).map_err(|e| Error::Backend {
            backend: match &cfg.backend {
                crate::config::BackendSpec::Tcp(t) => t.url(),
                other => format!("{other:?}"),
            },
            msg: e.to_string(),
        })?;
        let inner = Arc::new(Inner {
            budget: cfg.budget_pages(),
            free_target: cfg.free_target_pages(),
            backend,
            policy: Mutex::new(policy::build(cfg.policy)),
            book: Default::default(),
            probation: cfg.policy != crate::config::PolicyKind::Fifo,
            cfg,
            uffd,
            unmapper: Unmapper::new(),
            resident: AtomicUsize::new(0),
            stats: Stats::default(),
            shutdown: AtomicBool::new(false),
            control_lock: Mutex::new(()),
            control_cv: Condvar::new(),
            control_sleeping: AtomicBool::new(false),
            wake_fd,
            fault_busy_since: AtomicU64::new(0),
            epoch: Instant::now(),
            regions: RwLock::new(BTreeMap::new()),
            next_region: AtomicU32::new(1),
            far_full_until: AtomicU64::new(0),
            far_full_backoff: AtomicU64::new(0),
            inflight: Default::default(),
            reclaim_paused: AtomicBool::new(false),
            evict_gate: RwLock::new(()),
            // From 1: a shadow of 0 means "never evicted".
            evict_clock: AtomicU64::new(1),
        });
        let mut threads = Vec::new();
        for i in 0..inner.cfg.fault_threads {
            let inn = inner.clone();
            threads.push(
                crate::spawn_runtime_thread(format!("farmem-fault-{i}"), move || {
                    fault::fault_thread(inn)
                })
                .map_err(|e| Error::sys("starting fault thread", e))?,
            );
        }
        let inn = inner.clone();
        threads.push(
            crate::spawn_runtime_thread("farmem-control".into(), move || {
                reclaim::control_thread(inn)
            })
            .map_err(|e| Error::sys("starting control thread", e))?,
        );
        tracing::debug!(
            budget_pages = inner.budget,
            backend = %inner.backend.describe(),
            vectored_unmap = inner.unmapper.is_vectored(),
            "farmem runtime started"
        );
        Ok(Runtime {
            shared: Arc::new(Shared {
                inner,
                threads: Mutex::new(threads),
            }),
        })
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
        static GLOBAL: OnceLock<std::result::Result<Runtime, String>> = OnceLock::new();
        let r = GLOBAL.get_or_init(|| {
            let rt = Config::from_env()
                .and_then(Runtime::new)
                .map_err(|e| e.to_string())?;
            if rt.config().stats_at_exit {
                extern "C" fn print_stats() {
                    if let Ok(rt) = Runtime::global() {
                        eprintln!("{}", rt.report());
                    }
                }
                // SAFETY: registering a plain extern "C" function with no arguments.
                unsafe { libc::atexit(print_stats) };
            }
            Ok(rt)
        });
        r.as_ref().map_err(|m| Error::Config(m.clone()))
    }

    /// Make `rt` the process-wide runtime that [`Runtime::global`] returns (the transparent
    /// mode installs its runtime, so that hints and regions of the C API share its budget).
    /// The first installed runtime stays.
    pub fn install_global(rt: Runtime) {
        let _ = INSTALLED.set(rt);
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.shared.inner
    }

    pub fn config(&self) -> &Config {
        &self.shared.inner.cfg
    }

    /// Statistics so far.
    pub fn stats(&self) -> StatsSnapshot {
        self.shared.inner.snapshot()
    }

    /// Statistics and the backend's own counters as text for people.
    pub fn report(&self) -> String {
        self.shared.inner.report()
    }

    /// Description of the backend in use.
    pub fn backend_name(&self) -> String {
        self.shared.inner.backend.describe()
    }

    /// Name of the reclaim policy in use.
    pub fn policy_name(&self) -> &'static str {
        self.shared.inner.policy.lock().name()
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

    fn create_region_impl(&self, size: usize, at: Option<usize>) -> Result<Region> {
        refuse_in_child()?;
        let inner = self.inner();
        if size == 0 {
            return Err(Error::Invalid("region size must be positive".into()));
        }
        if size > 1 << 45 {
            return Err(Error::Invalid(format!(
                "region size {size} exceeds the 32 TiB limit"
            )));
        }
        let len = size.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let id = inner.next_region.fetch_add(1, Ordering::Relaxed);
        let info = crate::region::map(inner, id, len, at)?;
        REGISTRY.write().insert(
            info.base,
            RegistryEntry {
                end: info.end(),
                info,
                rt: Arc::downgrade(inner),
            },
        );
        inner.regions.write().insert(info.base, info);
        Ok(Region::new(self.clone(), info))
    }

    /// Discard the contents of the pages of `[addr, addr+len)` that belong to this runtime's
    /// regions (what `munmap` or `madvise(MADV_DONTNEED)` do to anonymous memory): local
    /// copies are dropped, far copies forgotten, and the pages read as zeros afterwards.
    /// Returns how many of them were local. Partial pages at the ends are included.
    pub fn discard(&self, addr: usize, len: usize) -> usize {
        let inner = self.inner();
        let end = addr.saturating_add(len);
        let mut dropped = 0;
        let regions: Vec<RegionInfo> = inner
            .regions
            .read()
            .range(..end)
            .map(|(_, r)| *r)
            .filter(|r| r.end() > addr)
            .collect();
        for r in regions {
            let first = (addr.max(r.base)) / PAGE_SIZE;
            let last = (end.min(r.end())).div_ceil(PAGE_SIZE);
            if first < last {
                dropped += crate::discard::discard_pages(inner, first, last);
            }
        }
        dropped
    }

    pub(crate) fn destroy_region(&self, info: &RegionInfo) {
        REGISTRY.write().remove(&info.base);
        self.inner().regions.write().remove(&info.base);
        crate::region::unmap(self.inner(), info);
    }
}
