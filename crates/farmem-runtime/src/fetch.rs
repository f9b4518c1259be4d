//! The fetch path, shared by hints (on the application thread) and unhinted faults (on the
//! runtime's fault thread): lock the pages, reserve budget, read them from the backend (or
//! materialize zeros), install each contiguous run with one `UFFDIO_COPY`, mark them
//! present, release the locks and wake the waiters. Handing the pages to the reclaim policy
//! is queued for the control thread (`book.rs`).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::backend::{BackendError, Completion, IoClass, PageBuf, PageKey};
use crate::error::{Error, Result};
use crate::page_table::{self as pt, ABSENT, DIRTY, EVER_WRITTEN, IDLE, NOWRITE};
use crate::page_table::{CREDIT_MASK, CREDIT_SHIFT, LEVEL_MASK, LEVEL_SHIFT, MAX_LEVEL};
use crate::page_table::{PRIO_MASK, PRIO_SHIFT, REGISTERED, REMOTE};
use crate::page_table::{SHADOW_BITS, SHADOW_MASK, SHADOW_SHIFT};
use crate::region::RegionInfo;
use crate::runtime::Inner;
use crate::stats::add;
use crate::{prefetch, reclaim};
use farmem_sys::mem::{self, PAGE_SIZE};
use farmem_sys::uffd;

/// Most demanded pages locked and fetched in one go; longer hints loop.
const DEMAND_CHUNK: usize = 256;
/// Size of the shared read-only zero source (enough for any one run).
const ZERO_PAGES: usize = DEMAND_CHUNK + 4096;

/// Who is asking, which decides whether the caller may sleep on a locked page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// An application thread's hint: waits for pages locked by others.
    Hint,
    /// A runtime thread serving a userfaultfd event: never waits (it would stall every other
    /// fault); reports `busy` so the event is retried later.
    Fault,
}

pub(crate) struct Request {
    /// First demanded virtual page and how many (all of them must end up present).
    pub first: usize,
    pub count: usize,
    /// Demanded pages must be writable.
    pub write: bool,
    /// Optional extra pages after (positive) or before (negative) the demanded range.
    pub rdahead: isize,
    /// Install read-ahead pages writable (sequential writers) instead of write-protected.
    pub ra_write: bool,
    pub prio: u8,
    pub mode: Mode,
    /// How long the read-ahead stays useful (its stream's pace; `None`: not known).
    pub ahead_useful_for: Option<Duration>,
}

/// The deadline of a read-ahead whose pages its stream is expected to pass in `pace_based`,
/// never below the configured floor ([`crate::Config::prefetch_deadline_us`]).
///
/// The server serves demand before prefetch, so without a deadline a read-ahead could wait
/// for as long as other threads keep reading, and hold the threads that reach its pages as
/// long. But a read-ahead that arrives after its stream would have passed at full speed is
/// not useless: the stream waits for it instead of faulting page by page (deadlines of the
/// pace alone dropped most windows of a prefetched scan and made it several times slower:
/// the pace of a prefetched stream is that of its hits). A window is useless once a demand
/// read issued when the stream reached it would have been faster: when it has waited in the
/// queue far longer than a demand read takes. The floor is that bound.
pub(crate) fn prefetch_deadline(inner: &Inner, pace_based: Option<Duration>) -> Duration {
    let floor = Duration::from_micros(inner.cfg.prefetch_deadline_us);
    pace_based.map_or(floor, |d| d.max(floor))
}

#[derive(Default, Debug)]
pub(crate) struct Outcome {
    /// A demanded page is locked by another thread (Fault mode only).
    pub busy: bool,
    /// Pages installed (demanded and read-ahead).
    pub installed: usize,
    /// Present pages whose write protection was lifted.
    pub unprotected: usize,
}

/// A page locked for fetching.
#[derive(Clone, Copy)]
pub(crate) struct Locked {
    pub vpn: usize,
    /// Its metadata word before it was locked.
    pub old: u64,
    /// Install it writable (else write-protected, so the first write is noticed).
    pub writable: bool,
}

impl Locked {
    pub fn new(vpn: usize, old: u64, writable: bool) -> Locked {
        Locked { vpn, old, writable }
    }
}

pub(crate) fn owner_id() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    thread_local!(static ID: u16 = (NEXT.fetch_add(1, Ordering::Relaxed) % 0xFFFF) as u16 + 1);
    ID.with(|i| *i)
}

