//! Far memory the program made unreadable (`mprotect` without `PROT_READ`), which eviction
//! must not read.
//!
//! Eviction copies a dirty page out by reading it where it is, in the program's address
//! space: a page the program protected against reading would fault in the runtime's own
//! thread. Runtimes with heaps of their own (V8, the JVM) reserve their heap `PROT_NONE`
//! and commit and decommit its pages with `mprotect`; V8 protects a page and then discards
//! it (`madvise`), so for a moment resident data is unreadable. The program changes
//! protections only through [`Unreadable::change`], which records an unreadable range
//! before the protection drops and forgets it after the protection is back; eviction holds
//! [`Unreadable::read`] across a step, from picking victims to unmapping them, and leaves
//! resident the pages the record names: a protection cannot drop under a page being read.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{RwLock, RwLockReadGuard};

use farmem_sys::mem::PAGE_SIZE;

#[derive(Default)]
pub(crate) struct Unreadable {
    /// Unreadable page ranges: first page -> end page (exclusive), disjoint.
    ranges: RwLock<BTreeMap<usize, usize>>,
    /// Whether any range was ever recorded: eviction skips the lock until then.
    ever: AtomicBool,
}

/// What eviction holds during a step (None: nothing was ever unreadable).
pub(crate) struct Held<'a>(Option<RwLockReadGuard<'a, BTreeMap<usize, usize>>>);

impl Held<'_> {
    /// Whether page `vpn` is in an unreadable range.
    pub(crate) fn contains(&self, vpn: usize) -> bool {
        self.0.as_ref().is_some_and(|m| {
            m.range(..=vpn)
                .next_back()
                .is_some_and(|(_, &end)| vpn < end)
        })
    }
}

impl Unreadable {
    /// For an eviction step. Recursive: it does not queue behind a waiting writer, since a
    /// step may wait for another thread that is itself starting a step (the control thread
    /// hands its write-protects to the fault thread, which may be in direct reclaim), while
    /// the writer waits for the first step: a cycle. A writer gets in between steps.
    pub(crate) fn read(&self) -> Held<'_> {
        Held(
            self.ever
                .load(Ordering::Acquire)
                .then(|| self.ranges.read_recursive()),
        )
    }

    /// Change the protection of `[addr, addr+len)` to `prot` with `apply` (the `mprotect`),
    /// keeping the record true around it. Returns what `apply` returns.
    pub(crate) fn change<E>(
        &self,
        addr: usize,
        len: usize,
        prot: i32,
        apply: impl FnOnce() -> Result<(), E>,
    ) -> Result<(), E> {
        let first = addr / PAGE_SIZE;
        let end = addr.saturating_add(len).div_ceil(PAGE_SIZE);
        if prot & libc::PROT_READ == 0 {
            // Recorded first, under the write lock: no step is reading these pages when
            // the protection drops, and none will read them after.
            self.ever.store(true, Ordering::Release);
            let mut m = self.ranges.write();
            let r = apply();
            if r.is_ok() {
                crate::disjoint::insert(&mut m, first, end);
            }
            r
        } else {
            let r = apply();
            if r.is_ok() && self.ever.load(Ordering::Acquire) {
                crate::disjoint::take(&mut self.ranges.write(), first, end);
            }
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pages(u: &Unreadable) -> Vec<usize> {
        let h = u.read();
        (0..40).filter(|&v| h.contains(v)).collect()
    }

    fn set(u: &Unreadable, first: usize, n: usize, prot: i32) {
        u.change(first * PAGE_SIZE, n * PAGE_SIZE, prot, || Ok::<(), ()>(()))
            .unwrap();
    }

    #[test]
    fn ranges_merge_split_and_follow_failed_changes() {
        let u = Unreadable::default();
        assert!(
            u.read().0.is_none(),
            "no lock before anything is unreadable"
        );
        set(&u, 2, 3, libc::PROT_NONE); // 2..5
        set(&u, 5, 2, libc::PROT_WRITE); // 5..7, touching: merged
        set(&u, 10, 5, libc::PROT_NONE); // 10..15
        assert_eq!(pages(&u), vec![2, 3, 4, 5, 6, 10, 11, 12, 13, 14]);
        set(&u, 3, 9, libc::PROT_READ | libc::PROT_WRITE); // cuts both
        assert_eq!(pages(&u), vec![2, 12, 13, 14]);
        // A change that fails leaves the record as it was.
        let failed = u.change(20 * PAGE_SIZE, PAGE_SIZE, libc::PROT_NONE, || Err(()));
        assert!(failed.is_err() && !pages(&u).contains(&20));
        let failed = u.change(12 * PAGE_SIZE, PAGE_SIZE, libc::PROT_READ, || Err(()));
        assert!(failed.is_err() && pages(&u).contains(&12));
        set(&u, 0, 40, libc::PROT_READ);
        assert!(pages(&u).is_empty());
    }
}
