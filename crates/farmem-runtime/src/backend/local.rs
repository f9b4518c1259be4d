//! The embedded backend: pages kept in this process's ordinary memory, outside the regions,
//! optionally compressed (`codec.rs`: LZ4 or zstd). Zero set-up, and the fastest tier there is, so benchmarks on it
//! show the runtime's own overheads.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};

use parking_lot::Mutex;

use farmem_proto::{IoClass, PageKey};
use farmem_sys::mem::PAGE_SIZE;

use super::codec::Codec;
use super::compressibility::Compressibility;
use super::error::BackendError;
use super::index::PageIndex;
use super::io::{short_buffer, Backend, Completion, FarUsage, IoDone, PageBuf};
use super::slabs::{Slabs, Slot};

/// Where a stored page is, and how to read it back.
#[derive(Clone, Copy, Default)]
struct Stored {
    slot: Slot,
    /// Compressed length, 0 for a page kept raw (it did not compress below a page), or
    /// [`SAME_FILLED`].
    clen: u16,
    /// When it was stored by `put_compressed` (its place in `order`; 0: not queued).
    seq: u32,
    /// The fork generation of the process that stored it ([`LocalBackend::take_fetched`]).
    gen: u16,
}

// The index keeps one per page (64 to a chunk): 16 bytes, where zram keeps 16 too.
const _: () = assert!(std::mem::size_of::<Stored>() == 16);

/// `clen` of a page whose 8-byte words are all the same (zeros, a memset pattern: zram's
/// same-filled pages): its slot holds the word and the page is filled back from it, neither
/// compressed nor decompressed. Never a compressed length (those are below a page).
const SAME_FILLED: u16 = u16::MAX;

/// The word every 8 bytes of `page` repeat, if they do (most pages differ within a few
/// words: the test stops at the first difference).
fn same_filled(page: &[u8]) -> Option<u64> {
    let mut words = page
        .chunks_exact(8)
        .map(|w| u64::from_ne_bytes(w.try_into().expect("chunks of 8 bytes")));
    let first = words.next()?;
    (page.len().is_multiple_of(8) && words.all(|w| w == first)).then_some(first)
}

thread_local! {
    /// Compression output, reused: a page compresses here before its slot is known.
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(vec![0; Codec::max_len(PAGE_SIZE)]);
}

/// Set up this thread's compression buffer now (see `fetch::warm_thread_locals`).
pub(crate) fn warm_thread_locals() {
    SCRATCH.with(|_| ());
}

/// The queue of `put_compressed` pages, and the length at which its stale entries are next
/// dropped.
#[derive(Default)]
struct Order {
    queue: VecDeque<(PageKey, u32)>,
    compact_at: usize,
}

pub struct LocalBackend {
    /// Pages stored by `put_compressed`, oldest first, with their `seq` (an entry whose page
    /// was stored again or forgotten since is stale and skipped): the tiered store's
    /// candidates for moving to its file.
    order: Mutex<Order>,
    next_seq: AtomicU32,
    /// The compressor, if pages are compressed.
    codec: Option<Codec>,
    /// Which neighbourhoods' pages are not worth compressing, and how many pages skipped it.
    guess: Compressibility,
    skipped: AtomicU64,
    /// Pages stored as one repeated word.
    same: AtomicU64,
    index: PageIndex<Stored>,
    slabs: Slabs,
    /// Forks this process has been through, as parent or child (0 before any): a page
    /// stored by an earlier generation lies in memory that may be shared with the other side
    /// of a fork (copy-on-write).
    gen: AtomicU16,
}

impl LocalBackend {
    /// A store that may hold up to `max_bytes` of memory (blocks, after compression).
    pub fn new(codec: Option<Codec>, max_bytes: usize) -> Result<LocalBackend, BackendError> {
        let slabs = Slabs::new(max_bytes).map_err(|e| {
            BackendError::Failed(format!(
                "reserving {} MiB of address space for far pages: {e}",
                max_bytes >> 20
            ))
        })?;
        Ok(LocalBackend {
            order: Mutex::new(Order::default()),
            next_seq: AtomicU32::new(1),
            codec,
            guess: Compressibility::default(),
            skipped: AtomicU64::new(0),
            same: AtomicU64::new(0),
            index: PageIndex::new(),
            slabs,
            gen: AtomicU16::new(0),
        })
    }

