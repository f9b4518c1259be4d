//! Read-ahead in flight: windows fetched asynchronously ahead of a sequential hinted scan.
//!
//! Two users: strided runs predicted from unhinted faults (`fault.rs`, through
//! [`submit_pages`]), and sequential hinted scans. A hint with `FM_SEQ` and forward
//! read-ahead `R` declares a sequential stream. Fetching
//! only on misses makes the scan wait a whole backend round trip per window (over TCP that
//! caps a scan at about one window per round trip whatever the link could carry), so after
//! such a hint the runtime keeps `depth` further windows of `R` pages in flight: their pages
//! are locked, their budget reserved, their read submitted, and the batch is registered here.
//! When the scan reaches a window, the data has usually arrived and is just installed.
//!
//! A batch's pages stay locked until the batch is completed (installed), by exactly one of:
//! the thread that reaches them (hint or fault, see `fetch::ensure`), the control thread when
//! the batch is old (nobody came back for it), or region teardown. Completing takes the batch
//! out of the registry first, so it happens once.
//!
//! **Late prefetches are dropped** (Canvas). Each batch carries how long its pages stay
//! useful: the time until its stream (measured pace) passes the batch's last page. The
//! backend answers `Late` to a read it could not start in that time (a far-memory server
//! busy with demand reads); completing such a batch releases its pages unread and returns
//! their budget, and a thread that was waiting for one of them reads it on demand.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::backend::{IoClass, PageBuf};
use crate::error::Result;
use crate::fetch::{self, InFlight, Locked, Mode, Request};
use crate::page_table::{self as pt, REMOTE};
use crate::reclaim;
use crate::region::RegionInfo;
use crate::runtime::Inner;
use crate::stats::add;

/// A window of pages being read ahead.
pub(crate) struct Batch {
    reg: RegionInfo,
    /// Locked, absent pages in ascending order (not always contiguous).
    pages: Vec<Locked>,
    read: Option<InFlight>,
    prio: u8,
    submitted: Instant,
}

impl Batch {
    fn last_vpn(&self) -> usize {
        self.pages.last().expect("non-empty batch").vpn
    }
}

/// The batches in flight of one runtime, by first page.
#[derive(Default)]
pub(crate) struct InFlightSet {
    map: Mutex<BTreeMap<usize, Batch>>,
    count: AtomicUsize,
}

impl InFlightSet {
    /// Nothing in flight (one atomic load: cheap enough for every locked-page encounter).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Batches in flight.
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    fn insert(&self, b: Batch) {
        self.map.lock().insert(b.pages[0].vpn, b);
        self.count.fetch_add(1, Ordering::AcqRel);
    }

    fn take_where(&self, mut pick: impl FnMut(&Batch) -> bool) -> Vec<Batch> {
        let mut m = self.map.lock();
        let keys: Vec<usize> = m.iter().filter(|(_, b)| pick(b)).map(|(&k, _)| k).collect();
        let out: Vec<Batch> = keys.iter().filter_map(|k| m.remove(k)).collect();
        self.count.fetch_sub(out.len(), Ordering::AcqRel);
        out
    }

