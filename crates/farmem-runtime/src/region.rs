//! Making and unmaking far-memory regions: anonymous mappings registered with the runtime's
//! userfaultfd (missing and write-protect faults), with their page words in the table and
//! their storage opened in the backend; and the reverse, without losing a page's budget or
//! racing an eviction.

use std::sync::atomic::Ordering;

use farmem_sys::mem::{self, PAGE_SIZE};
use farmem_sys::uffd;

use crate::error::{Error, Result};
use crate::fetch::readahead;
use crate::page::table;
use crate::page::word::{Access, Hotness};
use crate::regions::RegionInfo;
use crate::state::State;

/// Give a region's address range back: unmap it, or for a fixed region turn it back into an
/// inaccessible reservation so nothing else gets mapped there.
fn release_range(info: &RegionInfo) {
    let len = info.npages * PAGE_SIZE;
    if info.fixed {
        // SAFETY: the range is the caller's reservation; nothing refers to it any more.
        let _ = unsafe { mem::map_anon_fixed(info.base, len, libc::PROT_NONE) };
    } else {
        // SAFETY: the mapping is ours and nothing refers to it any more.
        unsafe { mem::unmap(info.base as *mut u8, len) };
    }
}

/// Map and register a region of `len` bytes (a page multiple), at `at` if given (a range of
/// a reservation the caller owns).
pub(crate) fn map(st: &State, id: u32, len: usize, at: Option<usize>) -> Result<RegionInfo> {
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    let base = match at {
        // SAFETY: the caller owns the reserved range (`Runtime::create_region_at`).
        Some(a) => unsafe { mem::map_anon_fixed(a, len, prot) },
        None => mem::map_anon(len, prot),
    }
    .map_err(|e| Error::sys("mapping region", e))? as usize;
    let info = RegionInfo {
        id,
        base,
        npages: len / PAGE_SIZE,
        fixed: at.is_some(),
    };
    attach(st, &info).inspect_err(|_| release_range(&info))?;
    Ok(info)
}

/// Make the mapped range of `info` a region: page words, userfaultfd registration (missing
/// and write-protect), backend storage. On failure, whatever it did is undone (the mapping
/// is the caller's).
fn attach(st: &State, info: &RegionInfo) -> Result<()> {
    let (base, len) = (info.base, info.npages * PAGE_SIZE);
    // The runtime installs and evicts 4 KiB pages; huge pages would defeat both.
    let _ = mem::madvise(base, len, libc::MADV_NOHUGEPAGE);
    table::register(info.first_vpn(), info.npages).map_err(|e| Error::sys("page metadata", e))?;
    let undo = |e: Error| {
        table::unregister(info.first_vpn(), info.npages);
        e
    };
    let ioctls = st
        .uffd
        .register(
            base,
            len,
            uffd::REGISTER_MODE_MISSING | uffd::REGISTER_MODE_WP,
        )
        .map_err(|e| {
            undo(Error::sys(
                "registering region with userfaultfd (missing + write-protect)",
                e,
            ))
        })?;
    let needed = uffd::IOCTL_BIT_COPY | uffd::IOCTL_BIT_WAKE | uffd::IOCTL_BIT_WRITEPROTECT;
    if ioctls & needed != needed {
        let _ = st.uffd.unregister(base, len);
        return Err(undo(Error::Config(
            "this kernel's userfaultfd lacks UFFDIO_COPY/WAKE/WRITEPROTECT on anonymous memory"
                .into(),
        )));
    }
    if let Err(e) = st.backend.open_region(info.id, info.npages as u64) {
        let _ = st.uffd.unregister(base, len);
        return Err(undo(Error::backend(st.backend.describe(), None, e)));
    }
    Ok(())
}

/// Register `[base, base+len)`, an anonymous private mapping that already exists and holds
/// data (a program's static arrays), as a region that lives until the process ends. Its
/// resident pages become resident dirty pages of the region (they count against the budget
/// and may be evicted); the others read as zeros when first touched, as anonymous memory
/// does. Nothing else may touch the range meanwhile (the caller runs before the program's
/// threads exist).
pub(crate) fn adopt(st: &State, id: u32, base: usize, len: usize) -> Result<RegionInfo> {
    let info = RegionInfo {
        id,
        base,
        npages: len / PAGE_SIZE,
        fixed: true,
    };
    let resident = mem::resident_pages(base, len).map_err(|e| Error::sys("mincore", e))?;
    attach(st, &info)?;
    let present: Vec<usize> = resident
        .iter()
        .enumerate()
        .filter(|(_, &r)| r)
        .map(|(i, _)| info.first_vpn() + i)
        .collect();
    for &vpn in &present {
        let slot = table::slot(vpn);
        if let Ok(old) = slot.try_lock(0) {
            slot.unlock(old.installed(Access::Written, 0, Hotness::Used));
        }
    }
    st.resident.fetch_add(present.len(), Ordering::AcqRel);
    st.policy().insert(&present, 0);
    Ok(info)
}