/// A read-only, never-written mapping: reads as zeros, costs no memory.
fn zero_source() -> *const u8 {
    static ZERO: OnceLock<usize> = OnceLock::new();
    *ZERO.get_or_init(|| {
        mem::map_anon(ZERO_PAGES * PAGE_SIZE, libc::PROT_READ).expect("mapping the zero source")
            as usize
    }) as *const u8
}

thread_local! {
    /// Per-thread scratch used to assemble runs that mix zero and fetched pages.
    static SCRATCH: RefCell<Option<PageBuf>> = const { RefCell::new(None) };
    /// Per-thread receive buffers handed to the backend (returned with the completion), one
    /// for demanded pages and one for read-ahead, which are in flight together.
    static RECV: RefCell<Option<PageBuf>> = const { RefCell::new(None) };
    static RECV_AHEAD: RefCell<Option<PageBuf>> = const { RefCell::new(None) };
}

fn take_buf(
    slot: &'static std::thread::LocalKey<RefCell<Option<PageBuf>>>,
    pages: usize,
) -> PageBuf {
    slot.with(|s| match s.borrow_mut().take() {
        Some(b) if b.capacity() >= pages => b,
        _ => PageBuf::new(pages.next_power_of_two().max(64)),
    })
}

fn give_buf(slot: &'static std::thread::LocalKey<RefCell<Option<PageBuf>>>, b: PageBuf) {
    slot.with(|s| *s.borrow_mut() = Some(b));
}

#[inline]
fn satisfied(word: u64, write: bool) -> bool {
    let need = if write { NOWRITE } else { ABSENT };
    word & REGISTERED == 0 || word & need == 0
}

fn addr_of(vpn: usize) -> usize {
    vpn * PAGE_SIZE
}

/// Make `[first, first+count)` present (and writable if asked), plus best-effort read-ahead.
pub(crate) fn ensure(inner: &Inner, reg: &RegionInfo, req: &Request) -> Result<Outcome> {
    let _local = crate::scope::LocalScope::enter();
    let mut out = Outcome::default();
    let end = req.first + req.count;
    let mut vpn = req.first;
    let me = owner_id();
    while vpn < end {
        let w = pt::entry(vpn);
        let cur = w.load(Ordering::Acquire);
        if cur & IDLE != 0 {
            // Used again since the policy's hand passed it (a lost race with a lock holder
            // storing its word only leaves the page looking idle one more pass).
            w.fetch_and(!IDLE, Ordering::AcqRel);
        }
        if satisfied(cur, req.write) {
            vpn += 1;
            continue;
        }
        let old = match pt::try_lock(w, me) {
            Ok(old) => old,
            Err(cur) if cur & REGISTERED == 0 => {
                vpn += 1;
                continue;
            }
            // Held by read-ahead in flight: complete it here (this thread holds no page
            // lock at this point), then look at the page again.
            Err(_) if prefetch::complete_covering(inner, vpn)? => continue,
            Err(_) if req.mode == Mode::Fault => {
                out.busy = true;
                return Ok(out);
            }
            Err(_) => {
                pt::wait_unlocked(w, 1000);
                continue;
            }
        };
        if old & ABSENT == 0 {
            // Present: either someone fetched it meanwhile, or a write needs the protection
            // lifted (the first write to a page installed read-only).
            let mut new = old;
            if req.write && old & NOWRITE != 0 {
                if let Err(e) = inner.uffd.writeprotect(addr_of(vpn), PAGE_SIZE, false) {
                    pt::unlock(w, old);
                    return Err(Error::sys("lifting write protection", e));
                }
                new = (old & !(NOWRITE | IDLE)) | DIRTY | EVER_WRITTEN;
                out.unprotected += 1;
            }
            pt::unlock(w, new);
            vpn += 1;
            continue;
        }

        // Absent: lock the following demanded pages that are absent too, up to a chunk.
        let mut batch = vec![Locked {
            vpn,
            old,
            writable: req.write,
        }];
        let mut next = vpn + 1;
        while next < end && batch.len() < DEMAND_CHUNK {
            match lock_absent(next, me) {
                Some(o) => batch.push(Locked {
                    vpn: next,
                    old: o,
                    writable: req.write,
                }),
                None => break,
            }
            next += 1;
        }
        let n_demand = batch.len();
        if next == end && req.rdahead != 0 {
            lock_readahead(inner, reg, req, me, &mut batch);
        }
        vpn = next;
        out.installed += fetch_locked(inner, reg, req, &mut batch, n_demand)?;
    }
    Ok(out)
}

