//! The page table: one atomic [`PageWord`] per page, in one flat table indexed by the page's
//! virtual page number, and the per-page lock that serializes a page's transitions.
//!
//! The table covers the whole 47-bit user address space (2^35 entries, 256 GiB of *virtual*
//! memory, reserved read-only and `MAP_NORESERVE`); only the slices that back registered
//! regions are made writable, and only the pages of the table that are touched use memory.
//! Flat indexing is what makes the hint fast path a handful of instructions: shift, mask,
//! load, test (see `include/farmem.h` and [`crate::hint`]). Unregistered memory reads as 0,
//! which the fast path takes as "nothing to do".
//!
//! The lock: `LOCKED` in the word, taken with a CAS ([`PageSlot::try_lock`]) and released
//! by storing the next state ([`PageSlot::unlock`]). A thread that must wait announces
//! itself with `WAITERS` and sleeps on the word's futex; the unlock wakes it. Threads that
//! lock several pages lock them in ascending order, so they cannot deadlock.

use std::io;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use farmem_sys::mem::{self, PAGE_SHIFT, PAGE_SIZE};

use super::word::{PageWord, IDLE};

/// Number of virtual page numbers covered (47-bit user address space).
const TABLE_ENTRIES: usize = 1 << (47 - PAGE_SHIFT);
const TABLE_BYTES: usize = TABLE_ENTRIES * 8;

/// The structure the C header reads inline: `table[(addr >> 12) & mask]`.
/// Until the table is reserved `mask` is 0 and `table` points at a zero word, so every hint
/// reads "nothing to do".
#[repr(C)]
pub struct Guard {
    table: AtomicPtr<AtomicU64>,
    mask: AtomicUsize,
}

static ZERO_WORD: AtomicU64 = AtomicU64::new(0);

/// Exported for `include/farmem.h`: the inline hint check reads it directly.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static fm_guard: Guard = Guard {
    table: AtomicPtr::new(&ZERO_WORD as *const AtomicU64 as *mut AtomicU64),
    mask: AtomicUsize::new(0),
};

static TABLE: OnceLock<Result<usize, String>> = OnceLock::new();

/// Reserve the table (once) and publish it to the fast path. Safe to call from any thread.
pub(crate) fn init() -> io::Result<()> {
    let r = TABLE.get_or_init(|| match mem::map_anon(TABLE_BYTES, libc::PROT_READ) {
        Ok(p) => {
            // Read-only reserve: never charged against overcommit, even in strict mode.
            let _ = mem::madvise(p as usize, TABLE_BYTES, libc::MADV_NOHUGEPAGE);
            // Publish the table before the mask so a Rust reader that sees the mask (Acquire)
            // also sees the table. C readers are safe because this runs in the library
            // constructor, before any program thread exists.
            fm_guard.table.store(p.cast(), Ordering::Release);
            fm_guard.mask.store(TABLE_ENTRIES - 1, Ordering::Release);
            Ok(p as usize)
        }
        Err(e) => Err(format!("cannot reserve the page-metadata table: {e}")),
    });
    match r {
        Ok(_) => Ok(()),
        Err(msg) => Err(io::Error::new(io::ErrorKind::OutOfMemory, msg.clone())),
    }
}

/// Reserve the table when the library is loaded, before `main` and before any thread the
/// program could start, so the C fast path never sees a half-published guard.
#[used]
#[link_section = ".init_array"]
static INIT_TABLE_AT_LOAD: extern "C" fn() = {
    extern "C" fn init_at_load() {
        // Failure is reported again (with context) when the first region is created.
        let _ = init();
    }
    init_at_load
};

fn base() -> *mut AtomicU64 {
    fm_guard.table.load(Ordering::Acquire)
}

/// The atomic word of one page.
#[repr(transparent)]
pub(crate) struct PageSlot(AtomicU64);

/// The slot of virtual page number `vpn`. Only valid for pages of live regions (whose slice
/// of the table is writable) or for reading elsewhere.
#[inline]
pub(crate) fn slot(vpn: usize) -> &'static PageSlot {
    debug_assert!(vpn < TABLE_ENTRIES);
    // SAFETY: `init` succeeded before any region existed (callers hold a region), so the
    // table spans all TABLE_ENTRIES words; the reserved mapping lives for the whole process.
    // PageSlot is a transparent AtomicU64.
    unsafe { &*base().add(vpn & (TABLE_ENTRIES - 1)).cast::<PageSlot>() }
}

