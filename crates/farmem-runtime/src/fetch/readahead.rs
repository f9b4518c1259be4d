//! Asynchronous read-ahead: windows fetched ahead of a sequential hinted scan, or of a
//! strided fault pattern, and completed by whoever reaches them first.
//!
//! Two users: strided runs predicted from unhinted faults (`fault.rs`, through
//! [`submit_pages`]), and sequential hinted scans. A hint with `FM_SEQ` and forward
//! read-ahead `R` declares a sequential stream. Fetching only on misses makes the scan wait a whole backend round trip per window (over TCP that
//! caps a scan at about one window per round trip whatever the link could carry), so after
//! such a hint the runtime keeps `depth` further windows of `R` pages in flight: their pages
//! are locked, their budget reserved, their read submitted, and the batch is registered (`batches.rs`).
//! When the scan reaches a window, the data has usually arrived and is just installed.
//!
//! A batch's pages stay locked until the batch is completed (installed), by exactly one of:
//! the thread that reaches them (hint or fault, see `demand::ensure`), the control thread when
//! the batch is old (nobody came back for it), or region teardown. Completing takes the batch
//! out of the registry first, so it happens once.
//!
//! **Late prefetches are dropped** (Canvas). Each batch carries how long its pages stay
//! useful: the time until its stream (measured pace) passes the batch's last page. The
//! backend answers `Late` to a read it could not start in that time (a far-memory server
//! busy with demand reads); completing such a batch releases its pages unread and returns
//! their budget, and a thread that was waiting for one of them reads it on demand.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use farmem_proto::IoClass;

use super::batches::Batch;
use super::phases::{self, prefetch_deadline};
use super::request::{Locked, Mode, Request};
use crate::backend::io::PageBuf;
use crate::error::Result;
use crate::page::table;
use crate::reclaim;
use crate::regions::RegionInfo;
use crate::state::State;
use crate::stats::add;

/// A thread's sequential stream.
#[derive(Clone, Copy, Default)]
struct Stream {
    region: u32,
    /// First page of the previous sequential hint that reached the runtime.
    last_first: usize,
    /// Next page to read ahead.
    next: usize,
    /// When that hint reached the runtime, and the stream's pace in ns per page (0: not
    /// measured yet).
    last_ns: u64,
    pace_ns: u64,
}

thread_local! {
    static STREAM: Cell<Stream> = Cell::new(Stream::default());
    /// Receive buffers of this thread's batches (several are in flight at once).
    static BUFS: RefCell<Vec<PageBuf>> = const { RefCell::new(Vec::new()) };
}

/// Set up this thread's stream and batch buffers' slots now (see `fetch::warm_thread_locals`).
pub(crate) fn warm_thread_locals() {
    STREAM.with(|_| ());
    BUFS.with(|_| ());
}

fn take_buf(pages: usize) -> PageBuf {
    BUFS.with(|b| {
        let mut v = b.borrow_mut();
        match v.iter().position(|x| x.capacity() >= pages) {
            Some(i) => v.swap_remove(i),
            None => PageBuf::new(pages.next_power_of_two().max(64)),
        }
    })
}

fn give_buf(b: PageBuf) {
    BUFS.with(|v| {
        let mut v = v.borrow_mut();
        if v.len() < 8 {
            v.push(b);
        }
    });
}

