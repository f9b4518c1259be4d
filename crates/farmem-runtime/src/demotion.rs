//! Moving cold far pages to a slower tier in the background (zswap's write-back: the
//! compressed DRAM tier keeps room for the pages evicted next, which are the likelier to
//! come back). The backend names the pages ([`Backend::demotion_candidates`]); this module
//! takes their page locks, so that no fetch, write-back or forget of them runs meanwhile,
//! and hands them back to be moved ([`Backend::demote`]). Run by the control thread.
//!
//! [`Backend::demotion_candidates`]: crate::backend::io::Backend::demotion_candidates
//! [`Backend::demote`]: crate::backend::io::Backend::demote

use crate::page::table;
use crate::state::State;

/// Pages looked at per round: a round holds their locks across one file write.
const PER_ROUND: usize = 256;

/// One round; whether any page was offered (more may follow at once).
pub(crate) fn round(st: &State) -> bool {
    let keys = st.backend.demotion_candidates(PER_ROUND);
    if keys.is_empty() {
        return false;
    }
    let regions = st.regions.all();
    let mut held = Vec::with_capacity(keys.len());
    let locked: Vec<bool> = keys
        .iter()
        .map(|k| {
            let Some(r) = regions.iter().find(|r| r.id == k.region) else {
                return false;
            };
            if k.page >= r.npages as u64 {
                return false;
            }
            let vpn = r.first_vpn() + k.page as usize;
            // Never wait: a page someone works on is not cold.
            match table::slot(vpn).try_lock(0) {
                Ok(old) => {
                    held.push((vpn, old));
                    true
                }
                Err(_) => false,
            }
        })
        .collect();
    st.backend.demote(&keys, &locked);
    for (vpn, old) in held {
        table::slot(vpn).unlock(old);
    }
    true
}
