//! The file tier: far pages in a file on a disk, read and written with direct I/O (the page
//! cache would keep them in memory again), in runs of contiguous slots.
//!
//! The file has no name (`O_TMPFILE`, or unlinked at once where that is refused): it is gone
//! when the process ends, killed or not, and nothing else can open it. Slots are handed out
//! from clusters of 64 (256 KiB), lowest first inside the cluster being filled, so that the
//! pages of a write-back batch land side by side and go out in few writes (Linux's swap
//! allocates clusters for the same reason); a cluster whose last page is freed goes back to
//! the pool and its disk space to the file system (a punched hole). A full or failing disk
//! refuses the write ([`BackendError::Full`] / `Failed`): the runtime keeps those pages local
//! and says so; nothing is dropped.
//!
//! A child made by `fork()` keeps reading its far pages from the parent's file, through
//! the descriptor it inherited, and writes its own evictions to a file of its own: a slot
//! number carries the generation of the file it is in (the parent's, the child's, a
//! grandchild's). The parent keeps the slots in use at the fork until the child is gone
//! (`pins.rs`).

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};

use parking_lot::Mutex;

use farmem_proto::{IoClass, PageKey};
use farmem_sys::mem::PAGE_SIZE;

use super::awake::Awake;
use super::error::BackendError;
use super::index::PageIndex;
use super::io::{short_buffer, Backend, Completion, FarUsage, IoDone, PageBuf};
use super::pins::Pins;
use super::uring::{self, ReadRun};

/// Slots per cluster: one `u64` of bits, which is also the layout `pins.rs` takes.
const CLUSTER: u32 = 64;
/// A stored slot number: the file's generation above this bit, the slot in it below.
const GEN_SHIFT: u32 = 28;
const SLOT_MASK: u32 = (1 << GEN_SHIFT) - 1;
/// Files one process can read: its own and its forebears' (a fork deeper than this brings
/// the far pages back instead).
const GENS: usize = 1 << (32 - GEN_SHIFT);
/// Clusters given disk space at once when the file grows (16 MiB).
///
/// The file's space is allocated before pages are written to it, never by the writes: on
/// ext4 a direct write that extends the file or fills a hole takes the inode's lock
/// exclusively for the whole write, and every read of a faulting page (which takes it
/// shared) waits behind it. Reads beside 64 KiB writes (`probes/read_under_writes.c`): avg
/// 142-160 µs with writes that grow the file, 126-135 µs with writes into allocated space,
/// 85-110 µs with no writer. In the suite's memcached at 25% (1.1 GB written back while it
/// reads) the difference was within the run-to-run noise (3 alternated pairs).
const PREALLOCATE: u32 = 64;
/// Least free space a directory must have to be accepted for a file tier.
const MIN_FREE: u64 = 64 << 20;
const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// Disk space to allocate before a write: the file's growth and punched clusters.
#[derive(Default)]
struct Allocation {
    grow: Option<std::ops::Range<u32>>,
    /// The end of the clusters the slots need (the growth may go further).
    needed_end: u32,
    holes: Vec<u32>,
}

/// Slot allocation over clusters of 64 slots.
#[derive(Default)]
struct Slots {
    /// Per cluster: a bit per slot in use.
    used: Vec<u64>,
    /// Clusters with no slot in use (their disk space punched out).
    empty: Vec<u32>,
    /// The cluster being filled.
    current: Option<u32>,
    /// Slots in use.
    live: u64,
    /// Clusters below this one have had disk space allocated (some since punched out).
    allocated: u32,
    /// Per cluster: its space was punched out and must be allocated again before a write.
    holes: Vec<bool>,
}

