//! Per-page metadata: one atomic 64-bit word per page, in one flat table indexed by the
//! page's virtual page number.
//!
//! The table covers the whole 47-bit user address space (2^35 entries, 256 GiB of *virtual*
//! memory, reserved read-only and `MAP_NORESERVE`); only the slices that back registered
//! regions are made writable, and only the pages of the table that are touched use memory.
//! Flat indexing is what makes the hint fast path a handful of instructions: shift, mask,
//! load, test (see `include/farmem.h` and [`crate::hint`]). Unregistered memory reads as 0,
//! which the fast path takes as "nothing to do".
//!
//! The flag sense is chosen for the fast path: `ABSENT` and `NOWRITE` are set when a hint
//! has work to do, so a read hint tests one bit and a write hint tests one bit.

use std::io;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use farmem_sys::mem::{self, PAGE_SHIFT, PAGE_SIZE};

/// The page is not mapped locally (remote, never materialized, or being fetched).
pub const ABSENT: u64 = 1 << 0;
/// The page may not be written without the runtime's help (absent, or installed
/// write-protected so that the first write is noticed).
pub const NOWRITE: u64 = 1 << 1;
/// The page belongs to a far-memory region.
pub const REGISTERED: u64 = 1 << 2;
/// The local copy differs from the backend copy (or the backend has none): write back
/// before dropping.
pub const DIRTY: u64 = 1 << 3;
/// A thread owns the page's transition (fetch, write-unprotect or eviction).
pub const LOCKED: u64 = 1 << 4;
/// The owner is evicting the page.
pub const EVICTING: u64 = 1 << 5;
/// Recency, in the sense the fast path needs: set by a policy's hand when it passes a
/// resident page ("not used since"), cleared by any hint or fault on the page. The inline
/// hint tests it together with `ABSENT`/`NOWRITE`, so a hint on an idle page takes the slow
/// path once per pass of the hand, and a hint on a recently used one costs nothing more.
/// Policies that do not track recency never set it.
pub const IDLE: u64 = 1 << 6;
/// The page was written at least once: it must never be refilled with zeros.
pub const EVER_WRITTEN: u64 = 1 << 7;
/// The backend holds a copy of the page (current unless `DIRTY`).
pub const REMOTE: u64 = 1 << 8;
/// Some thread sleeps on the futex of this word waiting for `LOCKED` to clear.
pub const WAITERS: u64 = 1 << 9;
/// Eviction priority given by the last hint (`ev_prio`), 0..=7.
pub const PRIO_SHIFT: u32 = 10;
pub const PRIO_MASK: u64 = 0x7 << PRIO_SHIFT;
/// Small id of the thread that holds `LOCKED` (diagnostics and fault stealing decisions).
pub const OWNER_SHIFT: u32 = 16;
pub const OWNER_MASK: u64 = 0xFFFF << OWNER_SHIFT;
/// Bits 32..60: the page's shadow while it is far after an eviction (0 otherwise): the low
/// 28 bits of the runtime's eviction clock when it was evicted. At the refault, the clock's
/// advance since then is the refault distance (Linux's workingset shadow entries), the
/// hotness signal recency policies have for pages no hint touches.
pub const SHADOW_SHIFT: u32 = 32;
pub const SHADOW_BITS: u32 = 28;
pub const SHADOW_MASK: u64 = ((1 << SHADOW_BITS) - 1) << SHADOW_SHIFT;
/// Bits 60..62: how many times in a row the page came back soon after its eviction (kept
/// while it is far); bits 62..64: the extra passes of a policy's hand it has left while
/// local. A page that keeps proving to be in the working set is kept up to `MAX_LEVEL`
/// passes longer, which a single use bit cannot express for pages no hint touches.
pub const LEVEL_SHIFT: u32 = 60;
pub const LEVEL_MASK: u64 = 0x3 << LEVEL_SHIFT;
pub const CREDIT_SHIFT: u32 = 62;
pub const CREDIT_MASK: u64 = 0x3 << CREDIT_SHIFT;
pub const MAX_LEVEL: u64 = 3;

/// Initial state of a page of a fresh region: registered, never materialized.
pub const FRESH: u64 = REGISTERED | ABSENT | NOWRITE;

/// Number of virtual page numbers covered (47-bit user address space).
pub const TABLE_ENTRIES: usize = 1 << (47 - PAGE_SHIFT);
const TABLE_BYTES: usize = TABLE_ENTRIES * 8;

