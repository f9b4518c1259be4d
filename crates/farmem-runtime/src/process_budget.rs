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
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let mut f = s.split_whitespace().skip(1);
    let resident: usize = f.next()?.parse().ok()?;
    let shared: usize = f.next()?.parse().ok()?;
    Some(resident.saturating_sub(shared))
}

/// Set the budget the program asked for (pages), and the regions' share of it now.
pub(crate) fn set_asked(st: &State, pages: usize) {
    st.asked_budget.store(pages, Ordering::Relaxed);
    apply(st);
}

/// From the control thread: measure again if it is time.
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
    st.budget_checked_ns.store(now.max(1), Ordering::Relaxed);
    apply(st);
}

/// The regions' budget from the asked one and the other memory measured now.
fn apply(st: &State) {
    let asked = st.asked_budget.load(Ordering::Relaxed);
    let other = match st.cfg.budget_scope {
        BudgetScope::Regions => 0,
        BudgetScope::Process => match anon_resident_pages() {
            Some(anon) => {
                let far_tiers = st.backend.memory_in_process() as usize / PAGE_SIZE;
                let now = anon.saturating_sub(st.resident.load(Ordering::Relaxed) + far_tiers);
                let before = st.other_pages.load(Ordering::Relaxed);
                if now >= before {
                    now
                } else {
                    before - ((before - now) >> FALL_SHIFT).max(1)
                }
            }
            None => st.other_pages.load(Ordering::Relaxed),
        },
    };
    st.other_pages.store(other, Ordering::Relaxed);
    let want = asked
        .saturating_sub(other)
        .max(asked / 2)
        .max(crate::config::MIN_BUDGET_PAGES.min(asked));
    // Small changes are left alone: each one moves the eviction goal.
    let cur = st.budget();
    if want.abs_diff(cur) <= (asked / 128).max(16) && want != asked {
        return;
    }
    st.budget.store(want, Ordering::Release);
    if st.resident.load(Ordering::Relaxed) > want {
        // Over the smaller budget: evict ahead from now on, as at a shrink.
        st.over_budget_once.store(true, Ordering::Relaxed);
        st.kick_control();
    }
}
