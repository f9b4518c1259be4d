//! Pages shared with a forked relative: evicting one frees nothing.
//!
//! After `fork()` parent and child map the same physical pages until one of them writes
//! (copy-on-write). Evicting such a page in one process only drops that process's mapping:
//! the other still holds the page, so no memory is freed, and an in-process far store even
//! adds its copy. Right after a fork a child's oldest pages (the first its policy picks) are
//! all shared, so its reclaim freed nothing while its own fetches added memory: `bench
//! programs`' python-fork at 25% peaked at 185 MiB against a 125 MiB budget (Linux with
//! zram: 147 MiB), every worker evicting pages its parent kept mapped.
//!
//! So once a process has forked or was forked, reclaim asks the kernel which victims are
//! mapped by this process alone (`/proc/self/pagemap`'s exclusive bit) and evicts those,
//! putting the others back in the policy's queue (`reclaim::evict_batch_if`). When several
//! batches in a row hold no exclusive page, the shared ones are evicted anyway: reclaim must
//! make progress.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

/// Candidates further apart than this (pages) are looked up with separate reads.
const SPAN: usize = 512;

#[derive(Default)]
pub(crate) struct SharedPages {
    /// This process has forked, or is a forked child.
    forked: AtomicBool,
    /// This process's pagemap (the pid that opened it: one inherited across a fork reads
    /// the parent's).
    pagemap: Mutex<Option<(u32, File)>>,
}

impl SharedPages {
    /// A fork happened in this process (parent or child): pages may be shared from now on.
    pub(crate) fn note_fork(&self) {
        self.forked.store(true, Ordering::Relaxed);
    }

    /// Take out of `cands` (sorted page numbers) those not mapped by this process alone, and
    /// return them; nothing if this process never forked, or the kernel does not say.
    pub(crate) fn take_shared(&self, cands: &mut Vec<usize>) -> Vec<usize> {
        if !self.forked.load(Ordering::Relaxed) || cands.is_empty() {
            return Vec::new();
        }
        let Some(exclusive) = self.exclusive(cands) else {
            return Vec::new();
        };
        let mut shared = Vec::new();
        let mut i = 0;
        cands.retain(|&v| {
            let keep = exclusive[i];
            i += 1;
            if !keep {
                shared.push(v);
            }
            keep
        });
        shared
    }

    /// For each of `cands` (sorted), whether it is present and mapped by this process alone.
    fn exclusive(&self, cands: &[usize]) -> Option<Vec<bool>> {
        let mut g = self.pagemap.lock();
        let pid = std::process::id();
        if g.as_ref().is_none_or(|(p, _)| *p != pid) {
            match File::open("/proc/self/pagemap") {
                Ok(f) => *g = Some((pid, f)),
                Err(e) => {
                    tracing::debug!("no pagemap ({e}): shared pages are evicted like others");
                    self.forked.store(false, Ordering::Relaxed);
                    return None;
                }
            }
        }
        let fd = g.as_ref().map(|(_, f)| f.as_raw_fd())?;
        let mut out = Vec::with_capacity(cands.len());
        let mut buf = Vec::new();
        let mut i = 0;
        while i < cands.len() {
            let first = cands[i];
            let mut j = i + 1;
            while j < cands.len() && cands[j] - first < SPAN {
                j += 1;
            }
            buf.resize(cands[j - 1] - first + 1, false);
            farmem_sys::mem::exclusive_pages(fd, first, &mut buf).ok()?;
            out.extend(cands[i..j].iter().map(|&v| buf[v - first]));
            i = j;
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farmem_sys::mem::PAGE_SIZE;

    /// Pages written by this process are exclusive; after a fork, the pages both processes
    /// still map are not. The child writes the first half (its copies become private, and
    /// the parent's pages its own again) and waits; the parent looks.
    #[test]
    fn pages_shared_with_a_forked_child_are_told_apart() {
        let n = 8;
        let p = farmem_sys::mem::map_anon(n * PAGE_SIZE, libc::PROT_READ | libc::PROT_WRITE)
            .expect("a mapping");
        for i in 0..n {
            // SAFETY: inside the mapping just made.
            unsafe { p.add(i * PAGE_SIZE).write(1) };
        }
        let first = p as usize / PAGE_SIZE;
        let cands: Vec<usize> = (first..first + n).collect();
        let s = SharedPages::default();
        let mut all = cands.clone();
        assert!(
            s.take_shared(&mut all).is_empty(),
            "no fork noted: not looked at"
        );
        s.note_fork();
        assert!(s.take_shared(&mut all).is_empty(), "nothing shared yet");
        assert_eq!(all, cands);
        let (mut to_child, mut to_parent) = ([0i32; 2], [0i32; 2]);
        // SAFETY: two pipes into arrays of two descriptors.
        assert!(unsafe {
            libc::pipe(to_child.as_mut_ptr()) == 0 && libc::pipe(to_parent.as_mut_ptr()) == 0
        });
        // SAFETY: the child only writes its copy of the mapping and uses the pipes (no
        // allocation, no lock) before `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        let mut byte = 0u8;
        if pid == 0 {
            for i in 0..n / 2 {
                // SAFETY: inside the child's copy of the mapping.
                unsafe { p.add(i * PAGE_SIZE).write(2) };
            }
            // SAFETY: one byte each way through the pipes, then the child ends.
            unsafe {
                libc::write(to_parent[1], (&byte as *const u8).cast(), 1);
                libc::read(to_child[0], (&mut byte as *mut u8).cast(), 1);
                libc::_exit(0);
            }
        }
        // SAFETY: waits for the child's byte.
        unsafe { libc::read(to_parent[0], (&mut byte as *mut u8).cast(), 1) };
        let mut c = cands.clone();
        let shared = s.take_shared(&mut c);
        // SAFETY: lets the child end, then reaps it.
        unsafe {
            libc::write(to_child[1], (&byte as *const u8).cast(), 1);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
            for fd in to_child.into_iter().chain(to_parent) {
                libc::close(fd);
            }
        }
        assert_eq!(
            c,
            cands[..n / 2],
            "pages the child copied are the parent's alone"
        );
        assert_eq!(shared, cands[n / 2..], "pages both still map are shared");
        // SAFETY: the mapping made above, no longer used.
        unsafe { farmem_sys::mem::unmap(p, n * PAGE_SIZE) };
    }
}
