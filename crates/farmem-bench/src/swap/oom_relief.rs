//! Linux swap in a cgroup v1 memory cgroup without the OOM killer, and without stalls that
//! never end.
//!
//! In a v1 cgroup whose limit is merely tight, a swap-in's charge can fail after the
//! kernel's reclaim retries (every page on the active list, none found inactive in time)
//! even with zram mostly empty, and the cgroup's OOM killer ends the program: kvs and
//! csrbuild at 50% of their peak were killed in every run here. That is a benchmark without a
//! Linux figure, not a measurement of swapping. With the killer off (`memory.oom_control`
//! set to 1) the faulting thread is parked instead, until something uncharges memory or the
//! limit grows, and in a cgroup of one process nothing does: the program stalls for ever.
//!
//! [`OomRelief`] ends each such stall as the kernel's reclaim would have, had it tried
//! longer: a thread waits for the cgroup's OOM notification (an eventfd registered through
//! `cgroup.event_control`), lowers the limit by [`RELIEF_BYTES`], which makes the kernel
//! reclaim that much in the writing thread (pages swapped out), and sets it back, which wakes
//! the parked threads; their faults retry into the room made.
//!
//! With the program parked that reclaim can fail too (EBUSY: every page referenced since the
//! kernel last looked; the helper test's scatter hits it at once). Then the limit is raised
//! by [`RELIEF_BYTES`], which wakes the program, and brought back as soon as the kernel can
//! reclaim. A program parked again meanwhile waits for that up to [`PARKED_PATIENCE`], the
//! kernel retrying, before the limit is raised further; past an eighth of the limit the OOM
//! killer is turned back on and ends the program, as Linux would have. Waking it at once
//! instead does not work: the kernel then fails to reclaim for long stretches while the
//! program runs on, and csrbuild and kvs at 50% reached the eighth within seconds and were
//! killed. So these stalls cost the program time, and that time is reported with each run
//! (`oom_parked_us`, from the relief's first look at a stall to its wake-up): csrbuild at 50%
//! (scale 0.25) spent 10.8 s of 34.5 s parked in 42 stalls, kvs at 50% 0 to 1.8 s of 1.7 to
//! 3.4 s. The cgroup holds at most a few relief's worth past its limit for moments (csrbuild
//! at 50%: 256 KiB past 24.8 MiB), the run's peak shows it, and the raises are counted
//! ([`OomRelief::overruns`]).

use super::*;

use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::thread::JoinHandle;

/// Room made per stall: SWAP_CLUSTER_MAX pages, the batch the kernel's own reclaim aims for.
pub(super) const RELIEF_BYTES: u64 = 32 * 4096;

/// Tries at lowering the limit (each reclaims until it fails to make progress) per look: the
/// kernel's charge path gives up after 16 (MAX_RECLAIM_RETRIES).
const RECLAIM_TRIES: usize = 16;

/// How often the relief looks at the cgroup without a notification, ms.
const LOOK_EVERY_MS: i32 = 100;

/// How long a program parked again while the limit is raised waits for the reclaim that
/// brings the limit back, before the limit is raised further.
const PARKED_PATIENCE: Duration = Duration::from_millis(1000);

/// The relief thread of one cgroup; stopped (and joined) on drop.
pub(super) struct OomRelief {
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
    counts: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    stalls: AtomicU64,
    overruns: AtomicU64,
    /// Time the program was seen parked before this thread woke it, summed.
    parked_ns: AtomicU64,
}

impl OomRelief {
    /// Turns the OOM killer of the v1 cgroup `dir` (limited to `limit` bytes) off and starts
    /// relieving its stalls.
    pub(super) fn start(dir: &Path, limit: u64) -> Result<OomRelief> {
        let ctl = dir.join("memory.oom_control");
        write_sys(&ctl, "1").context("turning the cgroup's OOM killer off")?;
        let oom = File::open(&ctl).with_context(|| format!("opening {}", ctl.display()))?;
        let notify = eventfd()?;
        let stop = eventfd()?;
        let reg = format!("{} {}", notify.as_raw_fd(), oom.as_raw_fd());
        write_sys(&dir.join("cgroup.event_control"), &reg)
            .context("registering for the cgroup's OOM notifications")?;
        let counts = Arc::new(Counts::default());
        let relief = Relief {
            limit_file: dir.join("memory.limit_in_bytes"),
            oom,
            limit,
            counts: counts.clone(),
        };
        let stop_fd = stop.try_clone().context("duplicating an eventfd")?;
        let thread = thread::Builder::new()
            .name("oom-relief".into())
            .spawn(move || relief.serve(notify, stop_fd))
            .context("starting the OOM relief thread")?;
        Ok(OomRelief {
            stop,
            thread: Some(thread),
            counts,
        })
    }

    /// How many OOM stalls were ended by reclaim from outside, so far.
    pub(super) fn stalls(&self) -> u64 {
        self.counts.stalls.load(Ordering::Relaxed)
    }

    /// How many times the limit was raised for a moment to end one (nothing could be
    /// reclaimed with the program parked).
    pub(super) fn overruns(&self) -> u64 {
        self.counts.overruns.load(Ordering::Relaxed)
    }

    /// How long the program was seen parked in them before the relief woke it, in total
    /// (from the relief's first look, so the kernel's notification is not counted).
    pub(super) fn parked(&self) -> Duration {
        Duration::from_nanos(self.counts.parked_ns.load(Ordering::Relaxed))
    }
}

