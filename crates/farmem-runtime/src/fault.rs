//! The unhinted path: page faults delivered through userfaultfd, served by the runtime's
//! fault thread through the same fetch code as hints.
//!
//! The fault thread never sleeps on a page lock: a fault on a page that another thread is
//! fetching or evicting is parked and retried, so one slow transition cannot stall every
//! other fault. If the fault thread itself is busy for too long (a large fetch, a direct
//! reclaim), the control thread steals pending events and serves them (Eden's fault stealing).
//! Faults that follow a pattern get read-ahead chosen by the predictor (`predict.rs`: runs
//! with a window that doubles while they hold, like the kernel's swap read-ahead, and a
//! majority vote when runs fail). Runs of stride ±1 are fetched with the demanded page;
//! other strides are read asynchronously in the prefetch class once the demanded page is in
//! (`fetch::readahead::submit_pages`).

use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use farmem_sys::mem::{PAGE_SHIFT, PAGE_SIZE};
use farmem_sys::uffd::{Event, UffdMsg};

use crate::fault_log::{self, FaultKind, FaultRecord};
use crate::fetch::demand;
use crate::fetch::phases::prefetch_deadline;
use crate::fetch::readahead;
use crate::fetch::request::{Mode, Request};
use crate::fork_window;
use crate::gate;
use crate::neighbour::Neighbour;
use crate::page::table;
use crate::placement::{self, Placement};
use crate::predict::{Prediction, Predictor};
use crate::state::State;
use crate::stats::add;
use crate::watchdog;

#[derive(Clone, Copy, Debug)]
struct Fault {
    addr: usize,
    write: bool,
    wp: bool,
    tid: u32,
    /// When it was read (`State::now_ns`), and whether the watchdog heard of it waiting.
    since: u64,
    reported: bool,
}

/// Reads and serves fault events; owns the faults it could not serve yet.
pub(crate) struct FaultServer {
    msgs: Vec<UffdMsg>,
    /// The faults of the last read (kept for its capacity).
    arrived: Vec<Fault>,
    pending: VecDeque<Fault>,
    predictor: Option<Predictor>,
    neighbour: Option<Neighbour>,
    /// `farmem trace` is recording (`crate::fault_log`).
    logging: bool,
    /// The thread of the last fault read.
    last_tid: u32,
}

/// Record a fault for `farmem trace`, with what it needs (read off the page's word now,
/// before it is served).
fn log_fault(f: &Fault) {
    let w = table::slot(f.addr >> PAGE_SHIFT).load();
    let kind = if f.wp {
        FaultKind::WriteProtect
    } else if w.is_present() {
        FaultKind::Resolved
    } else if w.has_far_copy() {
        FaultKind::Fetch
    } else {
        FaultKind::ZeroFill
    };
    fault_log::record(FaultRecord {
        time_ns: fault_log::monotonic_ns(),
        tid: f.tid,
        kind,
        write: f.write,
        addr: f.addr as u64,
    });
}

impl FaultServer {
    pub(crate) fn new() -> FaultServer {
        FaultServer {
            msgs: vec![UffdMsg::default(); 64],
            arrived: Vec::with_capacity(64),
            pending: VecDeque::new(),
            predictor: None,
            neighbour: None,
            logging: fault_log::enabled(),
            last_tid: 0,
        }
    }

    /// Read what is pending on the userfaultfd and serve it, calling `before_serving` with
    /// each fault's thread while that thread still waits in its fault. Returns events read.
    fn poll_events(&mut self, st: &State, before_serving: &mut dyn FnMut(u32)) -> usize {
        let n = self.read_faults(st);
        let arrived = std::mem::take(&mut self.arrived);
        for &f in &arrived {
            self.last_tid = f.tid;
            if self.logging {
                log_fault(&f);
            }
            before_serving(f.tid);
            if !self.serve(st, f) {
                self.pending.push_back(f);
            }
        }
        self.arrived = arrived;
        n
    }

