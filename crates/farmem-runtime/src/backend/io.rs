//! The backend interface: batched, asynchronous requests of whole pages, each in a priority
//! class, and the buffers and completions they travel with.

use std::alloc::{self, Layout};
use std::sync::Arc;
use std::time::{Duration, Instant};

use farmem_proto::{IoClass, PageKey};
use farmem_sys::mem::PAGE_SIZE;
use parking_lot::{Condvar, Mutex};

use super::error::BackendError;

/// A page-aligned buffer of whole pages (UFFDIO_COPY needs an aligned source).
pub struct PageBuf {
    ptr: *mut u8,
    cap_pages: usize,
    len_pages: usize,
}

// SAFETY: PageBuf owns its allocation exclusively; moving it between threads is like moving
// a Vec<u8>.
unsafe impl Send for PageBuf {}

/// Buffers of at least this many pages are mapped directly and kept in [`POOL`] when freed,
/// rather than taken from the C library's heap: glibc raises its mmap threshold after the
/// first such free, then keeps freed buffers in the arenas of the runtime threads, which
/// held 4 MiB more than needed at a sort run's end (memory the budget now counts:
/// `process_budget.rs`).
const MAPPED_PAGES: usize = 16;
/// Most bytes of freed mapped buffers kept for reuse (each reuse spares the kernel's page
/// faults on a fresh mapping).
const POOL_BYTES: usize = 1 << 20;

/// Freed mapped buffers: (address, pages).
static POOL: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

impl PageBuf {
    pub fn new(cap_pages: usize) -> PageBuf {
        let cap_pages = cap_pages.max(1);
        if cap_pages >= MAPPED_PAGES {
            return Self::mapped(cap_pages);
        }
        let layout =
            Layout::from_size_align(cap_pages * PAGE_SIZE, PAGE_SIZE).expect("page buffer layout");
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { alloc::alloc(layout) };
        if ptr.is_null() {
            alloc::handle_alloc_error(layout);
        }
        PageBuf {
            ptr,
            cap_pages,
            len_pages: 0,
        }
    }

    /// A mapped buffer of at least `want` pages: a pooled one no more than twice as large,
    /// else a new mapping.
    fn mapped(want: usize) -> PageBuf {
        let reused = {
            let mut pool = POOL.lock();
            let best = pool
                .iter()
                .enumerate()
                .filter(|(_, &(_, cap))| cap >= want && cap <= 2 * want)
                .min_by_key(|(_, &(_, cap))| cap)
                .map(|(i, _)| i);
            best.map(|i| pool.swap_remove(i))
        };
        let (ptr, cap_pages) = match reused {
            Some((p, cap)) => (p as *mut u8, cap),
            None => match farmem_sys::mem::map_anon(
                want * PAGE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
            ) {
                Ok(p) => (p, want),
                Err(_) => alloc::handle_alloc_error(
                    Layout::from_size_align(want * PAGE_SIZE, PAGE_SIZE)
                        .expect("page buffer layout"),
                ),
            },
        };
        PageBuf {
            ptr,
            cap_pages,
            len_pages: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.cap_pages
    }

    pub fn len(&self) -> usize {
        self.len_pages
    }

    pub fn is_empty(&self) -> bool {
        self.len_pages == 0
    }

    /// Set the number of pages in use (contents of newly included pages are unspecified).
    pub fn set_len(&mut self, pages: usize) {
        assert!(pages <= self.cap_pages, "page buffer overflow");
        self.len_pages = pages;
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the allocation holds cap_pages pages and len_pages <= cap_pages.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len_pages * PAGE_SIZE) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, with exclusive access through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len_pages * PAGE_SIZE) }
    }

    pub fn page(&self, i: usize) -> &[u8] {
        &self.bytes()[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]
    }

    pub fn page_mut(&mut self, i: usize) -> &mut [u8] {
        &mut self.bytes_mut()[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        if self.cap_pages >= MAPPED_PAGES {
            let mut pool = POOL.lock();
            let held: usize = pool.iter().map(|&(_, cap)| cap * PAGE_SIZE).sum();
            if held + self.cap_pages * PAGE_SIZE <= POOL_BYTES {
                pool.push((self.ptr as usize, self.cap_pages));
                return;
            }
            drop(pool);
            // SAFETY: mapped in `mapped` with this length, and no longer referenced.
            unsafe { farmem_sys::mem::unmap(self.ptr, self.cap_pages * PAGE_SIZE) };
            return;
        }
        let layout = Layout::from_size_align(self.cap_pages * PAGE_SIZE, PAGE_SIZE)
            .expect("page buffer layout");
        // SAFETY: allocated in `new` with this very layout.
        unsafe { alloc::dealloc(self.ptr, layout) };
    }
}

