//! Where the fault thread runs: on the CPU of the program thread whose faults it serves.
//!
//! A fault is a round trip: the faulting thread sleeps in the kernel, the fault thread
//! installs the page and wakes it. On this machine (a 2-CPU VM whose idle CPUs halt) the
//! round trip costs 9-11.5 us when both threads share a CPU and the fault thread sleeps in
//! the kernel between faults, 18-31 us when the fault thread busy-polls on the other CPU (the
//! faulting CPU halts and an IPI wakes it), and 90-107 us when both sleep on different CPUs
//! (`probes/fault_round_trip.c`). Sharing a CPU only lasts if the program thread cannot
//! leave it: woken while the fault thread still runs there, it is placed on the idle CPU;
//! and while it runs, the fault thread is runnable beside it and the scheduler's balancing
//! moves it away (up to 160 times a second here, each move then costing faults across CPUs).
//! So the fault thread follows a program thread that faults alone by pinning both to that
//! thread's CPU; the fault thread then sleeps in `poll` between faults instead of spinning.
//! The suite's randscan at 25% (local+lz4): 9.1-9.4 s before, 5.0-5.75 s (Linux swap to
//! zram at the same limit: 4.2-5.3 s).
//!
//! The program thread gets its own affinity back (if nobody changed it meanwhile), and the
//! fault thread stops following, after 1 ms without a fault, every 250 ms for 10 ms (so that
//! the scheduler can move the program away from a CPU another process needs), when other
//! threads take a fair share of the faults (a third, counted over the last tens of ms: no
//! following for 100 ms; a thread that faults less does not stop it), before the pinned
//! thread starts a thread or a process, which would inherit the pin (`Runtime::before_spawn`,
//! the fork handler, `Runtime::release_at_exit` before an exec), and when the runtime ends.
//! The program never sees the pin: the transparent mode reports the thread's own affinity
//! (`Runtime::own_affinity`), and a program that sets it takes it back
//! (`Runtime::program_sets_affinity`).
//!
//! Where the faulting thread runs is read from `/proc/self/task/TID/stat` (~4.4 us, the file
//! kept open) every 8 faults, every 2 ms, after a sleep, and when another thread faults;
//! not while that thread is the one pinned beside the fault thread (it cannot have moved).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use farmem_sys::sched;

use crate::stats::{add, Counters};

/// Faults served between two looks at where the faulting thread runs. A look costs ~4.4 us;
/// the scheduler's balancing moves a program now and then (from a few times a run to 160
/// times a second), and every fault until the next look crosses CPUs (~100 us when the
/// program's CPU halts in between).
const LOOK_EVERY_FAULTS: u32 = 8;
/// Longest time between two looks while faults arrive.
const LOOK_EVERY_NS: u64 = 2_000_000;
/// Shortest time between two looks prompted by a fault from another thread (threads taking
/// turns would otherwise cost a look per fault).
const LOOK_AFTER_NS: u64 = 200_000;
/// The faults of each thread are counted over windows this long, halved at each new one.
const SPREAD_WINDOW_NS: u64 = 20_000_000;
/// Threads counted (more faulting threads than this: the program faults on several anyway).
const TALLY_THREADS: usize = 8;
/// The following stops when the threads other than the one that faults most take at least
/// one fault in this many (and at least [`SPREAD_MIN_FAULTS`]). A thread that faults less
/// is served from where the fault thread is, a cross-CPU round trip for each of its faults,
/// rather than stopping the following for [`SPREAD_PAUSE_NS`]. memcached at 25% local on the
/// file tier faults on the worker serving the GETs and on one of its background threads,
/// which took 10-55% of a window's faults when it was logged: with any second thread
/// stopping the following it paused 290-550 times a run, with this rule 13-66 times, and
/// the GET phase took 59 s instead of 66 (medians of 5 alternated pairs).
const SPREAD_SHARE: u32 = 3;
const SPREAD_MIN_FAULTS: u32 = 8;
/// How long the following stops when several threads fault.
const SPREAD_PAUSE_NS: u64 = 100_000_000;
/// How long it stops when the program sets the pinned thread's affinity itself.
const SET_PAUSE_NS: u64 = 1_000_000_000;
/// A program thread pinned this long gets its CPUs back for a while: if another process needs
/// its CPU, the scheduler can move it then.
const PIN_SPELL_NS: u64 = 250_000_000;
const UNPINNED_SPELL_NS: u64 = 10_000_000;
/// How long a thread that starts a process or a thread stays unpinned.
const SPAWN_UNPINNED_NS: u64 = 100_000_000;
/// The fault thread sleeps this long at most while the program is pinned; with no fault
/// meanwhile, the program gets its CPUs back.
pub(crate) const QUIET_MS: i32 = 1;