impl Slots {
    /// `n` free slots, as contiguous as the free space allows; `None` when the file would
    /// grow past `max_clusters`.
    fn take(&mut self, n: usize, max_clusters: u32) -> Option<Vec<u32>> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let c = match self.current {
                Some(c) if self.used[c as usize] != u64::MAX => c,
                _ => match self.next_cluster(max_clusters) {
                    Some(c) => c,
                    None => {
                        self.give(&out);
                        return None;
                    }
                },
            };
            self.current = Some(c);
            let bits = &mut self.used[c as usize];
            while out.len() < n && *bits != u64::MAX {
                let i = (!*bits).trailing_zeros();
                *bits |= 1 << i;
                out.push(c * CLUSTER + i);
            }
        }
        self.live += n as u64;
        Some(out)
    }

    /// An empty cluster, a new one, or else the one with the most free slots.
    fn next_cluster(&mut self, max_clusters: u32) -> Option<u32> {
        if let Some(c) = self.empty.pop() {
            return Some(c);
        }
        if (self.used.len() as u32) < max_clusters {
            self.used.push(0);
            return Some(self.used.len() as u32 - 1);
        }
        let (c, bits) = self
            .used
            .iter()
            .enumerate()
            .min_by_key(|(_, b)| b.count_ones())?;
        (*bits != u64::MAX).then_some(c as u32)
    }

    /// Free slots; returns the clusters that became empty. They are not handed out again
    /// until [`Slots::reuse`] gets them back: their space is punched out first, and a hole
    /// punched after a new write would lose it.
    fn give(&mut self, slots: &[u32]) -> Vec<u32> {
        let mut emptied = Vec::new();
        for &s in slots {
            let c = s / CLUSTER;
            let bits = &mut self.used[c as usize];
            debug_assert!(*bits & (1 << (s % CLUSTER)) != 0, "slot {s} freed twice");
            *bits &= !(1 << (s % CLUSTER));
            self.live -= 1;
            if *bits == 0 && self.current != Some(c) {
                // Reserved (all bits set) until punched, so nothing is placed there.
                *bits = u64::MAX;
                emptied.push(c);
            }
        }
        emptied
    }

    /// Clusters emptied by [`Slots::give`], punched out now: free for use.
    fn reuse(&mut self, clusters: &[u32]) {
        for &c in clusters {
            self.used[c as usize] = 0;
            self.empty.push(c);
            if self.holes.len() <= c as usize {
                self.holes.resize(c as usize + 1, false);
            }
            self.holes[c as usize] = true;
        }
    }

    /// The clusters that `slots` (just taken) lie in and that have no disk space yet, marked
    /// as allocated: past the allocated end, a step of at least [`PREALLOCATE`] clusters (up
    /// to `max_clusters`); below it, each punched cluster. [`Slots::unallocate`] undoes it.
    fn claim_space(&mut self, slots: &[u32], max_clusters: u32) -> Allocation {
        let mut out = Allocation::default();
        let end = slots.iter().map(|s| s / CLUSTER + 1).max().unwrap_or(0);
        if end > self.allocated {
            let to = (self.allocated + PREALLOCATE).min(max_clusters).max(end);
            out.grow = Some(self.allocated..to);
            out.needed_end = end;
            self.allocated = to;
        }
        for &s in slots {
            let c = (s / CLUSTER) as usize;
            if self.holes.get(c).copied().unwrap_or(false) {
                self.holes[c] = false;
                out.holes.push(c as u32);
            }
        }
        out
    }

    /// Allocating `a` failed: its clusters are holes again (the growth is retried by the
    /// next write).
    fn unallocate(&mut self, a: &Allocation) {
        if let Some(g) = &a.grow {
            if self.allocated == g.end {
                self.allocated = g.start;
            }
        }
        for &c in &a.holes {
            self.holes[c as usize] = true;
        }
    }
}

pub struct FileBackend {
    /// The file this process writes (its generation is `gen`).
    file: File,
    dir: PathBuf,
    /// Slot numbers with their generation.
    index: PageIndex<u32>,
    /// Slots of `file`, by number within it.
    slots: Mutex<Slots>,
    max_clusters: u32,
    /// The generation of `file`: how many forks (that kept far pages far) lie between the
    /// process that made the first file and this one.
    gen: AtomicU32,
    /// Descriptors of the forebears' files, by generation (read only).
    old_files: [AtomicI32; GENS],
    /// Pages this process reads from forebears' files.
    inherited: AtomicU64,
    /// False when a forked child could not make a file of its own: it writes nothing then.
    writable: AtomicBool,
    pins: Pins,
    /// Keeps the reading CPU out of its halt while a read is in flight.
    awake: Awake,
    /// The CPUs the disk's completions interrupt, when not all (read once at the start).
    completion_cpus: Option<Vec<u32>>,
    /// Calls that read from the disk.
    reads: AtomicU64,
    /// The file system allocates space on request (`fallocate`); false once refused.
    fallocates: AtomicBool,
}