/// Tear a region down: forget its pages in the policy, wait for in-flight transitions,
/// return its budget, unmap it and drop its far copies.
pub(crate) fn unmap(st: &State, info: &RegionInfo) {
    // Read-ahead in flight holds some pages locked: finish it first.
    readahead::complete_range(st, info.first_vpn(), info.end_vpn());
    st.policy().remove_range(info.first_vpn(), info.npages);
    // Take every page's lock and keep it until the metadata is cleared: an evictor that took
    // a page from the policy just before it forgot the region can then neither evict it after
    // we counted it (which would return its budget twice) nor find it half torn down.
    //
    // First the pages nobody holds. A holder may be waiting for budget before it lets go (a
    // late fetch into this region: a stolen fault retried after its thread moved on), and
    // none of this region's pages can be evicted any more to make room: so the budget of the
    // pages locked so far is returned before waiting for the others, or both would wait for
    // ever. Locked by us, those pages cannot be evicted (and counted) by anyone else.
    let (mut present, mut held) = (0usize, Vec::new());
    for vpn in info.first_vpn()..info.end_vpn() {
        match table::slot(vpn).try_lock(0) {
            Ok(old) if old.is_present() => present += 1,
            Ok(_) => {}
            Err(cur) if cur.is_locked() => held.push(vpn),
            Err(_) => {} // not registered (cannot happen for a live region)
        }
    }
    if !held.is_empty() {
        st.resident.fetch_sub(present, Ordering::Relaxed);
        present = 0;
    }
    for vpn in held {
        if table::slot(vpn)
            .lock_waiting(0)
            .is_some_and(|old| old.is_present())
        {
            present += 1;
        }
    }
    // An evictor that found one of our pages locked may have put it back meanwhile.
    st.policy().remove_range(info.first_vpn(), info.npages);
    table::unregister(info.first_vpn(), info.npages);
    let _ = st.uffd.unregister(info.base, info.npages * PAGE_SIZE);
    // The region's handle is being dropped and its metadata cleared: nothing the runtime
    // does refers to these addresses any more.
    release_range(info);
    st.resident.fetch_sub(present, Ordering::Relaxed);
    st.backend.close_region(info.id);
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;
    use crate::config::Config;
    use crate::runtime::Runtime;
    use farmem_sys::mem::PAGE_SHIFT;

    /// A thread that holds a page of a region locked and waits for budget (a late fetch: a
    /// stolen fault retried after its thread moved on) while the region is dropped, with the
    /// budget full of that region's pages. Dropping took them out of the policy, so nothing
    /// can be evicted for the fetch; the fetch holds a page the drop waits for. The drop must
    /// return the budget of the pages it has before waiting (it hung; seen under load in the
    /// region-churn test, with the control thread stuck in `reserve`).
    #[test]
    fn a_fetch_waiting_for_budget_does_not_hang_dropping_its_region() {
        let rt = Runtime::new(Config {
            local_mem: 256 * PAGE_SIZE as u64,
            ..Config::default()
        })
        .expect("a runtime (needs userfaultfd)");
        let st = rt.state().clone();
        let pages = 1024;
        let r = rt.create_region(pages * PAGE_SIZE).unwrap();
        for p in 0..pages {
            // SAFETY: inside the region.
            unsafe {
                r.as_mut_ptr()
                    .add(p * PAGE_SIZE)
                    .write_volatile(p as u8 | 1)
            };
        }
        let vpn = (0..pages)
            .find(|&p| !r.is_resident(p * PAGE_SIZE))
            .map(|p| (r.as_ptr() as usize >> PAGE_SHIFT) + p)
            .expect("an evicted page");
        let old = table::slot(vpn)
            .lock_if_absent(7)
            .expect("lock an absent page");
        // The late fetch will want more pages than are free (settled: nothing runs now).
        std::thread::sleep(Duration::from_millis(50));
        let want = st.free_pages() + 1;
        assert!(want <= st.budget());

        let (done_tx, done) = mpsc::channel();
        let dropper = std::thread::spawn(move || {
            drop(r);
            let _ = done_tx.send(());
        });
        // Once the drop has taken the region out of the policy, nothing is evictable.
        while !st.policy().is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
        // The late fetch, with the page still locked.
        let (got_tx, got) = mpsc::channel();
        let fetcher = {
            let st = st.clone();
            std::thread::spawn(move || {
                crate::reclaim::reserve(&st, want);
                // Give the reservation back and let go of the page, still absent.
                st.resident.fetch_sub(want, Ordering::Relaxed);
                table::slot(vpn).unlock(old);
                let _ = got_tx.send(());
            })
        };
        // Generous limits: a deadlock never ends, the fixed path takes milliseconds.
        got.recv_timeout(Duration::from_secs(60))
            .expect("the fetch never got its budget: the drop kept it");
        done.recv_timeout(Duration::from_secs(60))
            .expect("dropping the region never finished");
        fetcher.join().unwrap();
        dropper.join().unwrap();
        assert_eq!(st.resident.load(Ordering::Relaxed), 0);
    }
}