/// What the fault thread and the program's threads share about the placement.
#[derive(Default)]
pub(crate) struct Shared {
    /// No following before this time (`State::now_ns`).
    paused_until_ns: AtomicU64,
    /// The program thread pinned beside the fault thread (0: none), its CPU, its own
    /// affinity from before (the words of a `cpu_set_t`), and since when.
    program_tid: AtomicU32,
    program_cpu: AtomicU32,
    program_mask: [AtomicU64; sched::SET_WORDS],
    pinned_since_ns: AtomicU64,
    /// No pinning of the program before this time (after a spell of pinning).
    repin_after_ns: AtomicU64,
}

impl Shared {
    fn pause(&self, until_ns: u64, stats: &Counters) {
        self.paused_until_ns.fetch_max(until_ns, Ordering::AcqRel);
        self.release_program();
        add(&stats.follow_pauses, 1);
    }

    /// Whether a program thread is pinned now.
    pub(crate) fn program_pinned(&self) -> bool {
        self.program_tid.load(Ordering::Relaxed) != 0
    }

    /// Confine program thread `tid` to `cpu`, where it runs, remembering its own affinity;
    /// whether it is confined there now (by this pin, or by its own affinity). Only the
    /// fault thread pins.
    fn pin_program(&self, tid: u32, cpu: u32, now_ns: u64) -> bool {
        if self.program_tid.load(Ordering::Acquire) == tid
            && self.program_cpu.load(Ordering::Relaxed) == cpu
        {
            return true;
        }
        self.release_program();
        let (Ok(own), Ok(one)) = (sched::affinity_of(tid), sched::only(cpu)) else {
            return false;
        };
        if sched::same_set(&own, &one) {
            return true; // the program keeps it there itself
        }
        if now_ns < self.repin_after_ns.load(Ordering::Relaxed) || !sched::has_cpu(&own, cpu) {
            return false;
        }
        for (slot, w) in self.program_mask.iter().zip(sched::set_to_words(&own)) {
            slot.store(w, Ordering::Relaxed);
        }
        self.program_cpu.store(cpu, Ordering::Relaxed);
        self.pinned_since_ns.store(now_ns, Ordering::Relaxed);
        if sched::set_affinity(tid, &one).is_err() {
            return false;
        }
        self.program_tid.store(tid, Ordering::Release);
        true
    }

    /// Give the pinned program thread (if any) its own affinity back, unless someone else
    /// changed it meanwhile. Any thread may call this.
    pub(crate) fn release_program(&self) {
        let tid = self.program_tid.swap(0, Ordering::AcqRel);
        if tid == 0 {
            return;
        }
        let cpu = self.program_cpu.load(Ordering::Relaxed);
        if let (Ok(now), Ok(one)) = (sched::affinity_of(tid), sched::only(cpu)) {
            if sched::same_set(&now, &one) {
                let _ = sched::set_affinity(tid, &self.saved_mask());
            }
        }
    }

    /// The pinned program thread's own affinity, as stored when it was pinned.
    fn saved_mask(&self) -> libc::cpu_set_t {
        let mut words = [0u64; sched::SET_WORDS];
        for (w, slot) in words.iter_mut().zip(&self.program_mask) {
            *w = slot.load(Ordering::Relaxed);
        }
        sched::words_to_set(&words)
    }

    /// A fork is coming: its child inherits the forking thread's affinity, so the pinned
    /// program thread (whichever it is) gets its own back, and is not pinned again before
    /// the child surely exists.
    pub(crate) fn before_fork(&self, now_ns: u64) {
        self.repin_after_ns
            .fetch_max(now_ns + SPAWN_UNPINNED_NS, Ordering::Relaxed);
        self.release_program();
    }