/// After a sequential hint at `first` whose window (with its read-ahead of `r` pages) ends
/// before `window_end`: if it continues this thread's stream, keep `depth` further windows of
/// `r` pages in flight. A lone `FM_SEQ` hint is no stream yet: reading ahead for it would
/// mostly fetch pages nobody asks for.
pub(crate) fn pipeline(
    st: &State,
    reg: &RegionInfo,
    first: usize,
    window_end: usize,
    r: usize,
    prio: u8,
) {
    let depth = st.cfg.hint_pipeline;
    if depth == 0 || r == 0 {
        return;
    }
    let prev = STREAM.with(|s| s.get());
    let reach = r * (depth + 1) + 1;
    let continues =
        prev.region == reg.id && first > prev.last_first && first <= prev.last_first + reach;
    let mut next = if continues && prev.next >= window_end {
        prev.next
    } else {
        window_end
    };
    let now = st.now_ns();
    let pace_ns = if continues && now > prev.last_ns {
        let sample = (now - prev.last_ns) / (first - prev.last_first) as u64;
        if prev.pace_ns == 0 {
            sample
        } else {
            (3 * prev.pace_ns + sample) / 4
        }
    } else {
        prev.pace_ns
    };
    let mut stream = Stream {
        region: reg.id,
        last_first: first,
        next,
        last_ns: now,
        pace_ns,
    };
    STREAM.with(|s| s.set(stream));
    if !continues {
        return;
    }
    // Windows end `depth` windows past the current one.
    let horizon = (first + r * (depth + 1)).min(reg.end_vpn());
    while next < horizon {
        let hi = (next + r).min(reg.end_vpn());
        let window = next..hi;
        next = hi;
        // Useful until the scan passes the window's last page.
        let useful_for = prefetch_deadline(
            st,
            (pace_ns != 0).then(|| Duration::from_nanos((hi - 1 - first) as u64 * pace_ns)),
        );
        if submit_pages(st, reg, window, prio, useful_for) == Submitted::NoBudget {
            break;
        }
    }
    stream.next = next;
    STREAM.with(|s| s.set(stream));
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Submitted {
    /// A batch is in flight.
    Batch,
    /// Nothing to read: every page is present, in flight, or was never written.
    Nothing,
    /// The pages the backend holds found no free budget.
    NoBudget,
}

/// Read pages `vpns` (ascending, inside `reg`) ahead of use, in the prefetch class: lock the
/// absent ones, reserve free budget for them (never reclaiming for read-ahead), submit the
/// read and register the batch, to be completed by whoever reaches one of its pages first.
/// With `useful_for`, the backend may drop the read if it cannot start it in that time.
pub(crate) fn submit_pages(
    st: &State,
    reg: &RegionInfo,
    vpns: impl IntoIterator<Item = usize>,
    prio: u8,
    useful_for: Duration,
) -> Submitted {
    let me = table::owner_id();
    let mut pages: Vec<Locked> = vpns
        .into_iter()
        .filter_map(|v| {
            table::slot(v).lock_if_absent(me).map(|old| Locked {
                vpn: v,
                old,
                writable: false,
            })
        })
        .collect();
    // Checked under the first lock: the rest were locked inside the region as well.
    if pages
        .first()
        .is_some_and(|l| !phases::still_in_region(st, reg, l.vpn))
    {
        for l in pages {
            table::slot(l.vpn).unlock(l.old);
        }
        return Submitted::Nothing;
    }
    // Only pages the backend holds are worth reading ahead; fresh ones are zero-filled for
    // nothing when reached.
    let remote = pages.iter().any(|l| l.old.has_far_copy());
    let got = if remote {
        reclaim::try_reserve(st, pages.len())
    } else {
        0
    };
    for l in pages.drain(got..) {
        table::slot(l.vpn).unlock(l.old);
    }
    if pages.is_empty() {
        return if remote {
            Submitted::NoBudget
        } else {
            Submitted::Nothing
        };
    }
    let read = match phases::submit_phase(
        st,
        reg,
        &pages,
        IoClass::Prefetch,
        Some(useful_for),
        take_buf,
    ) {
        Ok(r) => r,
        Err(e) => farmem_sys::process::fatal(&format!("read-ahead: {e}")),
    };
    add(&st.stats.c.prefetch_batches, 1);
    add(&st.stats.c.prefetch_pages, pages.len() as u64);
    st.inflight.insert(Batch {
        reg: *reg,
        pages,
        read,
        prio,
        submitted: Instant::now(),
    });
    Submitted::Batch
}

/// Install a batch: wait for its data, map its pages (waking threads that faulted on them),
/// unlock them and hand them to the reclaim policy. A batch the backend dropped as late is
/// released instead: its pages go back to absent and unlocked, their budget is returned.
fn complete(st: &State, mut b: Batch) -> Result<()> {
    if b.read.as_ref().is_some_and(|r| !r.completion.is_done()) {
        add(&st.stats.c.prefetch_late, 1);
    }
    match phases::arrived_in_time(st, b.read.take()) {
        Ok(read) => b.read = read,
        Err(msg) => {
            tracing::trace!("read-ahead dropped: {msg}");
            phases::release_unread(st, &b.pages);
            return Ok(());
        }
    }
    let req = Request {
        first: b.pages[0].vpn,
        count: b.pages.len(),
        write: false,
        readahead: 0,
        readahead_writable: false,
        prio: b.prio,
        mode: Mode::Hint,
        readahead_useful_for: None,
        readahead_trusted: false,
        fresh_end: 0,
    };
    phases::install_phase(st, &b.reg, &req, &b.pages, b.read, give_buf)?;
    if st
        .book
        .note_fetched(b.pages.iter().map(|l| (l.vpn, false)), b.prio, None)
    {
        st.kick_control();
    }
    Ok(())
}

/// Install the batches whose data has arrived (a fault thread with nothing else to do): a
/// prefetched page that is already mapped when the program reaches it costs no fault at all.
pub(crate) fn complete_arrived(st: &State) {
    if st.inflight.is_empty() {
        return;
    }
    let arrived = st
        .inflight
        .take_where(|b| b.read.as_ref().is_none_or(|r| r.completion.is_done()));
    for b in arrived {
        if let Err(e) = complete(st, b) {
            farmem_sys::process::fatal(&format!("read-ahead: {e}"));
        }
    }
}

/// If page `vpn` is held by a batch in flight, complete that batch. Returns whether it did.
pub(crate) fn complete_covering(st: &State, vpn: usize) -> Result<bool> {
    if st.inflight.is_empty() {
        return Ok(false);
    }
    match st.inflight.take_covering(vpn) {
        Some(b) => complete(st, b).map(|()| true),
        None => Ok(false),
    }
}

/// Complete every batch of pages in `[first, end)` (a region going away).
pub(crate) fn complete_range(st: &State, first: usize, end: usize) {
    if st.inflight.is_empty() {
        return;
    }
    for b in st
        .inflight
        .take_where(|b| b.pages[0].vpn < end && b.last_vpn() >= first)
    {
        if let Err(e) = complete(st, b) {
            farmem_sys::process::fatal(&format!("read-ahead: {e}"));
        }
    }
}

/// Batches nobody came back for: arrived and older than a few milliseconds, or older than
/// `max_age` whatever their state. Completed by the control thread so that their pages do
/// not stay locked (and their budget reserved) indefinitely.
pub(crate) fn sweep(st: &State, max_age: Duration) {
    if st.inflight.is_empty() {
        return;
    }
    let now = Instant::now();
    let stale = st.inflight.take_where(|b| {
        let age = now.duration_since(b.submitted);
        age > max_age
            || (age > max_age / 8 && b.read.as_ref().is_none_or(|r| r.completion.is_done()))
    });
    for b in stale {
        add(&st.stats.c.prefetch_swept, 1);
        if let Err(e) = complete(st, b) {
            farmem_sys::process::fatal(&format!("read-ahead: {e}"));
        }
    }
}