/// Lock `vpn` if it is absent and free; `None` otherwise (left untouched).
pub(crate) fn lock_absent(vpn: usize, me: u16) -> Option<u64> {
    let w = pt::entry(vpn);
    if w.load(Ordering::Relaxed) & (ABSENT | REGISTERED) != (ABSENT | REGISTERED) {
        return None;
    }
    match pt::try_lock(w, me) {
        Ok(o) if o & ABSENT != 0 => Some(o),
        Ok(o) => {
            pt::unlock(w, o);
            None
        }
        Err(_) => None,
    }
}

/// Lock read-ahead candidates: absent, unlocked pages of the window inside the region.
fn lock_readahead(
    inner: &Inner,
    reg: &RegionInfo,
    req: &Request,
    me: u16,
    batch: &mut Vec<Locked>,
) {
    let r = req
        .rdahead
        .unsigned_abs()
        .min(inner.cfg.max_rdahead.max(inner.cfg.fault_readahead));
    let (lo, hi) = if req.rdahead > 0 {
        let lo = req.first + req.count;
        (lo, (lo + r).min(reg.end_vpn()))
    } else {
        (req.first.saturating_sub(r).max(reg.first_vpn()), req.first)
    };
    for v in lo..hi {
        if let Some(o) = lock_absent(v, me) {
            batch.push(Locked {
                vpn: v,
                old: o,
                writable: req.ra_write,
            });
        }
    }
}

/// Fetch and install a batch of locked absent pages (the first `n_demand` demanded).
/// Returns the number installed; read-ahead pages that find no free budget are released.
fn fetch_locked(
    inner: &Inner,
    reg: &RegionInfo,
    req: &Request,
    batch: &mut Vec<Locked>,
    n_demand: usize,
) -> Result<usize> {
    let t0 = Instant::now();
    reclaim::reserve(inner, n_demand);
    let extra = batch.len() - n_demand;
    if extra > 0 {
        let got = reclaim::try_reserve(inner, extra);
        for l in batch.drain(n_demand + got..) {
            pt::unlock(pt::entry(l.vpn), l.old);
        }
    }
    let recv = |n| take_buf(&RECV, n);
    let recv_back = |b| give_buf(&RECV, b);
    if req.mode == Mode::Hint {
        // A hint returns only once its read-ahead is installed too: one request for all the
        // pages (one reply, one wake-up) is all the thread can use.
        let read = submit_phase(inner, reg, batch, IoClass::Demand, None, recv)?;
        install_phase(inner, reg, req, batch, read, recv_back)?;
    } else {
        // The faulting thread resumes as soon as its page is in, so the read-ahead goes as a
        // separate, lower-priority request. Both are sent before either is waited for: over
        // a network the read-ahead then costs no extra round trip.
        let (demand, ahead) = batch.split_at(n_demand);
        let demand_read = submit_phase(inner, reg, demand, IoClass::Demand, None, recv)?;
        let useful_for = prefetch_deadline(inner, req.ahead_useful_for);
        let ahead_read = submit_phase(
            inner,
            reg,
            ahead,
            IoClass::Prefetch,
            Some(useful_for),
            |n| take_buf(&RECV_AHEAD, n),
        )?;
        install_phase(inner, reg, req, demand, demand_read, recv_back)?;
        match arrived_in_time(ahead_read) {
            Ok(read) => install_phase(inner, reg, req, ahead, read, |b| give_buf(&RECV_AHEAD, b))?,
            Err(msg) => {
                tracing::trace!("fault read-ahead dropped: {msg}");
                release_unread(inner, ahead);
                batch.truncate(n_demand);
            }
        }
    }
    add(
        &inner.stats.c.readahead_pages,
        (batch.len() - n_demand) as u64,
    );
    // Bookkeeping is queued, not done here: the policy and the histogram are shared with
    // every other fetching thread and the reclaimer (PFA's minimal fault path).
    let ns = t0.elapsed().as_nanos() as u64;
    if inner
        .book
        .note_fetched(batch.iter().map(|l| l.vpn), req.prio, Some(ns))
    {
        inner.kick_control();
    }
    Ok(batch.len())
}

/// A backend read in flight for one class of pages.
pub(crate) struct InFlight {
    pub completion: Completion,
    pub pages: usize,
}

/// Wait for a prefetch read: `Err` if the backend dropped it as late (nothing was read), else
/// the finished read, ready for [`install_phase`].
pub(crate) fn arrived_in_time(
    read: Option<InFlight>,
) -> std::result::Result<Option<InFlight>, String> {
    let Some(r) = read else { return Ok(None) };
    match r.completion.wait() {
        Err(BackendError::Late(msg)) => Err(msg),
        result => Ok(Some(InFlight {
            completion: Completion::ready(result),
            ..r
        })),
    }
}

