//! The two phases that touch the backend and the page tables, shared by demand fetches and
//! asynchronous read-ahead: submit the read of the locked pages that have a far copy, then
//! install every locked page (fetched or zero-filled) run by run and publish its word.

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::OnceLock;
use std::time::Duration;

use farmem_proto::{IoClass, PageKey};
use farmem_sys::mem::{self, PAGE_SIZE};
use farmem_sys::uffd;

use super::request::{InFlight, Locked, Mode, Request};
use crate::backend::error::BackendError;
use crate::backend::io::{Completion, PageBuf};
use crate::config::FarCopies;
use crate::error::{Error, Result};
use crate::page::word::{Access, Hotness};
use crate::page::{digest, table};
use crate::regions::RegionInfo;
use crate::state::State;
use crate::stats::add;

/// Most demanded pages locked and fetched in one go; longer hints loop.
pub(crate) const DEMAND_CHUNK: usize = 256;
/// Size of the shared read-only zero source (enough for any one run).
const ZERO_PAGES: usize = DEMAND_CHUNK + 4096;

/// A read-only, never-written mapping: reads as zeros, costs no memory.
fn zero_source() -> *const u8 {
    static ZERO: OnceLock<usize> = OnceLock::new();
    *ZERO.get_or_init(|| {
        mem::map_anon(ZERO_PAGES * PAGE_SIZE, libc::PROT_READ).expect("mapping the zero source")
            as usize
    }) as *const u8
}

/// A per-thread slot for a reusable page buffer.
pub(crate) type BufSlot = &'static std::thread::LocalKey<RefCell<Option<PageBuf>>>;

thread_local! {
    /// Per-thread scratch used to assemble runs that mix zero and fetched pages.
    static SCRATCH: RefCell<Option<PageBuf>> = const { RefCell::new(None) };
}

/// Set up this thread's scratch buffer's slot now (see `fetch::warm_thread_locals`).
pub(crate) fn warm_thread_locals() {
    SCRATCH.with(|_| ());
}

/// This thread's buffer from `slot` if it holds `pages`, else a new one.
pub(crate) fn take_buf(slot: BufSlot, pages: usize) -> PageBuf {
    slot.with(|s| match s.borrow_mut().take() {
        Some(b) if b.capacity() >= pages => b,
        _ => PageBuf::new(pages.next_power_of_two().max(64)),
    })
}

pub(crate) fn give_buf(slot: BufSlot, b: PageBuf) {
    slot.with(|s| *s.borrow_mut() = Some(b));
}

fn addr_of(vpn: usize) -> usize {
    vpn * PAGE_SIZE
}