/// Why `dir` cannot hold a file tier, if it cannot: missing, not a directory, in memory
/// (tmpfs), not writable, or nearly full. Checked before a program starts.
pub fn check_dir(dir: &Path) -> Result<(), BackendError> {
    let bad = |why: String| {
        BackendError::Failed(format!("far-memory directory {}: {why}", dir.display()))
    };
    let meta = std::fs::metadata(dir).map_err(|e| bad(e.to_string()))?;
    if !meta.is_dir() {
        return Err(bad("not a directory".into()));
    }
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| bad("a path with a NUL byte".into()))?;
    // SAFETY: `c` is a valid C string and `st` a zeroed statfs the call fills.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(bad(std::io::Error::last_os_error().to_string()));
    }
    let kind = st.f_type as i64;
    if kind == TMPFS_MAGIC || kind == RAMFS_MAGIC {
        return Err(bad(
            "it is in memory (tmpfs): a file tier there saves nothing; choose a directory on \
             a disk"
                .into(),
        ));
    }
    let free = st.f_bavail as u64 * st.f_bsize as u64;
    if free < MIN_FREE {
        return Err(bad(format!(
            "only {} MiB free (at least {} MiB needed)",
            free >> 20,
            MIN_FREE >> 20
        )));
    }
    // SAFETY: `c` is a valid C string.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
        return Err(bad(format!(
            "not writable: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// Open an unnamed file in `dir` for direct I/O (falling back to buffered I/O where the file
/// system refuses it).
fn open_unnamed(dir: &Path) -> std::io::Result<(File, bool)> {
    let mut last = None;
    for direct in [true, false] {
        let flags = if direct { libc::O_DIRECT } else { 0 };
        let opts = |extra: i32| {
            let mut o = std::fs::OpenOptions::new();
            o.read(true)
                .write(true)
                .custom_flags(libc::O_CLOEXEC | flags | extra)
                .mode(0o600);
            o
        };
        match opts(libc::O_TMPFILE).open(dir) {
            Ok(f) => return Ok((f, direct)),
            Err(e) => last = Some(e),
        }
        // No O_TMPFILE here: a named file, unlinked at once.
        let name = dir.join(format!(
            ".farmem-far-{}-{:016x}",
            std::process::id(),
            u64::from_ne_bytes(farmem_sys::random::random_bytes())
        ));
        if let Ok(f) = opts(0).create_new(true).open(&name) {
            let _ = std::fs::remove_file(&name);
            return Ok((f, direct));
        }
    }
    Err(last.expect("an error"))
}

impl FileBackend {
    /// A file tier in `dir` holding at most `max_bytes`.
    pub fn new(dir: &Path, max_bytes: u64) -> Result<FileBackend, BackendError> {
        check_dir(dir)?;
        let (file, direct) = open_unnamed(dir).map_err(|e| {
            BackendError::Failed(format!(
                "far-memory directory {}: cannot create the far file: {e}",
                dir.display()
            ))
        })?;
        // Out of the program's way (it may close every descriptor it did not open).
        let file = farmem_sys::fds::keep(file);
        if !direct {
            tracing::warn!(
                "far file in {}: direct I/O refused, pages also pass through the page cache",
                dir.display()
            );
        }
        let cluster_bytes = CLUSTER as u64 * PAGE_SIZE as u64;
        let completion_cpus = farmem_sys::disk_irqs::completion_cpus(file.as_raw_fd());
        tracing::debug!("far file's disk completes on CPUs {completion_cpus:?} (None: all)");
        Ok(FileBackend {
            file,
            dir: dir.to_path_buf(),
            index: PageIndex::new(),
            slots: Mutex::new(Slots::default()),
            max_clusters: (max_bytes / cluster_bytes).clamp(1, (SLOT_MASK / CLUSTER) as u64) as u32,
            gen: AtomicU32::new(0),
            old_files: std::array::from_fn(|_| AtomicI32::new(-1)),
            inherited: AtomicU64::new(0),
            writable: AtomicBool::new(true),
            pins: Pins::default(),
            awake: Awake::new(),
            completion_cpus,
            reads: AtomicU64::new(0),
            fallocates: AtomicBool::new(true),
        })
    }

    fn gen(&self) -> u32 {
        self.gen.load(Ordering::Relaxed)
    }

    /// The descriptor of the file holding stored slot `s`.
    fn fd_of(&self, s: u32) -> RawFd {
        let g = s >> GEN_SHIFT;
        if g == self.gen() {
            self.file.as_raw_fd()
        } else {
            self.old_files[g as usize].load(Ordering::Relaxed)
        }
    }

    fn failed(&self, what: &str, e: std::io::Error) -> BackendError {
        let msg = format!("far file in {}: {what}: {e}", self.dir.display());
        match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG) => BackendError::Full(msg),
            _ => BackendError::Failed(msg),
        }
    }

    /// Give stored slots back: those of this process's file to its pool (unless a forked
    /// child still reads them), punching out the clusters that emptied; a forebear's are
    /// only no longer read.
    fn free_slots(&self, stored: &[u32]) {
        if stored.is_empty() {
            return;
        }
        let gen = self.gen();
        let mut own = Vec::with_capacity(stored.len());
        for &s in stored {
            if s >> GEN_SHIFT == gen {
                own.push(s & SLOT_MASK);
            } else {
                self.inherited.fetch_sub(1, Ordering::Relaxed);
            }
        }
        let own = self.pins.release(own);
        if own.is_empty() {
            return;
        }
        let emptied = self.slots.lock().give(&own);
        if emptied.is_empty() {
            return;
        }
        for &c in &emptied {
            let len = CLUSTER as i64 * PAGE_SIZE as i64;
            // SAFETY: plain fallocate on our own descriptor; failure only keeps disk space.
            unsafe {
                libc::fallocate(
                    self.file.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    c as i64 * len,
                    len,
                );
            }
        }
        self.slots.lock().reuse(&emptied);
    }

    /// Give the clusters claimed by [`Slots::claim_space`] disk space (see [`PREALLOCATE`]).
    /// A file system without `fallocate` is written as it is.
    fn allocate_space(&self, a: &Allocation) -> std::io::Result<()> {
        if a.grow.is_none() && a.holes.is_empty() {
            return Ok(());
        }
        let cluster = CLUSTER as i64 * PAGE_SIZE as i64;
        let fallocate = |from: u32, to: u32| {
            // SAFETY: fallocate on our own descriptor; mode 0 allocates (and extends the
            // file's size over) the range, writing nothing.
            let r = unsafe {
                libc::fallocate(
                    self.file.as_raw_fd(),
                    0,
                    from as i64 * cluster,
                    (to - from) as i64 * cluster,
                )
            };
            if r == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        };
        let mut result = Ok(());
        if let Some(g) = &a.grow {
            result = fallocate(g.start, g.end).or_else(|e| {
                // A nearly full disk may still hold what this write needs.
                if e.raw_os_error() == Some(libc::ENOSPC) && a.needed_end < g.end {
                    fallocate(g.start, a.needed_end)?;
                    let mut slots = self.slots.lock();
                    if slots.allocated == g.end {
                        slots.allocated = a.needed_end;
                    }
                    Ok(())
                } else {
                    Err(e)
                }
            });
        }
        for &c in &a.holes {
            if result.is_err() {
                break;
            }
            result = fallocate(c, c + 1);
        }
        match result {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                self.fallocates.store(false, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                self.slots.lock().unallocate(a);
                Err(e)
            }
        }
    }

    /// Runs `(first page of the buffer, first slot, pages)` where both the buffer's pages and
    /// the slots are consecutive: one read or write each.
    fn runs(items: &[(usize, u32)]) -> Vec<(usize, u32, usize)> {
        let mut out: Vec<(usize, u32, usize)> = Vec::new();
        for &(i, s) in items {
            match out.last_mut() {
                Some((b, first, n))
                    if *first + *n as u32 == s
                        && *b + *n == i
                        && s >> GEN_SHIFT == *first >> GEN_SHIFT =>
                {
                    *n += 1
                }
                _ => out.push((i, s, 1)),
            }
        }
        out
    }

    /// Store the pages of `buf` at the given positions under their keys.
    pub(crate) fn write_pages(
        &self,
        items: &[(usize, PageKey)],
        buf: &PageBuf,
    ) -> Result<(), BackendError> {
        if items.is_empty() {
            return Ok(());
        }
        if !self.writable.load(Ordering::Relaxed) {
            return Err(BackendError::Full(format!(
                "no far file of this process's own in {} (a forked child that could not \
                 make one keeps its evicted pages local)",
                self.dir.display()
            )));
        }
        let (slots, space) = {
            let mut pool = self.slots.lock();
            let slots = pool.take(items.len(), self.max_clusters).ok_or_else(|| {
                BackendError::Full(format!(
                    "the far file in {} holds {} MiB, its most",
                    self.dir.display(),
                    (self.max_clusters as u64 * CLUSTER as u64 * PAGE_SIZE as u64) >> 20
                ))
            })?;
            // Claimed under the same lock as the slots (see [`PREALLOCATE`]).
            let space = if self.fallocates.load(Ordering::Relaxed) {
                pool.claim_space(&slots, self.max_clusters)
            } else {
                Allocation::default()
            };
            (slots, space)
        };
        let gen = self.gen() << GEN_SHIFT;
        let slots: Vec<u32> = slots.into_iter().map(|s| s | gen).collect();
        if let Err(e) = self.allocate_space(&space) {
            self.free_slots(&slots);
            return Err(self.failed("allocating disk space", e));
        }
        let placed: Vec<(usize, u32)> = items
            .iter()
            .map(|&(i, _)| i)
            .zip(slots.iter().copied())
            .collect();
        for (i, slot, n) in Self::runs(&placed) {
            let bytes = &buf.bytes()[i * PAGE_SIZE..(i + n) * PAGE_SIZE];
            if let Err(e) = self
                .file
                .write_all_at(bytes, (slot & SLOT_MASK) as u64 * PAGE_SIZE as u64)
            {
                self.free_slots(&slots);
                return Err(self.failed("writing pages", e));
            }
        }
        let mut old = Vec::new();
        for (&(_, k), &s) in items.iter().zip(&slots) {
            if let Some(o) = self.index.insert(k, s) {
                old.push(o);
            }
        }
        self.free_slots(&old);
        Ok(())
    }

    /// Read the pages of `items` into their positions of `buf`.
    pub(crate) fn read_pages(
        &self,
        items: &[(usize, PageKey)],
        buf: &mut PageBuf,
    ) -> Result<(), BackendError> {
        let mut placed = Vec::with_capacity(items.len());
        for &(i, k) in items {
            match self.index.get(k) {
                Some(s) => placed.push((i, s)),
                None => {
                    return Err(BackendError::Failed(format!(
                        "page {} of region {} is not in the far file",
                        k.page, k.region
                    )))
                }
            }
        }
        if placed.is_empty() {
            return Ok(());
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        let _awake = self.awake.during_read();
        let base = buf.bytes_mut().as_mut_ptr();
        let runs: Vec<ReadRun> = Self::runs(&placed)
            .into_iter()
            .map(|(i, slot, n)| ReadRun {
                fd: self.fd_of(slot),
                offset: (slot & SLOT_MASK) as u64 * PAGE_SIZE as u64,
                // SAFETY: page `i + n - 1` is within the buffer (the items' positions are).
                buf: unsafe { base.add(i * PAGE_SIZE) },
                len: n * PAGE_SIZE,
            })
            .collect();
        // SAFETY: the runs cover disjoint pages of `buf`, borrowed mutably for the call; the
        // descriptors are held open by this backend for its life.
        unsafe { uring::read_all(&runs) }.map_err(|e| self.failed("reading pages", e))
    }

    fn pages(&self) -> u64 {
        self.slots.lock().live + self.inherited.load(Ordering::Relaxed)
    }

    /// In a forked child: the file so far becomes a forebear's, read through the inherited
    /// descriptor; evictions go to a new file of the child's own.
    fn become_child(&self) {
        let gen = self.gen();
        // Owned by `old_files` from here on.
        let old = match farmem_sys::fds::keep_copy(self.file.as_fd()) {
            Ok(old) => std::os::fd::IntoRawFd::into_raw_fd(old),
            Err(e) => farmem_sys::process::fatal(&format!(
                "fork: cannot keep the parent's far file open in the child: {e}"
            )),
        };
        self.old_files[gen as usize].store(old, Ordering::Relaxed);
        let mut slots = self.slots.lock();
        self.inherited.fetch_add(slots.live, Ordering::Relaxed);
        *slots = Slots::default();
        match open_unnamed(&self.dir) {
            Ok((f, _)) => {
                let new = std::os::fd::OwnedFd::from(f);
                if let Err(e) = farmem_sys::mem::replace_fd(self.file.as_raw_fd(), new) {
                    self.no_file_of_own(e);
                }
            }
            Err(e) => self.no_file_of_own(e),
        }
        self.gen.store(gen + 1, Ordering::Relaxed);
    }

    fn no_file_of_own(&self, e: std::io::Error) {
        tracing::warn!(
            "forked child: no far file of its own in {} ({e}); its evicted pages stay local",
            self.dir.display()
        );
        self.writable.store(false, Ordering::Relaxed);
    }
}

impl Backend for FileBackend {
    fn describe(&self) -> String {
        format!("file://{}", self.dir.display())
    }

    fn open_region(&self, _region: u32, _npages: u64) -> Result<(), BackendError> {
        Ok(())
    }

    fn close_region(&self, region: u32) {
        let freed = self.index.remove_region(region);
        self.free_slots(&freed);
    }

    fn submit_read(&self, _class: IoClass, keys: Vec<PageKey>, mut buf: PageBuf) -> Completion {
        buf.set_len(keys.len());
        let items: Vec<(usize, PageKey)> = keys.iter().copied().enumerate().collect();
        match self.read_pages(&items, &mut buf) {
            Ok(()) => Completion::ready(Ok(IoDone { keys, buf })),
            Err(e) => Completion::ready(Err(e)),
        }
    }

    fn submit_write(&self, _class: IoClass, keys: Vec<PageKey>, buf: PageBuf) -> Completion {
        if let Some(short) = short_buffer(&keys, &buf) {
            return short;
        }
        let items: Vec<(usize, PageKey)> = keys.iter().copied().enumerate().collect();
        match self.write_pages(&items, &buf) {
            Ok(()) => Completion::ready(Ok(IoDone { keys, buf })),
            Err(e) => Completion::ready(Err(e)),
        }
    }

    fn fork_keeps_far(&self) -> bool {
        (self.gen() as usize) < GENS - 1
    }

    fn fork_prepare(&self) {
        self.pins.prepare(self.slots.lock().used.clone());
    }

    fn fork_parent(&self) {
        self.pins.parent();
    }

    fn fork_child(&self) {
        self.pins.child();
        self.become_child();
    }

    fn forget(&self, keys: &[PageKey]) {
        let mut freed = Vec::new();
        for &k in keys {
            if let Some(s) = self.index.remove(k) {
                freed.push(s);
            }
        }
        self.free_slots(&freed);
    }

    fn stored_bytes(&self) -> u64 {
        self.pages() * PAGE_SIZE as u64
    }

    fn usage(&self) -> FarUsage {
        let pages = self.pages();
        FarUsage {
            pages,
            stored_bytes: pages * PAGE_SIZE as u64,
            held_bytes: self.index.table_bytes() as u64,
            file_bytes: pages * PAGE_SIZE as u64,
        }
    }

    fn longest_wait(&self) -> std::time::Duration {
        // Requests complete during their submission (a stuck disk blocks in the kernel).
        std::time::Duration::from_secs(120)
    }

    fn completes_inline(&self) -> bool {
        true
    }

    fn completion_cpus(&self) -> Option<Vec<u32>> {
        self.completion_cpus.clone()
    }

    fn disk_reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    fn reads_in_parallel(&self) -> bool {
        uring::usable()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        std::env::var_os("FARMEM_TEST_FAR_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/tmp"))
    }

    fn keys(region: u32, pages: std::ops::Range<u64>) -> Vec<PageKey> {
        pages.map(|page| PageKey { region, page }).collect()
    }

    fn filled(n: usize, salt: u8) -> PageBuf {
        let mut b = PageBuf::new(n);
        b.set_len(n);
        for (i, x) in b.bytes_mut().iter_mut().enumerate() {
            *x = (i / 7) as u8 ^ salt;
        }
        b
    }

    #[test]
    fn pages_come_back_and_slots_are_reused() {
        let b = FileBackend::new(&dir(), 64 << 20).unwrap();
        let k = keys(1, 0..100);
        let w = filled(100, 3);
        let want = w.bytes().to_vec();
        let t = std::time::Duration::from_secs(10);
        b.submit_write(IoClass::WriteBack, k.clone(), w)
            .wait(t)
            .unwrap();
        assert_eq!(b.usage().pages, 100);
        let got = b
            .submit_read(IoClass::Demand, k.clone(), PageBuf::new(100))
            .wait(t)
            .unwrap();
        assert_eq!(got.buf.bytes(), &want[..]);
        // Rewriting moves the pages to new slots and frees the old ones.
        b.submit_write(IoClass::WriteBack, k.clone(), filled(100, 9))
            .wait(t)
            .unwrap();
        assert_eq!(b.usage().pages, 100);
        let got = b
            .submit_read(IoClass::Demand, k[40..41].to_vec(), PageBuf::new(1))
            .wait(t)
            .unwrap();
        assert_eq!(
            got.buf.bytes(),
            &filled(100, 9).bytes()[40 * PAGE_SIZE..41 * PAGE_SIZE]
        );
        b.forget(&k[..50]);
        assert_eq!(b.usage().pages, 50);
        assert!(
            b.submit_read(IoClass::Demand, k[..1].to_vec(), PageBuf::new(1))
                .wait(t)
                .is_err(),
            "a forgotten page is an error, never zeros"
        );
        b.close_region(1);
        assert_eq!(b.usage().pages, 0);
    }

    #[test]
    fn a_full_file_refuses_writes_and_keeps_what_it_has() {
        let b = FileBackend::new(&dir(), (2 * CLUSTER as usize * PAGE_SIZE) as u64).unwrap();
        let t = std::time::Duration::from_secs(10);
        let k = keys(2, 0..128);
        b.submit_write(IoClass::WriteBack, k.clone(), filled(128, 1))
            .wait(t)
            .unwrap();
        let more = b
            .submit_write(IoClass::WriteBack, keys(2, 128..129), filled(1, 2))
            .wait(t);
        assert!(
            matches!(more, Err(BackendError::Full(_))),
            "{:?}",
            more.err()
        );
        let got = b
            .submit_read(IoClass::Demand, k, PageBuf::new(128))
            .wait(t)
            .unwrap();
        assert_eq!(got.buf.bytes(), filled(128, 1).bytes());
    }

    #[test]
    fn bad_directories_are_named() {
        let e = FileBackend::new(Path::new("/nonexistent/far"), 1 << 30)
            .err()
            .unwrap();
        assert!(e.to_string().contains("/nonexistent/far"), "{e}");
        let e = check_dir(Path::new("/dev/shm")).err().unwrap();
        assert!(e.to_string().contains("tmpfs"), "{e}");
        let e = check_dir(Path::new("/proc/self/status")).err().unwrap();
        assert!(e.to_string().contains("not a directory"), "{e}");
    }

    #[test]
    fn slots_fill_clusters_in_order_and_empty_ones_come_back() {
        let mut s = Slots::default();
        let a = s.take(70, 10).unwrap();
        assert_eq!(
            a,
            (0..70).collect::<Vec<u32>>(),
            "contiguous from the start"
        );
        let emptied = s.give(&a[..64]);
        assert_eq!(emptied, vec![0], "cluster 0 is empty again");
        assert!(
            s.take(58, 10).unwrap().iter().all(|&x| x >= 64),
            "not reused before its hole is punched"
        );
        s.reuse(&emptied);
        s.give(&(70..128).collect::<Vec<u32>>());
        let b = s.take(64, 10).unwrap();
        assert_eq!(
            b[..58],
            (70..128).collect::<Vec<u32>>()[..],
            "the current cluster first"
        );
        assert_eq!(s.live, 70 - 64 + 64);
    }

    #[test]
    fn space_is_allocated_ahead_of_writes_and_again_after_a_punch() {
        let mut s = Slots::default();
        let a = s.take(10, 1000).unwrap();
        let got = s.claim_space(&a, 1000);
        assert_eq!(
            got.grow,
            Some(0..PREALLOCATE),
            "a step ahead of the first write"
        );
        assert!(got.holes.is_empty());
        let b = s.take(64, 1000).unwrap();
        assert!(s.claim_space(&b, 1000).grow.is_none(), "inside the step");
        // Near the most the file may hold, the step stops there.
        let mut s2 = Slots::default();
        let c = s2.take(1, 3).unwrap();
        assert_eq!(s2.claim_space(&c, 3).grow, Some(0..3));
        // A failed allocation is retried by the next write.
        let none = s2.claim_space(&c, 3);
        s2.unallocate(&none);
        assert_eq!(s2.allocated, 3, "nothing was taken: nothing undone");
        let mut s3 = Slots::default();
        let d = s3.take(1, 1000).unwrap();
        let g = s3.claim_space(&d, 1000);
        s3.unallocate(&g);
        assert_eq!(s3.claim_space(&d, 1000).grow, Some(0..PREALLOCATE));
        // An emptied cluster, once punched and reused, needs space again, once.
        let emptied = s.give(
            &a.iter()
                .chain(&b)
                .copied()
                .filter(|&x| x < 64)
                .collect::<Vec<_>>(),
        );
        assert_eq!(emptied, vec![0]);
        s.reuse(&emptied);
        let e = s.take(64 * 3, 1000).unwrap();
        let got = s.claim_space(&e, 1000);
        assert_eq!(got.holes, vec![0], "the punched cluster, once");
        assert!(s.claim_space(&e, 1000).holes.is_empty());
    }

    /// Blocks the file has on disk.
    fn blocks(b: &FileBackend) -> u64 {
        b.file
            .metadata()
            .map(|m| std::os::unix::fs::MetadataExt::blocks(&m))
            .unwrap()
            * 512
    }

    #[test]
    fn writes_go_to_allocated_space_and_scattered_pages_read_back() {
        let b = FileBackend::new(&dir(), 64 << 20).unwrap();
        let t = std::time::Duration::from_secs(10);
        let step = PREALLOCATE as u64 * CLUSTER as u64 * PAGE_SIZE as u64;
        b.submit_write(IoClass::WriteBack, keys(3, 0..200), filled(200, 5))
            .wait(t)
            .unwrap();
        if b.fallocates.load(Ordering::Relaxed) {
            assert!(
                blocks(&b) >= step,
                "{} bytes allocated, the step is {step}",
                blocks(&b)
            );
            assert!(
                b.file.metadata().unwrap().len() >= step,
                "the size covers the step"
            );
        }
        // Rewrite every other page: their slots move, so a read of the first 40 pages
        // is a request of many runs (in flight together through io_uring).
        let odd: Vec<PageKey> = keys(3, 0..200)
            .into_iter()
            .filter(|k| k.page % 2 == 1)
            .collect();
        let mut rewritten = PageBuf::new(odd.len());
        rewritten.set_len(odd.len());
        for (i, k) in odd.iter().enumerate() {
            rewritten.page_mut(i).fill(k.page as u8 ^ 0x5a);
        }
        b.submit_write(IoClass::WriteBack, odd, rewritten)
            .wait(t)
            .unwrap();
        let got = b
            .submit_read(IoClass::Demand, keys(3, 0..40), PageBuf::new(40))
            .wait(t)
            .unwrap();
        let orig = filled(200, 5);
        for p in 0..40usize {
            let page = got.buf.page(p);
            if p % 2 == 1 {
                assert!(page.iter().all(|&x| x == p as u8 ^ 0x5a), "page {p}");
            } else {
                assert_eq!(page, orig.page(p), "page {p}");
            }
        }
        // Freeing whole clusters punches them; writing there again allocates them again.
        b.forget(&keys(3, 0..200));
        let before = blocks(&b);
        b.submit_write(IoClass::WriteBack, keys(4, 0..300), filled(300, 6))
            .wait(t)
            .unwrap();
        if b.fallocates.load(Ordering::Relaxed) {
            assert!(blocks(&b) >= before, "{} < {before}", blocks(&b));
        }
        let got = b
            .submit_read(IoClass::Demand, keys(4, 0..300), PageBuf::new(300))
            .wait(t)
            .unwrap();
        assert_eq!(got.buf.bytes(), filled(300, 6).bytes());
    }
}