/// The slot of page `vpn` as the inline hint reads it: through the guard, so that without a
/// table (not reserved yet, or a failed start) it is a static zero word, never registered
/// and so never written.
#[inline(always)]
pub(crate) fn guarded_slot(vpn: usize) -> &'static PageSlot {
    // Mask before table: the table is published before the mask, so a non-zero mask implies
    // the real table (see `init`).
    let mask = fm_guard.mask.load(Ordering::Acquire);
    let table = fm_guard.table.load(Ordering::Relaxed);
    // SAFETY: the index is masked to the table's size (or to 0 when the table is not yet
    // reserved, where `table` points at a static zero word); the table is never unmapped.
    // PageSlot is a transparent AtomicU64.
    unsafe { &*table.add(vpn & mask).cast::<PageSlot>() }
}

/// Small id of the calling thread, recorded in the words it locks.
pub(crate) fn owner_id() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    thread_local!(static ID: u16 = (NEXT.fetch_add(1, Ordering::Relaxed) % 0xFFFF) as u16 + 1);
    ID.with(|i| *i)
}

fn table_span(first_vpn: usize, npages: usize) -> (usize, usize) {
    let start = base() as usize + first_vpn * 8;
    let end = start + npages * 8;
    let s = start & !(PAGE_SIZE - 1);
    let e = (end + PAGE_SIZE - 1) & !(PAGE_SIZE - 1);
    (s, e - s)
}

/// The pages among `npages` from `first_vpn` whose words are written one by one: all of
/// them, or with `whole_pages_mapped` only those whose words lie in the table pages shared
/// with neighbouring regions (at both ends), the whole pages between having been mapped.
fn one_by_one(
    first_vpn: usize,
    npages: usize,
    whole_pages_mapped: bool,
) -> impl Iterator<Item = usize> {
    let end_vpn = first_vpn + npages;
    let (head_end, tail_start) = if whole_pages_mapped {
        let (start, inner_s, inner_e) = whole_table_pages(first_vpn, npages);
        // Both differences are multiples of 8: the table starts on a page boundary.
        (
            first_vpn + (inner_s - start) / 8,
            first_vpn + (inner_e - start) / 8,
        )
    } else {
        (end_vpn, end_vpn)
    };
    (first_vpn..head_end.min(end_vpn)).chain(tail_start.min(end_vpn)..end_vpn)
}

/// Where the words of `npages` pages from `first_vpn` start in the table, and the whole
/// table pages among them `[inner_s, inner_e)` (no other region's words share them).
fn whole_table_pages(first_vpn: usize, npages: usize) -> (usize, usize, usize) {
    let start = base() as usize + first_vpn * 8;
    let end = start + npages * 8;
    let inner_s = (start + PAGE_SIZE - 1) & !(PAGE_SIZE - 1);
    let inner_e = (end & !(PAGE_SIZE - 1)).max(inner_s);
    (start, inner_s, inner_e)
}

/// Make the words of `npages` pages from `first_vpn` writable and set them to `FRESH`: the
/// whole table pages as copy-on-write `FRESH` pages (`fresh.rs`: no memory until written),
/// the partial ones at the ends (shared with neighbours) word by word.
pub(crate) fn register(first_vpn: usize, npages: usize) -> io::Result<()> {
    init()?;
    let (s, len) = table_span(first_vpn, npages);
    mem::mprotect(s as *mut u8, len, libc::PROT_READ | libc::PROT_WRITE)?;
    super::digest::register(first_vpn, npages)?;
    let (_, inner_s, inner_e) = whole_table_pages(first_vpn, npages);
    let mapped = inner_e > inner_s && super::fresh::map_fresh(inner_s, inner_e).is_ok();
    for vpn in one_by_one(first_vpn, npages, mapped) {
        slot(vpn).store(PageWord::FRESH);
    }
    Ok(())
}

/// Forget the words of a destroyed region: zero them, and give back the table pages it used
/// alone (anonymous and read-only again, as the rest of the reservation).
pub(crate) fn unregister(first_vpn: usize, npages: usize) {
    let (_, inner_s, inner_e) = whole_table_pages(first_vpn, npages);
    let unmapped = inner_e > inner_s && super::fresh::map_unregistered(inner_s, inner_e);
    for vpn in one_by_one(first_vpn, npages, unmapped) {
        slot(vpn).store(PageWord::UNREGISTERED);
    }
    super::digest::unregister(first_vpn, npages);
}

impl PageSlot {
    #[inline]
    pub(crate) fn load(&self) -> PageWord {
        PageWord::from_raw(self.0.load(Ordering::Acquire))
    }

