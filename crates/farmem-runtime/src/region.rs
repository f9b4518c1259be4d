//! Far-memory regions: anonymous mappings registered with the runtime's userfaultfd, whose
//! pages the runtime moves between local memory and the backend.

use std::sync::atomic::Ordering;

use crate::error::{Error, Result};
use crate::page_table::{self, ABSENT, LOCKED};
use crate::runtime::{Inner, Runtime};
use farmem_sys::mem::{self, PAGE_SHIFT, PAGE_SIZE};
use farmem_sys::uffd;

/// Where a region lives (copied freely; the [`Region`] handle owns the mapping).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionInfo {
    pub id: u32,
    pub base: usize,
    pub npages: usize,
    /// Placed inside a reservation of the caller's (`Runtime::create_region_at`): on
    /// teardown the range goes back to an inaccessible reservation instead of being unmapped.
    pub fixed: bool,
}

impl RegionInfo {
    pub fn end(&self) -> usize {
        self.base + self.npages * PAGE_SIZE
    }

    pub fn first_vpn(&self) -> usize {
        self.base >> PAGE_SHIFT
    }

    pub fn end_vpn(&self) -> usize {
        self.first_vpn() + self.npages
    }

    /// Page index within the region (the backend's key) of a virtual page number.
    pub fn index_of(&self, vpn: usize) -> u64 {
        (vpn - self.first_vpn()) as u64
    }
}

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
pub(crate) fn map(inner: &Inner, id: u32, len: usize, at: Option<usize>) -> Result<RegionInfo> {
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
    let undo = |e: Error| {
        release_range(&info);
        e
    };
    // The runtime installs and evicts 4 KiB pages; huge pages would defeat both.
    let _ = mem::madvise(base, len, libc::MADV_NOHUGEPAGE);
    page_table::register(info.first_vpn(), info.npages)
        .map_err(|e| undo(Error::sys("page metadata", e)))?;
    let ioctls = inner
        .uffd
        .register(
            base,
            len,
            uffd::REGISTER_MODE_MISSING | uffd::REGISTER_MODE_WP,
        )
        .map_err(|e| {
            page_table::unregister(info.first_vpn(), info.npages);
            undo(Error::sys(
                "registering region with userfaultfd (missing + write-protect)",
                e,
            ))
        })?;
    let needed = uffd::IOCTL_BIT_COPY | uffd::IOCTL_BIT_WAKE | uffd::IOCTL_BIT_WRITEPROTECT;
    if ioctls & needed != needed {
        let _ = inner.uffd.unregister(base, len);
        page_table::unregister(info.first_vpn(), info.npages);
        return Err(undo(Error::Config(
            "this kernel's userfaultfd lacks UFFDIO_COPY/WAKE/WRITEPROTECT on anonymous memory"
                .into(),
        )));
    }
    if let Err(e) = inner.backend.open_region(id, info.npages as u64) {
        let _ = inner.uffd.unregister(base, len);
        page_table::unregister(info.first_vpn(), info.npages);
        return Err(undo(Error::Backend {
            backend: inner.backend.describe(),
            msg: e.to_string(),
        }));
    }
    Ok(info)
}

/// Tear a region down: forget its pages in the policy, wait for in-flight transitions,
/// return its budget, unmap it and drop its far copies.
pub(crate) fn unmap(inner: &Inner, info: &RegionInfo) {
    // Read-ahead in flight holds some pages locked: finish it first.
    crate::prefetch::complete_range(inner, info.first_vpn(), info.end_vpn());
    inner.policy().remove_range(info.first_vpn(), info.npages);
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
        match page_table::try_lock(page_table::entry(vpn), 0) {
            Ok(old) if old & ABSENT == 0 => present += 1,
            Ok(_) => {}
            Err(cur) if cur & LOCKED != 0 => held.push(vpn),
            Err(_) => {} // not registered (cannot happen for a live region)
        }
    }
    if !held.is_empty() {
        inner.resident.fetch_sub(present, Ordering::Relaxed);
        present = 0;
    }
    for vpn in held {
        let w = page_table::entry(vpn);
        loop {
            match page_table::try_lock(w, 0) {
                Ok(old) => {
                    if old & ABSENT == 0 {
                        present += 1;
                    }
                    break;
                }
                Err(cur) if cur & LOCKED != 0 => page_table::wait_unlocked(w, 1000),
                Err(_) => break,
            }
        }
    }
    // An evictor that found one of our pages locked may have put it back meanwhile.
    inner.policy().remove_range(info.first_vpn(), info.npages);
    page_table::unregister(info.first_vpn(), info.npages);
    let _ = inner.uffd.unregister(info.base, info.npages * PAGE_SIZE);
    // The region's handle is being dropped and its metadata cleared: nothing the runtime
    // does refers to these addresses any more.
    release_range(info);
    inner.resident.fetch_sub(present, Ordering::Relaxed);
    inner.backend.close_region(info.id);
}

