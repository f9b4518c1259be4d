//! Write-protecting eviction victims from the program's CPU.
//!
//! Before a dirty victim is copied out it is write-protected, one ioctl per run of pages, and
//! each ioctl flushes the TLB of every CPU that runs the program at that moment. From the
//! control thread, on the other CPU than the program, that flush is an IPI the ioctl waits
//! for: 18-21 us a scattered page against 1.7-2.1 us when no other CPU runs the process
//! (`probes/eviction_flush.c`). sqlite at half its peak spent about half of a CPU there.
//!
//! While the fault thread follows a program thread (`placement.rs`), both run on one CPU
//! (pinned there by the fault thread, or by the program's own affinity).
//! Then the control thread hands the write-protects to the fault thread and sleeps until they
//! are done: the flush stays on that CPU (the sleeping control thread's CPU runs nothing of
//! the process, and a CPU without it gets no IPI). The copy, the compression and the unmap
//! stay on the control thread. If the fault thread does not take the job soon (it may be
//! reclaiming for itself, waiting for pages the control thread holds), the control thread
//! takes it back and protects the pages itself.

use std::cell::Cell;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use farmem_sys::uffd::Uffd;

use crate::stats::{add, Counters};

/// What a handoff needs of the runtime's state (which holds the slot, so the slot does not
/// see the state).
pub(crate) struct Context<'a> {
    pub uffd: &'a Uffd,
    /// The eventfd the fault thread polls beside the userfaultfd.
    pub wake_fd: RawFd,
    pub shutdown: &'a AtomicBool,
    pub stats: &'a Counters,
    /// `Config::protect_handoff`.
    pub enabled: bool,
}

/// How long the control thread waits for the fault thread to take a job (0.5 and 2 ms gave
/// the same within noise). The fault thread
/// looks between batches of faults and wakes from poll at once; it is only later when it is
/// busy for longer (a direct reclaim, a large fetch), and then the control thread would only
/// wait on it.
const TAKE_WITHIN: Duration = Duration::from_millis(1);

#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
enum Stage {
    #[default]
    Empty,
    Posted,
    Taken,
    Done,
}

#[derive(Default)]
struct Job {
    ranges: Vec<(usize, usize)>,
    stage: Stage,
    failed: bool,
}

/// Jobs are handed over only if the fault thread served a fault this recently: a program
/// that faults this often spends its time waiting on the fault thread, which then takes the
/// job within microseconds. A program computing between rare faults holds the shared CPU,
/// and the woken fault thread may wait for it up to a scheduler slice (kvs at half its
/// peak, which faults in bursts between lookups, lost 0.3-0.6 s handing over every job).
const HOT_NS: u64 = 200_000;

/// The one job slot between the control thread and the fault thread.
#[derive(Default)]
pub(crate) struct ProtectHandoff {
    /// When (`State::now_ns`) the fault thread last read a fault.
    last_fault_ns: AtomicU64,
    /// The fault thread sits on the CPU of the program thread it serves (`placement.rs`).
    following: AtomicBool,
    posted: AtomicBool,
    job: Mutex<Job>,
    done: Condvar,
}

thread_local! {
    static ON_FAULT_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Called by a fault thread when it starts: it never hands jobs to itself.
pub(crate) fn mark_fault_thread() {
    ON_FAULT_THREAD.with(|c| c.set(true));
}

/// Write-protect `ranges` on this thread; false if an ioctl failed (logged).
fn protect_here(uffd: &Uffd, ranges: &[(usize, usize)]) -> bool {
    let mut ok = true;
    for &(start, len) in ranges {
        if let Err(e) = uffd.writeprotect(start, len, true) {
            tracing::error!("write-protecting pages for eviction failed: {e}");
            ok = false;
        }
    }
    ok
}

impl ProtectHandoff {
    /// Write-protect `ranges` (page-aligned `(addr, len)`) for an eviction, on the program's
    /// CPU when the fault thread follows the program there; false if it failed.
    /// `now_ns` is `State::now_ns`.
    pub(crate) fn protect(&self, cx: &Context, now_ns: u64, ranges: &[(usize, usize)]) -> bool {
        if ranges.is_empty() {
            return true;
        }
        let hot = now_ns.saturating_sub(self.last_fault_ns.load(Ordering::Relaxed)) < HOT_NS;
        if !cx.enabled
            || !hot
            || !self.following.load(Ordering::Relaxed)
            || ON_FAULT_THREAD.with(|c| c.get())
        {
            return protect_here(cx.uffd, ranges);
        }
        let mut job = self.job.lock().unwrap_or_else(|p| p.into_inner());
        if job.stage != Stage::Empty {
            // Another thread's eviction uses the slot (a direct reclaim).
            drop(job);
            return protect_here(cx.uffd, ranges);
        }
        job.ranges.clear();
        job.ranges.extend_from_slice(ranges);
        job.stage = Stage::Posted;
        job.failed = false;
        self.posted.store(true, Ordering::Release);
        wake(cx.wake_fd);
        let (mut job, _) = self
            .done
            .wait_timeout_while(job, TAKE_WITHIN, |j| j.stage == Stage::Posted)
            .unwrap_or_else(|p| p.into_inner());
        if job.stage == Stage::Posted {
            // Not taken in time: withdraw it.
            job.stage = Stage::Empty;
            self.posted.store(false, Ordering::Release);
            drop(job);
            add(&cx.stats.protect_handoffs_withdrawn, 1);
            return protect_here(cx.uffd, ranges);
        }
        let mut job = self
            .done
            .wait_while(job, |j| j.stage == Stage::Taken)
            .unwrap_or_else(|p| p.into_inner());
        job.stage = Stage::Empty;
        add(&cx.stats.protect_handoffs, 1);
        !job.failed
    }

    /// On the fault thread: faults were read just now.
    pub(crate) fn faults_read(&self, now_ns: u64) {
        self.last_fault_ns.store(now_ns, Ordering::Relaxed);
    }

    /// On the fault thread: whether it follows a program thread now.
    pub(crate) fn set_following(&self, following: bool) {
        if self.following.load(Ordering::Relaxed) != following {
            self.following.store(following, Ordering::Relaxed);
        }
    }

    /// On the fault thread: do the job posted, if any.
    pub(crate) fn serve(&self, cx: &Context) {
        if !self.posted.load(Ordering::Acquire) {
            return;
        }
        let ranges = {
            let mut job = self.job.lock().unwrap_or_else(|p| p.into_inner());
            if job.stage != Stage::Posted {
                return;
            }
            self.posted.store(false, Ordering::Release);
            job.stage = Stage::Taken;
            std::mem::take(&mut job.ranges)
        };
        drain_wake(cx.wake_fd, cx.shutdown);
        let ok = protect_here(cx.uffd, &ranges);
        let mut job = self.job.lock().unwrap_or_else(|p| p.into_inner());
        job.ranges = ranges;
        job.failed = !ok;
        job.stage = Stage::Done;
        self.done.notify_all();
    }
}

/// Wake the fault thread out of poll (the shutdown eventfd).
fn wake(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a valid u64 to our eventfd.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Reset the eventfd a handoff signalled, so that poll sleeps again; a shutdown that
/// signalled it meanwhile is signalled again (the fault loop checks the flag first anyway).
fn drain_wake(fd: RawFd, shutdown: &AtomicBool) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a valid u64 from our non-blocking eventfd.
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
    if shutdown.load(Ordering::Acquire) {
        wake(fd);
    }
}