    /// The affinity thread `tid` (0: the caller) had before it was pinned, if it is the
    /// pinned program thread: what it asked for, which is what it should see.
    pub(crate) fn own_affinity(&self, tid: u32) -> Option<libc::cpu_set_t> {
        let tid = if tid == 0 { sched::gettid() } else { tid };
        if self.program_tid.load(Ordering::Acquire) != tid {
            return None;
        }
        let mask = self.saved_mask();
        // Still pinned (not released meanwhile): the mask is the one stored for it.
        (self.program_tid.load(Ordering::Acquire) == tid).then_some(mask)
    }

    /// The program is about to set the affinity of thread `tid` (0: the caller): if that is
    /// the pinned thread, the pin is forgotten (what the program sets wins) and the following
    /// stops for a while.
    pub(crate) fn program_sets_affinity(&self, tid: u32, now_ns: u64, stats: &Counters) {
        let tid = if tid == 0 { sched::gettid() } else { tid };
        if self
            .program_tid
            .compare_exchange(tid, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            self.repin_after_ns
                .fetch_max(now_ns + SET_PAUSE_NS, Ordering::Relaxed);
            self.pause(now_ns + SET_PAUSE_NS, stats);
        }
    }

    /// The calling thread is about to start a thread or a process, which would inherit its
    /// affinity: if it is the pinned program thread, give it its own back (and, for a
    /// thread, stop following for a while: the program is about to have several).
    pub(crate) fn before_spawn(&self, thread: bool, now_ns: u64, stats: &Counters) {
        if self.program_tid.load(Ordering::Acquire) != sched::gettid() {
            return;
        }
        // Not pinned again until the new thread or process surely started (the spawn's own
        // faults would otherwise pin this thread again before the clone).
        self.repin_after_ns
            .fetch_max(now_ns + SPAWN_UNPINNED_NS, Ordering::Relaxed);
        if thread {
            self.pause(now_ns + SPREAD_PAUSE_NS, stats);
        } else {
            self.release_program();
        }
    }
}

/// Recent faults per thread, to tell a program that faults on one thread (perhaps with
/// another now and then) from one that faults on several.
#[derive(Default)]
struct Tally {
    /// (thread, faults), at most [`TALLY_THREADS`]; halved at each new window.
    threads: Vec<(u32, u32)>,
    window_ns: u64,
}

impl Tally {
    /// Count `n` faults of thread `tid` (the counts halve when a window ends, so a thread's
    /// share follows what it did lately without forgetting it at once).
    fn count(&mut self, tid: u32, n: usize, now_ns: u64) {
        if now_ns.saturating_sub(self.window_ns) > SPREAD_WINDOW_NS {
            self.window_ns = now_ns;
            for (_, f) in self.threads.iter_mut() {
                *f /= 2;
            }
            self.threads.retain(|&(_, f)| f > 0);
        }
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        if let Some((_, f)) = self.threads.iter_mut().find(|(t, _)| *t == tid) {
            *f = f.saturating_add(n);
        } else if self.threads.len() < TALLY_THREADS {
            self.threads.push((tid, n));
        } else if let Some(least) = self.threads.iter_mut().min_by_key(|(_, f)| *f) {
            // Full: the new thread takes the place of the one with the fewest faults.
            *least = (tid, n);
        }
    }

    /// The thread to follow: the one with the most faults, unless the others together take
    /// one in [`SPREAD_SHARE`] of them (and at least [`SPREAD_MIN_FAULTS`]); `None` then.
    fn followed(&self) -> Option<u32> {
        let all = self
            .threads
            .iter()
            .fold(0u32, |a, &(_, f)| a.saturating_add(f));
        let (top, most) = self.threads.iter().copied().max_by_key(|&(_, f)| f)?;
        let others = all - most;
        (others < SPREAD_MIN_FAULTS || others.saturating_mul(SPREAD_SHARE) < all).then_some(top)
    }
}

