//! Test support, compiled with the `testing` feature only: checked page patterns, a source
//! of memory pressure, and the integrity workloads (churn, overlapping scans) that the
//! runtime's tests run on the embedded backend and `farmem-cli`'s tests run against a real
//! memory server.

pub mod churn;
pub mod scans;

use crate::{Config, FarCopies, Region, Runtime, PAGE_SIZE};

/// Tiny xorshift64* PRNG: deterministic, seedable, no dependencies.
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `lo..=hi`.
    pub fn range_i64(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as i64
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }
}

/// A 64-bit mixer (splitmix64 finalizer) used to derive page and record contents.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Build a runtime with the given budget, eviction batch and fault read-ahead window.
pub fn runtime(local_mem: u64, evict_batch: usize, fault_readahead: usize) -> Runtime {
    runtime_with(local_mem, evict_batch, fault_readahead, None)
}

/// As [`runtime`], with far copies kept (as over TCP): a page fetched for reading keeps its
/// far copy whatever it is installed as, and an unchanged page is dropped at its eviction
/// without a write-back.
pub fn runtime_keeping_far_copies(
    local_mem: u64,
    evict_batch: usize,
    fault_readahead: usize,
) -> Runtime {
    runtime_with(
        local_mem,
        evict_batch,
        fault_readahead,
        Some(FarCopies::Keep),
    )
}

fn runtime_with(
    local_mem: u64,
    evict_batch: usize,
    fault_readahead: usize,
    far_copies: Option<FarCopies>,
) -> Runtime {
    Runtime::new(Config {
        local_mem,
        evict_batch,
        fault_readahead,
        far_copies,
        ..Config::default()
    })
    .expect("starting a farmem runtime (needs userfaultfd)")
}

pub fn budget_pages(rt: &Runtime) -> usize {
    rt.stats().budget_bytes as usize / PAGE_SIZE
}

/// Address of byte `off` of a region.
pub fn at(r: &Region, off: usize) -> *mut u8 {
    assert!(off < r.len());
    // SAFETY: in bounds of the region's mapping.
    unsafe { r.as_mut_ptr().add(off) }
}

pub fn rd(p: *const u8) -> u64 {
    // SAFETY: callers pass 8-byte aligned addresses inside live regions or buffers.
    unsafe { std::ptr::read_volatile(p as *const u64) }
}

pub fn wr(p: *mut u8, v: u64) {
    // SAFETY: as for `rd`.
    unsafe { std::ptr::write_volatile(p as *mut u64, v) }
}

pub fn rd_at(r: &Region, off: usize) -> u64 {
    rd(at(r, off))
}

pub fn wr_at(r: &Region, off: usize, v: u64) {
    wr(at(r, off), v)
}

pub const WORDS_PER_PAGE: usize = PAGE_SIZE / 8;

/// Fill page `page` of `r` with `f(word index)` (unhinted writes).
pub fn fill_page(r: &Region, page: usize, f: impl Fn(usize) -> u64) {
    for w in 0..WORDS_PER_PAGE {
        wr_at(r, page * PAGE_SIZE + w * 8, f(w));
    }
}

/// First word of page `page` that differs from `f(word index)`, as (word, got, want).
pub fn page_mismatch(
    r: &Region,
    page: usize,
    f: impl Fn(usize) -> u64,
) -> Option<(usize, u64, u64)> {
    for w in 0..WORDS_PER_PAGE {
        let got = rd_at(r, page * PAGE_SIZE + w * 8);
        let want = f(w);
        if got != want {
            return Some((w, got, want));
        }
    }
    None
}

/// The standard content of word `w` of page `page` for a test identified by `salt`
/// (never zero, so a page wrongly refilled with zeros is caught).
pub fn pattern(salt: u64, page: usize, w: usize) -> u64 {
    mix(salt ^ ((page as u64) << 20) ^ w as u64) | 1
}

