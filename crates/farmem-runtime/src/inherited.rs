//! Pages shared with a parent or child since a fork: set aside at the fork, evicted after
//! every other page, and given back to the policy once the other side has ended.

use std::sync::atomic::Ordering;

use crate::state::State;

/// Before a fork that keeps far pages far: the pages resident now will be shared by parent
/// and child (copy-on-write), so both sides evict them last ([`State::inherited`]). Evicting
/// a shared page frees nothing while the other side maps it, and costs a far copy in each
/// process that evicts it: the C fork program's child, reading the whole heap after the
/// fork, evicted the ~65 K pages it shared with its parent and stored them again, as the
/// parent did, where Linux swaps a shared page out once (1,055 MiB used at half the peak,
/// Linux 911). The pages each side fetches after the fork are its own and go first (those
/// still stored from before the fork are dropped without a write).
///
/// Only in a process that shares its tree's budget (`farmem run`'s default): the tree file
/// tells when the other side has ended ([`rejoin_inherited`]).
pub(crate) fn set_aside_resident(st: &State) {
    if !st.tree.as_ref().is_some_and(|t| t.is_member()) {
        return;
    }
    st.inherited_since_ns.store(st.now_ns(), Ordering::Relaxed);
    let mut policy = st.policy();
    let mut pages = Vec::with_capacity(policy.len());
    policy.take_all(&mut pages, &Unused);
    // After any still set aside from an earlier fork.
    st.inherited.lock().extend(pages);
}

/// A use-bits view that reports no use: the whole policy is taken in its order.
struct Unused;
impl crate::policy::UseBits for Unused {
    fn used_since_last_look(&self, _vpn: usize) -> bool {
        false
    }

    fn watch(&self, _vpn: usize) -> u8 {
        0
    }
}

/// How long after a fork the other side may take to show in the tree file (a member
/// publishes within 10 ms, a slot is stale after 1 s).
const REJOIN_AFTER_NS: u64 = 2_000_000_000;

/// Once no other member of the tree is alive (the parent or children it shared its pages
/// with have ended), the pages set aside at the fork are its own again: back into the policy,
/// ahead of the pages taken in since (they are older). Without it a parent whose child had
/// ended would evict the pages it fetched since before those it had at the fork, however
/// cold. Called by the control thread; cheap while nothing is set aside.
pub(crate) fn rejoin_inherited(st: &State) {
    let Some(t) = &st.tree else { return };
    if st.inherited.lock().is_empty()
        || st
            .now_ns()
            .saturating_sub(st.inherited_since_ns.load(Ordering::Relaxed))
            < REJOIN_AFTER_NS
        || t.file().others_alive(std::process::id()) > 0
    {
        return;
    }
    let mut policy = st.policy();
    let n = policy.len();
    let mut newer = Vec::with_capacity(n);
    policy.take_victims(n, &mut newer, &Unused);
    let older: Vec<usize> = st.inherited.lock().drain(..).collect();
    policy.insert(&older, 0);
    policy.insert(&newer, 0);
}
