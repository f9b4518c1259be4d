//! Compressed DRAM in front of a file (zswap's shape): a page that compresses to at most
//! three quarters of a page is kept compressed in this process while the compressed tier is
//! under its cap; any other page, and every page once the cap is reached, goes to the file.
//!
//! Each page lives in one tier at a time: storing it in one forgets it in the other. The
//! runtime holds a page's lock across every request on it, so no two requests on one page
//! ever race here. When the compressed tier is nearly full, its oldest pages move to the
//! file in the background (zswap's write-back): the control thread takes them
//! ([`Backend::demotion_candidates`]), locks the pages and hands them back
//! ([`Backend::demote`]), so that moving one never races a request on it either. A page
//! evicted while the tier is full still goes straight to the file.

use std::path::Path;

use farmem_proto::{IoClass, PageKey};
use farmem_sys::mem::PAGE_SIZE;

use super::codec::Codec;
use super::error::BackendError;
use super::file::FileBackend;
use super::io::{short_buffer, Backend, Completion, FarUsage, IoDone, PageBuf};
use super::local::LocalBackend;

/// Largest compressed size kept in memory: a page saving less than a quarter of itself goes
/// to the file. Kept in memory, such pages make the default save little memory: zswap keeps
/// any page that compresses below a page, and at that rule (a page less 64 bytes) the
/// suite's memcached at 25% local (scale 0.25) used 242 MiB against 87 MiB, for 262 MiB
/// natively. The price is time where most pages compress to 87-98%: dictgrow at 25% ran in
/// 38.4 s against 8.4 s, and 36.8 s with 7/8 of a page as the bound; Linux swap to a file on
/// the same disk took 41.9 s (one run of each).
const MAX_COMPRESSED: usize = PAGE_SIZE * 3 / 4;

/// The compressed tier's fill (per mille of its cap) above which its oldest pages move to
/// the file in the background, so that new evictions (the likelier to come back) find room
/// in memory rather than overflowing to the disk.
const DEMOTE_ABOVE_PERMILLE: u64 = 900;
/// ... until its live blocks are down to this (per mille of its cap).
const DEMOTE_DOWN_TO_PERMILLE: u64 = 750;

pub struct TieredBackend {
    dram: LocalBackend,
    file: FileBackend,
    /// Pages moved from the compressed tier to the file.
    demoted: std::sync::atomic::AtomicU64,
}

impl TieredBackend {
    /// Compressed DRAM of at most `dram_max` bytes in front of a file in `dir` of at most
    /// `file_max` bytes.
    pub fn new(
        codec: Codec,
        dram_max: usize,
        dir: &Path,
        file_max: u64,
    ) -> Result<TieredBackend, BackendError> {
        Ok(TieredBackend {
            dram: LocalBackend::new(Some(codec), dram_max)?,
            file: FileBackend::new(dir, file_max)?,
            demoted: Default::default(),
        })
    }
}

impl TieredBackend {
    /// Compress into the DRAM tier the pages that fit; the others (position, key) go to the
    /// file.
    fn compress_what_fits<'a>(
        &self,
        keys: &[PageKey],
        page: impl Fn(usize) -> &'a [u8],
    ) -> (Vec<PageKey>, Vec<(usize, PageKey)>) {
        let mut to_file = Vec::new();
        let mut in_dram = Vec::new();
        for (i, &k) in keys.iter().enumerate() {
            if self.dram.put_compressed(k, page(i), MAX_COMPRESSED) {
                in_dram.push(k);
            } else {
                to_file.push((i, k));
            }
        }
        (in_dram, to_file)
    }

    /// Write the file's pages (positions of `buf`), then drop the copies the new ones
    /// replace: only once the new copies are stored may the old ones go.
    fn finish_write(
        &self,
        in_dram: &[PageKey],
        to_file: &[(usize, PageKey)],
        buf: &PageBuf,
    ) -> Result<(), BackendError> {
        self.file.write_pages(to_file, buf)?;
        self.file.forget(in_dram);
        let moved: Vec<PageKey> = to_file.iter().map(|&(_, k)| k).collect();
        self.dram.forget(&moved);
        Ok(())
    }
}

impl Backend for TieredBackend {
    fn describe(&self) -> String {
        format!("{} then {}", self.dram.codec_name(), self.file.describe())
    }

    fn open_region(&self, _region: u32, _npages: u64) -> Result<(), BackendError> {
        Ok(())
    }

    fn close_region(&self, region: u32) {
        self.dram.close_region(region);
        self.file.close_region(region);
    }

    fn submit_read(&self, _class: IoClass, keys: Vec<PageKey>, mut buf: PageBuf) -> Completion {
        buf.set_len(keys.len());
        let mut from_file = Vec::new();
        for (i, &k) in keys.iter().enumerate() {
            match self.dram.try_read_into(k, buf.page_mut(i)) {
                Ok(true) => {}
                Ok(false) => from_file.push((i, k)),
                Err(e) => return Completion::ready(Err(e)),
            }
        }
        match self.file.read_pages(&from_file, &mut buf) {
            Ok(()) => Completion::ready(Ok(IoDone { keys, buf })),
            Err(e) => Completion::ready(Err(e)),
        }
    }