/// A finished request: the keys and the buffer handed back to the caller (filled for reads).
pub struct IoDone {
    pub keys: Vec<PageKey>,
    pub buf: PageBuf,
}

type Slot = Arc<(Mutex<Option<Result<IoDone, BackendError>>>, Condvar)>;

/// The result of a submitted request, now or later.
pub struct Completion(CompletionState);

enum CompletionState {
    Ready(Result<IoDone, BackendError>),
    Pending(Slot),
}

/// The backend side of a pending [`Completion`].
pub struct Completer(Slot);

impl Completion {
    /// A request that finished during submission (in-process backends).
    pub fn ready(r: Result<IoDone, BackendError>) -> Completion {
        Completion(CompletionState::Ready(r))
    }

    /// A request that finishes later, when the returned [`Completer`] is completed.
    pub fn pending() -> (Completion, Completer) {
        let slot: Slot = Arc::new((Mutex::new(None), Condvar::new()));
        (
            Completion(CompletionState::Pending(slot.clone())),
            Completer(slot),
        )
    }

    pub fn is_done(&self) -> bool {
        match &self.0 {
            CompletionState::Ready(_) => true,
            CompletionState::Pending(s) => s.0.lock().is_some(),
        }
    }

    /// Block until the request finishes, or `limit` passes. A request unanswered that long is
    /// an error ([`BackendError::Unavailable`]): the thread that should deliver the answer is
    /// stuck, or the backend is, and waiting longer would hang the program instead of
    /// stopping it with the cause.
    pub fn wait(self, limit: Duration) -> Result<IoDone, BackendError> {
        match self.0 {
            CompletionState::Ready(r) => r,
            CompletionState::Pending(slot) => {
                let deadline = Instant::now() + limit;
                let mut g = slot.0.lock();
                while g.is_none() {
                    if slot.1.wait_until(&mut g, deadline).timed_out() && g.is_none() {
                        return Err(BackendError::Unavailable(format!(
                            "no answer from far memory in {} s (the backend, or the thread \
                             that receives its answers, is stuck)",
                            limit.as_secs_f64()
                        )));
                    }
                }
                g.take().expect("completion present")
            }
        }
    }
}

impl Completer {
    pub fn complete(self, r: Result<IoDone, BackendError>) {
        *self.0 .0.lock() = Some(r);
        self.0 .1.notify_all();
    }
}

/// The error of a write whose buffer holds fewer pages than it has keys (`None`: it holds
/// enough).
pub(crate) fn short_buffer(keys: &[PageKey], buf: &PageBuf) -> Option<Completion> {
    (buf.len() < keys.len()).then(|| {
        Completion::ready(Err(BackendError::Failed(format!(
            "write of {} pages with a buffer of {}",
            keys.len(),
            buf.len()
        ))))
    })
}

/// What a far tier holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FarUsage {
    /// Pages stored (0 when the tier does not count them).
    pub pages: u64,
    /// Bytes of the stored pages as kept (after compression).
    pub stored_bytes: u64,
    /// Memory the tier holds for them: the stored bytes with their slack and bookkeeping.
    pub held_bytes: u64,
    /// Bytes of them on disk (a file tier), not in memory.
    pub file_bytes: u64,
}

/// Where far pages live. Implementations must be safe to call from many threads at once.
pub trait Backend: Send + Sync {
    /// Human-readable description (`local`, `local+lz4`, `tcp://host:port`).
    fn describe(&self) -> String;

    /// Prepare storage for a region of `npages` pages (allocation may be lazy).
    fn open_region(&self, region: u32, npages: u64) -> Result<(), BackendError>;

    /// Drop every page of a region.
    fn close_region(&self, region: u32);

    /// Read `keys.len()` pages into `buf` (whose length is set to the number of keys).
    /// Reading a page the backend does not hold is an error, never zeros.
    fn submit_read(&self, class: IoClass, keys: Vec<PageKey>, buf: PageBuf) -> Completion;