/// Give back locked pages whose read was dropped: each goes back to its word before the lock
/// (absent, far copy intact), which wakes whoever waits for it, and its budget is returned.
pub(crate) fn release_unread(inner: &Inner, pages: &[Locked]) {
    for l in pages {
        pt::unlock(pt::entry(l.vpn), l.old);
    }
    inner.resident.fetch_sub(pages.len(), Ordering::AcqRel);
    add(&inner.stats.c.prefetch_dropped_late, pages.len() as u64);
}

/// Submit the backend read of the remote pages among `pages` (none if all are fresh), into
/// a buffer from `buf(pages)`. A prefetch with `useful_for` may come back
/// [`crate::backend::BackendError::Late`] instead (see [`crate::backend::Backend::submit_prefetch`]).
pub(crate) fn submit_phase(
    inner: &Inner,
    reg: &RegionInfo,
    pages: &[Locked],
    class: IoClass,
    useful_for: Option<Duration>,
    buf: impl FnOnce(usize) -> PageBuf,
) -> Result<Option<InFlight>> {
    let mut keys = Vec::new();
    for l in pages {
        if l.old & REMOTE != 0 {
            keys.push(PageKey {
                region: reg.id,
                page: reg.index_of(l.vpn),
            });
        } else if l.old & EVER_WRITTEN != 0 {
            return Err(Error::Backend {
                backend: inner.backend.describe(),
                msg: format!(
                    "page at {:#x} was written but has no far copy; refusing to zero it",
                    addr_of(l.vpn)
                ),
            });
        }
    }
    if keys.is_empty() {
        return Ok(None);
    }
    let n = keys.len();
    let completion = match useful_for {
        Some(d) if class == IoClass::Prefetch => inner.backend.submit_prefetch(keys, buf(n), d),
        _ => inner.backend.submit_read(class, keys, buf(n)),
    };
    Ok(Some(InFlight {
        completion,
        pages: n,
    }))
}

/// Was a page evicted so recently that it belongs to the working set? Its refault distance
/// (pages evicted since it was) is below the budget: with one more pass of the hand it would
/// still have been local. Pages that no hint touches get their only recency signal here:
/// a recent refault is installed as used, anything else (first touches, old refaults,
/// read-ahead) on probation, idle, so a recency policy evicts it at the hand's first pass.
fn recent_refault(old: u64, clock: u64, budget: usize) -> bool {
    let bits = (1u64 << SHADOW_BITS) - 1;
    let shadow = (old & SHADOW_MASK) >> SHADOW_SHIFT;
    old & REMOTE != 0 && shadow != 0 && (clock.wrapping_sub(shadow) & bits) < budget as u64
}

/// The working-set state of a page a fault installs: a recent refault goes up a level (up
/// to `MAX_LEVEL`) and gets as many extra passes of the hand, starting as used; any other
/// page starts over at level 0, idle (on probation).
fn working_set_bits(old: u64, recent: bool) -> u64 {
    if !recent {
        return IDLE;
    }
    let level = (((old & LEVEL_MASK) >> LEVEL_SHIFT) + 1).min(MAX_LEVEL);
    (level << LEVEL_SHIFT) | (level << CREDIT_SHIFT)
}

