//! The digest of each page's far copy, so that eviction can tell whether a page installed
//! writable without write tracking ([`super::word::PageWord::is_unverified`]) still equals
//! it, and drop it without a write-back when it does.
//!
//! A digest is XXH3-128 keyed with a secret drawn at random for the process: two different
//! pages share a digest with probability about 2^-128, and contents chosen to collide would
//! need the secret. It is taken when a page is installed unverified over a far copy, from
//! the fetched bytes (those of the far copy), and only then: no other page is ever compared.
//! (It used to be taken at every write-back, over pages gone cold in the cache, for the few
//! that would come back unverified.) A digest left from an earlier stay is never trusted:
//! eviction drops a page as unchanged only if it is unverified and has a far copy, which
//! means this stay's install stored its digest. Digests live in a flat table beside the
//! page words (16 bytes per page of a live region, 0.4% of the data; only table pages that
//! are touched use memory). 0 means "unknown": a page whose digest is unknown counts as
//! changed.
//!
//! Only the holder of a page's lock reads or writes its digest.

use std::io;
use std::sync::OnceLock;

use farmem_sys::mem::{self, PAGE_SHIFT, PAGE_SIZE};

/// Digests for the whole 47-bit address space, like the page table: 2^35 entries.
const ENTRIES: usize = 1 << (47 - PAGE_SHIFT);
const BYTES: usize = ENTRIES * 16;

struct Table {
    base: usize,
    secret: [u8; 192],
}

static TABLE: OnceLock<Result<Table, String>> = OnceLock::new();

fn table() -> io::Result<&'static Table> {
    let r = TABLE.get_or_init(|| match mem::map_anon(BYTES, libc::PROT_READ) {
        Ok(p) => {
            // Read-only reserve, like the page table: never charged against overcommit;
            // the slices of live regions are made writable.
            let _ = mem::madvise(p as usize, BYTES, libc::MADV_NOHUGEPAGE);
            Ok(Table {
                base: p as usize,
                secret: farmem_sys::random::random_bytes(),
            })
        }
        Err(e) => Err(format!("cannot reserve the page-digest table: {e}")),
    });
    r.as_ref()
        .map_err(|msg| io::Error::new(io::ErrorKind::OutOfMemory, msg.clone()))
}

fn entry(t: &Table, vpn: usize) -> *mut u128 {
    (t.base + (vpn & (ENTRIES - 1)) * 16) as *mut u128
}

/// The digest of one page's contents (never 0).
pub(crate) fn of(page: &[u8]) -> u128 {
    let t = table().expect("the digest table exists while regions do");
    xxhash_rust::xxh3::xxh3_128_with_secret(page, &t.secret).max(1)
}

/// Whether `page` is all zeros.
pub(crate) fn is_zero(page: &[u8]) -> bool {
    let (pre, words, post) = {
        // SAFETY: reading u64s of initialized bytes; the unaligned ends are checked bytewise.
        unsafe { page.align_to::<u64>() }
    };
    pre.iter().all(|&b| b == 0)
        && words.iter().fold(0, |acc, &w| acc | w) == 0
        && post.iter().all(|&b| b == 0)
}

/// The stored digest of page `vpn`'s far copy (0: unknown). The caller holds its lock.
pub(crate) fn stored(vpn: usize) -> u128 {
    let Ok(t) = table() else { return 0 };
    // SAFETY: the entry lies in the reservation, readable everywhere (writable for live
    // regions); the caller holds the page's lock, so nobody writes it concurrently.
    unsafe { entry(t, vpn).read() }
}

/// Store the digest of page `vpn`'s far copy. The caller holds its lock, and the page
/// belongs to a live region (its slice is writable).
pub(crate) fn store(vpn: usize, digest: u128) {
    let t = table().expect("the digest table exists while regions do");
    // SAFETY: the page belongs to a live region, so its entry was made writable by
    // `register`; the page lock makes this thread the only writer.
    unsafe { entry(t, vpn).write(digest) }
}

fn span(t: &Table, first_vpn: usize, npages: usize) -> (usize, usize, usize, usize) {
    let start = entry(t, first_vpn) as usize;
    let end = start + npages * 16;
    (
        start,
        end,
        start & !(PAGE_SIZE - 1),
        (end + PAGE_SIZE - 1) & !(PAGE_SIZE - 1),
    )
}

/// Make the digests of `npages` pages from `first_vpn` writable and unknown.
pub(crate) fn register(first_vpn: usize, npages: usize) -> io::Result<()> {
    let t = table()?;
    let (_, _, s, e) = span(t, first_vpn, npages);
    mem::mprotect(s as *mut u8, e - s, libc::PROT_READ | libc::PROT_WRITE)?;
    clear(t, first_vpn, npages);
    Ok(())
}

/// Forget the digests of a destroyed region, giving back the table pages it used alone.
pub(crate) fn unregister(first_vpn: usize, npages: usize) {
    let Ok(t) = table() else { return };
    clear(t, first_vpn, npages);
}

fn clear(t: &Table, first_vpn: usize, npages: usize) {
    let (start, end, _, _) = span(t, first_vpn, npages);
    let inner_s = (start + PAGE_SIZE - 1) & !(PAGE_SIZE - 1);
    let inner_e = end & !(PAGE_SIZE - 1);
    if inner_e > inner_s {
        // Whole table pages of this region alone: dropped, they read as zeros again.
        let _ = mem::madvise(inner_s, inner_e - inner_s, libc::MADV_DONTNEED);
    }
    // The partial pages at both ends are shared with neighbours: zero entry by entry.
    for vpn in first_vpn..first_vpn + npages {
        let a = entry(t, vpn) as usize;
        if a < inner_s || a >= inner_e.max(inner_s) {
            // SAFETY: writable (register made the whole span writable before).
            unsafe { entry(t, vpn).write(0) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_tell_pages_apart_and_zero_pages_are_seen() {
        let mut a = vec![0u8; PAGE_SIZE];
        assert!(is_zero(&a));
        let z = of(&a);
        a[PAGE_SIZE - 1] = 1;
        assert!(!is_zero(&a));
        assert_ne!(of(&a), z);
        let b = a.clone();
        assert_eq!(of(&a), of(&b));
        assert_ne!(of(&a), 0);
    }
}
