//! Parts of a region lent to the kernel: the program maps at a fixed address inside far
//! memory something the runtime cannot manage (a file, shared memory: a "magic" ring
//! buffer's two views of one memfd, a code heap's writable and executable views), and that
//! mapping must be the kernel's while it lives.
//!
//! Lending discards the pages (as `munmap` would: the new mapping replaces them) and leaves
//! their words unregistered, so that no fault, read-ahead, eviction or fork takes them for
//! the runtime's; then the range leaves the userfaultfd, and the caller lets the kernel map
//! over it. Taking it back makes the range an inaccessible anonymous reservation again,
//! registered, its pages fresh: far memory the program can commit once more.

use farmem_sys::mem::{self, PAGE_SIZE};
use farmem_sys::uffd;

use crate::discard;
use crate::error::{Error, Result};
use crate::page::word::PageWord;
use crate::page::{digest, table};
use crate::state::State;

/// Give `[addr, addr+len)` (page-aligned, in far memory) to the kernel: its contents are
/// dropped and the runtime stops serving it. Idempotent.
pub(crate) fn lend(st: &State, addr: usize, len: usize) -> Result<()> {
    for (first, end) in st.regions.page_runs(addr, addr.saturating_add(len)) {
        // Locked one by one, so a transition in flight finishes first; unlocked unregistered,
        // so none starts afterwards. Only then does the range leave the userfaultfd: an
        // install in flight needs the registration to finish.
        discard::discard_into(st, first, end, PageWord::UNREGISTERED);
        digest::unregister(first, end - first);
        st.uffd
            .unregister(first * PAGE_SIZE, (end - first) * PAGE_SIZE)
            .map_err(|e| Error::sys("unregistering a lent range from userfaultfd", e))?;
    }
    Ok(())
}

/// Make `[addr, addr+len)`, lent before, far memory again: an inaccessible reservation
/// (`PROT_NONE`), whatever the kernel had mapped there replaced.
///
/// # Safety
/// The range must be lent (see [`lend`]) and the caller's to replace.
pub(crate) unsafe fn take_back(st: &State, addr: usize, len: usize) -> Result<()> {
    for (first, end) in st.regions.page_runs(addr, addr.saturating_add(len)) {
        let (a, l) = (first * PAGE_SIZE, (end - first) * PAGE_SIZE);
        st.unreadable
            .change(a, l, libc::PROT_NONE, || {
                // SAFETY: the caller's range (this function's contract).
                unsafe { mem::map_anon_fixed(a, l, libc::PROT_NONE) }.map(|_| ())
            })
            .map_err(|e| Error::sys("mapping a lent range anew", e))?;
        let _ = mem::madvise(a, l, libc::MADV_NOHUGEPAGE);
        st.uffd
            .register(a, l, uffd::REGISTER_MODE_MISSING | uffd::REGISTER_MODE_WP)
            .map_err(|e| Error::sys("registering a lent range again", e))?;
        table::register(first, end - first).map_err(|e| Error::sys("page metadata", e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use crate::config::Config;
    use crate::runtime::Runtime;
    use farmem_sys::mem::PAGE_SIZE;

    fn stamp(p: usize, round: u64) -> u64 {
        (p as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ round
    }

    /// A range lent from the middle of a region holds a shared mapping (a memfd) while two
    /// threads churn through the rest of the region at four times the budget; taken back, it
    /// reads as zeros and is far memory again; the rest keeps its data throughout.
    #[test]
    fn lent_ranges_hold_shared_mappings_and_come_back_as_far_memory() {
        let rt = Runtime::new(Config {
            local_mem: 256 * PAGE_SIZE as u64,
            ..Config::default()
        })
        .expect("a runtime (needs userfaultfd)");
        let pages = 1024;
        let r = rt.create_region(pages * PAGE_SIZE).unwrap();
        let base = r.as_mut_ptr() as usize;
        let word = |p: usize| (base + p * PAGE_SIZE) as *mut u64;
        const LENT_FROM: usize = 500;
        const LENT_TO: usize = 540;
        let (lent_from, lent_to) = (LENT_FROM, LENT_TO);
        fn outside(p: usize) -> bool {
            !(LENT_FROM..LENT_TO).contains(&p)
        }
        for p in 0..pages {
            // SAFETY: inside the region.
            unsafe { word(p).write_volatile(stamp(p, 0)) };
        }
        let stop = Arc::new(AtomicBool::new(false));
        let churn: Vec<_> = (0..2)
            .map(|t| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut round = 0;
                    while !stop.load(Ordering::Relaxed) {
                        round += 1;
                        for p in (t..pages).step_by(2).filter(|&p| outside(p)) {
                            let w = (base + p * PAGE_SIZE + 8) as *mut u64;
                            // SAFETY: inside the region, outside the lent range.
                            unsafe { w.write_volatile(stamp(p, round)) };
                        }
                    }
                })
            })
            .collect();
        let (a, len) = (
            base + lent_from * PAGE_SIZE,
            (lent_to - lent_from) * PAGE_SIZE,
        );
        rt.lend(a, len).unwrap();
        // SAFETY: plain syscalls; the mapping goes over the lent range, which is ours.
        let fd = unsafe { libc::memfd_create(c"lend-test".as_ptr(), 0) };
        assert!(fd >= 0);
        // SAFETY: as above.
        unsafe {
            assert_eq!(libc::ftruncate(fd, len as i64), 0);
            let flags = libc::MAP_SHARED | libc::MAP_FIXED;
            let prot = libc::PROT_READ | libc::PROT_WRITE;
            let m = libc::mmap(a as *mut libc::c_void, len, prot, flags, fd, 0);
            assert_eq!(m as usize, a);
            let m2 = libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0);
            for p in lent_from..lent_to {
                word(p).write_volatile(!stamp(p, 0));
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
            for p in lent_from..lent_to {
                let other = (m2 as usize + (p - lent_from) * PAGE_SIZE) as *const u64;
                assert_eq!(other.read_volatile(), !stamp(p, 0), "the shared view");
            }
            libc::munmap(m2, len);
            libc::close(fd);
        }
        stop.store(true, Ordering::Relaxed);
        for t in churn {
            t.join().unwrap();
        }
        // SAFETY: the shared mapping over the lent range is ours to replace.
        unsafe { rt.take_back(a, len) }.unwrap();
        rt.protect(a, len, libc::PROT_READ | libc::PROT_WRITE)
            .unwrap();
        for p in lent_from..lent_to {
            // SAFETY: inside the region, readable again.
            assert_eq!(unsafe { word(p).read_volatile() }, 0, "page {p} taken back");
            // SAFETY: as above.
            unsafe { word(p).write_volatile(stamp(p, 7)) };
        }
        for p in 0..pages {
            let want = if outside(p) { stamp(p, 0) } else { stamp(p, 7) };
            // SAFETY: inside the region.
            assert_eq!(unsafe { word(p).read_volatile() }, want, "page {p}");
        }
        assert!(rt.stats().pages_evicted > 1000, "{:?}", rt.stats());
    }
}