    /// Read what is pending on the userfaultfd into `arrived` (its page faults, counted);
    /// returns events read.
    fn read_faults(&mut self, st: &State) -> usize {
        self.arrived.clear();
        let n = match st.uffd.read_events(&mut self.msgs) {
            Ok(n) => n,
            Err(e) => {
                tracing::error!("reading userfaultfd: {e}");
                return 0;
            }
        };
        for i in 0..n {
            let Event::PageFault {
                addr,
                write,
                wp,
                tid,
            } = self.msgs[i].event()
            else {
                continue;
            };
            add(&st.stats.c.unhinted_faults, 1);
            self.arrived.push(Fault {
                addr: addr & !(PAGE_SIZE - 1),
                write,
                wp,
                tid,
                since: st.now_ns(),
                reported: false,
            });
        }
        n
    }

    /// Retry parked faults once each; tell the watchdog of one parked too long.
    fn retry_pending(&mut self, st: &State) {
        if self.pending.is_empty() {
            return;
        }
        let bound = watchdog::bound(st).map(|b| b.as_nanos() as u64);
        let now = st.now_ns();
        for _ in 0..self.pending.len() {
            let mut f = self.pending.pop_front().expect("pending fault");
            if self.serve(st, f) {
                continue;
            }
            if let Some(b) = bound.filter(|&b| !f.reported && now.saturating_sub(f.since) > b) {
                f.reported = true;
                watchdog::report(
                    st,
                    &format!(
                        "the fault at {:#x} (thread {}) has found its page locked for over {} s",
                        f.addr,
                        f.tid,
                        b as f64 / 1e9
                    ),
                );
            }
            self.pending.push_back(f);
        }
    }

    /// Serve one fault; false if a page it needs is locked by someone else.
    fn serve(&mut self, st: &State, f: Fault) -> bool {
        let Some(reg) = st.region_of(f.addr) else {
            // Region destroyed meanwhile (unregistering woke the thread already).
            return true;
        };
        let vpn = f.addr >> PAGE_SHIFT;
        let absent = table::slot(vpn).load().is_absent();
        let prediction = if absent && !f.wp {
            let predictor = self
                .predictor
                .get_or_insert_with(|| Predictor::new(st.cfg.fault_readahead));
            let p = predictor.on_fault_at(reg.id, f.tid, vpn, st.now_ns());
            let t = predictor.take_tally();
            let c = &st.stats.c;
            add(&c.fault_predicted_pages, t.predicted);
            add(&c.fault_prefetch_used, t.used);
            add(&c.fault_prefetch_wasted, t.wasted);
            p
        } else {
            None
        };
        let mut readahead = prediction.map_or(0, |p| readahead_for(vpn, &p));
        let mut fresh_end = 0;
        // Also under a forward prediction: its window alone stops zero-filling at the
        // 16-page block (GNU sort's merge, whose outputs are streams in fresh memory, took
        // 7,800 faults at its peak, 19 pages each).
        let forward = prediction.is_none_or(|p| p.stride == 1);
        if absent && !f.wp && forward {
            if let Some(block_end) = fresh_block_end(st, &reg, vpn) {
                // New memory being filled while the program fits its budget: zero-fill the
                // rest of its block too (no I/O, budget to spare: read-ahead takes only free
                // budget), so that a growing heap faults once per block, not once per page or
                // per predicted run (CPython building 128 MiB at a budget it fits: 5,772 ->
                // 630 faults, 0.46 -> 0.37 s; native 0.34 s).
                readahead = readahead.max((block_end - vpn - 1) as isize);
                fresh_end = block_end;
            }
        }
        // Objects that straddle a page boundary fault in pairs no stream predicts: read the
        // next page too while such pages are needed during their stay (`neighbour.rs`).
        let neighbour = absent && !f.wp && {
            let eligible = prediction.is_none()
                && readahead == 0
                && st.cfg.fault_readahead > 0
                && vpn + 1 < reg.end_vpn()
                && table::slot(vpn + 1).load().is_far();
            self.neighbour
                .get_or_insert_with(|| Neighbour::new(st.backend.reads_in_parallel()))
                .on_fault(vpn, eligible, st.unprotected_budget() as u64)
        };
        if neighbour {
            readahead = 1;
            if let Some(p) = self.predictor.as_mut() {
                p.read_along(reg.id, f.tid, vpn);
            }
            add(&st.stats.c.neighbour_reads, 1);
        }
        let req = Request {
            first: vpn,
            count: 1,
            write: f.write,
            readahead,
            // A neighbour is installed as its own history says, not as the faulting write.
            readahead_writable: f.write && !neighbour,
            prio: 0,
            mode: Mode::Fault,
            readahead_useful_for: prediction.and_then(|p| p.useful_for(vpn)),
            readahead_trusted: prediction.is_some() && predictions_hit(st),
            fresh_end,
        };
        match demand::ensure(st, &reg, &req) {
            Ok(o) if o.busy => false,
            Ok(o) => {
                if o.unprotected > 0 {
                    add(&st.stats.c.wp_faults, o.unprotected as u64);
                }
                if o.installed == 0 && o.unprotected == 0 {
                    // Someone else resolved it; make sure the faulting thread runs again.
                    add(&st.stats.c.spurious_faults, 1);
                    let _ = st.uffd.wake(f.addr, PAGE_SIZE);
                }
                // Strided predictions: read asynchronously, after the demanded page is in.
                if let Some(p) = prediction.filter(|_| readahead == 0) {
                    let mut pages: Vec<usize> = p
                        .pages()
                        .filter(|&v| v >= reg.first_vpn() && v < reg.end_vpn())
                        .collect();
                    pages.sort_unstable();
                    let useful_for = prefetch_deadline(st, p.useful_for(vpn));
                    readahead::submit_pages(st, &reg, pages, 0, useful_for);
                }
                true
            }
            Err(e) => farmem_sys::process::fatal(&format!(
                "cannot resolve a page fault at {:#x}: {e}",
                f.addr
            )),
        }
    }

