//! Reclaim: keep the resident set within the budget.
//!
//! Once the program has needed more than its budget, the control thread keeps at least
//! `free_target` pages of budget free by evicting batches
//! chosen by the policy. A batch: lock the victims, write-protect the dirty ones (so a
//! concurrent write faults and waits instead of being lost), copy them out and write them to
//! the backend, and only after the backend acknowledges, unmap the whole batch with one
//! vectored `process_madvise(MADV_DONTNEED)`. Clean pages whose current contents are in the
//! backend (or that were never written) are dropped without I/O. A thread that needs budget
//! when none is free reclaims for itself (Fastswap's direct reclaim past the slack).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use farmem_proto::{IoClass, PageKey};
use farmem_sys::mem::PAGE_SIZE;

use crate::backend::error::BackendError;
use crate::backend::io::PageBuf;
use crate::page::word::PageWord;
use crate::page::{digest, table};
use crate::state::State;
use crate::stats::add;
use crate::workingset::PageTableUse;

/// Reserve `n` pages of budget, reclaiming on this thread if none is free.
///
/// A thread that finds no budget free and nothing it can evict waits, but never on another
/// thread alone: it measures the budget itself (the control thread, which otherwise does, may
/// be the one waiting here, serving a fault it stole) and its wait makes the process count as
/// pressed in its tree's budget, which then gives it a share (a process that could evict
/// nothing never counted as pressed and was held to what it had). Past [`STALL_LIMIT`] it
/// takes the pages beyond the budget: a `cat` started under a tree at its limit, whose few
/// resident pages were all in use, hung for good in its first `setlocale`.
pub(crate) fn reserve(st: &State, n: usize) {
    let mut idle_rounds = 0u32;
    let mut stalled_since: Option<Instant> = None;
    loop {
        if st.reclaim_paused.load(Ordering::Acquire) || crate::gate::closer().is_some() {
            // A fork is under way (bringing far pages back, or holding the fork gate while
            // its thread faults, `fork_window.rs`): nothing may be evicted until it is done.
            let now = st.resident.fetch_add(n, Ordering::AcqRel) + n;
            st.stats.note_resident(now as u64);
            return;
        }
        let cur = st.resident.load(Ordering::Relaxed);
        if cur + n <= st.budget() {
            if st
                .resident
                .compare_exchange_weak(cur, cur + n, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                after_reserve(st, cur + n);
                return;
            }
            continue;
        }
        st.over_budget_once.store(true, Ordering::Relaxed);
        st.kick_control();
        if evict_batch(st, st.cfg.evict_batch.max(n)) > 0 {
            add(&st.stats.c.direct_reclaims, 1);
            stalled_since = None;
        } else if far_refusing(st) {
            // The far tier refuses pages (quota or capacity) and nothing clean is left to
            // drop: take the pages beyond the budget rather than stall the program. Nothing
            // is lost, and the pressure shows in the statistics and the log.
            take_beyond_budget(st, n);
            return;
        } else {
            // Nothing can be evicted now: everything resident is locked by in-flight work
            // (it will become evictable), or the budget is below what the process needs.
            let since = *stalled_since.get_or_insert_with(|| {
                add(&st.stats.c.room_waits, 1);
                Instant::now()
            });
            crate::process_budget::refresh(st);
            if since.elapsed() > STALL_LIMIT {
                if !st.stall_warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        resident = st.resident.load(Ordering::Relaxed),
                        budget = st.budget(),
                        tracked = st.policy().len(),
                        "no page could be evicted for {STALL_LIMIT:?}: taking pages beyond \
                         the budget"
                    );
                }
                take_beyond_budget(st, n);
                return;
            }
            idle_rounds += 1;
            if idle_rounds > 100 {
                std::thread::sleep(Duration::from_micros(100));
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// How long a thread waits for a page to become evictable before it takes budget beyond the
/// limit: in-flight work (an eviction batch written to a server, a fetch) ends well within
/// it; what outlasts it is a budget the process cannot meet.
const STALL_LIMIT: Duration = Duration::from_millis(100);

/// Take `n` pages beyond the budget (counted; reclaim brings the process back under it).
fn take_beyond_budget(st: &State, n: usize) {
    let now = st.resident.fetch_add(n, Ordering::AcqRel) + n;
    st.stats.note_resident(now as u64);
    add(&st.stats.c.over_budget_pages, n as u64);
}

/// Reserve up to `n` pages without reclaiming (for read-ahead); returns how many.
pub(crate) fn try_reserve(st: &State, n: usize) -> usize {
    st.readahead_seen.fetch_max(n, Ordering::Relaxed);
    let mut cur = st.resident.load(Ordering::Relaxed);
    loop {
        let take = n.min(st.budget().saturating_sub(cur));
        if take == 0 {
            return 0;
        }
        match st.resident.compare_exchange_weak(
            cur,
            cur + take,
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => {
                after_reserve(st, cur + take);
                return take;
            }
            Err(c) => cur = c,
        }
    }
}

fn after_reserve(st: &State, now: usize) {
    st.stats.note_resident(now as u64);
    if st.budget().saturating_sub(now) < st.free_target()
        && st.over_budget_once.load(Ordering::Relaxed)
    {
        st.kick_control();
    }
}

/// Backoff after the far tier refused a write-back: no dirty page is offered to it until
/// then, so a full server is not asked again and again; clean pages are still dropped.
const FULL_BACKOFF_MIN_NS: u64 = 10_000_000;
const FULL_BACKOFF_MAX_NS: u64 = 1_000_000_000;

fn far_refusing(st: &State) -> bool {
    st.far_full_until.load(Ordering::Acquire) > st.now_ns()
}

fn note_far_full(st: &State, pages: usize, e: &BackendError) {
    let backoff = st.far_full_backoff.load(Ordering::Relaxed);
    let backoff = (backoff * 2).clamp(FULL_BACKOFF_MIN_NS, FULL_BACKOFF_MAX_NS);
    st.far_full_backoff.store(backoff, Ordering::Relaxed);
    st.far_full_until
        .store(st.now_ns() + backoff, Ordering::Release);
    add(&st.stats.c.backend_full, pages as u64);
    if backoff == FULL_BACKOFF_MIN_NS {
        tracing::warn!("far memory refuses pages, keeping {pages} dirty pages local: {e}");
    }
}

struct Victim {
    vpn: usize,
    old: PageWord,
    /// Its contents' digest, when `verify` took it (0: not taken).
    digest: u128,
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

/// Most separate address ranges one step of an eviction handles. Each range costs a
/// write-protect ioctl (a TLB flush with an IPI, ~6 us here) and every page of a step stays
/// locked until the whole step is unmapped: a program touching one of them waits that long.
/// Scattered victims (random access) are therefore evicted 16 at a time, while contiguous
/// ones (scans) still go as one step of the whole batch. A CSR build at 50% local (8 MiB,
/// local+lz4): steps of 128 scattered pages took 2.1 ms each; 16 per step: 61 -> 40 s.
/// Only where a write-back completes inline: over a network each step would wait for its
/// own round trip (measured 4% slower on random scans over TCP).
const RANGES_PER_STEP: usize = 16;

/// Evict up to `max` pages. Returns how many left local memory.
pub(crate) fn evict_batch(st: &State, max: usize) -> usize {
    evict_batch_if(st, max, || true)
}

/// Evict up to `max` pages if `wanted()` still holds when the victims are chosen (under the
/// policy lock). Reclaim ahead of demand decides to evict some time before it picks its
/// victims; if room appeared meanwhile (pages freed or discarded) it would evict pages for
/// nothing, and those would be the newest ones, the likeliest to come back: a loaded test
/// machine saw 25-32 pages a storm had just fetched evicted this way with 960 of 1024 free.
pub(crate) fn evict_batch_if(st: &State, max: usize, wanted: impl Fn() -> bool) -> usize {
    let _gate = st.evict_gate.read();
    if st.reclaim_paused.load(Ordering::Acquire) {
        return 0;
    }
    let t0 = Instant::now();
    let mut cands = Vec::with_capacity(max);
    {
        let mut policy = st.policy();
        if !wanted() {
            return 0;
        }
        policy.take_victims(max, &mut cands, &PageTableUse);
        st.protected.store(policy.protected(), Ordering::Relaxed);
        if cands.len() < max {
            // Pages shared with a parent or child since a fork come last: evicting one
            // frees nothing while the other process maps it (`inherited.rs`).
            let mut inherited = st.inherited.lock();
            let n = (max - cands.len()).min(inherited.len());
            cands.extend(inherited.drain(..n));
        }
    }
    if cands.is_empty() {
        return 0;
    }
    cands.sort_unstable();
    let per_step = if st.backend.completes_inline() {
        RANGES_PER_STEP
    } else {
        usize::MAX
    };
    let runs: Vec<&[usize]> = cands.chunk_by(|a, b| *b == a + 1).collect();
    let mut evicted = 0;
    let mut start = 0;
    for step in runs.chunks(per_step) {
        let len: usize = step.iter().map(|r| r.len()).sum();
        evicted += evict_step(st, &cands[start..start + len]);
        start += len;
    }
    if evicted > 0 {
        st.stats.record_evict(t0.elapsed().as_nanos() as u64);
    }
    evicted
}

/// Evict `cands` (sorted page numbers, taken from the policy), at most
/// [`RANGES_PER_STEP`] ranges: lock, write back what changed, unmap, unlock.
fn evict_step(st: &State, cands: &[usize]) -> usize {
    let mut victims = Vec::with_capacity(cands.len());
    let mut busy = Vec::new();
    let refusing = far_refusing(st);
    // Held until the step's pages are unmapped: no protection drops under a page read here.
    let unreadable = st.unreadable.read();
    for &v in cands {
        if unreadable.contains(v) {
            // Its contents cannot be read to evict it: it stays until readable or discarded.
            busy.push(v);
            continue;
        }
        let slot = table::slot(v);
        match slot.try_lock(0) {
            Ok(old) if refusing && old.is_present() && old.is_dirty() => {
                // It would need a write-back the far tier refuses: keep it for later.
                slot.unlock(old);
                busy.push(v);
            }
            Ok(old) if old.is_present() => {
                slot.mark_evicting();
                victims.push(Victim {
                    vpn: v,
                    old: old.evicting(),
                    digest: 0,
                });
            }
            // Not resident any more (cannot normally happen): forget it.
            Ok(old) => slot.unlock(old),
            // Locked by a fetch or write-unprotect: try again later.
            Err(cur) if cur.is_registered() => busy.push(v),
            // Region gone.
            Err(_) => {}
        }
    }
    if !busy.is_empty() {
        let mut p = st.policy.lock();
        for v in busy {
            p.reinsert(v);
        }
    }
    leave_foreign(st, &mut victims);
    if victims.is_empty() {
        return 0;
    }

    // Write back the dirty ones, after write-protecting them so their contents are stable.
    // Unverified ones (writable without write tracking) are looked at first, once stable:
    // equal to their far copy, or all zeros, they need no write-back.
    let mut kept_local: Vec<usize> = Vec::new();
    let maybe_dirty = victims.iter().any(|v| v.old.is_dirty());
    if maybe_dirty {
        // Dirty pages installed write-protected (their far copy forgotten at the fetch) need
        // no second protection.
        let writable = victims
            .iter()
            .filter(|v| v.old.is_dirty() && v.old.is_writable())
            .map(|v| v.vpn);
        let wp_failed =
            !st.protect_handoff
                .protect(&st.handoff_cx(), st.now_ns(), &ranges_of(writable));
        if !wp_failed {
            verify(st, &mut victims);
        }
        let dirty: Vec<&Victim> = victims.iter().filter(|v| v.old.is_dirty()).collect();
        let result = if wp_failed {
            Err(BackendError::Failed("write-protect failed".into()))
        } else if dirty.is_empty() {
            Ok(())
        } else {
            write_back(st, &dirty)
        };
        match result {
            Ok(()) => {
                add(&st.stats.c.pages_written_back, dirty.len() as u64);
                add(&st.stats.c.bytes_written, (dirty.len() * PAGE_SIZE) as u64);
                st.far_full_backoff.store(0, Ordering::Relaxed);
            }
            Err(BackendError::Unavailable(msg)) => {
                // The far tier is gone with the pages it held: continuing would hand the
                // program zeros or stale data later.
                farmem_sys::process::fatal(&format!("backend {}: {msg}", st.backend.describe()))
            }
            Err(e) => {
                if matches!(e, BackendError::Full(_)) {
                    note_far_full(st, dirty.len(), &e);
                } else if dirty
                    .iter()
                    .any(|v| st.region_of(v.vpn * PAGE_SIZE).is_none())
                {
                    // The program dropped the region while we held these pages: its teardown
                    // waits for them and discards them, so keeping them is all there is to do
                    // (seen between `bench kv` points, logged as an error until now).
                    tracing::debug!("write-back skipped, region being torn down: {e}");
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
        let mut p = st.policy.lock();
        for v in victims
            .iter()
            .filter(|v| kept_local.binary_search(&v.vpn).is_ok())
        {
            table::slot(v.vpn).unlock(v.old.kept_local());
            p.reinsert(v.vpn);
        }
        victims.retain(|v| kept_local.binary_search(&v.vpn).is_err());
    }
    if victims.is_empty() {
        return 0;
    }

    let ranges = ranges_of(victims.iter().map(|v| v.vpn));
    match st.unmapper.dontneed(&ranges) {
        Ok(calls) => add(&st.stats.c.unmap_syscalls, calls as u64),
        Err(e) => {
            // Cannot happen for our own mappings; if it does, leave the pages as they are.
            tracing::error!("unmapping evicted pages failed: {e}");
            for v in &victims {
                table::slot(v.vpn).unlock(v.old.eviction_undone());
            }
            st.policy
                .lock()
                .insert(&victims.iter().map(|v| v.vpn).collect::<Vec<_>>(), 0);
            return 0;
        }
    }
    let n = victims.len();
    // Each page keeps the eviction clock as its shadow, for the refault distance; its level
    // (recent refaults in a row) stays with it while it is far.
    let stamp = st.workingset.stamp_evictions(n);
    let mut clean = 0u64;
    for v in &victims {
        if !v.old.is_dirty() {
            clean += 1;
        }
        table::slot(v.vpn).unlock(v.old.evicted(stamp));
    }
    st.resident.fetch_sub(n, Ordering::AcqRel);
    add(&st.stats.c.pages_evicted, n as u64);
    add(&st.stats.c.clean_drops, clean);
    n
}

/// Unlock and forget the victims (sorted, locked) outside this runtime's regions. The
/// policy can hold a page of a region that was dropped after the page was queued (a fetch
/// queues its pages after installing them; a busy victim is put back after its region may
/// have gone). The address may belong to another runtime's region by now: evicting it here
/// would take it out of the wrong count and keep the owner's count above the truth forever.
/// Under the page lock the answer cannot change: dropping a region takes it out of the map
/// first, then waits for every page lock.
fn leave_foreign(st: &State, victims: &mut Vec<Victim>) {
    st.regions.with(|regions| {
        let mut known = 0..0; // vpns of the last region found
        victims.retain(|v| {
            if known.contains(&v.vpn) {
                return true;
            }
            match regions.containing_vpn(v.vpn) {
                Some(r) => {
                    known = r.first_vpn()..r.end_vpn();
                    true
                }
                None => {
                    table::slot(v.vpn).unlock(v.old.eviction_undone());
                    false
                }
            }
        });
    })
}

/// Decide whether each unverified victim (locked, present, write-protected by now: its
/// contents cannot change) differs from its far copy: if not, it becomes clean; if it holds
/// only zeros, it becomes fresh (no far copy needed).
fn verify(st: &State, victims: &mut [Victim]) {
    let (mut unchanged, mut zero) = (0u64, 0u64);
    for v in victims.iter_mut().filter(|v| v.old.is_unverified()) {
        // SAFETY: the page is locked by us, present and write-protected: it stays mapped and
        // unchanged until we unmap it, so reading 4 KiB from it is sound.
        let page =
            unsafe { std::slice::from_raw_parts((v.vpn * PAGE_SIZE) as *const u8, PAGE_SIZE) };
        if st.keeps_digests() && (v.old.has_far_copy() || v.old.ever_written()) {
            v.digest = digest::of(page);
        }
        let stored = digest::stored(v.vpn);
        let same = v.digest != 0 && v.digest == stored;
        if v.digest != 0 && stored != 0 {
            // A stay after a fetch for reading whose writes are now known: evidence for
            // how its neighbourhood's next fetches are installed.
            st.write_guess.installed_protected(v.vpn, 1);
            if !same {
                st.write_guess.written(v.vpn);
            }
        }
        if same && v.old.has_far_copy() {
            v.old = v.old.found_unchanged();
            unchanged += 1;
        } else if same {
            // Its far copy was forgotten when it was fetched: written back all the same, but
            // its next fetch need not expect writes.
            v.old = v.old.found_unwritten();
        } else if digest::is_zero(page) {
            v.old = v.old.found_zero();
            zero += 1;
        }
    }
    add(&st.stats.c.verified_unchanged, unchanged);
    add(&st.stats.c.verified_zero, zero);
}

/// Copy the (write-protected) dirty victims out and write them to the backend; returns once
/// the backend has acknowledged. (No digest is taken here: a page's is taken when it is
/// installed unverified, from the fetched bytes, `fetch::phases`.)
fn write_back(st: &State, dirty: &[&Victim]) -> Result<(), BackendError> {
    let mut keys = Vec::with_capacity(dirty.len());
    let mut pages = Vec::with_capacity(dirty.len());
    for v in dirty {
        let addr = v.vpn * PAGE_SIZE;
        let reg = st
            .region_of(addr)
            .ok_or_else(|| BackendError::Failed(format!("page {addr:#x} has no region")))?;
        keys.push(PageKey {
            region: reg.id,
            page: reg.index_of(v.vpn),
        });
        // SAFETY: the page is locked by us, present and write-protected: it stays mapped
        // and unchanged until we unmap it (after this function returns), so reading 4 KiB
        // from it is sound for as long as `pages` lives.
        pages.push(unsafe { std::slice::from_raw_parts(addr as *const u8, PAGE_SIZE) });
    }
    // An in-process store reads the pages where they are; others get a copy to send.
    match st.backend.write_in_place(&keys, &pages) {
        Some(r) => r?,
        None => {
            let mut buf = PageBuf::new(dirty.len());
            buf.set_len(dirty.len());
            for (i, page) in pages.iter().enumerate() {
                buf.page_mut(i).copy_from_slice(page);
            }
            st.backend
                .submit_write(IoClass::WriteBack, keys, buf)
                .wait(st.io_timeout)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    use farmem_sys::mem::PAGE_SIZE;

    use crate::config::Config;
    use crate::runtime::Runtime;

    /// A reservation that finds the budget taken and nothing it can evict (here the budget
    /// is held by pages reserved and not installed, as by in-flight work that does not end,
    /// or by a budget below what the process holds) takes its pages beyond the budget after
    /// a bounded wait, counted, instead of waiting for good.
    #[test]
    fn a_reservation_with_nothing_evictable_goes_beyond_the_budget_rather_than_hang() {
        let rt = Runtime::new(Config {
            local_mem: 256 * PAGE_SIZE as u64,
            ..Config::default()
        })
        .expect("a runtime (needs userfaultfd)");
        let st = rt.state();
        let held = st.budget() - st.resident.load(Ordering::Relaxed);
        st.resident.fetch_add(held, Ordering::AcqRel);
        let t0 = Instant::now();
        super::reserve(st, 1);
        let waited = t0.elapsed();
        let s = rt.stats();
        st.resident.fetch_sub(held + 1, Ordering::AcqRel);
        assert!(
            waited >= super::STALL_LIMIT && waited < Duration::from_secs(30),
            "waited {waited:?}"
        );
        assert_eq!(s.room_waits, 1, "the wait is counted");
        assert_eq!(
            s.over_budget_pages, 1,
            "the page is taken beyond the budget"
        );
    }
}