    fn submit_write(&self, _class: IoClass, keys: Vec<PageKey>, buf: PageBuf) -> Completion {
        if let Some(short) = short_buffer(&keys, &buf) {
            return short;
        }
        let (in_dram, to_file) = self.compress_what_fits(&keys, |i| buf.page(i));
        match self.finish_write(&in_dram, &to_file, &buf) {
            Ok(()) => Completion::ready(Ok(IoDone { keys, buf })),
            Err(e) => Completion::ready(Err(e)),
        }
    }

    fn write_in_place(
        &self,
        keys: &[PageKey],
        pages: &[&[u8]],
    ) -> Option<Result<(), BackendError>> {
        let (in_dram, to_file) = self.compress_what_fits(keys, |i| pages[i]);
        // Pages that go to the file are gathered into a buffer (runs of it are written
        // with one call each).
        let mut buf = PageBuf::new(to_file.len());
        buf.set_len(to_file.len());
        let mut items = Vec::with_capacity(to_file.len());
        for (j, &(i, k)) in to_file.iter().enumerate() {
            buf.page_mut(j).copy_from_slice(pages[i]);
            items.push((j, k));
        }
        Some(self.finish_write(&in_dram, &items, &buf))
    }

    fn forget(&self, keys: &[PageKey]) {
        self.dram.forget(keys);
        self.file.forget(keys);
    }

    fn fork_keeps_far(&self) -> bool {
        self.dram.fork_keeps_far() && self.file.fork_keeps_far()
    }

    fn fork_prepare(&self) {
        self.file.fork_prepare();
    }

    fn tidy(&self) -> usize {
        self.dram.compact()
    }

    fn store_range(&self) -> Option<(usize, usize)> {
        self.dram.store_range()
    }

    fn fork_parent(&self) {
        self.dram.after_fork();
        self.file.fork_parent();
    }

    fn fork_child(&self) {
        self.dram.after_fork();
        self.file.fork_child();
    }

    fn completion_cpus(&self) -> Option<Vec<u32>> {
        self.file.completion_cpus()
    }

    fn disk_reads(&self) -> u64 {
        self.file.disk_reads()
    }

    fn reads_in_parallel(&self) -> bool {
        self.file.reads_in_parallel()
    }

    fn demotion_candidates(&self, max: usize) -> Vec<PageKey> {
        // Only as many as bring the tier down to its mark: a small tier would otherwise be
        // emptied by one round (a round's worth of pages can be most of it).
        match self
            .dram
            .excess_over(DEMOTE_ABOVE_PERMILLE, DEMOTE_DOWN_TO_PERMILLE)
        {
            Some(bytes) => self.dram.oldest(max, bytes),
            None => Vec::new(),
        }
    }

    fn demote(&self, keys: &[PageKey], locked: &[bool]) {
        let mut buf = PageBuf::new(keys.len());
        buf.set_len(keys.len());
        let (mut moving, mut kept) = (Vec::new(), Vec::new());
        for (i, (&k, &l)) in keys.iter().zip(locked).enumerate() {
            // Under the page's lock its copy cannot change or go: read it once.
            if l && matches!(self.dram.try_read_into(k, buf.page_mut(i)), Ok(true)) {
                moving.push((i, k));
            } else if !l {
                kept.push(k);
            }
        }
        match self.file.write_pages(&moving, &buf) {
            Ok(()) => {
                for &(_, k) in &moving {
                    self.dram.take(k);
                }
                self.demoted
                    .fetch_add(moving.len() as u64, std::sync::atomic::Ordering::Relaxed);
            }
            // The file is full or failing: the pages stay compressed.
            Err(_) => kept.extend(moving.iter().map(|&(_, k)| k)),
        }
        self.dram.requeue(&kept);
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut c = vec![(
            "demoted_to_file",
            self.demoted.load(std::sync::atomic::Ordering::Relaxed),
        )];
        c.extend(self.dram.compress_counters());
        c
    }

    fn frees_on_forget(&self) -> bool {
        true
    }

    /// Compressed copies go (memory), copies in the file stay (disk).
    fn forget_fetched(&self, keys: &[PageKey]) -> Vec<bool> {
        keys.iter().map(|&k| self.dram.take_fetched(k)).collect()
    }

    fn stored_bytes(&self) -> u64 {
        self.dram.stored_bytes() + self.file.stored_bytes()
    }

    fn usage(&self) -> FarUsage {
        let (d, f) = (self.dram.usage(), self.file.usage());
        FarUsage {
            pages: d.pages + f.pages,
            stored_bytes: d.stored_bytes + f.stored_bytes,
            held_bytes: d.held_bytes + f.held_bytes,
            file_bytes: f.file_bytes,
        }
    }

    fn longest_wait(&self) -> std::time::Duration {
        self.file.longest_wait()
    }

    fn completes_inline(&self) -> bool {
        true
    }
}
