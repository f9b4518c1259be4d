//! `fork()` and far memory.
//!
//! A child made by `fork()` gets a copy of the address space but not the userfaultfd
//! registration (the kernel drops it unless `UFFD_FEATURE_EVENT_FORK` is asked for) and not
//! the runtime's threads: a page that is far at the moment of the fork would read as zeros
//! in the child. Two ways out, chosen per fork:
//!
//! - **Far pages stay far** (every in-process store: `local://`, `file://`, `tiered://`).
//!   The prepare handler closes the fork gate (`gate.rs`): new runtime work waits and the
//!   work inside finishes, so at the fork no runtime lock is held and no page is in
//!   transition; read-ahead in flight is installed first. The child then takes the runtime
//!   over, on the memory it inherited: a new userfaultfd under the old descriptor number,
//!   its regions registered again, new threads, and its own copy of the far store (the
//!   compressed tier is its memory; a file tier reads the parent's file, which keeps those
//!   slots for it, and writes a file of its own). The child takes a share of the tree's
//!   budget when the processes share one (`tree_budget.rs`, `farmem run`'s default), else it
//!   has a budget of its own, the parent's or `fork_local_mem`. Pages the parent had
//!   write-protected are writable in the child (the kernel drops the protection with the
//!   registration): they are dirty there. A fork then costs what it costs under Linux, plus
//!   a walk over the page table in the child.
//! - **Far pages come back** (a memory server: the child cannot share the connection).
//!   Each runtime pauses reclaim, waits for the eviction batch in progress, and brings every
//!   far page back into local memory, beyond the budget if need be; the child then runs
//!   with its memory all local (hints become no-ops, new regions are refused). The parent
//!   evicts back down to its budget after the fork. Cost: a fetch of every far page.
//!
//! `posix_spawn` and `vfork` (what `system()` and most `subprocess` calls use) do not run
//! fork handlers and cost nothing.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Once};

use farmem_sys::mem::PAGE_SIZE;
use farmem_sys::signals::BlockAll;
use farmem_sys::uffd;
use parking_lot::lock_api::RawRwLock as _;
use parking_lot::Mutex;

use crate::fetch::demand;
use crate::fetch::readahead;
use crate::fetch::request::{Mode, Request};
use crate::gate;
use crate::page::table;
use crate::registry::{self, in_child};
use crate::scope::LocalScope;
use crate::state::State;
use crate::stats::add;

/// How the fork under way treats far memory.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    KeepFar,
    BringBack,
}

/// The runtimes of the fork under way (prepare handler to parent or child handler); no way
/// when there is nothing to do (a child of a child whose memory is all local).
static FORKING: Mutex<(Vec<Arc<State>>, Option<Way>)> = Mutex::new((Vec::new(), None));

/// Install the fork handlers (once per process).
pub(crate) fn install_handlers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registering three plain extern "C" functions that never unwind.
        let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
        if rc != 0 {
            tracing::warn!("pthread_atfork failed ({rc}): a forked child may see zeros");
        }
    });
}

fn no_unwind(what: &str, f: impl FnOnce()) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
        farmem_sys::process::fatal(&format!(
            "internal error (panic) in the fork {what} handler"
        ));
    }
}

extern "C" fn prepare() {
    let _signals = BlockAll::enter();
    let _local = LocalScope::enter();
    no_unwind("prepare", || {
        if in_child() {
            return; // a child of a child that brought its pages back: nothing is far here
        }
        // The child inherits this thread's affinity: not the pin beside the fault thread.
        for st in registry::live_runtimes() {
            st.placement.before_fork(st.now_ns());
        }
        let keep_far = registry::live_runtimes()
            .iter()
            .all(|st| st.backend.fork_keeps_far());
        if keep_far {
            // From here until the parent or child handler, this thread alone is inside
            // the runtime.
            gate::close();
            let runtimes = registry::live_runtimes();
            for st in &runtimes {
                readahead::complete_range(st, 0, usize::MAX);
                st.backend.fork_prepare();
                crate::inherited::set_aside_resident(st);
            }
            *FORKING.lock() = (runtimes, Some(Way::KeepFar));
            return;
        }
        let _pass = gate::enter();
        let runtimes = registry::live_runtimes();
        for st in &runtimes {
            pause(st);
        }
        *FORKING.lock() = (runtimes, Some(Way::BringBack));
    })
}