    /// Read ahead of use: like a prefetch-class [`Backend::submit_read`], except that the
    /// pages are only useful for `useful_for` from now. A backend that cannot deliver them
    /// in time may answer [`BackendError::Late`] instead (in-process backends deliver at
    /// once, so they never do).
    fn submit_prefetch(
        &self,
        keys: Vec<PageKey>,
        buf: PageBuf,
        useful_for: std::time::Duration,
    ) -> Completion {
        let _ = useful_for;
        self.submit_read(IoClass::Prefetch, keys, buf)
    }

    /// Store `keys.len()` pages from `buf`. When the completion reports success, every page
    /// is durable in the backend (the runtime may drop its local copies).
    fn submit_write(&self, class: IoClass, keys: Vec<PageKey>, buf: PageBuf) -> Completion;

    /// Store `keys.len()` pages read where they are, `pages[i]` the contents of `keys[i]`
    /// (an in-process store compresses straight from the program's write-protected page:
    /// copying each victim into a buffer first was 8% of the control thread's time when a
    /// hash table grew at 25% local). Done when it returns, as a completed
    /// [`Backend::submit_write`]. None: the backend takes buffers only.
    fn write_in_place(
        &self,
        keys: &[PageKey],
        pages: &[&[u8]],
    ) -> Option<Result<(), BackendError>> {
        let _ = (keys, pages);
        None
    }

    /// The backend no longer needs to hold these pages: their contents were discarded, or
    /// the runtime took them back and will write them again before it drops them. Pages it
    /// does not hold are ignored. Tiers that cannot free single pages may keep them.
    fn forget(&self, keys: &[PageKey]) {
        let _ = keys;
    }

    /// The runtime has just installed these pages from their far copies and asks the
    /// backend to forget the copies worth forgetting: those held in memory (a copy on disk
    /// costs no memory, and keeping it spares a write-back if the page stays unchanged).
    /// Returns, per key, whether its copy is gone. By default: all, if forgetting frees
    /// memory ([`Backend::frees_on_forget`]), else none.
    fn forget_fetched(&self, keys: &[PageKey]) -> Vec<bool> {
        let free = self.frees_on_forget();
        if free {
            self.forget(keys);
        }
        vec![free; keys.len()]
    }

    /// Whether [`Backend::forget`] frees memory: the runtime then forgets the far copy of a
    /// page as soon as it is fetched back (an exclusive cache, as zswap does), so that no
    /// page is held twice, at the price of writing it back at its next eviction.
    fn frees_on_forget(&self) -> bool {
        false
    }

    /// Bytes the backend uses to hold the pages (after compression, if any).
    fn stored_bytes(&self) -> u64;

    /// Bytes of this process's own memory that hold far pages: what [`Backend::usage`] says
    /// is held, for the in-process tiers (blocks and index). A backend whose pages are held
    /// elsewhere (a memory server) returns 0.
    fn memory_in_process(&self) -> u64 {
        self.usage().held_bytes
    }

    /// What the far tier holds for this runtime, and what that costs in memory.
    fn usage(&self) -> FarUsage {
        FarUsage {
            pages: 0,
            stored_bytes: self.stored_bytes(),
            held_bytes: self.stored_bytes(),
            file_bytes: 0,
        }
    }

    /// How long a request may take, at the most, when all is well: with a network backend,
    /// reconnecting to a lost server and sending the request again included. Waiting longer
    /// for an answer means something is stuck.
    fn longest_wait(&self) -> Duration;

    /// The program is about to end (exit, or exec another image): `release` asks the far
    /// tier to free this program's pages as soon as its connections close, instead of
    /// keeping them for it to come back; `false` takes that back (an exec that failed).
    /// The connections stay usable meanwhile: whatever the program still touches before
    /// it is gone is served. Nothing to do for in-process backends.
    fn release_at_exit(&self, release: bool) {
        let _ = release;
    }

    /// Whether a request completes during its submission, with no round trip to wait for
    /// (in-process tiers): many small write-backs then cost no more than one large one.
    fn completes_inline(&self) -> bool {
        false
    }

    /// Whether a child made by `fork()` can keep its far pages far: it then reads them from
    /// this store as it was at the fork (an in-process store is the child's own copy), and
    /// the parent's later changes never show through. Otherwise the fork brings every far
    /// page back first (`fork.rs`).
    fn fork_keeps_far(&self) -> bool {
        false
    }