/// The fault thread's side (one fault thread).
pub(crate) struct Placement {
    /// The CPUs the fault thread may use (its affinity when it started).
    allowed: libc::cpu_set_t,
    /// The CPU it is pinned to while following.
    pinned: Option<u32>,
    since_look: u32,
    last_look_ns: u64,
    last_tid: u32,
    /// Slept in `poll` since the last look: the program may have moved meanwhile.
    slept: bool,
    where_threads_run: sched::ThreadCpu,
    /// Recent faults per thread.
    tally: Tally,
    /// The CPUs the far file's disk interrupts with its completions, when only some do
    /// (and the fault thread may use them): while faults read from the disk, the pair sits
    /// on one of those rather than wherever the program ran.
    near_disk: Vec<u32>,
    /// The backend's disk reads at the last look.
    disk_reads_seen: u64,
}

impl Placement {
    /// The placement of a fault thread, if `on`; `None` leaves it where the scheduler puts
    /// it (off, one CPU, or the thread's CPUs unknown).
    pub(crate) fn start(on: bool, near_disk: Option<Vec<u32>>) -> Option<Placement> {
        if !on {
            return None;
        }
        let allowed = sched::allowed_cpus().ok()?;
        let cpus = (0..libc::CPU_SETSIZE as u32)
            .filter(|&c| sched::has_cpu(&allowed, c))
            .count();
        if cpus < 2 {
            return None;
        }
        Some(Placement {
            allowed,
            pinned: None,
            since_look: 0,
            last_look_ns: 0,
            last_tid: 0,
            slept: false,
            where_threads_run: sched::ThreadCpu::default(),
            tally: Tally::default(),
            near_disk: near_disk
                .unwrap_or_default()
                .into_iter()
                .filter(|&c| sched::has_cpu(&allowed, c))
                .collect(),
            disk_reads_seen: 0,
        })
    }

    /// Sits beside a program thread: sleeps between faults instead of spinning.
    pub(crate) fn following(&self) -> bool {
        self.pinned.is_some()
    }

    /// After serving `n` faults, the last from thread `tid`: follow it if it is time to
    /// look where it runs.
    pub(crate) fn after_faults(
        &mut self,
        sh: &Shared,
        stats: &Counters,
        tid: u32,
        n: usize,
        now_ns: u64,
        disk_reads: u64,
    ) {
        self.tally.count(tid, n, now_ns);
        if sh.paused_until_ns.load(Ordering::Acquire) > now_ns {
            self.stop(sh);
            return;
        }
        self.since_look = self.since_look.saturating_add(n as u32);
        let since = now_ns.saturating_sub(self.last_look_ns);
        let due = self.since_look >= LOOK_EVERY_FAULTS
            || since >= LOOK_EVERY_NS
            || self.slept
            || (tid != self.last_tid && since >= LOOK_AFTER_NS);
        if !due {
            return;
        }
        self.since_look = 0;
        self.last_look_ns = now_ns;
        self.last_tid = tid;
        self.slept = false;
        // Several threads fault, each a fair share: the fault thread cannot sit beside them
        // all, and none may be kept on one CPU because one of them was pinned.
        let Some(top) = self.tally.followed() else {
            sh.pause(now_ns + SPREAD_PAUSE_NS, stats);
            self.tally = Tally::default();
            self.stop(sh);
            return;
        };
        if tid != top {
            // A thread that faults now and then: the one that faults most stays followed.
            return;
        }
        let Some(cpu) = self
            .pinned_beside(sh, tid)
            .or_else(|| self.where_threads_run.of(tid))
        else {
            return;
        };
        if sh.program_pinned()
            && now_ns.saturating_sub(sh.pinned_since_ns.load(Ordering::Relaxed)) > PIN_SPELL_NS
        {
            // A spell without the pin, so that the scheduler may move the program.
            sh.repin_after_ns
                .fetch_max(now_ns + UNPINNED_SPELL_NS, Ordering::Relaxed);
            self.stop(sh);
            return;
        }
        // Faults that read from the disk are served beside its interrupts if the program
        // may run there; otherwise where the program runs.
        let from_disk = disk_reads != self.disk_reads_seen;
        self.disk_reads_seen = disk_reads;
        let near = match self.near_disk.first() {
            Some(&d) if from_disk && !self.near_disk.contains(&cpu) => Some(d),
            _ => None,
        };
        let placed = near
            .filter(|&d| sh.pin_program(tid, d, now_ns))
            .or_else(|| {
                (sched::has_cpu(&self.allowed, cpu) && sh.pin_program(tid, cpu, now_ns))
                    .then_some(cpu)
            });
        let Some(cpu) = placed else {
            // Not kept on one CPU: the fault thread would be left behind at its next move.
            self.stop(sh);
            return;
        };
        if self.pinned != Some(cpu) && sched::pin_to(cpu).is_ok() {
            self.pinned = Some(cpu);
            add(&stats.fault_thread_moves, 1);
        }
    }