    /// While a fork holds the gate closed: serve the faults of the thread that closed it
    /// (`fork_window.rs`); the other threads' faults are parked until the gate opens.
    fn serve_for_fork(&mut self, st: &State) {
        let Some(closer) = gate::closer() else {
            return; // opened meanwhile (or about to be closed: look again)
        };
        for _ in 0..self.pending.len() {
            let f = self.pending.pop_front().expect("pending fault");
            if f.tid != closer || !fork_window::serve(st, f.addr, f.write) {
                self.pending.push_back(f);
            }
        }
        // The gate opens within a fork (a few milliseconds at most): a short wait, and the
        // gate looked at again after it.
        wait_for_events(st, 50_000);
        self.read_faults(st);
        let arrived = std::mem::take(&mut self.arrived);
        for &f in &arrived {
            if f.tid != closer || !fork_window::serve(st, f.addr, f.write) {
                self.pending.push_back(f);
            }
        }
        self.arrived = arrived;
    }

    /// Serve events on behalf of a busy fault thread (control thread).
    pub(crate) fn steal(&mut self, st: &State) {
        loop {
            let n = self.poll_events(st, &mut |_| {});
            add(&st.stats.c.stolen_faults, n as u64);
            self.retry_pending(st);
            if n == 0 && self.pending.is_empty() {
                break;
            }
            if st.shutdown.load(Ordering::Acquire) {
                break;
            }
        }
    }
}

/// Serve faults on the calling thread until `done` says so (a forked child's handler, while
/// the child's own fault thread starts: glibc's thread start reads program memory, such as
/// the locale data `setlocale` allocated, which may be far).
pub(crate) fn serve_until(st: &State, done: impl Fn() -> bool) {
    let mut server = FaultServer::new();
    while !done() {
        let n = server.poll_events(st, &mut |_| {});
        server.retry_pending(st);
        if n == 0 && server.pending.is_empty() {
            // A short wait, `done` checked again after it: the fault thread is up within
            // ~100 us, and a wait of poll's least timeout (1 ms) made every fork+exec of a
            // shell under farmem 1.1 ms slower (bash's children waited here 1.45 ms).
            wait_for_events(st, 20_000);
        }
    }
}

