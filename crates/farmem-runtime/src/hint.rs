//! Hints: software guards placed before accesses that may touch far memory.
//!
//! The fast path is inlined at the call site: one table load, one bit test, no call and no
//! syscall when the page is already present with the needed permission (the same check as
//! `include/farmem.h`). Otherwise the slow path locks and fetches the page(s) on the calling
//! thread, with as much read-ahead as the hint asks for. Hints on memory outside any region
//! do nothing.

use std::cell::Cell;

use farmem_sys::mem::{PAGE_SHIFT, PAGE_SIZE};

use crate::fetch::demand;
use crate::fetch::readahead::pipeline;
use crate::fetch::request::{Mode, Request};
use crate::page::table::guarded_slot;
use crate::page::word::{ABSENT, IDLE, NOWRITE};
use crate::registry;
use crate::scope::RuntimeScope;
use crate::stats::add;

/// The hinted access will write.
pub const FM_WRITE: u32 = 1;
/// Sequential hint: skip the work when the hint lands on the same page as this thread's
/// previous `FM_SEQ` hint.
pub const FM_SEQ: u32 = 2;

#[inline(always)]
fn needs_work(addr: usize, bit: u64) -> bool {
    // The raw bits, as `include/farmem.h` tests them: this is the inlined part of every hint.
    guarded_slot(addr >> PAGE_SHIFT).peek().raw() & bit != 0
}

/// The next access to `addr` will read it: make its page local if it is not.
#[inline(always)]
pub fn hint<T: ?Sized>(addr: *const T) {
    let a = addr as *const u8 as usize;
    if needs_work(a, ABSENT | IDLE) {
        hint_slow(a, 1, 0, 0, 0);
    }
}

/// The next access to `addr` will write it.
#[inline(always)]
pub fn hint_write<T: ?Sized>(addr: *const T) {
    let a = addr as *const u8 as usize;
    if needs_work(a, NOWRITE | IDLE) {
        hint_slow(a, 1, FM_WRITE, 0, 0);
    }
}

/// Extended hint: `len` bytes from `addr` will be accessed (`FM_WRITE` if written); also
/// fetch up to `readahead` pages after the range (before it if negative) when they are absent;
/// pages fetched get eviction priority `ev_prio` (higher is evicted first by policies that
/// use it).
#[inline(always)]
pub fn hint_ex<T: ?Sized>(addr: *const T, len: usize, flags: u32, readahead: i32, ev_prio: u8) {
    let a = addr as *const u8 as usize;
    let bit = IDLE
        | if flags & FM_WRITE != 0 {
            NOWRITE
        } else {
            ABSENT
        };
    // The inline check covers the first page; multi-page ranges go to the runtime.
    if needs_work(a, bit) || len > PAGE_SIZE - (a & (PAGE_SIZE - 1)) {
        hint_slow(a, len, flags, readahead, ev_prio);
    }
}

/// The commonest reason a hint on a present page leaves the inline path: a recency policy's
/// hand marked the page idle. Report the use by clearing the mark, without the region
/// lookup and locking of the full path (which made recency policies slower than FIFO on the
/// key-value benchmark despite fetching fewer pages). Returns false if there is more to do.
/// The hint's eviction priority goes into the word too: the priority policy reads it to
/// move a page that became resident without it (written before any hint) to its level.
#[inline]
fn mark_used(vpn: usize, write: bool, prio: u8) -> bool {
    // The zero word of a missing table is never registered, so it is never written.
    let slot = guarded_slot(vpn);
    let w = slot.load();
    if !w.only_idle_for(write) {
        return false;
    }
    // A lost race (the page evicted meanwhile) only clears the mark of an absent page,
    // which every install and eviction resets anyway.
    slot.mark_used_by_hint(w, prio);
    true
}

thread_local!(static LAST_SEQ_PAGE: Cell<usize> = const { Cell::new(usize::MAX) });

/// The out-of-line part of every hint (also the C ABI's `fm_hint_slow`).
#[inline(never)]
pub fn hint_slow(addr: usize, len: usize, flags: u32, readahead: i32, ev_prio: u8) {
    if addr == 0 {
        return;
    }
    let first_vpn = addr >> PAGE_SHIFT;
    let one_page = len <= PAGE_SIZE - (addr & (PAGE_SIZE - 1));
    if one_page && readahead == 0 && mark_used(first_vpn, flags & FM_WRITE != 0, ev_prio.min(7)) {
        return;
    }
    if flags & FM_SEQ != 0 {
        let repeat = LAST_SEQ_PAGE.with(|c| c.replace(first_vpn)) == first_vpn;
        if repeat {
            return;
        }
    }
    // The registry's lock is taken inside the fork gate, as every runtime lock is.
    let _scope = RuntimeScope::enter();
    let Some((st, reg)) = registry::lookup(addr) else {
        return;
    };
    add(&st.stats.c.hint_calls, 1);
    // Clip the range to the region (a huge length is not an error, just more than exists),
    // and to a quarter of the budget so one hint cannot thrash the whole local memory.
    let end_addr = addr.saturating_add(len.max(1)).min(reg.end());
    let end_vpn = (end_addr + PAGE_SIZE - 1) >> PAGE_SHIFT;
    let count = (end_vpn - first_vpn).clamp(1, (st.budget() / 4).max(1));
    let max_ra = st.cfg.max_readahead as i64;
    let readahead = (readahead as i64).clamp(-max_ra, max_ra) as isize;
    let write = flags & FM_WRITE != 0;
    let req = Request {
        first: first_vpn,
        count,
        write,
        readahead,
        // The read-ahead of a write hint is for a writer going on (a merge's output, a
        // buffer being filled): install it writable and dirty, as the fault path does for
        // sequential writers, instead of write-protected pages that each fault again.
        readahead_writable: write,
        prio: ev_prio.min(7),
        mode: Mode::Hint,
        readahead_useful_for: None,
        readahead_trusted: false,
        fresh_end: 0,
    };
    match demand::ensure(&st, &reg, &req) {
        Ok(o) if o.installed + o.unprotected > 0 => add(&st.stats.c.hint_misses, 1),
        Ok(_) => add(&st.stats.c.hint_hits, 1),
        Err(e) => farmem_sys::process::fatal(&format!("hint at {addr:#x} failed: {e}")),
    }
    if flags & FM_SEQ != 0 && readahead > 0 {
        // A declared sequential stream: keep its next windows in flight.
        let window_end = (first_vpn + count + readahead as usize).min(reg.end_vpn());
        pipeline(
            &st,
            &reg,
            first_vpn,
            window_end,
            readahead as usize,
            req.prio,
        );
    }
}
