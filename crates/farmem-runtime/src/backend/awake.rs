//! Keeping the reading CPU awake while a disk read is in flight.
//!
//! A thread waiting for a read sleeps in the kernel; with nothing else to run its CPU goes
//! idle, and in a VM an idle CPU halts: the completion's interrupt (or the wake-up sent from
//! the CPU that took it) then has to bring a halted virtual CPU back, which costs tens of
//! microseconds on a read of ~60-100. Random 4 KiB direct reads at queue depth 1 on this
//! machine's disk (`probes/disk_read_wait.c`), p50: 100-102 us with the reader's CPU idle,
//! 76-86 us with a spinning thread of the idle class on it; 104-150 us and 95-105 us when the
//! reader runs on the CPU the disk does not interrupt. A fault waits for exactly one such read.
//!
//! So while a read is in flight, a thread of the idle scheduling class (`SCHED_IDLE`: it
//! only runs when nothing else wants the CPU, and any waking thread preempts it at once)
//! spins on the reading thread's CPU. It lingers a little after the last read (faults come
//! back to back when a program misses), then sleeps on a futex until the next one. It costs
//! the program nothing but the CPU's idle time, and a futex wake when it slept.
//! `FARMEM_IO_SPIN=0` turns it off.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use farmem_sys::{mem, sched};

/// How long the spinner goes on after the last read before it sleeps.
const LINGER: Duration = Duration::from_micros(300);

#[derive(Default)]
struct Shared {
    /// Reads in flight (the futex word the spinner sleeps on while it is 0).
    reading: AtomicU64,
    /// The CPU of the thread that started the latest read.
    cpu: AtomicU32,
    /// The spinner sleeps on `reading`: a read must wake it.
    asleep: AtomicBool,
    /// The owner is gone: the spinner ends.
    stop: AtomicBool,
    /// The spinner's thread id (for tests and diagnostics).
    tid: AtomicU32,
}

/// The spinner of one far file; [`Awake::during_read`] around each read.
pub(crate) struct Awake {
    shared: Arc<Shared>,
    /// The process the spinner runs in (a child made by fork() has no spinner: it starts its
    /// own at its first read).
    spinner_pid: AtomicU32,
    enabled: bool,
}

/// A read in flight, until dropped.
pub(crate) struct Reading<'a>(Option<&'a Shared>);

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.0 {
            s.reading.fetch_sub(1, Ordering::Release);
        }
    }
}

impl Awake {
    pub(crate) fn new() -> Awake {
        Awake::with(std::env::var("FARMEM_IO_SPIN").map_or(true, |v| v != "0"))
    }

    fn with(enabled: bool) -> Awake {
        Awake {
            shared: Arc::default(),
            spinner_pid: AtomicU32::new(0),
            enabled,
        }
    }

    /// Keep this thread's CPU awake until the returned guard is dropped.
    pub(crate) fn during_read(&self) -> Reading<'_> {
        if !self.enabled || !self.spinner_running() {
            return Reading(None);
        }
        let s = &*self.shared;
        if let Some(cpu) = sched::current_cpu() {
            s.cpu.store(cpu, Ordering::Relaxed);
        }
        s.reading.fetch_add(1, Ordering::AcqRel);
        if s.asleep.load(Ordering::Acquire) {
            mem::futex_wake_all(&s.reading);
        }
        Reading(Some(s))
    }

    /// Start the spinner in this process if it has none; false if it cannot run here.
    fn spinner_running(&self) -> bool {
        let pid = std::process::id();
        let had = self.spinner_pid.load(Ordering::Acquire);
        if had == pid {
            return true;
        }
        if had == u32::MAX
            || self
                .spinner_pid
                .compare_exchange(had, pid, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            // Refused before, or another thread is starting it: this read goes without.
            return false;
        }
        let shared = self.shared.clone();
        // A child inherits the counters of reads its parent had in flight at the fork.
        shared.reading.store(0, Ordering::Release);
        match crate::thread::spawn("farmem-io-spin".into(), move || spin(&shared)) {
            Ok(_) => true,
            Err(e) => {
                tracing::debug!("no I/O spinner: {e}");
                self.spinner_pid.store(u32::MAX, Ordering::Release);
                false
            }
        }
    }
}

impl Drop for Awake {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        mem::futex_wake_all(&self.shared.reading);
    }
}

fn spin(s: &Shared) {
    s.tid.store(sched::gettid(), Ordering::Release);
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sets this thread's own policy; `param` is a valid sched_param.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        // At normal priority it would take CPU time from the program: better none.
        tracing::debug!(
            "no I/O spinner: SCHED_IDLE refused: {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    let mut pinned = None;
    while !s.stop.load(Ordering::Acquire) {
        if s.reading.load(Ordering::Acquire) == 0 {
            s.asleep.store(true, Ordering::Release);
            // Checked again after saying so: a read that started in between saw `asleep`
            // false and did not wake us, but the futex sees its count.
            mem::futex_wait(&s.reading, 0, 1_000_000);
            s.asleep.store(false, Ordering::Release);
            continue;
        }
        let cpu = s.cpu.load(Ordering::Relaxed);
        if pinned != Some(cpu) && sched::pin_to(cpu).is_ok() {
            pinned = Some(cpu);
        }
        let mut idle_since = None;
        loop {
            std::hint::spin_loop();
            if s.reading.load(Ordering::Acquire) != 0 {
                idle_since = None;
                if s.cpu.load(Ordering::Relaxed) != cpu {
                    break;
                }
            } else {
                let t = *idle_since.get_or_insert_with(Instant::now);
                if t.elapsed() >= LINGER || s.stop.load(Ordering::Relaxed) {
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scheduler state letter of thread `tid` of this process, if it exists.
    fn state(tid: u32) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
        stat[stat.rfind(')')? + 2..].chars().next()
    }

    fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
        let t = Instant::now();
        while !ok() {
            assert!(t.elapsed() < Duration::from_secs(5), "{what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn spins_in_the_idle_class_while_a_read_is_in_flight_and_sleeps_after() {
        let awake = Awake::with(true);
        let reading = awake.during_read();
        assert!(reading.0.is_some(), "a spinner starts at the first read");
        let sh = awake.shared.clone();
        wait_for("the spinner starts", || sh.tid.load(Ordering::Acquire) != 0);
        let tid = sh.tid.load(Ordering::Acquire);
        wait_for("the spinner runs during the read", || {
            state(tid) == Some('R')
        });
        // SAFETY: sched_getscheduler only reads the policy of thread `tid`.
        let policy = unsafe { libc::sched_getscheduler(tid as libc::pid_t) };
        assert_eq!(
            policy,
            libc::SCHED_IDLE,
            "it never takes CPU time from others"
        );
        // Still spinning a while later: it does not stop in the middle of a read.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(state(tid), Some('R'));
        drop(reading);
        wait_for("the spinner sleeps once no read is in flight", || {
            state(tid) == Some('S')
        });
        // The next read wakes it again.
        let again = awake.during_read();
        wait_for("the spinner runs again", || state(tid) == Some('R'));
        drop(again);
        drop(awake);
        wait_for("the spinner ends with its owner", || state(tid).is_none());
    }

    #[test]
    fn off_means_no_spinner() {
        let awake = Awake::with(false);
        assert!(awake.during_read().0.is_none());
        assert_eq!(awake.shared.tid.load(Ordering::Acquire), 0);
    }
}
