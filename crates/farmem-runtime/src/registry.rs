//! The process-wide index of every runtime's regions, for the paths that know only an
//! address (a hint's slow path) or need every runtime (a fork), and the process's fork
//! state: in a child forked from a far-memory process the runtimes' threads did not survive,
//! so nothing is found there.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::RwLock;

use crate::regions::RegionInfo;
use crate::state::State;

struct Entry {
    end: usize,
    info: RegionInfo,
    rt: Weak<State>,
}

static REGISTRY: RwLock<BTreeMap<usize, Entry>> = RwLock::new(BTreeMap::new());

static IN_CHILD: AtomicBool = AtomicBool::new(false);

/// Whether this process is a child forked from a process that had far memory.
pub(crate) fn in_child() -> bool {
    IN_CHILD.load(Ordering::Relaxed)
}

/// This process is such a child now (the fork handler of the child says so).
pub(crate) fn enter_child() {
    IN_CHILD.store(true, Ordering::Relaxed);
}

pub(crate) fn insert(info: RegionInfo, rt: &Arc<State>) {
    REGISTRY.write().insert(
        info.base,
        Entry {
            end: info.end(),
            info,
            rt: Arc::downgrade(rt),
        },
    );
}

pub(crate) fn remove(base: usize) {
    REGISTRY.write().remove(&base);
}

/// Find the runtime and region holding `addr`. None in a forked child, whose runtime threads
/// did not survive the fork (its memory is all local there).
pub(crate) fn lookup(addr: usize) -> Option<(Arc<State>, RegionInfo)> {
    if in_child() {
        return None;
    }
    let reg = REGISTRY.read();
    let (_, e) = reg.range(..=addr).next_back()?;
    if addr >= e.end {
        return None;
    }
    Some((e.rt.upgrade()?, e.info))
}

/// Every runtime that has at least one region.
pub(crate) fn live_runtimes() -> Vec<Arc<State>> {
    let mut out: Vec<Arc<State>> = Vec::new();
    for e in REGISTRY.read().values() {
        if let Some(rt) = e.rt.upgrade() {
            if !out.iter().any(|o| Arc::ptr_eq(o, &rt)) {
                out.push(rt);
            }
        }
    }
    out
}