/// Wait for a class's read (if any) and install its pages (ascending vpn order) run by run;
/// the receive buffer goes back through `recycle`.
pub(crate) fn install_phase(
    inner: &Inner,
    reg: &RegionInfo,
    req: &Request,
    pages: &[Locked],
    read: Option<InFlight>,
    recycle: impl FnOnce(PageBuf),
) -> Result<()> {
    let received = match read {
        None => None,
        Some(r) => {
            let n = r.pages;
            let done = r.completion.wait().map_err(|e| Error::Backend {
                backend: inner.backend.describe(),
                msg: format!("reading {n} page(s) of region {}: {e}", reg.id),
            })?;
            add(&inner.stats.c.pages_fetched, n as u64);
            add(&inner.stats.c.bytes_read, (n * PAGE_SIZE) as u64);
            Some(done.buf)
        }
    };

    let mut packed = 0usize; // index of the next fetched page in `received`
    let mut i = 0;
    while i < pages.len() {
        // A run: consecutive pages with the same protection.
        let mut j = i + 1;
        while j < pages.len()
            && pages[j].vpn == pages[j - 1].vpn + 1
            && pages[j].writable == pages[i].writable
        {
            j += 1;
        }
        let run = &pages[i..j];
        let remote = run.iter().filter(|l| l.old & REMOTE != 0).count();
        let mut scratch = None;
        let src: *const u8 = if remote == 0 {
            add(&inner.stats.c.zero_fills, run.len() as u64);
            zero_source()
        } else if remote == run.len() {
            // SAFETY: `received` holds keys.len() pages; this run's pages are the next
            // `run.len()` of them, in order.
            unsafe {
                received
                    .as_ref()
                    .expect("fetched pages")
                    .as_ptr()
                    .add(packed * PAGE_SIZE)
            }
        } else {
            let mut s = take_buf(&SCRATCH, run.len());
            s.set_len(run.len());
            let rb = received.as_ref().expect("fetched pages");
            let mut p = packed;
            for (k, l) in run.iter().enumerate() {
                if l.old & REMOTE != 0 {
                    s.page_mut(k).copy_from_slice(rb.page(p));
                    p += 1;
                } else {
                    s.page_mut(k).fill(0);
                    add(&inner.stats.c.zero_fills, 1);
                }
            }
            let ptr = s.as_ptr();
            scratch = Some(s);
            ptr
        };
        packed += remote;
        let mode = if run[0].writable {
            0
        } else {
            uffd::COPY_MODE_WP
        };
        // Counted first: a woken thread that reads the statistics sees its page counted.
        add(&inner.stats.c.install_ioctls, 1);
        add(&inner.stats.c.pages_installed, run.len() as u64);
        // The copy wakes the faulting threads itself (PFA's minimal path: no separate
        // UFFDIO_WAKE, ~4% of an unhinted fault here). A woken thread may find the page's
        // metadata still locked for the few nanoseconds until the loop below: hints then
        // wait on the lock, and `Region::is_resident` waits for it too.
        inner
            .uffd
            .copy(addr_of(run[0].vpn), src, run.len() * PAGE_SIZE, mode)
            .map_err(|e| Error::sys("installing pages (UFFDIO_COPY)", e))?;
        if let Some(s) = scratch {
            give_buf(&SCRATCH, s);
        }
        let prio = ((req.prio as u64) << PRIO_SHIFT) & PRIO_MASK;
        let clock = inner.evict_clock.load(Ordering::Relaxed);
        for l in run {
            let keep = l.old
                & !(ABSENT | NOWRITE | DIRTY | IDLE | PRIO_MASK)
                & !(SHADOW_MASK | LEVEL_MASK | CREDIT_MASK);
            let mut new = if l.writable {
                keep | DIRTY | EVER_WRITTEN
            } else {
                keep | NOWRITE
            };
            if inner.probation && req.mode == Mode::Fault {
                let recent = recent_refault(l.old, clock, inner.budget);
                if recent {
                    add(&inner.stats.c.recent_refaults, 1);
                }
                new |= working_set_bits(l.old, recent);
            }
            pt::unlock(pt::entry(l.vpn), new | prio);
        }
        i = j;
    }
    if let Some(b) = received {
        recycle(b);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evicted_at(stamp: u64) -> u64 {
        pt::FRESH | REMOTE | (stamp << SHADOW_SHIFT)
    }

    #[test]
    fn refault_distance_below_the_budget_is_the_working_set() {
        let budget = 1000;
        assert!(recent_refault(evicted_at(5000), 5999, budget));
        assert!(
            !recent_refault(evicted_at(5000), 6000, budget),
            "a full budget ago"
        );
        let top = (1 << SHADOW_BITS) - 10;
        assert!(
            recent_refault(evicted_at(top), (1 << SHADOW_BITS) + 100, budget),
            "the clock wraps"
        );
        assert!(
            !recent_refault(pt::FRESH | REMOTE, 10, budget),
            "no shadow: never evicted (or discarded)"
        );
        assert!(
            !recent_refault(evicted_at(5000) & !REMOTE, 5001, budget),
            "a page with no far copy was not evicted with its data"
        );
    }

    #[test]
    fn recent_refaults_in_a_row_earn_more_passes() {
        let level = |w: u64| (w & LEVEL_MASK) >> LEVEL_SHIFT;
        let credit = |w: u64| (w & CREDIT_MASK) >> CREDIT_SHIFT;
        assert_eq!(working_set_bits(0, false), IDLE, "probation");
        let mut w = 0;
        for expect in [1, 2, 3, 3] {
            w = working_set_bits(w, true);
            assert_eq!(w & IDLE, 0, "a working-set page starts used");
            assert_eq!((level(w), credit(w)), (expect, expect));
        }
        assert_eq!(
            working_set_bits(w, false),
            IDLE,
            "an old refault starts over"
        );
    }
}