extern "C" fn parent() {
    // The backends' bookkeeping of the fork is runtime memory: local.
    let _signals = BlockAll::enter();
    let _local = LocalScope::enter();
    no_unwind("parent", || {
        let (runtimes, way) = std::mem::take(&mut *FORKING.lock());
        match way {
            Some(Way::KeepFar) => {
                for st in &runtimes {
                    st.backend.fork_parent();
                    if let Some(t) = &st.tree {
                        t.after_fork_in_parent();
                    }
                }
                gate::open();
            }
            Some(Way::BringBack) => {
                for st in &runtimes {
                    resume(st);
                }
            }
            None => {}
        }
    })
}

extern "C" fn child() {
    // What the take-over allocates (thread names, their start packets) must be local: no
    // fault thread exists yet to serve a far page.
    let _signals = BlockAll::enter();
    let _local = LocalScope::enter();
    let (runtimes, way) = std::mem::take(&mut *FORKING.lock());
    match way {
        Some(Way::KeepFar) => {
            if crate::fork_window::forked_while_serving() {
                farmem_sys::process::fatal(
                    "fork: the child was made while a page fault of the forking thread was \
                     being served (a signal let it go on early); its far memory is not \
                     consistent",
                );
            }
            no_unwind("child", || {
                for st in &runtimes {
                    take_over(st);
                }
            });
            gate::open();
        }
        Some(Way::BringBack) => {
            registry::enter_child();
            // The paused runtimes stay paused (their threads do not exist here); their
            // locks are never taken again in this process.
            std::mem::forget(runtimes);
        }
        None => {}
    }
}