impl Drop for OomRelief {
    fn drop(&mut self) {
        // SAFETY: writing 8 bytes from a live local to an eventfd we own.
        unsafe {
            libc::write(
                self.stop.as_raw_fd(),
                (&1u64 as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn eventfd() -> Result<OwnedFd> {
    // SAFETY: eventfd has no memory preconditions; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error()).context("creating an eventfd");
    }
    // SAFETY: fd is a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// What the relief thread works with.
struct Relief {
    limit_file: PathBuf,
    /// `memory.oom_control`, kept open: its registration lives as long as it does.
    oom: File,
    limit: u64,
    counts: Arc<Counts>,
}

impl Relief {
    fn serve(self, notify: OwnedFd, stop: OwnedFd) {
        // Bytes the limit is raised by at the moment (reclaim found nothing to take).
        let mut raised = 0u64;
        // Since when the program has been seen parked, until this thread wakes it.
        let mut parked_at: Option<Instant> = None;
        loop {
            let mut fds = [notify.as_fd(), stop.as_fd()].map(|fd| libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            // While raised, look every millisecond for the moment the limit can come back;
            // else wait for a notification, but look now and then all the same: a stall
            // whose notification was taken with an earlier one must not wait for ever.
            let timeout = if raised > 0 { 1 } else { LOOK_EVERY_MS };
            // SAFETY: fds is a live array of two pollfds.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
            if n < 0 {
                if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                tracing::warn!("OOM relief: poll: {}", io::Error::last_os_error());
                return;
            }
            if fds[1].revents != 0 {
                return;
            }
            if fds[0].revents & libc::POLLIN != 0 {
                let mut v = 0u64;
                // SAFETY: reading 8 bytes into a live local from an eventfd we own.
                unsafe { libc::read(fds[0].fd, (&mut v as *mut u64).cast(), 8) };
            }
            // The notification also comes when the cgroup is removed: only a cgroup under
            // OOM is relieved.
            let parked = self.under_oom();
            if parked {
                parked_at.get_or_insert_with(Instant::now);
            }
            // While the program runs, one try a millisecond: it may run on the other CPU of
            // a small machine, and this thread must not take its time. Parked, it waits for
            // this reclaim (whose uncharges wake it): as many tries as the kernel's.
            let tries = if parked { RECLAIM_TRIES } else { 1 };
            if raised > 0 && self.reclaim_to(self.limit, tries) {
                // A program still parked is woken below: the limit may have come back with
                // nothing to reclaim, so with no uncharge to wake it.
                raised = 0;
            }
            if !parked {
                parked_at = None;
                continue;
            }
            if raised == 0 {
                // Reclaim a relief's worth below the limit, then set it back: that wakes the
                // parked threads, whose faults retry into the room made.
                if self.reclaim_to(self.limit - RELIEF_BYTES, RECLAIM_TRIES) {
                    let _ = self.set_limit(self.limit);
                    self.woken(&mut parked_at);
                    continue;
                }
            } else if parked_at.is_some_and(|t| t.elapsed() < PARKED_PATIENCE) {
                // Raised, and the program stalled again: give the reclaim above its chance.
                continue;
            }
            // Nothing to reclaim with the program parked (every page was referenced since
            // the kernel last looked): wake it past the limit; the limit comes back as soon
            // as the kernel can reclaim, which it does once the program runs on. Past a
            // bound, hand the program to the OOM killer, as Linux would have.
            self.counts.overruns.fetch_add(1, Ordering::Relaxed);
            raised += RELIEF_BYTES;
            if raised > max_overrun(self.limit) || self.set_limit(self.limit + raised).is_err() {
                tracing::warn!(
                    "OOM relief: nothing to reclaim {} past the limit: OOM killer back on",
                    human(raised)
                );
                let _ = self.oom_killer_on();
                return;
            }
            self.woken(&mut parked_at);
        }
    }

    /// Counts a stall ended, and how long the program was seen parked in it.
    fn woken(&self, parked_at: &mut Option<Instant>) {
        if let Some(t) = parked_at.take() {
            self.counts.stalls.fetch_add(1, Ordering::Relaxed);
            let ns = t.elapsed().as_nanos() as u64;
            self.counts.parked_ns.fetch_add(ns, Ordering::Relaxed);
        }
    }

    /// Sets the limit to `bytes`, which makes the kernel reclaim down to it in this thread:
    /// whether it could, within `tries`.
    fn reclaim_to(&self, bytes: u64, tries: usize) -> bool {
        (0..tries).any(|_| self.set_limit(bytes).is_ok())
    }

    fn under_oom(&self) -> bool {
        let mut buf = [0u8; 256];
        let Ok(n) = self.oom.read_at(&mut buf, 0) else {
            return false;
        };
        String::from_utf8_lossy(&buf[..n])
            .lines()
            .any(|l| l == "under_oom 1")
    }

    fn set_limit(&self, bytes: u64) -> Result<()> {
        write_sys(&self.limit_file, &bytes.to_string())
    }

    /// Turning the killer back on also wakes the parked threads, to be killed.
    fn oom_killer_on(&self) -> Result<()> {
        write_sys(&self.limit_file.with_file_name("memory.oom_control"), "0")
    }
}

/// How far past the limit the relief lets a program go while reclaim cannot catch up: an
/// eighth of the limit, at least one relief's worth.
fn max_overrun(limit: u64) -> u64 {
    (limit / 8).max(RELIEF_BYTES)
}
