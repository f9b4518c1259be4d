//! The thread that empties the perf rings into memory while the program runs.
//!
//! Parsing and unwinding a sample takes microseconds; a program taking zero-fill faults
//! writes samples faster than that. If the thread that unwinds also read the rings, a burst
//! of faults (or a moment without a CPU) would overflow them and the kernel would drop
//! samples, which skews the shares towards the slower sites. So one thread only copies
//! records out, at real-time priority where allowed, into buffers that are already mapped,
//! and hands them over in chunks.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::record::{parse_records, Event, Recorder};

/// The thread that empties the rings into memory, ahead of the parsing.
pub struct Copier {
    chunks: mpsc::Receiver<Vec<u8>>,
    /// Parsed chunks go back to the copier to be filled again.
    spare: mpsc::Sender<Vec<u8>>,
    /// Bytes copied out and not parsed yet.
    backlog: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Buffers the copier prepares before its first copy, and their size: a few copies' worth
/// (it copies every few milliseconds; a program faulting as fast as it can fills a few MiB
/// of ring in that time), prepared in a few milliseconds before the program starts.
const PREPARED_BUFFERS: usize = 3;
const PREPARED_BYTES: usize = 8 << 20;

/// Most bytes of records held between the copier and the parser: past it the copier waits,
/// the rings fill and the kernel drops samples (and says how many), instead of the trace
/// taking the machine's memory. Up to a hundred thousand samples of 8 KiB of stack.
fn backlog_limit() -> usize {
    let avail = farmem_sys::host::meminfo_kib("MemAvailable").map_or(usize::MAX, |kib| {
        usize::try_from(kib * 1024 / 4).unwrap_or(usize::MAX)
    });
    avail.clamp(64 << 20, 1 << 30)
}

impl Copier {
    pub fn start(rec: Recorder) -> Copier {
        let (tx, chunks) = mpsc::channel();
        let (spare, spare_rx) = mpsc::channel();
        let backlog = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (b, s) = (backlog.clone(), stop.clone());
        let (ready_tx, ready) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            realtime_if_allowed();
            Self::copy(rec, tx, spare_rx, ready_tx, &b, &s, backlog_limit());
        });
        let _ = ready.recv(); // its buffers are prepared (or it ended)
        Copier {
            chunks,
            spare,
            backlog,
            stop,
            thread: Some(thread),
        }
    }

    /// The copier's loop: says `ready` once prepared, then until `stop` copies the rings out
    /// whenever they have data and the backlog is under `limit`. Returning drops the
    /// recorder, which closes the events.
    ///
    /// It copies into buffers that are already mapped: the parser hands them back, and the
    /// first ones are touched before the program starts. Allocating and faulting here would
    /// contend for the process's memory map with the parser (which maps debug files and
    /// frees large buffers) while the rings fill.
    fn copy(
        mut rec: Recorder,
        tx: mpsc::Sender<Vec<u8>>,
        spare: mpsc::Receiver<Vec<u8>>,
        ready: mpsc::Sender<()>,
        backlog: &AtomicUsize,
        stop: &AtomicBool,
        limit: usize,
    ) {
        let mut pool: Vec<Vec<u8>> = (0..PREPARED_BUFFERS)
            .map(|_| {
                let mut b = vec![1u8; PREPARED_BYTES];
                b.clear();
                b
            })
            .collect();
        let _ = ready.send(());
        loop {
            // The last pass, after the program ended, takes everything regardless of the
            // backlog: nothing more will come.
            let last = stop.load(Ordering::Acquire);
            if !last {
                rec.wait(5);
            }
            pool.extend(spare.try_iter());
            if last || backlog.load(Ordering::Relaxed) < limit {
                let mut buf = pool.pop().unwrap_or_default();
                buf.clear();
                if rec.copy_out(&mut buf) > 0 {
                    backlog.fetch_add(buf.len(), Ordering::Relaxed);
                    if tx.send(buf).is_err() {
                        return;
                    }
                } else {
                    pool.push(buf);
                }
            } else {
                std::thread::sleep(Duration::from_millis(1));
            }
            if last {
                return;
            }
        }
    }

    /// Hand the records the copier has delivered to `f`, for up to about `wait`.
    pub fn take_for(&self, wait: Duration, mut f: impl FnMut(Event<'_>)) {
        let deadline = Instant::now() + wait;
        while let Ok(buf) = self
            .chunks
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            parse_records(&buf, &mut f);
            self.backlog.fetch_sub(buf.len(), Ordering::Relaxed);
            let _ = self.spare.send(buf);
        }
    }

    /// After the program ended: copy out what is left, and hand every record to `f`.
    pub fn finish(mut self, mut f: impl FnMut(Event<'_>)) {
        self.stop.store(true, Ordering::Release);
        for buf in &self.chunks {
            parse_records(&buf, &mut f);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Copier {
    /// On an early return, the copier closes the events and ends.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Run this thread at the lowest real-time priority if allowed (root): the copier then
/// runs as soon as it wakes, whatever else the machine does, and the rings never overflow
/// while it waits for a CPU. It only copies and sleeps, so it cannot starve anything.
fn realtime_if_allowed() {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: changes this thread's scheduling class; `param` is valid for the call.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if rc != 0 {
        tracing::debug!(
            "trace copier stays at normal priority: {}",
            std::io::Error::last_os_error()
        );
    }
}