/// Whether page `vpn`, locked by the caller, is still a page of region `reg` of this
/// runtime. The caller found `reg` before it took the lock; the region may have been dropped
/// since, and its address taken by a region of another runtime in this process, whose word
/// the lock then is. A fetch must not go on: `UFFDIO_COPY` through this runtime's
/// userfaultfd installs into any registered range, so the page would land in the other
/// runtime's region while this one counted it (its count never fell back; the owner's fell
/// below zero when it dropped the region: seen in CI). Under the page lock the answer holds:
/// dropping a region takes it out of the map first, then waits for every page lock.
pub(crate) fn still_in_region(st: &State, reg: &RegionInfo, vpn: usize) -> bool {
    st.region_of(addr_of(vpn)).is_some_and(|r| r.id == reg.id)
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
pub(crate) fn prefetch_deadline(st: &State, pace_based: Option<Duration>) -> Duration {
    let floor = Duration::from_micros(st.cfg.prefetch_deadline_us);
    pace_based.map_or(floor, |d| d.max(floor))
}

/// Submit the backend read of the pages among `pages` that have a far copy (none if all
/// are fresh), into a buffer from `buf(pages)`. A prefetch with `useful_for` may come back
/// [`BackendError::Late`] instead (see [`crate::backend::Backend::submit_prefetch`]).
pub(crate) fn submit_phase(
    st: &State,
    reg: &RegionInfo,
    pages: &[Locked],
    class: IoClass,
    useful_for: Option<Duration>,
    buf: impl FnOnce(usize) -> PageBuf,
) -> Result<Option<InFlight>> {
    let mut keys = Vec::new();
    for l in pages {
        if l.old.has_far_copy() {
            keys.push(PageKey {
                region: reg.id,
                page: reg.index_of(l.vpn),
            });
        } else if l.old.ever_written() {
            return Err(Error::NoFarCopy(addr_of(l.vpn)));
        }
    }
    if keys.is_empty() {
        return Ok(None);
    }
    let n = keys.len();
    let completion = match useful_for {
        Some(d) if class == IoClass::Prefetch => st.backend.submit_prefetch(keys, buf(n), d),
        _ => st.backend.submit_read(class, keys, buf(n)),
    };
    Ok(Some(InFlight {
        completion,
        pages: n,
    }))
}

/// Wait for a prefetch read: `Err` if the backend dropped it as late (nothing was read), else
/// the finished read, ready for [`install_phase`].
pub(crate) fn arrived_in_time(
    st: &State,
    read: Option<InFlight>,
) -> std::result::Result<Option<InFlight>, String> {
    let Some(r) = read else { return Ok(None) };
    match r.completion.wait(st.io_timeout) {
        Err(BackendError::Late(msg)) => Err(msg),
        result => Ok(Some(InFlight {
            completion: Completion::ready(result),
            ..r
        })),
    }
}

/// Give back locked pages whose read was dropped: each goes back to its word before the lock
/// (absent, far copy intact), which wakes whoever waits for it, and its budget is returned.
pub(crate) fn release_unread(st: &State, pages: &[Locked]) {
    for l in pages {
        table::slot(l.vpn).unlock(l.old);
    }
    st.resident.fetch_sub(pages.len(), Ordering::AcqRel);
    add(&st.stats.c.prefetch_dropped_late, pages.len() as u64);
}

/// How to install a locked page: written if asked; else writable and unverified when its
/// first write is likely (it was written during its last stay, or its neighbourhood writes
/// what it reads: `write_guess.rs`) or it is a zero fill (a page that stays all zeros is
/// dropped at eviction without a write-back), so that the write costs no fault; else
/// write-protected, so that its eviction, if it is not written, needs no write-protect
/// ioctl (a TLB shootdown of the program's CPUs) and, where its far copy is kept, no write.
///
/// Every fetched page used to be unverified where far copies are dropped at the fetch (it
/// is written back at eviction anyway): sqlite at half its peak lost 326K write-protect
/// faults of 1.37M, but read-only data paid a shootdown per eviction (the suite's kvs at
/// 50%: 6.2-6.7 s, against 4.3-4.6 s write-protected).
fn access_for(st: &State, l: &Locked) -> Access {
    if l.writable {
        Access::Written
    } else if st.cfg.writable_install
        && (l.old.wrote_last() || !l.old.has_far_copy() || st.write_guess.likely_written(l.vpn))
    {
        Access::Unverified
    } else {
        Access::Protected
    }
}

/// The digests of a run's pages installed unverified over a far copy, taken from `src` (the
/// run's contents as fetched: the far copy's, whatever the program, already woken, writes
/// meanwhile), so that their eviction can tell whether they changed (`page/digest.rs`).
/// Taken here rather than at every write-back: only these pages are ever compared, and the
/// fetched bytes are in the cache (kvs at 25%: 71 K unverified installs, 618 K write-backs
/// whose XXH3 over cold pages was 3.5% of the run's CPU).
fn store_digests(run: &[Locked], access: &[Access], src: *const u8) {
    for (k, (l, a)) in run.iter().zip(access).enumerate() {
        if *a == Access::Unverified && l.old.has_far_copy() {
            // SAFETY: `src` holds the run's `run.len()` pages, in order, and stays alive and
            // unchanged until the caller gives its buffer back.
            let page = unsafe { std::slice::from_raw_parts(src.add(k * PAGE_SIZE), PAGE_SIZE) };
            // We hold the page's lock, as a digest's reader and writer must.
            digest::store(l.vpn, digest::of(page));
        }
    }
}

/// Whether a page installed `writable` (written, or likely to be) loses its far copy at the
/// install under `copies`.
fn forgets_copy_at_install(copies: FarCopies, writable: bool) -> bool {
    match copies {
        FarCopies::Keep => false,
        FarCopies::Clean => writable,
        FarCopies::Drop => true,
    }
}

/// Wait for a class's read (if any) and install its pages (ascending vpn order) run by run;
/// the receive buffer goes back through `recycle`.
pub(crate) fn install_phase(
    st: &State,
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
            let done = r.completion.wait(st.io_timeout).map_err(|e| {
                Error::backend(
                    st.backend.describe(),
                    Some(format!("reading {n} page(s) of region {}", reg.id)),
                    e,
                )
            })?;
            add(&st.stats.c.pages_fetched, n as u64);
            add(&st.stats.c.bytes_read, (n * PAGE_SIZE) as u64);
            Some(done.buf)
        }
    };

    let mut packed = 0usize; // index of the next fetched page in `received`
                             // Decided once per page: the guess may change while the runs are installed.
    let access: Vec<Access> = pages.iter().map(|l| access_for(st, l)).collect();
    let mut i = 0;
    while i < pages.len() {
        // A run: consecutive pages with the same protection.
        let writable = access[i].writable();
        let mut unverified = (access[i] == Access::Unverified) as u64;
        let mut j = i + 1;
        while j < pages.len() && pages[j].vpn == pages[j - 1].vpn + 1 {
            if access[j].writable() != writable {
                break;
            }
            unverified += (access[j] == Access::Unverified) as u64;
            j += 1;
        }
        let run = &pages[i..j];
        let remote = run.iter().filter(|l| l.old.has_far_copy()).count();
        let mut scratch = None;
        let src: *const u8 = if remote == 0 {
            add(&st.stats.c.zero_fills, run.len() as u64);
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
                if l.old.has_far_copy() {
                    s.page_mut(k).copy_from_slice(rb.page(p));
                    p += 1;
                } else {
                    s.page_mut(k).fill(0);
                    add(&st.stats.c.zero_fills, 1);
                }
            }
            let ptr = s.as_ptr();
            scratch = Some(s);
            ptr
        };
        packed += remote;
        let mode = if writable { 0 } else { uffd::COPY_MODE_WP };
        // Counted first: a woken thread that reads the statistics sees its page counted.
        add(&st.stats.c.install_ioctls, 1);
        add(&st.stats.c.pages_installed, run.len() as u64);
        add(&st.stats.c.unverified_installs, unverified);
        // The copy wakes the faulting threads itself (PFA's minimal path: no separate
        // UFFDIO_WAKE, ~4% of an unhinted fault here). A woken thread may find the page's
        // word still locked for the few nanoseconds until the loop below: hints then wait on
        // the lock, and `Region::is_resident` waits for it too.
        st.uffd
            .copy(addr_of(run[0].vpn), src, run.len() * PAGE_SIZE, mode)
            .map_err(|e| Error::sys("installing pages (UFFDIO_COPY)", e))?;
        // (Pages are installed unverified only where digests are kept: `access_for`.)
        if unverified > 0 {
            store_digests(run, &access[i..j], src);
        }
        if let Some(s) = scratch {
            give_buf(&SCRATCH, s);
        }
        // Far copies that are not worth keeping are forgotten now, under the page locks (no
        // one reads them meanwhile), so that no page is held both here and there for nothing.
        // The backend says which it forgot: a tier on disk keeps its copies (disk space is
        // cheap, writing a page back again is not).
        let mut forgotten = Vec::new();
        if remote > 0 && forgets_copy_at_install(st.far_copies, writable) {
            let keys: Vec<PageKey> = run
                .iter()
                .filter(|l| l.old.has_far_copy())
                .map(|l| PageKey {
                    region: reg.id,
                    page: reg.index_of(l.vpn),
                })
                .collect();
            forgotten = st.backend.forget_fetched(&keys);
        }
        if !writable && remote > 0 {
            st.write_guess
                .installed_protected(run[0].vpn, remote as u32);
        }
        let mut remote_i = 0;
        for (l, &a) in run.iter().zip(&access[i..j]) {
            let hotness = if req.mode == Mode::Fault {
                let (h, recent) = st.workingset.at_fault_install(l.old);
                if recent {
                    add(&st.stats.c.recent_refaults, 1);
                }
                h
            } else {
                Hotness::Used
            };
            let mut new = l.old.installed(a, req.prio, hotness);
            if l.old.has_far_copy() {
                if forgotten.get(remote_i) == Some(&true) {
                    new = new.far_copy_taken();
                }
                remote_i += 1;
            }
            table::slot(l.vpn).unlock(new);
        }
        i = j;
    }
    if let Some(b) = received {
        recycle(b);
    }
    Ok(())
}