/// In the child: make the runtime this process's own (see the module's comment).
fn take_over(st: &Arc<State>) {
    let fail = |what: &str, e: &dyn std::fmt::Display| -> ! {
        farmem_sys::process::fatal(&format!(
            "fork: the child cannot keep its far memory: {what}: {e}"
        ))
    };
    st.pid.store(std::process::id(), Ordering::Relaxed);
    // Its statistics are its own: what the parent did is counted in the parent.
    st.stats.c.reset();
    if let Err(e) = st.uffd.reopen_in_child() {
        fail("opening a userfaultfd", &e);
    }
    // SAFETY: eventfd has no memory-safety preconditions.
    let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if efd < 0 {
        fail("eventfd", &std::io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor from the kernel.
    let efd = unsafe { OwnedFd::from_raw_fd(efd) };
    if let Err(e) = farmem_sys::mem::replace_fd(st.wake_fd.as_raw_fd(), efd) {
        fail("eventfd", &e);
    }
    st.unmapper.reopen_in_child();
    for reg in st.regions.all() {
        // Parts lent to the kernel (`lend.rs`: their words unregistered) hold the kernel's
        // mappings, which may not be registrable (files): only the rest is registered.
        for (first, end) in registered_runs_unprotected(reg.first_vpn(), reg.end_vpn()) {
            if let Err(e) = st.uffd.register(
                first * PAGE_SIZE,
                (end - first) * PAGE_SIZE,
                uffd::REGISTER_MODE_MISSING | uffd::REGISTER_MODE_WP,
            ) {
                fail("registering a region", &e);
            }
        }
    }
    st.backend.fork_child();
    if let Some(t) = &st.tree {
        // A member of its own (its budget a share of the tree's), unless given one. Until
        // its first measurement, one measuring interval after the fork, it holds what it
        // inherited and one eviction batch more, and evicts only for room it needs (not
        // ahead, for a free pool): with the parent's budget, three workers filling fresh
        // memory at once took the tree 20% over; with exactly what it inherited, evicting
        // ahead and measured at once, every short-lived child (a shell's `$(...)`, a fork
        // before exec) evicted and wrote back ~200 pages it shared with its parent, which
        // frees nothing: 2 ms of a subshell's 5. The measurement then evicts it down to its
        // share if it holds more (`process_budget::set_regions_budget`).
        t.after_fork_in_child(st.cfg.fork_local_mem.is_some());
        st.budget_checked_ns
            .store(st.now_ns().max(1), Ordering::Relaxed);
        if t.is_member() {
            let resident = st.resident.load(Ordering::Relaxed);
            st.budget.store(
                (resident + st.cfg.evict_batch).max(crate::config::MIN_BUDGET_PAGES),
                Ordering::Release,
            );
            st.over_budget_once.store(false, Ordering::Relaxed);
        }
    }
    if let Some(bytes) = st.cfg.fork_local_mem {
        // The child's own budget: the control thread evicts down to it once running.
        let cfg = crate::config::Config {
            local_mem: bytes,
            ..st.cfg.clone()
        };
        crate::process_budget::set_asked(st, cfg.budget_pages());
        st.set_free_pool(&cfg);
        st.over_budget_once.store(true, Ordering::Relaxed);
    }
    // The parent's threads do not exist here: their handles are never joined. Work the
    // parent had deferred is the parent's (this process defers its own), never run nor
    // dropped here: what it owns (the parent's control socket) is let go of by its owner's
    // own code (`ctl::restart_in_child`).
    std::mem::forget(std::mem::take(&mut *st.threads.lock()));
    std::mem::forget(std::mem::take(&mut *st.deferred.lock()));
    st.deferred_at_ns.store(0, Ordering::Release);
    st.fault_busy_since.store(0, Ordering::Relaxed);
    st.control_sleeping.store(false, Ordering::Relaxed);
    st.fault_thread_up.store(false, Ordering::Release);
    if let Err(e) = crate::workers::start_in_child(st) {
        fail("starting its threads", &e);
    }
    // A new thread's start in glibc reads program memory that may be far (the locale data
    // `setlocale` allocated on the heap): serve faults here until the fault thread runs.
    crate::fault::serve_until(st, || st.fault_thread_up.load(Ordering::Acquire));
}

/// The runs `[first, end)` of registered pages in `[from, to)`, in one walk that also marks
/// their write-protected pages writable: the kernel dropped the protection with the
/// registration the child lost.
fn registered_runs_unprotected(from: usize, to: usize) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for vpn in (from..to).filter(|&v| table::slot(v).peek().is_registered()) {
        table::slot(vpn).update(|w| (w.is_present() && !w.is_writable()).then(|| w.unprotected()));
        match runs.last_mut() {
            Some((_, e)) if *e == vpn => *e += 1,
            _ => runs.push((vpn, vpn + 1)),
        }
    }
    runs
}

/// Stop reclaim, wait for the batch in flight, and bring every far page back.
fn pause(st: &Arc<State>) {
    st.reclaim_paused.store(true, Ordering::SeqCst);
    // Waits for the eviction batches in progress (they hold the gate shared).
    // SAFETY: taking the raw lock without a guard; `resume` (parent) releases it on this
    // same thread, and in the child it is never touched again.
    unsafe { st.evict_gate.raw() }.lock_exclusive();
    readahead::complete_range(st, 0, usize::MAX);
    let regions = st.regions.all();
    let mut fetched = 0u64;
    for reg in regions {
        let mut vpn = reg.first_vpn();
        while vpn < reg.end_vpn() {
            if !is_far(vpn) {
                vpn += 1;
                continue;
            }
            let start = vpn;
            while vpn < reg.end_vpn() && vpn - start < 256 && is_far(vpn) {
                vpn += 1;
            }
            let req = Request::demand(start, vpn - start, false, Mode::Hint);
            match demand::ensure(st, &reg, &req) {
                Ok(o) => fetched += o.installed as u64,
                Err(e) => farmem_sys::process::fatal(&format!(
                    "fork: bringing far pages back for the child failed: {e}"
                )),
            }
        }
    }
    add(&st.stats.c.fork_fetched_pages, fetched);
}

/// A page whose contents exist only in far memory.
fn is_far(vpn: usize) -> bool {
    table::slot(vpn).load().is_far()
}

fn resume(st: &Arc<State>) {
    st.reclaim_paused.store(false, Ordering::SeqCst);
    // SAFETY: `pause` took the gate exclusively on this thread (the one that forked) and
    // nothing released it since.
    unsafe { st.evict_gate.raw().unlock_exclusive() };
    st.kick_control();
}