    /// `v` as stored by this process now.
    fn stamped(&self, v: Stored) -> Stored {
        Stored {
            gen: self.gen.load(Ordering::Relaxed),
            ..v
        }
    }

    /// Compaction: when the store holds well beyond its live blocks
    /// ([`Slabs::worth_compacting`]), move the blocks of its sparse chunks into fuller ones
    /// and give the emptied chunks back (zsmalloc's compaction, for zram). Each block moves
    /// under its index shard's lock, as readers read it. Not in a process that forked or was
    /// forked: its blocks may be shared with the other side, and moving them would copy them.
    /// Returns the blocks moved.
    pub(crate) fn compact(&self) -> usize {
        if self.gen.load(Ordering::Relaxed) != 0 || !self.slabs.worth_compacting() {
            return 0;
        }
        let draining = self.slabs.start_draining();
        if draining.is_empty() {
            return 0;
        }
        let mut moved = 0;
        self.index.for_each_mut(|v| {
            if self.slabs.is_draining(v.slot, &draining) {
                // SAFETY: the entry's shard is locked: no one reads, writes or frees its slot
                // meanwhile (every use of a stored slot holds that lock or owns the entry).
                if let Some(n) = unsafe { self.slabs.relocate(v.slot) } {
                    v.slot = n;
                    moved += 1;
                }
            }
        });
        self.slabs.stop_draining(&draining);
        moved
    }

    /// After a fork, in the parent and in the child: what was stored so far is the other
    /// side's too.
    pub(crate) fn after_fork(&self) {
        self.gen.fetch_add(1, Ordering::Relaxed);
    }

    /// Forget page `k`, just fetched back, unless it was stored before a fork this process
    /// went through: that copy lies in memory it may share with the other side (copy-on-
    /// write), so forgetting it frees nothing, and storing the page again would take new
    /// memory, where keeping the copy lets the page, if unchanged, be dropped at its next
    /// eviction. A parent and child that both read the parent's far heap each stored all of
    /// it again (`bench programs`' c-fork at 25%: 995 MiB used against Linux's 783). The
    /// price, once the other side is gone: such a page is held twice (local and its copy)
    /// while it is local, as every page is where far copies are kept. Whether it was
    /// forgotten.
    pub(crate) fn take_fetched(&self, k: PageKey) -> bool {
        let now = self.gen.load(Ordering::Relaxed);
        // Before any fork every copy is this process's: one lookup, as before. The page is
        // locked by the fetch: its entry cannot change between the two looks.
        if now != 0 && self.index.get(k).is_some_and(|s| s.gen != now) {
            return false;
        }
        self.take(k)
    }

    /// Whether to compress page `k` (its neighbours have been compressing); counted if not.
    fn worth_compressing(&self, k: PageKey) -> bool {
        let worth = self.guess.worth_trying(k);
        if !worth {
            self.skipped.fetch_add(1, Ordering::Relaxed);
        }
        worth
    }

    /// Store page `k` as its repeated word if it is one (only where pages are compressed:
    /// `local://` measures the mechanism with every page kept as it is).
    /// Such a page stays here: it is never a candidate for the tiered store's file (`seq` 0).
    fn store_same_filled(&self, page: &[u8]) -> Option<Stored> {
        let word = same_filled(page)?;
        let slot = self.slabs.alloc(8)?;
        // SAFETY: a fresh slot of at least 8 bytes, ours alone.
        unsafe { self.slabs.fill(slot, &word.to_ne_bytes()) };
        self.same.fetch_add(1, Ordering::Relaxed);
        Some(Stored {
            slot,
            clen: SAME_FILLED,
            seq: 0,
            gen: 0,
        })
    }

    /// Store page `k`: compressed if that saves at least a size class, else raw.
    /// Store each page under its key, replacing what the key held.
    fn store_all(&self, keys: &[PageKey], pages: &[&[u8]]) -> Result<(), BackendError> {
        for (&k, page) in keys.iter().zip(pages) {
            let v = self.store(k, page)?;
            if let Some(o) = self.index.insert(k, self.stamped(v)) {
                self.slabs.free(o.slot);
            }
        }
        Ok(())
    }