    /// The batch holding page `vpn`, if one does.
    fn take_covering(&self, vpn: usize) -> Option<Batch> {
        let mut m = self.map.lock();
        let (&k, b) = m.range(..=vpn).next_back()?;
        if vpn > b.last_vpn() || b.pages.binary_search_by_key(&vpn, |l| l.vpn).is_err() {
            return None;
        }
        let b = m.remove(&k);
        self.count.fetch_sub(1, Ordering::AcqRel);
        b
    }
}

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
    inner: &Inner,
    reg: &RegionInfo,
    first: usize,
    window_end: usize,
    r: usize,
    prio: u8,
) {
    let depth = inner.cfg.hint_pipeline;
    if depth == 0 || r == 0 {
        return;
    }
    let st = STREAM.with(|s| s.get());
    let reach = r * (depth + 1) + 1;
    let continues = st.region == reg.id && first > st.last_first && first <= st.last_first + reach;
    let mut next = if continues && st.next >= window_end {
        st.next
    } else {
        window_end
    };
    let now = inner.now_ns();
    let pace_ns = if continues && now > st.last_ns {
        let sample = (now - st.last_ns) / (first - st.last_first) as u64;
        if st.pace_ns == 0 {
            sample
        } else {
            (3 * st.pace_ns + sample) / 4
        }
    } else {
        st.pace_ns
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
        let useful_for = fetch::prefetch_deadline(
            inner,
            (pace_ns != 0).then(|| Duration::from_nanos((hi - 1 - first) as u64 * pace_ns)),
        );
        if submit_pages(inner, reg, window, prio, useful_for) == Submitted::NoBudget {
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
    inner: &Inner,
    reg: &RegionInfo,
    vpns: impl IntoIterator<Item = usize>,
    prio: u8,
    useful_for: Duration,
) -> Submitted {
    let me = fetch::owner_id();
    let mut pages: Vec<Locked> = vpns
        .into_iter()
        .filter_map(|v| fetch::lock_absent(v, me).map(|old| Locked::new(v, old, false)))
        .collect();
    // Only pages the backend holds are worth reading ahead; fresh ones are zero-filled for
    // nothing when reached.
    let remote = pages.iter().any(|l| l.old & REMOTE != 0);
    let got = if remote {
        reclaim::try_reserve(inner, pages.len())
    } else {
        0
    };
    for l in pages.drain(got..) {
        pt::unlock(pt::entry(l.vpn), l.old);
    }
    if pages.is_empty() {
        return if remote {
            Submitted::NoBudget
        } else {
            Submitted::Nothing
        };
    }
    let read = match fetch::submit_phase(
        inner,
        reg,
        &pages,
        IoClass::Prefetch,
        Some(useful_for),
        take_buf,
    ) {
        Ok(r) => r,
        Err(e) => farmem_sys::process::fatal(&format!("read-ahead: {e}")),
    };
    add(&inner.stats.c.prefetch_batches, 1);
    add(&inner.stats.c.prefetch_pages, pages.len() as u64);
    inner.inflight.insert(Batch {
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
fn complete(inner: &Inner, mut b: Batch) -> Result<()> {
    if b.read.as_ref().is_some_and(|r| !r.completion.is_done()) {
        add(&inner.stats.c.prefetch_late, 1);
    }
    match fetch::arrived_in_time(b.read.take()) {
        Ok(read) => b.read = read,
        Err(msg) => {
            tracing::trace!("read-ahead dropped: {msg}");
            fetch::release_unread(inner, &b.pages);
            return Ok(());
        }
    }
    let req = Request {
        first: b.pages[0].vpn,
        count: b.pages.len(),
        write: false,
        rdahead: 0,
        ra_write: false,
        prio: b.prio,
        mode: Mode::Hint,
        ahead_useful_for: None,
    };
    fetch::install_phase(inner, &b.reg, &req, &b.pages, b.read, give_buf)?;
    if inner
        .book
        .note_fetched(b.pages.iter().map(|l| l.vpn), b.prio, None)
    {
        inner.kick_control();
    }
    Ok(())
}

/// Install the batches whose data has arrived (a fault thread with nothing else to do): a
/// prefetched page that is already mapped when the program reaches it costs no fault at all.
pub(crate) fn complete_arrived(inner: &Inner) {
    if inner.inflight.is_empty() {
        return;
    }
    let arrived = inner
        .inflight
        .take_where(|b| b.read.as_ref().is_none_or(|r| r.completion.is_done()));
    for b in arrived {
        if let Err(e) = complete(inner, b) {
            farmem_sys::process::fatal(&format!("read-ahead: {e}"));
        }
    }
}

/// If page `vpn` is held by a batch in flight, complete that batch. Returns whether it did.
pub(crate) fn complete_covering(inner: &Inner, vpn: usize) -> Result<bool> {
    if inner.inflight.is_empty() {
        return Ok(false);
    }
    match inner.inflight.take_covering(vpn) {
        Some(b) => complete(inner, b).map(|()| true),
        None => Ok(false),
    }
}

/// Complete every batch of pages in `[first, end)` (a region going away).
pub(crate) fn complete_range(inner: &Inner, first: usize, end: usize) {
    if inner.inflight.is_empty() {
        return;
    }
    for b in inner
        .inflight
        .take_where(|b| b.pages[0].vpn < end && b.last_vpn() >= first)
    {
        if let Err(e) = complete(inner, b) {
            farmem_sys::process::fatal(&format!("read-ahead: {e}"));
        }
    }
}

/// Batches nobody came back for: arrived and older than a few milliseconds, or older than
/// `max_age` whatever their state. Completed by the control thread so that their pages do
/// not stay locked (and their budget reserved) indefinitely.
pub(crate) fn sweep(inner: &Inner, max_age: Duration) {
    if inner.inflight.is_empty() {
        return;
    }
    let now = Instant::now();
    let stale = inner.inflight.take_where(|b| {
        let age = now.duration_since(b.submitted);
        age > max_age
            || (age > max_age / 8 && b.read.as_ref().is_none_or(|r| r.completion.is_done()))
    });
    for b in stale {
        add(&inner.stats.c.prefetch_swept, 1);
        if let Err(e) = complete(inner, b) {
            farmem_sys::process::fatal(&format!("read-ahead: {e}"));
        }
    }
}
