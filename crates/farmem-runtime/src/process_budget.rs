//! The budget of a whole process ([`BudgetScope::Process`], what `farmem run` uses).
//!
//! A memory cgroup's limit counts every anonymous page of a program: its data, and also the
//! runtime's own memory, thread stacks, glibc's arenas of the runtime threads and mappings
//! made before the runtime started. A budget compared with such a limit has to count them
//! too, or the comparison flatters farmem: python3 building 256 MiB of objects at a 128 MiB
//! budget peaked at 128 MiB of far heap plus 10 MiB of other anonymous memory.
//!
//! So the regions get the asked budget less that other memory, measured from
//! `/proc/self/statm` by the control thread every [`EVERY_NS`] and at each budget change.
//! They never get less than half the asked budget: a program whose unmanaged memory is most
//! of its budget still runs, and `other_bytes` says why it uses more. The far tiers' own
//! memory is not counted, as zram's is not charged to a cgroup: that is the comparison.

use std::sync::atomic::Ordering;

use farmem_sys::mem::PAGE_SIZE;

use crate::config::BudgetScope;
use crate::state::State;

/// How often the control thread measures the process's other memory (a read of
/// `/proc/self/statm` and of the far tiers' counts, ~10 µs). Often enough that a program
/// filling its memory in its first tens of milliseconds (static arrays touched at start) is
/// held to the budget from then on: at 100 ms, one peaked 3 MiB over its heap twin.
const EVERY_NS: u64 = 10_000_000;
/// The estimate rises at once and falls by 1/2^FALL_SHIFT of the difference per
/// measurement: the runtime's buffers come and go with each eviction, and a budget that
/// followed them up and down let the far heap regrow into room the next eviction's buffers
/// took again (python3 at 65 MiB peaked at 91.8 MiB, against 87.5 MiB measuring every 100
/// ms).
const FALL_SHIFT: u32 = 4;

/// Anonymous resident pages of this process (resident less file-backed and shared).
fn anon_resident_pages() -> Option<usize> {
    let s = farmem_sys::proc_file::STATM.read().ok()?;
    let mut f = s.split_whitespace().skip(1);
    let resident: usize = f.next()?.parse().ok()?;
    let shared: usize = f.next()?.parse().ok()?;
    Some(resident.saturating_sub(shared))
}

/// Set the budget the program asked for (pages), and the regions' share of it now. In a
/// process tree with one budget this sets the tree's.
pub(crate) fn set_asked(st: &State, pages: usize) {
    if let Some(t) = st.tree.as_ref().filter(|t| t.is_member()) {
        t.file().set_budget(pages);
    }
    st.asked_budget.store(pages, Ordering::Relaxed);
    apply(st);
}

/// Measure again if it is time: from the control thread, and from a thread waiting for
/// budget (`reclaim::reserve`). One measurement at a time: the one that claims the time runs
/// it, the others go on.
pub(crate) fn refresh(st: &State) {
    if st.cfg.budget_scope != BudgetScope::Process {
        return;
    }
    let now = st.now_ns();
    let last = st.budget_checked_ns.load(Ordering::Relaxed);
    // 0: never measured yet (the control thread's first round).
    if last != 0 && now.saturating_sub(last) < EVERY_NS {
        return;
    }
    if st
        .budget_checked_ns
        .compare_exchange(last, now.max(1), Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
    {
        apply(st);
    }
}

/// The regions' budget from the asked one (or this process's share of its tree's) and the
/// other memory measured now.
fn apply(st: &State) {
    let asked = st.asked_budget.load(Ordering::Relaxed);
    if st.cfg.budget_scope == BudgetScope::Regions {
        return set_regions_budget(st, asked, 0, 0);
    }
    let Some(anon) = anon_resident_pages() else {
        let other = st.other_pages.load(Ordering::Relaxed);
        return set_regions_budget(st, asked, 0, other);
    };
    let far_tiers = st.backend.memory_in_process() as usize / PAGE_SIZE;
    let resident = st.resident.load(Ordering::Relaxed);
    let other = smooth(st, anon.saturating_sub(resident + far_tiers));
    st.other_pages.store(other, Ordering::Relaxed);
    let unshared = anon.saturating_sub(far_tiers);
    // Wanting more room shows as evictions, or as waits where nothing could be evicted.
    let pressure = st.stats.c.pages_evicted.load(Ordering::Relaxed)
        + st.stats.c.room_waits.load(Ordering::Relaxed);
    match st.tree.as_ref().and_then(|t| {
        t.measure(
            asked,
            unshared,
            far_tiers,
            store_apart(st, anon, far_tiers),
            pressure,
        )
    }) {
        Some(m) => {
            st.asked_budget.store(m.budget, Ordering::Relaxed);
            // What others are charged for (pages shared copy-on-write) is room here.
            set_regions_budget(st, m.mine, m.shared, other)
        }
        None => set_regions_budget(st, asked, 0, other),
    }
}

/// The far tiers' address range, where they hold enough of the process's memory to be worth
/// measuring apart (an eighth): that reads all of `/proc/self/smaps` instead of its rollup,
/// and python3's many mappings made it so much dearer that the measurements, spaced by their
/// cost, came too seldom (its multiprocessing workers at 243M peaked at 334 MiB against 290).
fn store_apart(st: &State, anon: usize, far_tiers: usize) -> Option<(usize, usize)> {
    (far_tiers * 8 > anon)
        .then(|| st.backend.store_range())
        .flatten()
}

/// The regions get `base` (the budget, or this process's share of its tree's) plus `shared`
/// pages counted for other processes, less the other memory; never less than half of `base`.
fn set_regions_budget(st: &State, base: usize, shared: usize, other: usize) {
    let want = (base + shared)
        .saturating_sub(other)
        .max(base / 2)
        .max(crate::config::MIN_BUDGET_PAGES.min(base));
    // Small changes are left alone: each one moves the eviction goal.
    let cur = st.budget();
    if want.abs_diff(cur) <= (base / 128).max(16) && want != base {
        return;
    }
    st.budget.store(want, Ordering::Release);
    if st.resident.load(Ordering::Relaxed) > want {
        // Over the smaller budget: evict ahead from now on, as at a shrink.
        st.over_budget_once.store(true, Ordering::Relaxed);
        st.kick_control();
    }
}

/// The other memory's estimate: it rises at once and falls slowly (see [`FALL_SHIFT`]).
fn smooth(st: &State, now: usize) -> usize {
    let before = st.other_pages.load(Ordering::Relaxed);
    if now >= before {
        now
    } else {
        before - ((before - now) >> FALL_SHIFT).max(1)
    }
}