/// Wait until fault events arrive, at most `ns` nanoseconds.
fn wait_for_events(st: &State, ns: i64) {
    let mut fd = libc::pollfd {
        fd: st.uffd.raw(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: ns,
    };
    // SAFETY: one valid pollfd and a valid timespec; no signal mask.
    unsafe { libc::ppoll(&mut fd, 1, &ts, std::ptr::null()) };
}

/// Main loop of a fault thread.
pub(crate) fn run(st: Arc<State>) {
    crate::fetch::warm_thread_locals();
    crate::protect_handoff::mark_fault_thread();
    // Running: a forked child's handler stops serving faults for it (`fork.rs`).
    st.fault_thread_up.store(true, Ordering::Release);
    let mut server = FaultServer::new();
    let mut placement = Placement::start(
        st.cfg.fault_follow && st.cfg.fault_threads == 1,
        st.backend.completion_cpus(),
    );
    let spin = std::time::Duration::from_micros(st.cfg.fault_spin_us);
    let mut last_event = Instant::now();
    let mut fds = [
        libc::pollfd {
            fd: st.uffd.raw(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: st.wake_fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    while !st.shutdown.load(Ordering::Acquire) {
        let Some(pass) = gate::try_enter() else {
            // A fork holds the gate: its thread may fault before it forks.
            server.serve_for_fork(&st);
            continue;
        };
        // Inside the gate: a fork never finds the deferred work's lock held.
        crate::deferred::run_deferred(&st);
        st.fault_busy_since.store(st.now_ns(), Ordering::Release);
        st.protect_handoff.serve(&st.handoff_cx());
        let n = server.poll_events(&st, &mut |tid| {
            if let Some(p) = placement.as_mut() {
                p.before_serving(tid);
            }
        });
        server.retry_pending(&st);
        // Prefetches that have arrived are mapped now, before the program reaches them.
        readahead::complete_arrived(&st);
        st.fault_busy_since.store(0, Ordering::Release);
        drop(pass);
        if n > 0 {
            last_event = Instant::now();
            let now = st.now_ns();
            st.protect_handoff.faults_read(now);
            if let Some(p) = placement.as_mut() {
                let reads = st.backend.disk_reads();
                p.after_faults(&st.placement, &st.stats.c, server.last_tid, n, now, reads);
                st.protect_handoff.set_following(p.following());
            }
            continue;
        }
        if !server.pending.is_empty() {
            // A parked fault waits on a lock held for a few microseconds.
            std::thread::yield_now();
            continue;
        }
        // Beside the program it serves, spinning would only keep the program off its CPU.
        let following = placement.as_ref().is_some_and(|p| p.following());
        if !following && last_event.elapsed() < spin {
            std::hint::spin_loop();
            continue;
        }
        if let Some(p) = placement.as_mut() {
            p.before_sleep();
        }
        let timeout = if following { placement::QUIET_MS } else { 1000 };
        let timeout = crate::deferred::sleep_ms(&st, timeout);
        // SAFETY: `fds` is a valid array of two pollfd structs.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
        if ready == 0 && following {
            if let Some(p) = placement.as_mut() {
                p.quiet(&st.placement);
                st.protect_handoff.set_following(false);
            }
        }
        if fds[0].revents & libc::POLLNVAL != 0 && !st.shutdown.load(Ordering::Acquire) {
            // The program closed our userfaultfd (daemons that close every descriptor do):
            // the kernel now fills far pages with zeros. Stopping is the only honest choice.
            farmem_sys::process::fatal(
                "the program closed farmem's userfaultfd descriptor; far pages can no longer \
                 be fetched (programs that close all their file descriptors cannot run on \
                 far memory)",
            );
        }
        fds[0].revents = 0;
        fds[1].revents = 0;
    }
}

/// Pages zero-filled at once where a known allocation is being filled (`extents`): a V8
/// heap page (64 pages), a JVM heap region, an arena an allocator mapped.
const EXTENT_BLOCK: usize = 64;

/// Where the zero-fill of a fault at `vpn` on fresh memory ends (exclusive), if it is one,
/// while the program has never needed more than its budget: to the end of its block of
/// [`demand::FRESH_BLOCK`] pages where it grows resident memory (the page before it is
/// present); inside an allocation the allocator told of (`extents`), to the end of its block
/// of [`EXTENT_BLOCK`] pages (within the allocation) where it grows resident memory, and of
/// [`demand::FRESH_BLOCK`] pages where it starts the allocation (a language runtime's heap
/// page or region is filled from its start, and grows from there; a block used only at its
/// start, mimalloc's 2.25 MiB of bookkeeping in every process, kept 63 pages of zeros
/// resident when its first fault filled 64: an idle C program's anonymous memory went from
/// 964 to 760 KiB, the JVM test's peak from 160 to 144 MiB, at the same speed). Sparse
/// first touches (a page here and there of a large mapping) get no more than they touch:
/// memory the program never uses is never made resident for it. Where the fault that grows
/// resident memory is the front of memory filled in order, it goes as far as [`front_end`].
fn fresh_block_end(st: &State, reg: &crate::regions::RegionInfo, vpn: usize) -> Option<usize> {
    if st.over_budget_once.load(Ordering::Relaxed) || table::slot(vpn).load().is_far() {
        return None;
    }
    let grows = vpn > reg.first_vpn() && table::slot(vpn - 1).load().is_present();
    let extent = st.extents.around(vpn);
    let block_end = match &extent {
        Some(e) if grows => e.end.min((vpn | (EXTENT_BLOCK - 1)) + 1),
        Some(e) if vpn == e.start => return Some(e.end.min((vpn | (demand::FRESH_BLOCK - 1)) + 1)),
        _ if grows => (vpn | (demand::FRESH_BLOCK - 1)) + 1,
        _ => return None,
    };
    // Past the end of a known allocation is the room an allocator leaves after a block (a
    // slot's tail), not the front of anything being filled.
    if extent.is_none() && st.extents.around(vpn - 1).is_some() {
        return Some(block_end);
    }
    let (limit, most) = match extent {
        Some(e) => (e.end.min(reg.end_vpn()), FRONT_MAX_KNOWN),
        None => (reg.end_vpn(), FRONT_MAX),
    };
    Some(block_end.max(front_end(reg, vpn, limit, most)))
}

/// Most pages the fill of a fault at the front of memory written in order takes: 256 KiB.
/// At 256 (1 MiB) the C fork program (blocks of mixed sizes, whose allocator pages keep
/// slots no block ever takes) peaked 7 MiB higher than with no front rule, at 64 2 MiB.
const FRONT_MAX: usize = 64;
/// The same inside an allocation its allocator told of (`extents`: a large block, a mapping),
/// which the fill never leaves, so it leaves no slot tails resident: 1 MiB (the most a
/// fault's read-ahead takes, `max_readahead`). The suite's psort at its native peak (two
/// threads filling 128 MiB arrays, both CPUs busy) took 1,538 faults at 64 and ran at
/// 0.96x native.
const FRONT_MAX_KNOWN: usize = 256;

/// Where the zero-fill of a fault on fresh memory ends (exclusive) when it is the front of
/// memory being filled in order: as many pages ahead as are resident just behind it (at
/// least a block of [`demand::FRESH_BLOCK`], at most `most`: [`FRONT_MAX`], or
/// [`FRONT_MAX_KNOWN`] in a known allocation), up to `limit` and the
/// first page that is not fresh; else just past `vpn`. So a heap filled from its start
/// faults at doubling distances, then once per `most` pages, and speculation never
/// exceeds what the same stream has already used (mimalloc fills its arenas a 64 KiB page
/// at a time, which no allocation record covers: the suite's dictgrow at its native peak
/// took 3,225 faults, one per 16 pages, and ran at 0.93x native; now 1,619 faults, at or
/// above native speed).
fn front_end(reg: &crate::regions::RegionInfo, vpn: usize, limit: usize, most: usize) -> usize {
    let behind = (1..=most.min(vpn - reg.first_vpn()))
        .take_while(|&d| table::slot(vpn - d).load().is_present())
        .count();
    if behind < demand::FRESH_BLOCK {
        return vpn + 1;
    }
    let cap = (vpn + behind).min(limit);
    (vpn + 1..cap)
        .find(|&v| {
            let w = table::slot(v).load();
            !w.is_absent() || w.is_far() || w.is_locked()
        })
        .unwrap_or(cap)
}

/// The read-ahead of a fault request that covers a prediction: pages after (or before) the
/// faulting one up to the prediction's far end. Pages in between that are present or in
/// flight are skipped by the fetch. Other strides are read separately: 0.
fn readahead_for(vpn: usize, p: &Prediction) -> isize {
    let last = p.pages().last().unwrap_or(vpn) as isize;
    match p.stride {
        1 | -1 => last - vpn as isize,
        _ => 0,
    }
}

/// Whether the predictor's pages have been used at least four times in five so far (their
/// read-ahead is then as good as demanded: `Request::readahead_trusted`). sqlite's sweep
/// through an index, predicted at 54%, filled its protected band with pages never used.
fn predictions_hit(st: &State) -> bool {
    let c = &st.stats.c;
    let used = c.fault_prefetch_used.load(Ordering::Relaxed);
    let wasted = c.fault_prefetch_wasted.load(Ordering::Relaxed);
    used >= 4 * wasted && used > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predictions_become_read_ahead_in_their_direction() {
        let p = |start, stride, count| Prediction {
            start,
            stride,
            count,
            tier: 1,
            pace_ns: 0,
        };
        assert_eq!(readahead_for(100, &p(101, 1, 4)), 4);
        assert_eq!(readahead_for(100, &p(105, 1, 8)), 12, "up to the far end");
        assert_eq!(readahead_for(100, &p(99, -1, 4)), -4);
        assert_eq!(
            readahead_for(100, &p(103, 3, 4)),
            0,
            "strided: read separately"
        );
    }

    /// A fault whose page stays locked (here by the test, as a stuck fetch would) is
    /// reported by the watchdog, then served once the page is free.
    #[test]
    fn a_fault_parked_too_long_is_reported_then_served() {
        use crate::config::Config;
        use crate::runtime::Runtime;
        let rt = Runtime::new(Config {
            local_mem: 1 << 20,
            watchdog_s: 0.2,
            ..Config::default()
        })
        .expect("a runtime (needs userfaultfd)");
        let r = rt.create_region(16 * PAGE_SIZE).unwrap();
        let vpn = r.as_ptr() as usize >> PAGE_SHIFT;
        let old = table::slot(vpn)
            .lock_if_absent(7)
            .expect("a fresh page is absent");
        let p = r.as_mut_ptr() as usize;
        let toucher = std::thread::spawn(move || {
            // SAFETY: inside the region, which outlives this thread (joined below).
            unsafe { (p as *mut u64).write_volatile(42) }
        });
        let mut waited = 0;
        while rt.stats().watchdog_reports == 0 {
            std::thread::sleep(std::time::Duration::from_millis(10));
            waited += 1;
            assert!(
                waited < 6000,
                "the watchdog never reported the parked fault"
            );
        }
        table::slot(vpn).unlock(old);
        toucher.join().unwrap();
        // SAFETY: inside the region.
        assert_eq!(unsafe { (p as *const u64).read_volatile() }, 42);
        assert_eq!(rt.stats().watchdog_reports, 1, "reported once");
    }
}
