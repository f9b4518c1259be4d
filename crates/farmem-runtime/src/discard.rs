//! Discarding pages: what `munmap`, `madvise(MADV_DONTNEED)` and an allocator's purge mean
//! for far memory. The pages' contents are dropped wherever they are (local copy unmapped,
//! far copy forgotten) and they read as zeros again, like fresh anonymous memory.

use std::sync::atomic::Ordering;

use farmem_proto::PageKey;
use farmem_sys::mem::{PAGE_SHIFT, PAGE_SIZE};

use crate::fetch::readahead;
use crate::page::table::{self, owner_id};
use crate::page::word::PageWord;
use crate::scope::RuntimeScope;
use crate::state::State;
use crate::stats::add;

/// Pages locked at once: bounds how long other threads can find a page of the range locked
/// and how large the list of present pages grows.
const STEP: usize = 4096;

/// Discard `[first, end)` (virtual page numbers), which must lie inside one live region of
/// `st`. Returns the number of pages that were local.
pub(crate) fn discard_pages(st: &State, first: usize, end: usize) -> usize {
    discard_into(st, first, end, PageWord::FRESH)
}

/// As [`discard_pages`], leaving each page's word `after`: `FRESH` (reads as zeros) or
/// `UNREGISTERED` (no longer the runtime's: `lend.rs`).
pub(crate) fn discard_into(st: &State, first: usize, end: usize, after: PageWord) -> usize {
    let _scope = RuntimeScope::enter();
    // Read-ahead in flight holds pages of the range locked: finish it first.
    readahead::complete_range(st, first, end);
    let me = owner_id();
    let mut dropped = 0;
    let mut start = first;
    while start < end {
        let stop = (start + STEP).min(end);
        let mut locked = Vec::with_capacity(stop - start);
        let mut present: Vec<(usize, usize)> = Vec::new();
        let mut far: Vec<usize> = Vec::new();
        for vpn in start..stop {
            // Wait for a fetch or eviction in progress: its owner finishes it and then the
            // page is ours to reset. Pages are locked in ascending order, like every other
            // multi-page locker, so this cannot deadlock.
            let Some(old) = table::slot(vpn).lock_waiting(me) else {
                continue; // not registered
            };
            locked.push(vpn);
            if old.has_far_copy() {
                far.push(vpn);
            }
            if old.is_present() {
                let a = vpn << PAGE_SHIFT;
                match present.last_mut() {
                    Some((s, l)) if *s + *l == a => *l += PAGE_SIZE,
                    _ => present.push((a, PAGE_SIZE)),
                }
            }
        }
        // Drop the local copies before the pages can be taken again: a page reset to FRESH
        // while still mapped would keep its old contents.
        let n_present: usize = present.iter().map(|(_, l)| l / PAGE_SIZE).sum();
        if !present.is_empty() {
            match st.unmapper.dontneed(&present) {
                Ok(calls) => add(&st.stats.c.unmap_syscalls, calls as u64),
                Err(e) => {
                    farmem_sys::process::fatal(&format!("dropping discarded pages failed: {e}"))
                }
            }
        }
        // Their far copies are garbage now: a tier that can free them does.
        forget_far_copies(st, &far);
        // Stale entries of these pages in the reclaim policy are dropped when reached (the
        // reclaimer forgets pages it finds absent), which is cheaper than searching for them.
        for vpn in locked {
            table::slot(vpn).unlock(after);
        }
        if n_present > 0 {
            st.resident.fetch_sub(n_present, Ordering::AcqRel);
        }
        dropped += n_present;
        start = stop;
    }
    add(&st.stats.c.pages_discarded, (end - first) as u64);
    dropped
}

/// Tell the backend it may drop the far copies of `vpns` (locked by the caller, all in one
/// region: callers discard region by region).
fn forget_far_copies(st: &State, vpns: &[usize]) {
    let Some(&first) = vpns.first() else { return };
    let Some(reg) = st.region_of(first << PAGE_SHIFT) else {
        return;
    };
    let keys: Vec<PageKey> = vpns
        .iter()
        .map(|&v| PageKey {
            region: reg.id,
            page: reg.index_of(v),
        })
        .collect();
    st.backend.forget(&keys);
}