    fn store(&self, k: PageKey, page: &[u8]) -> Result<Stored, BackendError> {
        let full = || {
            BackendError::Full(format!(
                "the in-process far store holds {} MiB, its most",
                self.slabs.held_bytes() >> 20
            ))
        };
        if self.codec.is_some() {
            if let Some(v) = self.store_same_filled(page) {
                return Ok(v);
            }
        }
        if let Some(codec) = self.codec.filter(|_| self.worth_compressing(k)) {
            let got = SCRATCH.with(|s| {
                let mut s = s.borrow_mut();
                let n = codec.compress(page, &mut s[..]);
                let worth = n.is_some_and(|n| Slabs::slot_size_for(n) < PAGE_SIZE);
                self.guess.record(k, worth);
                let n = n.filter(|_| worth)?;
                let slot = self.slabs.alloc(n);
                if let Some(slot) = slot {
                    // SAFETY: a fresh slot of at least `n` bytes, ours alone.
                    unsafe { self.slabs.fill(slot, &s[..n]) };
                }
                Some(slot.map(|slot| Stored {
                    slot,
                    clen: n as u16,
                    seq: 0,
                    gen: 0,
                }))
            });
            if let Some(r) = got {
                return r.ok_or_else(full);
            }
        }
        let slot = self.slabs.alloc(PAGE_SIZE).ok_or_else(full)?;
        // SAFETY: a fresh page-sized slot, ours alone.
        unsafe { self.slabs.fill(slot, page) };
        Ok(Stored {
            slot,
            clen: 0,
            seq: 0,
            gen: 0,
        })
    }