    /// The CPU of program thread `tid` without reading `/proc`, when it is the thread this
    /// fault thread pinned beside itself: confined to that one CPU, it cannot be elsewhere
    /// (the program taking its affinity back ends the pin, `program_sets_affinity`). While
    /// following, the fault thread sleeps between almost every two faults and looks after
    /// each sleep, so the reading cost ~4.4 us per fault on the CPU where the program waits:
    /// 6% of that CPU in dictgrow's random lookups served from compressed memory.
    fn pinned_beside(&self, sh: &Shared, tid: u32) -> Option<u32> {
        let cpu = sh.program_cpu.load(Ordering::Relaxed);
        (sh.program_tid.load(Ordering::Acquire) == tid && self.pinned == Some(cpu)).then_some(cpu)
    }

    /// A fault of program thread `tid` is about to be served (the thread waits in it): the
    /// moment to open the `/proc` file a look wanted for it. Opened by this thread while the
    /// program runs, it would take a descriptor number for a moment that the program may be
    /// about to count on (`farmem_sys::proc_file`).
    pub(crate) fn before_serving(&mut self, tid: u32) {
        if self.where_threads_run.wanted() == Some(tid) {
            self.where_threads_run.open(tid);
        }
    }

    /// About to sleep in `poll`.
    pub(crate) fn before_sleep(&mut self) {
        self.slept = true;
    }

    /// No fault for [`QUIET_MS`]: the program gets its own affinity back.
    pub(crate) fn quiet(&mut self, sh: &Shared) {
        self.stop(sh);
        self.slept = true;
    }

    /// Stop following: the program thread's own affinity back, the fault thread's too.
    fn stop(&mut self, sh: &Shared) {
        sh.release_program();
        if self.pinned.take().is_some() {
            let _ = sched::set_affinity(0, &self.allowed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_that_faults_now_and_then_does_not_stop_the_following() {
        let mut t = Tally::default();
        for i in 0..100 {
            t.count(1, 1, i * 1000);
            if i % 10 == 0 {
                t.count(2, 1, i * 1000);
            }
        }
        assert_eq!(t.followed(), Some(1), "one fault in 11 from thread 2");
    }

    #[test]
    fn threads_with_fair_shares_stop_it_and_a_few_faults_do_not() {
        let mut t = Tally::default();
        t.count(1, 5, 0);
        t.count(2, 4, 0);
        assert_eq!(t.followed(), Some(1), "too few faults to judge");
        t.count(2, 20, 1);
        t.count(1, 30, 2);
        assert_eq!(t.followed(), None, "24 of 59 faults from thread 2");
    }

    #[test]
    fn counts_fade_window_by_window_so_the_followed_thread_can_change() {
        let mut t = Tally::default();
        t.count(1, 1000, 0);
        t.count(2, 10, 1);
        assert_eq!(t.followed(), Some(1));
        // Thread 1 stops faulting; thread 2 goes on, one window after another.
        let mut now = 0;
        for _ in 0..12 {
            now += SPREAD_WINDOW_NS + 1;
            t.count(2, 40, now);
        }
        assert_eq!(t.followed(), Some(2), "{:?}", t.threads);
    }

    #[test]
    fn more_threads_than_counted_replace_the_quietest() {
        let mut t = Tally::default();
        for tid in 0..TALLY_THREADS as u32 {
            t.count(tid, 100 + tid as usize, 0);
        }
        t.count(99, 1, 1);
        assert_eq!(t.threads.len(), TALLY_THREADS);
        assert!(t.threads.iter().any(|&(tid, _)| tid == 99));
        assert!(
            !t.threads.iter().any(|&(tid, _)| tid == 0),
            "the quietest left"
        );
    }
}