    /// The word once no transition holds it: waits for the lock holder, which releases
    /// soon (for tests and tools that ask after an access, not for the fault path).
    pub(crate) fn load_settled(&self) -> PageWord {
        let mut w = self.load();
        while w.is_locked() {
            self.wait_unlocked(1000);
            w = self.load();
        }
        w
    }

    /// A load that orders nothing (a first look, confirmed under the lock).
    #[inline]
    pub(crate) fn peek(&self) -> PageWord {
        PageWord::from_raw(self.0.load(Ordering::Relaxed))
    }

    fn store(&self, w: PageWord) {
        self.0.store(w.raw(), Ordering::Release)
    }

    /// Try to take the page's lock. On success returns the word as it was before locking;
    /// fails (with the current word) if the page is locked or not registered.
    #[inline]
    pub(crate) fn try_lock(&self, owner: u16) -> Result<PageWord, PageWord> {
        let mut cur = self.0.load(Ordering::Acquire);
        loop {
            let w = PageWord::from_raw(cur);
            if w.is_locked() || !w.is_registered() {
                return Err(w);
            }
            let new = w.locked_by(owner).raw();
            match self
                .0
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(w),
                Err(c) => cur = c,
            }
        }
    }

    /// Lock the page if it is absent and free; `None` otherwise (left untouched).
    pub(crate) fn lock_if_absent(&self, owner: u16) -> Option<PageWord> {
        let w = self.peek();
        if !(w.is_absent() && w.is_registered()) {
            return None;
        }
        match self.try_lock(owner) {
            Ok(o) if o.is_absent() => Some(o),
            Ok(o) => {
                self.unlock(o);
                None
            }
            Err(_) => None,
        }
    }

    /// Take the page's lock, waiting for its holder to finish; `None` if the page is not
    /// registered (its region is gone).
    pub(crate) fn lock_waiting(&self, owner: u16) -> Option<PageWord> {
        loop {
            match self.try_lock(owner) {
                Ok(old) => return Some(old),
                Err(cur) if cur.is_locked() => self.wait_unlocked(1000),
                Err(_) => return None,
            }
        }
    }

    /// Release the page's lock, publishing `new_state` (lock, waiters and owner cleared),
    /// and wake any waiters.
    #[inline]
    pub(crate) fn unlock(&self, new_state: PageWord) {
        let cur = PageWord::from_raw(self.0.swap(new_state.unlocked().raw(), Ordering::AcqRel));
        if cur.has_waiters() {
            mem::futex_wake_all(&self.0);
        }
    }

    /// Sleep until the page's lock is released (or `timeout_us` passes).
    pub(crate) fn wait_unlocked(&self, timeout_us: u64) {
        let mut cur = self.0.load(Ordering::Acquire);
        loop {
            let w = PageWord::from_raw(cur);
            if !w.is_locked() {
                return;
            }
            if w.has_waiters() {
                break;
            }
            let new = w.with_waiters().raw();
            match self
                .0
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    cur = new;
                    break;
                }
                Err(c) => cur = c,
            }
        }
        mem::futex_wait(&self.0, cur, timeout_us);
    }

    /// Mark the locked page as being evicted (the lock holder only).
    #[inline]
    pub(crate) fn mark_evicting(&self) {
        // A CAS, not a plain store: the use bits may change meanwhile.
        self.update(|w| Some(w.evicting()));
    }

    /// Clear the idle mark: the page was used. Needs no lock; a lost race with a lock holder
    /// storing its word only leaves the page looking idle one more pass.
    #[inline]
    pub(crate) fn mark_used(&self) {
        self.0.fetch_and(!IDLE, Ordering::AcqRel);
    }

    /// Clear the idle mark for a hint with eviction priority `prio`, recording the priority
    /// in the word when `seen` (the word as the caller last loaded it) has another: the
    /// priority policy reads it to move a page that became resident without it.
    #[inline]
    pub(crate) fn mark_used_by_hint(&self, seen: PageWord, prio: u8) {
        if seen.prio() == prio {
            self.mark_used();
        } else {
            self.update(|w| Some(w.used_with_prio(prio)));
        }
    }

    /// Apply `f` to the unlocked word until the CAS sticks; false if `f` declined.
    #[inline]
    pub(crate) fn update(&self, f: impl Fn(PageWord) -> Option<PageWord>) -> bool {
        let mut cur = self.0.load(Ordering::Acquire);
        loop {
            let Some(new) = f(PageWord::from_raw(cur)) else {
                return false;
            };
            match self
                .0
                .compare_exchange_weak(cur, new.raw(), Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(c) => cur = c,
            }
        }
    }
}