    /// A fork is about to happen (no request is in flight; see `gate.rs`).
    fn fork_prepare(&self) {}

    /// After the fork, in the parent.
    fn fork_parent(&self) {}

    /// After the fork, in the child (its only thread): make the store the child's own.
    fn fork_child(&self) {}

    /// Pages the backend would move from a fast tier to a slower one now: the oldest of its
    /// compressed DRAM tier, when that is nearly full (zswap's write-back of cold pages).
    /// The runtime locks those it can and hands them to [`Backend::demote`]; none by default.
    fn demotion_candidates(&self, max: usize) -> Vec<PageKey> {
        let _ = max;
        Vec::new()
    }

    /// Move the pages of `keys` whose `locked` is true (the runtime holds their page locks:
    /// no request on them runs meanwhile) to the slower tier; keep the others as candidates.
    fn demote(&self, keys: &[PageKey], locked: &[bool]) {
        let _ = (keys, locked);
    }

    /// The CPUs that take the completion interrupts of this backend's disk, when only some
    /// of them do (`farmem_sys::disk_irqs`): a thread waiting for its reads is best on one.
    fn completion_cpus(&self) -> Option<Vec<u32>> {
        None
    }

    /// The address range of this process holding the far pages' blocks, if the backend keeps
    /// them in one (the in-process stores' slab reservation): a forked process measures how
    /// much of it it shares (`tree_budget`).
    fn store_range(&self) -> Option<(usize, usize)> {
        None
    }

    /// Tidy the backend's memory if it is worth it now (the in-process stores' compaction);
    /// called by the control thread between rounds of work. Returns the blocks moved.
    fn tidy(&self) -> usize {
        0
    }

    /// Reads this backend has made from a disk so far.
    fn disk_reads(&self) -> u64 {
        0
    }

    /// Whether one read request of several pages waits for about one device read, not one
    /// per page: a disk backend that puts a request's reads in flight together, and whose
    /// submission returns only once they are done. A fault's page and its read-ahead then go
    /// as one request (two requests would wait for the device one after the other).
    fn reads_in_parallel(&self) -> bool {
        false
    }

    /// Backend-specific counters for the statistics (reconnections, resent requests...).
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Large buffers hold their whole length, and the pool of freed ones stays within its
    /// bound however many are freed at once.
    #[test]
    fn mapped_buffers_are_whole_and_their_pool_is_bounded() {
        let mut bufs: Vec<PageBuf> = (0..64).map(|i| PageBuf::new(16 + i)).collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            assert!(b.capacity() >= 16 + i);
            b.set_len(b.capacity());
            b.bytes_mut().fill(i as u8);
        }
        for (i, b) in bufs.iter().enumerate() {
            assert!(b.bytes().iter().all(|&x| x == i as u8));
        }
        drop(bufs);
        let held: usize = POOL.lock().iter().map(|&(_, cap)| cap * PAGE_SIZE).sum();
        assert!(held <= POOL_BYTES, "{held} bytes pooled");
    }

    /// The thread that should deliver an answer is stuck (here: holds the completer and
    /// never completes it): the wait ends in an error naming the cause, not in a hang.
    #[test]
    fn a_wait_whose_deliverer_is_stuck_ends_in_an_error() {
        let (c, completer) = Completion::pending();
        // The deliverer holds the completer until the wait is over: were the wait unbounded,
        // this test would never end.
        let (release, stuck_until) = std::sync::mpsc::channel::<()>();
        let stuck = std::thread::spawn(move || {
            let _ = stuck_until.recv();
            drop(completer);
        });
        match c.wait(Duration::from_millis(100)) {
            Err(BackendError::Unavailable(m)) => assert!(m.contains("no answer"), "{m}"),
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("a request nobody answered completed"),
        }
        release.send(()).unwrap();
        stuck.join().unwrap();
    }

    #[test]
    fn an_answer_in_time_is_delivered() {
        let (c, completer) = Completion::pending();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            completer.complete(Ok(IoDone {
                keys: vec![],
                buf: PageBuf::new(1),
            }));
        });
        assert!(c.wait(Duration::from_secs(30)).is_ok());
        t.join().unwrap();
    }
}