/// Where one page of a region is held, as the runtime's page table says once no transition
/// of it is in flight: for tests that check that no page is held twice for nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageView {
    /// Mapped locally.
    pub present: bool,
    /// Mapped without write protection (a write is not noticed).
    pub writable: bool,
    /// The local copy may differ from the far copy, or there is none: it must be written back.
    pub dirty: bool,
    /// The far store holds a copy of it.
    pub far_copy: bool,
}

impl PageView {
    /// Held both locally and far although only one copy is needed: a local copy is either
    /// equal to its far copy and write-protected (its first write drops the far one), or the
    /// far copy should be gone.
    pub fn held_twice_for_nothing(&self) -> bool {
        self.present && self.far_copy && (self.writable || self.dirty)
    }
}

/// The page table's view of page `page` of `r` (waits out a transition in flight).
pub fn page_view(r: &Region, page: usize) -> PageView {
    let w = crate::page::table::slot(at(r, page * PAGE_SIZE) as usize / PAGE_SIZE).load_settled();
    PageView {
        present: w.is_present(),
        writable: w.is_present() && w.is_writable(),
        dirty: w.is_dirty(),
        far_copy: w.has_far_copy(),
    }
}

/// Wait until the runtime has finished the transitions of `pages` it may still have in
/// flight. The fault thread's UFFDIO_COPY wakes the faulting thread before the page's
/// metadata says "present" (and before `pages_installed` counts it), so right after an
/// unhinted access `is_resident` can briefly be false. A read hint on such a page enters the
/// runtime and sleeps until the page's lock is released; on a present page it does nothing.
/// (On a page that really is absent it fetches it: call this only on pages just accessed.)
pub fn settle(r: &Region, pages: impl Iterator<Item = usize>) {
    for p in pages {
        crate::hint(at(r, p * PAGE_SIZE));
    }
}

/// A region that is only ever read (never written): touching its pages fills the budget with
/// zero pages, pushing older pages out (FIFO) at no backend cost (no fetch, no write-back).
pub struct Pressure {
    pub region: Region,
    cursor: usize,
}

impl Pressure {
    pub fn new(rt: &Runtime, pages: usize) -> Pressure {
        Pressure {
            region: rt
                .create_region(pages * PAGE_SIZE)
                .expect("pressure region"),
            cursor: 0,
        }
    }

    pub fn pages(&self) -> usize {
        self.region.len() / PAGE_SIZE
    }

    /// Make `n` more pages of the pressure region resident (read hints, 32 pages per hint).
    pub fn touch(&mut self, n: usize) {
        let total = self.pages();
        let mut left = n;
        while left > 0 {
            if self.cursor >= total {
                self.cursor = 0;
            }
            let k = left.min(32).min(total - self.cursor);
            crate::hint_ex(
                at(&self.region, self.cursor * PAGE_SIZE),
                k * PAGE_SIZE,
                0,
                0,
                0,
            );
            // Read one word per page too, so the pages are really accessed.
            for i in 0..k {
                let v = rd_at(&self.region, (self.cursor + i) * PAGE_SIZE);
                assert_eq!(v, 0, "pressure pages are never written");
            }
            self.cursor += k;
            left -= k;
        }
    }

    /// Touch pressure pages until none of `pages` of `r` is resident; panics if that does not
    /// happen (eviction is not working).
    pub fn evict(&mut self, r: &Region, pages: impl Iterator<Item = usize> + Clone) {
        // A page whose install is still being completed reads as absent (see `settle`): wait
        // for those first, or they would be taken for evicted.
        settle(r, pages.clone());
        let budget = budget_pages(r.runtime());
        for _ in 0..20 {
            if pages.clone().all(|p| !r.is_resident(p * PAGE_SIZE)) {
                return;
            }
            self.touch(budget);
        }
        let still: Vec<usize> = pages.filter(|&p| r.is_resident(p * PAGE_SIZE)).collect();
        panic!(
            "{} page(s) still resident after touching {} pressure pages: {:?}",
            still.len(),
            20 * budget,
            &still[..still.len().min(16)]
        );
    }
}

/// Sets a stop flag when dropped, so helper threads of a `std::thread::scope` stop even when
/// the main body panics (otherwise the scope would wait for them forever).
pub struct StopOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}