/// A far-memory region. Its memory is ordinary memory to the program: read and write it
/// through [`Region::as_mut_ptr`]; hints make accesses cheaper but are never required.
/// Dropping the region frees it (all its pages, local and far).
pub struct Region {
    rt: Runtime,
    info: RegionInfo,
}

impl Region {
    pub(crate) fn new(rt: Runtime, info: RegionInfo) -> Region {
        Region { rt, info }
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.info.base as *const u8
    }

    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.info.base as *mut u8
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.info.npages * PAGE_SIZE
    }

    pub fn is_empty(&self) -> bool {
        self.info.npages == 0
    }

    pub fn id(&self) -> u32 {
        self.info.id
    }

    pub fn runtime(&self) -> &Runtime {
        &self.rt
    }

    /// Whether the page holding `offset` is local right now (for tests and tools).
    pub fn is_resident(&self, offset: usize) -> bool {
        assert!(offset < self.len(), "offset out of region");
        let e = page_table::entry((self.info.base + offset) >> PAGE_SHIFT);
        let mut w = e.load(Ordering::Acquire);
        while w & LOCKED != 0 {
            // A thread woken by a page's install can get here before the installer marks
            // it present (the installer may even be preempted in between): answer for after
            // the transition, as every lock holder releases soon.
            page_table::wait_unlocked(e, 1000);
            w = e.load(Ordering::Acquire);
        }
        w & ABSENT == 0
    }

    /// The region's memory as a byte slice.
    ///
    /// # Safety
    /// The caller must make sure no other thread writes the region while the slice lives
    /// (the usual aliasing rules; the runtime itself never changes page contents).
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping spans len() bytes for the region's life; aliasing is the
        // caller's promise.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len()) }
    }

    /// The region's memory as a mutable byte slice.
    ///
    /// # Safety
    /// As [`Region::as_slice`], and no other reference to the memory may be used meanwhile.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        // SAFETY: as above; exclusivity is the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), self.len()) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.rt.destroy_region(&self.info);
    }
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("id", &self.info.id)
            .field("base", &format_args!("{:#x}", self.info.base))
            .field("len", &self.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;
    use crate::config::Config;

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
        let inner = rt.inner().clone();
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
        let old = crate::fetch::lock_absent(vpn, 7).expect("lock an absent page");
        // The late fetch will want more pages than are free (settled: nothing runs now).
        std::thread::sleep(Duration::from_millis(50));
        let want = inner.free_pages() + 1;
        assert!(want <= inner.budget);

        let (done_tx, done) = mpsc::channel();
        let dropper = std::thread::spawn(move || {
            drop(r);
            let _ = done_tx.send(());
        });
        // Once the drop has taken the region out of the policy, nothing is evictable.
        while !inner.policy().is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
        // The late fetch, with the page still locked.
        let (got_tx, got) = mpsc::channel();
        let fetcher = {
            let inner = inner.clone();
            std::thread::spawn(move || {
                crate::reclaim::reserve(&inner, want);
                // Give the reservation back and let go of the page, still absent.
                inner.resident.fetch_sub(want, Ordering::Relaxed);
                page_table::unlock(page_table::entry(vpn), old);
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
        assert_eq!(inner.resident.load(Ordering::Relaxed), 0);
    }
}