    /// Store page `k` compressed if it compresses to `max_len` bytes or less and the store
    /// has room; `false` if not (nothing stored, any old copy of `k` kept).
    pub(crate) fn put_compressed(&self, k: PageKey, page: &[u8], max_len: usize) -> bool {
        let codec = self.codec.unwrap_or_default();
        if let Some(v) = self.store_same_filled(page) {
            if let Some(o) = self.index.insert(k, self.stamped(v)) {
                self.slabs.free(o.slot);
            }
            return true;
        }
        if !self.worth_compressing(k) {
            return false;
        }
        let stored = SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            let n = codec.compress(page, &mut s[..]);
            let worth = n.is_some_and(|n| n <= max_len);
            self.guess.record(k, worth);
            let n = n.filter(|_| worth)?;
            let slot = self.slabs.alloc(n)?;
            // SAFETY: a fresh slot of at least `n` bytes, ours alone.
            unsafe { self.slabs.fill(slot, &s[..n]) };
            Some(Stored {
                slot,
                clen: n as u16,
                seq: self.next_seq.fetch_add(1, Ordering::Relaxed).max(1),
                gen: 0,
            })
        });
        let Some(v) = stored else { return false };
        {
            let mut order = self.order.lock();
            order.queue.push_back((k, v.seq));
            // Pages fetched back or stored again leave stale entries: drop them once the
            // queue has doubled since the last time (amortized, a lookup per entry put).
            if order.queue.len() > order.compact_at {
                order
                    .queue
                    .retain(|&(k, seq)| self.index.get(k).is_some_and(|s| s.seq == seq));
                order.compact_at = 2 * order.queue.len() + 4096;
            }
        }
        if let Some(o) = self.index.insert(k, self.stamped(v)) {
            self.slabs.free(o.slot);
        }
        true
    }

    /// Bytes of live blocks above `live_permille`/1000 of the cap, if the store's memory is
    /// above `held_permille`/1000 of it (freeing blocks does not always free chunks: a chunk
    /// goes back only when empty, so the first condition alone would empty the store).
    pub(crate) fn excess_over(&self, held_permille: u64, live_permille: u64) -> Option<u64> {
        let max = self.slabs.max_held();
        let live = self.slabs.slot_bytes();
        (self.slabs.held_bytes() * 1000 > max * held_permille && live * 1000 > max * live_permille)
            .then(|| live - max * live_permille / 1000)
    }

    /// The oldest pages stored by `put_compressed` and still held, up to `n` of them or until
    /// their blocks add up to `bytes`, taken out of the queue (give back those not moved with
    /// [`LocalBackend::requeue`]).
    pub(crate) fn oldest(&self, n: usize, bytes: u64) -> Vec<PageKey> {
        let mut order = self.order.lock();
        let mut out = Vec::with_capacity(n);
        let mut got = 0;
        while out.len() < n && got < bytes {
            let Some((k, seq)) = order.queue.pop_front() else {
                break;
            };
            if let Some(s) = self.index.get(k).filter(|s| s.seq == seq) {
                got += s.slot.size() as u64;
                out.push(k);
            }
        }
        out
    }

    /// Put pages taken by [`LocalBackend::oldest`] and not moved back in the queue (at its
    /// end: they were just looked at).
    pub(crate) fn requeue(&self, keys: &[PageKey]) {
        let mut order = self.order.lock();
        for &k in keys {
            if let Some(s) = self.index.get(k).filter(|s| s.seq != 0) {
                order.queue.push_back((k, s.seq));
            }
        }
    }

    /// Bytes of the store's own bookkeeping: the index, the queue of the tiered store's
    /// candidates and the slabs' chunk records. Like zram's tables, they are the far tier's
    /// memory, not the program's (`process_budget.rs`); in the suite's kvs at 25% they took
    /// about 100 bytes per stored page, twice what a fixed guess counted.
    fn bookkeeping_bytes(&self) -> u64 {
        let queue = self.order.lock().queue.capacity() * std::mem::size_of::<(PageKey, u32)>();
        (self.index.table_bytes() + queue + self.slabs.bookkeeping_bytes()) as u64
    }

    /// Pages not compressed because their neighbours did not compress.
    pub(crate) fn compress_counters(&self) -> Vec<(&'static str, u64)> {
        match self.codec {
            None => Vec::new(),
            Some(_) => vec![
                ("compress_skipped", self.skipped.load(Ordering::Relaxed)),
                ("same_filled", self.same.load(Ordering::Relaxed)),
            ],
        }
    }

    /// The compressor's name (`lz4` when pages are not compressed: `put_compressed` uses it).
    pub(crate) fn codec_name(&self) -> String {
        self.codec.unwrap_or_default().name()
    }

    /// Forget page `k`; whether the store held it.
    pub(crate) fn take(&self, k: PageKey) -> bool {
        match self.index.remove(k) {
            Some(o) => {
                self.slabs.free(o.slot);
                true
            }
            None => false,
        }
    }

    fn read_into(&self, k: PageKey, out: &mut [u8]) -> Result<(), BackendError> {
        if self.try_read_into(k, out)? {
            return Ok(());
        }
        Err(BackendError::Failed(format!(
            "page {} of region {} is not stored",
            k.page, k.region
        )))
    }

    /// Read page `k` into `out` if the store holds it (`false` if not: one lookup for both).
    pub(crate) fn try_read_into(&self, k: PageKey, out: &mut [u8]) -> Result<bool, BackendError> {
        // The shard stays locked while the slot is read: no one frees it meanwhile.
        let shard = self.index.shard(k);
        let Some(s) = shard.get(k) else {
            return Ok(false);
        };
        if s.clen == 0 {
            // SAFETY: the slot is live while its entry is in the shard, whose lock we hold.
            out.copy_from_slice(unsafe { self.slabs.bytes(s.slot, PAGE_SIZE) });
            return Ok(true);
        }
        if s.clen == SAME_FILLED {
            // SAFETY: as above; the slot holds the 8-byte word.
            let word = unsafe { self.slabs.bytes(s.slot, 8) };
            for w in out.chunks_exact_mut(8) {
                w.copy_from_slice(word);
            }
            return Ok(true);
        }
        // SAFETY: as above.
        let c = unsafe { self.slabs.bytes(s.slot, s.clen as usize) };
        let n = self
            .codec
            .unwrap_or_default()
            .decompress(c, out)
            .map_err(|e| {
                BackendError::Failed(format!(
                    "corrupt compressed page {} of region {}: {e}",
                    k.page, k.region
                ))
            })?;
        if n != PAGE_SIZE {
            return Err(BackendError::Failed(format!(
                "compressed page {} of region {} decodes to {n} bytes",
                k.page, k.region
            )));
        }
        Ok(true)
    }
}

