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
//! (`prefetch::submit_pages`).

use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::fetch::{self, Mode, Request};
use crate::predict::{Prediction, Predictor};
use crate::prefetch;
use crate::runtime::Inner;
use crate::stats::add;
use farmem_sys::mem::{PAGE_SHIFT, PAGE_SIZE};
use farmem_sys::uffd::{UffdMsg, EVENT_PAGEFAULT, PAGEFAULT_FLAG_WP, PAGEFAULT_FLAG_WRITE};

#[derive(Clone, Copy, Debug)]
struct Fault {
    addr: usize,
    write: bool,
    wp: bool,
    tid: u32,
}

/// Reads and serves fault events; owns the faults it could not serve yet.
pub(crate) struct FaultServer {
    msgs: Vec<UffdMsg>,
    pending: VecDeque<Fault>,
    predictor: Option<Predictor>,
    /// `farmem trace` is recording (`crate::fault_log`).
    logging: bool,
}

/// Record a fault for `farmem trace`, with what it needs (read off the page's word now,
/// before it is served).
fn log_fault(f: &Fault) {
    use crate::fault_log::{FaultKind, FaultRecord};
    use crate::page_table::{ABSENT, REMOTE};
    let w = crate::page_table::entry(f.addr >> PAGE_SHIFT).load(Ordering::Acquire);
    let kind = if f.wp {
        FaultKind::WriteProtect
    } else if w & ABSENT == 0 {
        FaultKind::Resolved
    } else if w & REMOTE != 0 {
        FaultKind::Fetch
    } else {
        FaultKind::ZeroFill
    };
    crate::fault_log::record(FaultRecord {
        time_ns: crate::fault_log::monotonic_ns(),
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
            pending: VecDeque::new(),
            predictor: None,
            logging: crate::fault_log::enabled(),
        }
    }

    /// Read what is pending on the userfaultfd and serve it. Returns events read.
    fn poll_events(&mut self, inner: &Inner) -> usize {
        let n = match inner.uffd.read_events(&mut self.msgs) {
            Ok(n) => n,
            Err(e) => {
                tracing::error!("reading userfaultfd: {e}");
                return 0;
            }
        };
        for i in 0..n {
            let m = self.msgs[i];
            if m.event != EVENT_PAGEFAULT {
                continue;
            }
            let f = Fault {
                addr: m.address as usize & !(PAGE_SIZE - 1),
                write: m.flags & PAGEFAULT_FLAG_WRITE != 0,
                wp: m.flags & PAGEFAULT_FLAG_WP != 0,
                tid: m.ptid,
            };
            add(&inner.stats.c.unhinted_faults, 1);
            if self.logging {
                log_fault(&f);
            }
            if !self.serve(inner, f) {
                self.pending.push_back(f);
            }
        }
        n
    }

    /// Retry parked faults once each.
    fn retry_pending(&mut self, inner: &Inner) {
        for _ in 0..self.pending.len() {
            let f = self.pending.pop_front().expect("pending fault");
            if !self.serve(inner, f) {
                self.pending.push_back(f);
            }
        }
    }

    /// Serve one fault; false if a page it needs is locked by someone else.
    fn serve(&mut self, inner: &Inner, f: Fault) -> bool {
        let Some(reg) = inner.region_of(f.addr) else {
            // Region destroyed meanwhile (unregistering woke the thread already).
            return true;
        };
        let vpn = f.addr >> PAGE_SHIFT;
        let absent =
            crate::page_table::entry(vpn).load(Ordering::Acquire) & crate::page_table::ABSENT != 0;
        let prediction = if absent && !f.wp {
            let predictor = self
                .predictor
                .get_or_insert_with(|| Predictor::new(inner.cfg.fault_readahead));
            let p = predictor.on_fault_at(reg.id, f.tid, vpn, inner.now_ns());
            let t = predictor.take_tally();
            let c = &inner.stats.c;
            add(&c.fault_predicted_pages, t.predicted);
            add(&c.fault_prefetch_used, t.used);
            add(&c.fault_prefetch_wasted, t.wasted);
            p
        } else {
            None
        };
        let rdahead = prediction.map_or(0, |p| readahead_for(vpn, &p));
        let req = Request {
            first: vpn,
            count: 1,
            write: f.write,
            rdahead,
            ra_write: f.write,
            prio: 0,
            mode: Mode::Fault,
            ahead_useful_for: prediction.and_then(|p| p.useful_for(vpn)),
        };
        match fetch::ensure(inner, &reg, &req) {
            Ok(o) if o.busy => false,
            Ok(o) => {
                if o.unprotected > 0 {
                    add(&inner.stats.c.wp_faults, o.unprotected as u64);
                }
                if o.installed == 0 && o.unprotected == 0 {
                    // Someone else resolved it; make sure the faulting thread runs again.
                    add(&inner.stats.c.spurious_faults, 1);
                    let _ = inner.uffd.wake(f.addr, PAGE_SIZE);
                }
                // Strided predictions: read asynchronously, after the demanded page is in.
                if let Some(p) = prediction.filter(|_| rdahead == 0) {
                    let mut pages: Vec<usize> = p
                        .pages()
                        .filter(|&v| v >= reg.first_vpn() && v < reg.end_vpn())
                        .collect();
                    pages.sort_unstable();
                    let useful_for = fetch::prefetch_deadline(inner, p.useful_for(vpn));
                    prefetch::submit_pages(inner, &reg, pages, 0, useful_for);
                }
                true
            }
            Err(e) => farmem_sys::process::fatal(&format!(
                "cannot resolve a page fault at {:#x}: {e}",
                f.addr
            )),
        }
    }

    /// Serve events on behalf of a busy fault thread (control thread).
    pub(crate) fn steal(&mut self, inner: &Inner) {
        loop {
            let n = self.poll_events(inner);
            add(&inner.stats.c.stolen_faults, n as u64);
            self.retry_pending(inner);
            if n == 0 && self.pending.is_empty() {
                break;
            }
            if inner.shutdown.load(Ordering::Acquire) {
                break;
            }
        }
    }
}

/// Main loop of a fault thread.
pub(crate) fn fault_thread(inner: Arc<Inner>) {
    let mut server = FaultServer::new();
    let spin = std::time::Duration::from_micros(inner.cfg.fault_spin_us);
    let mut last_event = Instant::now();
    let mut fds = [
        libc::pollfd {
            fd: inner.uffd.raw(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: inner.wake_fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    while !inner.shutdown.load(Ordering::Acquire) {
        inner
            .fault_busy_since
            .store(inner.now_ns(), Ordering::Release);
        let n = server.poll_events(&inner);
        server.retry_pending(&inner);
        // Prefetches that have arrived are mapped now, before the program reaches them.
        prefetch::complete_arrived(&inner);
        inner.fault_busy_since.store(0, Ordering::Release);
        if n > 0 {
            last_event = Instant::now();
            continue;
        }
        if !server.pending.is_empty() {
            // A parked fault waits on a lock held for a few microseconds.
            std::thread::yield_now();
            continue;
        }
        if last_event.elapsed() < spin {
            std::hint::spin_loop();
            continue;
        }
        // SAFETY: `fds` is a valid array of two pollfd structs.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, 1000) };
        if fds[0].revents & libc::POLLNVAL != 0 && !inner.shutdown.load(Ordering::Acquire) {
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
}
