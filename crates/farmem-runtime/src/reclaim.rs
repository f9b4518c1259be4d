//! Reclaim: keep the resident set within the budget.
//!
//! The control thread keeps at least `free_target` pages of budget free by evicting batches
//! chosen by the policy. A batch: lock the victims, write-protect the dirty ones (so a
//! concurrent write faults and waits instead of being lost), copy them out and write them to
//! the backend, and only after the backend acknowledges, unmap the whole batch with one
//! vectored `process_madvise(MADV_DONTNEED)`. Clean pages whose current contents are in the
//! backend (or that were never written) are dropped without I/O. A thread that needs budget
//! when none is free reclaims for itself (Fastswap's direct reclaim past the slack).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{BackendError, IoClass, PageBuf, PageKey};
use crate::page_table::{self as pt, ABSENT, DIRTY, EVICTING, IDLE, NOWRITE};
use crate::page_table::{CREDIT_MASK, PRIO_MASK, REGISTERED, REMOTE};
use crate::page_table::{SHADOW_BITS, SHADOW_MASK, SHADOW_SHIFT};
use crate::runtime::Inner;
use crate::stats::add;
use farmem_sys::mem::PAGE_SIZE;

/// Reserve `n` pages of budget, reclaiming on this thread if none is free.
pub(crate) fn reserve(inner: &Inner, n: usize) {
    let mut idle_rounds = 0u32;
    loop {
        if inner.reclaim_paused.load(Ordering::Acquire) {
            // A fork is bringing far pages back: nothing may be evicted until it is done.
            let now = inner.resident.fetch_add(n, Ordering::AcqRel) + n;
            inner.stats.note_resident(now as u64);
            return;
        }
        let cur = inner.resident.load(Ordering::Relaxed);
        if cur + n <= inner.budget {
            if inner
                .resident
                .compare_exchange_weak(cur, cur + n, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                after_reserve(inner, cur + n);
                return;
            }
            continue;
        }
        inner.kick_control();
        if evict_batch(inner, inner.cfg.evict_batch.max(n)) > 0 {
            add(&inner.stats.c.direct_reclaims, 1);
        } else if far_refusing(inner) {
            // The far tier refuses pages (quota or capacity) and nothing clean is left to
            // drop: take the pages beyond the budget rather than stall the program. Nothing
            // is lost, and the pressure shows in the statistics and the log.
            let now = inner.resident.fetch_add(n, Ordering::AcqRel) + n;
            inner.stats.note_resident(now as u64);
            add(&inner.stats.c.over_budget_pages, n as u64);
            return;
        } else {
            // Everything resident is locked by in-flight work; it will become evictable.
            idle_rounds += 1;
            if idle_rounds == 20_000 {
                tracing::warn!(
                    resident = inner.resident.load(Ordering::Relaxed),
                    budget = inner.budget,
                    tracked = inner.policy().len(),
                    "no page can be evicted; waiting for in-flight work"
                );
            }
            if idle_rounds > 100 {
                std::thread::sleep(Duration::from_micros(100));
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// Reserve up to `n` pages without reclaiming (for read-ahead); returns how many.
pub(crate) fn try_reserve(inner: &Inner, n: usize) -> usize {
    let mut cur = inner.resident.load(Ordering::Relaxed);
    loop {
        let take = n.min(inner.budget.saturating_sub(cur));
        if take == 0 {
            return 0;
        }
        match inner.resident.compare_exchange_weak(
            cur,
            cur + take,
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => {
                after_reserve(inner, cur + take);
                return take;
            }
            Err(c) => cur = c,
        }
    }
}

fn after_reserve(inner: &Inner, now: usize) {
    inner.stats.note_resident(now as u64);
    if inner.budget - now < inner.free_target {
        inner.kick_control();
    }
}

/// Backoff after the far tier refused a write-back: no dirty page is offered to it until
/// then, so a full server is not asked again and again; clean pages are still dropped.
const FULL_BACKOFF_MIN_NS: u64 = 10_000_000;
const FULL_BACKOFF_MAX_NS: u64 = 1_000_000_000;

fn far_refusing(inner: &Inner) -> bool {
    inner.far_full_until.load(Ordering::Acquire) > inner.now_ns()
}

fn note_far_full(inner: &Inner, pages: usize, e: &BackendError) {
    let backoff = inner.far_full_backoff.load(Ordering::Relaxed);
    let backoff = (backoff * 2).clamp(FULL_BACKOFF_MIN_NS, FULL_BACKOFF_MAX_NS);
    inner.far_full_backoff.store(backoff, Ordering::Relaxed);
    inner
        .far_full_until
        .store(inner.now_ns() + backoff, Ordering::Release);
    add(&inner.stats.c.backend_full, pages as u64);
    if backoff == FULL_BACKOFF_MIN_NS {
        tracing::warn!("far memory refuses pages, keeping {pages} dirty pages local: {e}");
    }
}

struct Victim {
    vpn: usize,
    old: u64,
}

/// Merge ascending page numbers into `(addr, len)` ranges.
fn ranges_of(vpns: impl Iterator<Item = usize>) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for v in vpns {
        let a = v * PAGE_SIZE;
        match out.last_mut() {
            Some((s, l)) if *s + *l == a => *l += PAGE_SIZE,
            _ => out.push((a, PAGE_SIZE)),
        }
    }
    out
}

/// Evict up to `max` pages. Returns how many left local memory.
pub(crate) fn evict_batch(inner: &Inner, max: usize) -> usize {
    let _gate = inner.evict_gate.read();
    if inner.reclaim_paused.load(Ordering::Acquire) {
        return 0;
    }
    let t0 = Instant::now();
    let mut cands = Vec::with_capacity(max);
    inner
        .policy()
        .take_victims(max, &mut cands, &crate::policy::PageTableBits);
    if cands.is_empty() {
        return 0;
    }
    let mut victims = Vec::with_capacity(cands.len());
    let mut busy = Vec::new();
    let refusing = far_refusing(inner);
    for v in cands {
        let w = pt::entry(v);
        match pt::try_lock(w, 0) {
            Ok(old) if refusing && old & ABSENT == 0 && old & DIRTY != 0 => {
                // It would need a write-back the far tier refuses: keep it for later.
                pt::unlock(w, old);
                busy.push(v);
            }
            Ok(old) if old & ABSENT == 0 => {
                w.fetch_or(EVICTING, Ordering::AcqRel);
                victims.push(Victim { vpn: v, old });
            }
            // Not resident any more (cannot normally happen): forget it.
            Ok(old) => pt::unlock(w, old),
            // Locked by a fetch or write-unprotect: try again later.
            Err(cur) if cur & REGISTERED != 0 => busy.push(v),
            // Region gone.
            Err(_) => {}
        }
    }
    if !busy.is_empty() {
        let mut p = inner.policy.lock();
        for v in busy {
            p.reinsert(v);
        }
    }
    victims.sort_unstable_by_key(|v| v.vpn);
    leave_foreign(inner, &mut victims);
    if victims.is_empty() {
        return 0;
    }

    // Write back the dirty ones, after write-protecting them so their contents are stable.
    let dirty: Vec<&Victim> = victims.iter().filter(|v| v.old & DIRTY != 0).collect();
    let mut kept_local: Vec<usize> = Vec::new();
    if !dirty.is_empty() {
        let mut wp_failed = false;
        for (start, len) in ranges_of(dirty.iter().map(|v| v.vpn)) {
            if let Err(e) = inner.uffd.writeprotect(start, len, true) {
                tracing::error!("write-protecting pages for eviction failed: {e}");
                wp_failed = true;
            }
        }
        let result = if wp_failed {
            Err(BackendError::Failed("write-protect failed".into()))
        } else {
            write_back(inner, &dirty)
        };
        match result {
            Ok(()) => {
                add(&inner.stats.c.pages_written_back, dirty.len() as u64);
                add(
                    &inner.stats.c.bytes_written,
                    (dirty.len() * PAGE_SIZE) as u64,
                );
                inner.far_full_backoff.store(0, Ordering::Relaxed);
            }
            Err(BackendError::Unavailable(msg)) => {
                // The far tier is gone with the pages it held: continuing would hand the
                // program zeros or stale data later.
                farmem_sys::process::fatal(&format!("backend {}: {msg}", inner.backend.describe()))
            }
            Err(e) => {
                if matches!(e, BackendError::Full(_)) {
                    note_far_full(inner, dirty.len(), &e);
                } else {
                    tracing::error!(
                        "write-back failed, keeping {} pages local: {e}",
                        dirty.len()
                    );
                }
                kept_local = dirty.iter().map(|v| v.vpn).collect();
            }
        }
    }

    // Pages kept local stay present (write-protected now: the next write is noticed).
    if !kept_local.is_empty() {
        let mut p = inner.policy.lock();
        for v in victims
            .iter()
            .filter(|v| kept_local.binary_search(&v.vpn).is_ok())
        {
            pt::unlock(pt::entry(v.vpn), (v.old | NOWRITE) & !EVICTING);
            p.reinsert(v.vpn);
        }
        victims.retain(|v| kept_local.binary_search(&v.vpn).is_err());
    }
    if victims.is_empty() {
        return 0;
    }

    let ranges = ranges_of(victims.iter().map(|v| v.vpn));
    match inner.unmapper.dontneed(&ranges) {
        Ok(calls) => add(&inner.stats.c.unmap_syscalls, calls as u64),
        Err(e) => {
            // Cannot happen for our own mappings; if it does, leave the pages as they are.
            tracing::error!("unmapping evicted pages failed: {e}");
            for v in &victims {
                pt::unlock(pt::entry(v.vpn), v.old & !EVICTING);
            }
            inner
                .policy
                .lock()
                .insert(&victims.iter().map(|v| v.vpn).collect::<Vec<_>>(), 0);
            return 0;
        }
    }
    let n = victims.len();
    // Each page keeps the eviction clock as its shadow, for the refault distance.
    let stamp = inner.evict_clock.fetch_add(n as u64, Ordering::Relaxed) & ((1 << SHADOW_BITS) - 1);
    let mut clean = 0u64;
    for v in &victims {
        let was_dirty = v.old & DIRTY != 0;
        if !was_dirty {
            clean += 1;
        }
        // The level (recent refaults in a row) stays with the page while it is far.
        let mut new = (v.old & !(DIRTY | IDLE | EVICTING | PRIO_MASK | SHADOW_MASK | CREDIT_MASK))
            | ABSENT
            | NOWRITE
            | (stamp << SHADOW_SHIFT);
        if was_dirty {
            new |= REMOTE;
        }
        pt::unlock(pt::entry(v.vpn), new);
    }
    inner.resident.fetch_sub(n, Ordering::AcqRel);
    add(&inner.stats.c.pages_evicted, n as u64);
    add(&inner.stats.c.clean_drops, clean);
    inner.stats.record_evict(t0.elapsed().as_nanos() as u64);
    n
}

/// Unlock and forget the victims (sorted, locked) outside this runtime's regions. The
/// policy can hold a page of a region that was dropped after the page was queued (a fetch
/// queues its pages after installing them; a busy victim is put back after its region may
/// have gone). The address may belong to another runtime's region by now: evicting it here
/// would take it out of the wrong count and keep the owner's count above the truth forever.
/// Under the page lock the answer cannot change: dropping a region takes it out of the map
/// first, then waits for every page lock.
fn leave_foreign(inner: &Inner, victims: &mut Vec<Victim>) {
    let regions = inner.regions.read();
    let mut known = 0..0; // vpns of the last region found
    victims.retain(|v| {
        if known.contains(&v.vpn) {
            return true;
        }
        match regions.range(..=v.vpn * PAGE_SIZE).next_back() {
            Some((_, r)) if v.vpn < r.end_vpn() => {
                known = r.first_vpn()..r.end_vpn();
                true
            }
            _ => {
                pt::unlock(pt::entry(v.vpn), v.old);
                false
            }
        }
    });
}

/// Copy the (write-protected) dirty victims out and write them to the backend; returns once
/// the backend has acknowledged.
fn write_back(inner: &Inner, dirty: &[&Victim]) -> Result<(), BackendError> {
    let mut buf = PageBuf::new(dirty.len());
    buf.set_len(dirty.len());
    let mut keys = Vec::with_capacity(dirty.len());
    for (i, v) in dirty.iter().enumerate() {
        let addr = v.vpn * PAGE_SIZE;
        let reg = inner
            .region_of(addr)
            .ok_or_else(|| BackendError::Failed(format!("page {addr:#x} has no region")))?;
        keys.push(PageKey {
            region: reg.id,
            page: reg.index_of(v.vpn),
        });
        // SAFETY: the page is locked by us, present and write-protected: it stays mapped
        // and unchanged until we unmap it, so reading 4 KiB from it is sound.
        let src = unsafe { std::slice::from_raw_parts(addr as *const u8, PAGE_SIZE) };
        buf.page_mut(i).copy_from_slice(src);
    }
    inner
        .backend
        .submit_write(IoClass::WriteBack, keys, buf)
        .wait()
        .map(|_| ())
}

/// The control thread: reclaims ahead of demand and steals faults from a busy fault thread.
pub(crate) fn control_thread(inner: Arc<Inner>) {
    let steal_after = inner.cfg.steal_after_us * 1000;
    let tick = Duration::from_micros(inner.cfg.steal_after_us.clamp(100, 10_000));
    let mut stealer = crate::fault::FaultServer::new();
    while !inner.shutdown.load(Ordering::Acquire) {
        crate::prefetch::sweep(&inner, Duration::from_millis(50));
        // The fetch paths' queued bookkeeping, in one batch.
        drop(inner.policy());
        let busy = inner.fault_busy_since.load(Ordering::Acquire);
        if busy != 0 && inner.now_ns().saturating_sub(busy) > steal_after {
            stealer.steal(&inner);
        }
        if inner.reclaim_paused.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        if inner.free_pages() < inner.free_target {
            let goal = (inner.free_target + inner.cfg.evict_batch).min(inner.budget);
            while inner.free_pages() < goal && !inner.shutdown.load(Ordering::Acquire) {
                if evict_batch(&inner, inner.cfg.evict_batch) == 0 {
                    std::thread::yield_now();
                    break;
                }
            }
            continue;
        }
        let mut g = inner.control_lock.lock();
        inner.control_sleeping.store(true, Ordering::SeqCst);
        if inner.free_pages() >= inner.free_target && !inner.shutdown.load(Ordering::Acquire) {
            inner.control_cv.wait_for(&mut g, tick);
        }
        inner.control_sleeping.store(false, Ordering::SeqCst);
    }
}