/// The structure the C header reads inline: `table[(addr >> 12) & mask]`.
/// Until the table is reserved `mask` is 0 and `table` points at a zero word, so every hint
/// reads "nothing to do".
#[repr(C)]
pub struct Guard {
    pub table: AtomicPtr<AtomicU64>,
    pub mask: AtomicUsize,
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
pub fn init() -> io::Result<()> {
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

/// The metadata word of virtual page number `vpn`. Only valid for pages of live regions
/// (whose slice of the table is writable) or for reading elsewhere.
#[inline]
pub fn entry(vpn: usize) -> &'static AtomicU64 {
    debug_assert!(vpn < TABLE_ENTRIES);
    // SAFETY: `init` succeeded before any region existed (callers hold a region), so the
    // table spans all TABLE_ENTRIES words; the reserved mapping lives for the whole process.
    unsafe { &*base().add(vpn & (TABLE_ENTRIES - 1)) }
}

/// Virtual page number of an address.
#[inline]
pub fn vpn_of(addr: usize) -> usize {
    addr >> PAGE_SHIFT
}

fn table_span(first_vpn: usize, npages: usize) -> (usize, usize) {
    let start = base() as usize + first_vpn * 8;
    let end = start + npages * 8;
    let s = start & !(PAGE_SIZE - 1);
    let e = (end + PAGE_SIZE - 1) & !(PAGE_SIZE - 1);
    (s, e - s)
}

/// Make the metadata of `npages` pages from `first_vpn` writable and set them to `FRESH`.
pub fn register(first_vpn: usize, npages: usize) -> io::Result<()> {
    init()?;
    let (s, len) = table_span(first_vpn, npages);
    mem::mprotect(s as *mut u8, len, libc::PROT_READ | libc::PROT_WRITE)?;
    for vpn in first_vpn..first_vpn + npages {
        entry(vpn).store(FRESH, Ordering::Release);
    }
    Ok(())
}

/// Forget the metadata of a destroyed region: zero it, and give back the table pages it used
/// alone (they stay writable, which is harmless: they read as zero again).
pub fn unregister(first_vpn: usize, npages: usize) {
    for vpn in first_vpn..first_vpn + npages {
        entry(vpn).store(0, Ordering::Release);
    }
    let start = base() as usize + first_vpn * 8;
    let end = start + npages * 8;
    let inner_s = (start + PAGE_SIZE - 1) & !(PAGE_SIZE - 1);
    let inner_e = end & !(PAGE_SIZE - 1);
    if inner_e > inner_s {
        let _ = mem::madvise(inner_s, inner_e - inner_s, libc::MADV_DONTNEED);
    }
}

/// Try to take a page's lock. On success returns the word as it was before locking.
#[inline]
pub fn try_lock(word: &AtomicU64, owner: u16) -> Result<u64, u64> {
    let mut cur = word.load(Ordering::Acquire);
    loop {
        if cur & LOCKED != 0 || cur & REGISTERED == 0 {
            return Err(cur);
        }
        let new = (cur & !OWNER_MASK) | LOCKED | ((owner as u64) << OWNER_SHIFT);
        match word.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Ok(cur),
            Err(c) => cur = c,
        }
    }
}

/// Release a page's lock, replacing its word with `new_state` (LOCKED, WAITERS and OWNER
/// cleared), and wake any waiters.
#[inline]
pub fn unlock(word: &AtomicU64, new_state: u64) {
    let state = new_state & !(LOCKED | WAITERS | OWNER_MASK);
    let cur = word.swap(state, Ordering::AcqRel);
    if cur & WAITERS != 0 {
        mem::futex_wake_all(word);
    }
}

/// Sleep until the page's lock is released (or `timeout_us` passes).
pub fn wait_unlocked(word: &AtomicU64, timeout_us: u64) {
    let mut cur = word.load(Ordering::Acquire);
    loop {
        if cur & LOCKED == 0 {
            return;
        }
        if cur & WAITERS != 0 {
            break;
        }
        match word.compare_exchange_weak(cur, cur | WAITERS, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                cur |= WAITERS;
                break;
            }
            Err(c) => cur = c,
        }
    }
    mem::futex_wait(word, cur, timeout_us);
}

#[cfg(test)]
mod header_tests {
    use super::*;

    /// The inline hints in `include/farmem.h` test these bits by value: the header and the
    /// table must agree, or hints would skip needed work.
    #[test]
    fn header_bits_match_the_table() {
        let header = include_str!("../../../include/farmem.h");
        let value = |name: &str| -> u64 {
            let line = header
                .lines()
                .find(|l| l.starts_with(&format!("#define {name} ")))
                .unwrap_or_else(|| panic!("{name} is not defined in farmem.h"));
            let v = line.split_whitespace().nth(2).unwrap();
            v.trim_end_matches("ull").parse().unwrap()
        };
        assert_eq!(value("FM__ABSENT"), ABSENT);
        assert_eq!(value("FM__NOWRITE"), NOWRITE);
        assert_eq!(value("FM__IDLE"), IDLE);
    }
}