impl Backend for LocalBackend {
    fn describe(&self) -> String {
        match self.codec {
            None => "local".into(),
            Some(Codec::Lz4) => "local+lz4".into(),
            Some(c) => format!("local+{}", c.name()),
        }
    }

    fn open_region(&self, _region: u32, _npages: u64) -> Result<(), BackendError> {
        Ok(())
    }

    fn close_region(&self, region: u32) {
        for v in self.index.remove_region(region) {
            self.slabs.free(v.slot);
        }
    }

    fn submit_read(&self, _class: IoClass, keys: Vec<PageKey>, mut buf: PageBuf) -> Completion {
        buf.set_len(keys.len());
        for (i, &k) in keys.iter().enumerate() {
            if let Err(e) = self.read_into(k, buf.page_mut(i)) {
                return Completion::ready(Err(e));
            }
        }
        Completion::ready(Ok(IoDone { keys, buf }))
    }

    fn submit_write(&self, _class: IoClass, keys: Vec<PageKey>, buf: PageBuf) -> Completion {
        if let Some(short) = short_buffer(&keys, &buf) {
            return short;
        }
        let pages: Vec<&[u8]> = (0..keys.len()).map(|i| buf.page(i)).collect();
        if let Err(e) = self.store_all(&keys, &pages) {
            return Completion::ready(Err(e));
        }
        drop(pages);
        Completion::ready(Ok(IoDone { keys, buf }))
    }

    fn write_in_place(
        &self,
        keys: &[PageKey],
        pages: &[&[u8]],
    ) -> Option<Result<(), BackendError>> {
        Some(self.store_all(keys, pages))
    }

    fn forget(&self, keys: &[PageKey]) {
        for &k in keys {
            self.take(k);
        }
    }

    fn fork_keeps_far(&self) -> bool {
        // The store is memory of this process: the child has its own copy.
        true
    }

    fn frees_on_forget(&self) -> bool {
        true
    }

    fn tidy(&self) -> usize {
        self.compact()
    }

    fn store_range(&self) -> Option<(usize, usize)> {
        Some(self.slabs.range())
    }

    fn forget_fetched(&self, keys: &[PageKey]) -> Vec<bool> {
        keys.iter().map(|&k| self.take_fetched(k)).collect()
    }

    fn fork_parent(&self) {
        self.after_fork();
    }

    fn fork_child(&self) {
        self.after_fork();
    }

    fn longest_wait(&self) -> std::time::Duration {
        // Every request completes during its submission: nothing is ever waited for.
        std::time::Duration::from_secs(60)
    }

    fn completes_inline(&self) -> bool {
        true
    }

    fn stored_bytes(&self) -> u64 {
        self.slabs.slot_bytes()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        self.compress_counters()
    }

