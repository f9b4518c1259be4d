//! The unhinted path: page faults delivered through userfaultfd, served by the runtime's
//! fault thread through the same fetch code as hints.
//!
//! The fault thread never sleeps on a page lock: a fault on a page that another thread is
//! fetching or evicting is parked and retried, so one slow transition cannot stall every
//! other fault. If the fault thread itself is busy for too long (a large fetch, a direct
//! reclaim), the control thread steals pending events and serves them (Eden's fault stealing).
//! Sequential faults get read-ahead with a window that doubles while the pattern holds, like
//! the kernel's swap read-ahead.

use std::collections::{HashMap, VecDeque};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::fetch::{self, Mode, Request};
use crate::runtime::Inner;
use crate::stats::add;
use crate::sys::mem::{PAGE_SHIFT, PAGE_SIZE};
use crate::sys::uffd::{UffdMsg, EVENT_PAGEFAULT, PAGEFAULT_FLAG_WP, PAGEFAULT_FLAG_WRITE};

#[derive(Clone, Copy, Debug)]
struct Fault {
    addr: usize,
    write: bool,
    wp: bool,
    tid: u32,
}

/// Per-stream sequential detector.
#[derive(Default, Clone, Copy)]
struct Stream {
    last: usize,
    window: usize,
}

/// Read-ahead decisions for unhinted faults, per (region, faulting thread).
#[derive(Default)]
pub(crate) struct SeqDetector {
    streams: HashMap<(u32, u32), Stream>,
}

impl SeqDetector {
    /// Pages to read ahead after a fault on `vpn`.
    pub(crate) fn on_fault(&mut self, region: u32, tid: u32, vpn: usize, max: usize) -> usize {
        if max == 0 {
            return 0;
        }
        if self.streams.len() > 4096 {
            self.streams.clear();
        }
        let s = self.streams.entry((region, tid)).or_default();
        // Sequential: just past the previous fault, or within/just past its read-ahead
        // window (the next fault of a sequential scan lands on the first page not fetched).
        let sequential = vpn > s.last && vpn <= s.last + s.window + 2;
        s.window = if sequential {
            (s.window * 2).clamp(4, max)
        } else {
            0
        };
        s.last = vpn;
        s.window
    }
}

/// Reads and serves fault events; owns the faults it could not serve yet.
pub(crate) struct FaultServer {
    msgs: Vec<UffdMsg>,
    pending: VecDeque<Fault>,
    seq: SeqDetector,
}

impl FaultServer {
    pub(crate) fn new() -> FaultServer {
        FaultServer {
            msgs: vec![UffdMsg::default(); 64],
            pending: VecDeque::new(),
            seq: SeqDetector::default(),
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
        let rdahead = if absent && !f.wp {
            self.seq
                .on_fault(reg.id, f.tid, vpn, inner.cfg.fault_readahead) as isize
        } else {
            0
        };
        let req = Request {
            first: vpn,
            count: 1,
            write: f.write,
            rdahead,
            ra_write: f.write,
            prio: 0,
            mode: Mode::Fault,
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
                true
            }
            Err(e) => crate::fatal(&format!(
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
            crate::fatal(
                "the program closed farmem's userfaultfd descriptor; far pages can no longer \
                 be fetched (programs that close all their file descriptors cannot run on \
                 far memory)",
            );
        }
        fds[0].revents = 0;
        fds[1].revents = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::SeqDetector;

    #[test]
    fn sequential_faults_grow_the_window_and_random_ones_reset_it() {
        let mut d = SeqDetector::default();
        assert_eq!(d.on_fault(1, 7, 100, 64), 0, "first fault: no history");
        assert_eq!(d.on_fault(1, 7, 101, 64), 4);
        // The next fault of a sequential scan lands just past the read-ahead window.
        assert_eq!(d.on_fault(1, 7, 106, 64), 8);
        assert_eq!(d.on_fault(1, 7, 115, 64), 16);
        assert_eq!(d.on_fault(1, 7, 132, 64), 32);
        assert_eq!(d.on_fault(1, 7, 165, 64), 64);
        assert_eq!(d.on_fault(1, 7, 230, 64), 64, "capped at the maximum");
        assert_eq!(d.on_fault(1, 7, 5000, 64), 0, "a jump resets the window");
        assert_eq!(d.on_fault(1, 7, 4000, 64), 0, "backwards is not sequential");
    }

    #[test]
    fn streams_are_per_thread_and_region() {
        let mut d = SeqDetector::default();
        d.on_fault(1, 1, 10, 64);
        d.on_fault(1, 2, 900, 64);
        assert_eq!(d.on_fault(1, 1, 11, 64), 4, "thread 1's stream is intact");
        assert_eq!(d.on_fault(1, 2, 901, 64), 4, "thread 2's stream is intact");
        assert_eq!(d.on_fault(2, 1, 12, 64), 0, "another region starts fresh");
        assert_eq!(d.on_fault(1, 1, 12, 0), 0, "read-ahead disabled");
    }
}