    fn usage(&self) -> FarUsage {
        let pages = self.index.len() as u64;
        FarUsage {
            pages,
            stored_bytes: self.slabs.slot_bytes(),
            held_bytes: self.slabs.held_bytes() + self.bookkeeping_bytes(),
            file_bytes: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page's contents: a random prefix of 200 to 2,000 bytes, then one repeated byte, so
    /// that pages compress to blocks of many size classes.
    fn varied_page(i: u64, salt: u64) -> Vec<u8> {
        let mut v = vec![(i % 251) as u8; PAGE_SIZE];
        let mut x = (i ^ salt.rotate_left(32)).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for b in v.iter_mut().take(200 + (i % 7) as usize * 300) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        v
    }

    /// Compaction moves blocks out of sparse chunks while other threads read and store
    /// pages: the store holds less afterwards, and every page reads back as it was stored.
    #[test]
    fn compaction_gives_memory_back_and_keeps_every_page() {
        let b = LocalBackend::new(Some(Codec::Lz4), 256 << 20).unwrap();
        let key = |p: u64| PageKey { region: 1, page: p };
        const N: u64 = 40_000;
        for start in (0..N).step_by(1000) {
            let keys: Vec<PageKey> = (start..start + 1000).map(key).collect();
            let pages: Vec<Vec<u8>> = (start..start + 1000).map(|i| varied_page(i, 1)).collect();
            let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
            b.store_all(&keys, &refs).unwrap();
        }
        // Three pages in four fetched back at random: holes in every chunk.
        let kept = |i: u64| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60).is_multiple_of(4);
        for i in (0..N).filter(|&i| !kept(i)) {
            assert!(b.take(key(i)));
        }
        let held = b.slabs.held_bytes();
        assert!(
            b.slabs.worth_compacting(),
            "held {held} for {}",
            b.slabs.slot_bytes()
        );
        let check = |i: u64, salt: u64| {
            let mut out = vec![0u8; PAGE_SIZE];
            assert!(
                b.try_read_into(key(i), &mut out).unwrap(),
                "page {i} is stored"
            );
            assert!(out == varied_page(i, salt), "page {i} reads back as stored");
        };
        let stop = std::sync::atomic::AtomicBool::new(false);
        let moved = std::thread::scope(|s| {
            let readers: Vec<_> = (0..2)
                .map(|t| {
                    let (stop, check) = (&stop, &check);
                    s.spawn(move || {
                        let mut rounds = 0;
                        while !stop.load(Ordering::Relaxed) || rounds == 0 {
                            for i in (t..N).step_by(2).filter(|&i| kept(i)) {
                                check(i, 1);
                            }
                            rounds += 1;
                        }
                    })
                })
                .collect();
            let writer = s.spawn(|| {
                // New pages stored meanwhile take slots of the same classes.
                for i in N..N + 4000 {
                    let p = varied_page(i, 2);
                    b.store_all(&[key(i)], &[p.as_slice()]).unwrap();
                }
            });
            let moved = b.compact();
            writer.join().unwrap();
            stop.store(true, Ordering::Relaxed);
            for r in readers {
                r.join().unwrap();
            }
            moved
        });
        assert!(moved > 0, "blocks were moved");
        assert!(
            b.slabs.held_bytes() + (4 << 20) < held,
            "memory went back: {held} held before, {} after",
            b.slabs.held_bytes()
        );
        for i in (0..N).filter(|&i| kept(i)) {
            check(i, 1);
        }
        for i in N..N + 4000 {
            check(i, 2);
        }
    }

    fn roundtrip(codec: Option<Codec>) {
        let b = LocalBackend::new(codec, 64 << 20).unwrap();
        let keys: Vec<PageKey> = (0..4).map(|p| PageKey { region: 7, page: p }).collect();
        let mut buf = PageBuf::new(4);
        buf.set_len(4);
        for (i, x) in buf.bytes_mut().iter_mut().enumerate() {
            *x = (i % 251) as u8;
        }
        let expect = buf.bytes().to_vec();
        let done = b
            .submit_write(IoClass::WriteBack, keys.clone(), buf)
            .wait(std::time::Duration::from_secs(5))
            .unwrap();
        let got = b
            .submit_read(IoClass::Demand, keys, done.buf)
            .wait(std::time::Duration::from_secs(5))
            .unwrap();
        assert_eq!(got.buf.bytes(), &expect[..]);
        assert!(b.stored_bytes() > 0);
        let missing = b.submit_read(
            IoClass::Demand,
            vec![PageKey { region: 8, page: 0 }],
            PageBuf::new(1),
        );
        assert!(
            missing.wait(std::time::Duration::from_secs(5)).is_err(),
            "an absent page must be an error"
        );
        b.close_region(7);
        assert_eq!(b.stored_bytes(), 0);
    }

    #[test]
    fn raw_roundtrip() {
        roundtrip(None);
    }

    /// A copy stored before a fork outlives the fetch of its page after it (the other side
    /// shares its memory); one stored since is forgotten at the fetch as usual; a discard
    /// forgets either.
    #[test]
    fn copies_from_before_a_fork_are_kept_at_the_fetch() {
        let b = LocalBackend::new(Some(Codec::Lz4), 64 << 20).unwrap();
        let key = |p| PageKey { region: 3, page: p };
        let write = |keys: Vec<PageKey>, salt: u8| {
            let mut buf = PageBuf::new(keys.len());
            buf.set_len(keys.len());
            for (i, x) in buf.bytes_mut().iter_mut().enumerate() {
                *x = (i as u8).wrapping_mul(salt);
            }
            b.submit_write(IoClass::WriteBack, keys, buf)
                .wait(std::time::Duration::from_secs(5))
                .unwrap();
        };
        write(vec![key(0), key(1)], 3);
        assert_eq!(
            b.forget_fetched(&[key(0)]),
            [true],
            "no fork yet: forgotten"
        );
        b.after_fork();
        write(vec![key(2)], 5);
        assert_eq!(
            b.forget_fetched(&[key(1), key(2)]),
            [false, true],
            "kept: stored before the fork; forgotten: stored after it"
        );
        let got = b
            .submit_read(IoClass::Demand, vec![key(1)], PageBuf::new(1))
            .wait(std::time::Duration::from_secs(5))
            .expect("the kept copy reads back");
        assert!(got
            .buf
            .bytes()
            .iter()
            .enumerate()
            .all(|(i, &x)| x == (i as u8).wrapping_mul(3)));
        write(vec![key(1)], 7);
        assert_eq!(
            b.forget_fetched(&[key(1)]),
            [true],
            "stored again since the fork: forgotten"
        );
        write(vec![key(4)], 9);
        b.after_fork();
        b.forget(&[key(4)]);
        assert!(
            b.submit_read(IoClass::Demand, vec![key(4)], PageBuf::new(1))
                .wait(std::time::Duration::from_secs(5))
                .is_err(),
            "a discard forgets a copy from before a fork too"
        );
    }

    #[test]
    fn lz4_roundtrip() {
        roundtrip(Some(Codec::Lz4));
    }

    #[test]
    fn zstd_roundtrip() {
        roundtrip(Some(Codec::Zstd(3)));
    }

    /// Pages of one repeated word come back whole, through both ways in; a page that
    /// differs in its last byte only, or repeats a 12-byte pattern, is not
    /// taken for one.
    #[test]
    fn same_filled_pages_are_kept_as_their_word() {
        let b = LocalBackend::new(Some(Codec::Lz4), 64 << 20).unwrap();
        let mut pages: Vec<Vec<u8>> = vec![vec![0; PAGE_SIZE], vec![0xff; PAGE_SIZE]];
        pages.push(
            (0..PAGE_SIZE / 8)
                .flat_map(|_| 0x0123_4567_89ab_cdefu64.to_ne_bytes())
                .collect(),
        );
        let mut last = vec![0u8; PAGE_SIZE];
        last[PAGE_SIZE - 1] = 1;
        pages.push(last);
        let twelve: Vec<u8> = (0..PAGE_SIZE / 4)
            .flat_map(|i| (i as u32 % 3).to_ne_bytes())
            .collect();
        pages.push(twelve);
        let keys: Vec<PageKey> = (0..pages.len() as u64)
            .map(|p| PageKey { region: 3, page: p })
            .collect();
        let mut buf = PageBuf::new(pages.len());
        buf.set_len(pages.len());
        for (i, p) in pages.iter().enumerate() {
            buf.page_mut(i).copy_from_slice(p);
        }
        let t = std::time::Duration::from_secs(5);
        let done = b
            .submit_write(IoClass::WriteBack, keys.clone(), buf)
            .wait(t)
            .unwrap();
        let got = b
            .submit_read(IoClass::Demand, keys.clone(), done.buf)
            .wait(t)
            .unwrap();
        for (i, p) in pages.iter().enumerate() {
            assert_eq!(got.buf.page(i), &p[..], "page {i}");
        }
        assert_eq!(b.same.load(Ordering::Relaxed), 3);
        // The tiered store's way in, over the same keys.
        for (k, p) in keys.iter().zip(&pages).take(3) {
            assert!(b.put_compressed(*k, p, 64));
        }
        assert_eq!(b.same.load(Ordering::Relaxed), 6);
        assert!(
            b.oldest(16, u64::MAX).is_empty(),
            "kept, never moved to a file"
        );
        let mut out = vec![7u8; PAGE_SIZE];
        for (k, p) in keys.iter().zip(&pages).take(3) {
            assert!(b.try_read_into(*k, &mut out).unwrap());
            assert_eq!(out, *p);
        }
    }
}
