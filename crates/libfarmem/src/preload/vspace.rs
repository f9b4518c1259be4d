//! The far address space of the transparent mode.
//!
//! One large inaccessible reservation (`PROT_NONE`, `MAP_NORESERVE`: it costs nothing) holds
//! every far byte of the program, so "is this pointer far?" is two comparisons:
//!
//! ```text
//!  base            mi_end        fine_end                                  end
//!   | mimalloc's arena | fine slabs |  direct ranges: mmap, mremap, large malloc  |
//! ```
//!
//! The reservation becomes far memory in chunks of [`CHUNK`] bytes, each a runtime region
//! made at that address on first use (registering 1 TiB up front would write 2 GiB of page
//! metadata). mimalloc asks for its part through its commit callback (`mi.rs`); the direct
//! part is handed out by a page-range allocator (best fit, coalescing), much as the kernel
//! hands out address ranges. Freed ranges are discarded first, so a range handed out always
//! reads as zeros, as fresh anonymous memory does.
//!
//! In a child forked from the program the runtime is gone: chunks are made accessible as
//! ordinary memory instead, and discards are plain `MADV_DONTNEED`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use farmem_runtime::Region;
use farmem_runtime::Runtime;
use farmem_sys::mem::{self, PAGE_SIZE};

/// Granularity at which the reservation becomes far memory.
pub const CHUNK: usize = 64 << 20;
/// mimalloc's arena (virtual: only what it commits is ever registered).
const MI_SPACE: usize = 256 << 30;
/// Room for mmap'ed ranges and large blocks.
const DIRECT_SPACE: usize = 1 << 40;

static BASE: AtomicUsize = AtomicUsize::new(0);
static MI_END: AtomicUsize = AtomicUsize::new(0);
static FINE_END: AtomicUsize = AtomicUsize::new(0);
static END: AtomicUsize = AtomicUsize::new(0);

/// What a piece of the direct part holds (see [`Space::pieces`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holds {
    /// Far memory (or a reservation of it).
    Far,
    /// The kernel's mapping in a chunk never registered (see `Space::make_foreign`).
    Foreign,
    /// The kernel's mapping in a range lent from far memory (see `Space::lend`).
    Lent,
}

impl Holds {
    /// Whether the kernel's mapping is there: calls on it go to the kernel.
    pub fn kernels(self) -> bool {
        self != Holds::Far
    }
}

/// Which part of the far address space a pointer is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Mimalloc,
    /// Mid-size blocks in fine size classes (`fine.rs`).
    Fine,
    Direct,
    Outside,
}

#[inline]
pub fn part_of(p: usize) -> Part {
    // Checking BASE first keeps this to one load for pointers below the reservation (and
    // for every pointer before it exists, when BASE is 0 and END is 0).
    if p < BASE.load(Ordering::Relaxed) || p >= END.load(Ordering::Relaxed) {
        Part::Outside
    } else if p < MI_END.load(Ordering::Relaxed) {
        Part::Mimalloc
    } else if p < FINE_END.load(Ordering::Relaxed) {
        Part::Fine
    } else {
        Part::Direct
    }
}

/// Whether `[a, a+len)` touches the reservation.
pub fn overlaps(a: usize, len: usize) -> bool {
    let (b, e) = (BASE.load(Ordering::Relaxed), END.load(Ordering::Relaxed));
    b != 0 && a < e && a.saturating_add(len) > b
}

/// The reservation's bounds: `(base, end of the allocators' parts, end)`. The allocators'
/// parts (mimalloc's arena, the fine slabs) are never unmapped, only discarded.
pub fn bounds() -> (usize, usize, usize) {
    (
        BASE.load(Ordering::Relaxed),
        FINE_END.load(Ordering::Relaxed),
        END.load(Ordering::Relaxed),
    )
}

/// A block of `malloc` served from the direct part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LargeBlock {
    /// Its length (page-rounded).
    pub len: usize,
    /// Address space reserved for it from its start, to grow into in place.
    pub room: usize,
    /// Address space reserved before its start, never used: its colour (`malloc.rs`).
    pub lead: usize,
}

pub struct Space {
    /// The runtime, or None in a forked child.
    rt: Option<Runtime>,
    /// Chunk regions; never dropped (the program may use their memory until it exits).
    chunks: Vec<Region>,
    registered: Vec<u64>,
    by_addr: BTreeMap<usize, usize>,
    by_size: BTreeSet<(usize, usize)>,
    /// High-water mark of the direct part: everything below is handed out or free.
    top: usize,
    /// Blocks of `malloc` served here (too large for mimalloc), by start.
    pub large: BTreeMap<usize, LargeBlock>,
    /// Parts of reservations (`PROT_NONE` mappings handed out here) in chunks not yet
    /// registered, start -> end: registering a chunk maps it readable and writable whole,
    /// and these must stay inaccessible until the program commits them.
    reserved: BTreeMap<usize, usize>,
    /// Whether a reservation was ever handed out: until then every free range of a
    /// registered chunk is readable and writable, and releasing one needs no `mprotect`.
    reservations: bool,
    /// Large reservations handed out (start -> end, what the program has not given back):
    /// address space freed in their chunks is not handed out again while they live, so
    /// that their chunks stay free of far memory (see `take_fresh`).
    big: BTreeMap<usize, usize>,
    /// Chunks holding a mapping the kernel made at the program's request inside a
    /// reservation (a file mapped at a fixed address: V8's builtins, the JVM's class data
    /// archive): never registered, their memory is ordinary memory (bit per chunk).
    foreign: Vec<u64>,
    /// Ranges of registered chunks lent to the kernel (start -> end, disjoint): a file or
    /// shared memory mapped at a fixed address where far memory was (a ring buffer's views
    /// of one memfd in a small reservation). Taken back when the program unmaps or replaces
    /// them (`Runtime::lend`).
    lent: BTreeMap<usize, usize>,
    /// Bounds of the whole reservation (copies of BASE and END).
    base: usize,
    end: usize,
}

pub static SPACE: Mutex<Option<Space>> = Mutex::new(None);

fn align_up(v: usize, a: usize) -> usize {
    (v + a - 1) & !(a - 1)
}

/// Reserve the address space. Returns `(mimalloc arena start, its length)`.
pub fn init(rt: Runtime) -> Result<(usize, usize), String> {
    let total = MI_SPACE + DIRECT_SPACE;
    let raw = mem::map_anon(total + CHUNK, libc::PROT_NONE)
        .map_err(|e| format!("cannot reserve {} GiB of address space: {e}", total >> 30))?
        as usize;
    let base = align_up(raw, CHUNK);
    let nchunks = total / CHUNK;
    *SPACE.lock() = Some(Space {
        rt: Some(rt),
        chunks: Vec::new(),
        registered: vec![0; nchunks.div_ceil(64)],
        by_addr: BTreeMap::new(),
        by_size: BTreeSet::new(),
        top: base + MI_SPACE + super::fine::SPACE,
        large: BTreeMap::new(),
        reserved: BTreeMap::new(),
        reservations: false,
        big: BTreeMap::new(),
        foreign: vec![0; nchunks.div_ceil(64)],
        lent: BTreeMap::new(),
        base,
        end: base + total,
    });
    MI_END.store(base + MI_SPACE, Ordering::Relaxed);
    super::fine::init(base + MI_SPACE);
    FINE_END.store(base + MI_SPACE + super::fine::SPACE, Ordering::Relaxed);
    END.store(base + total, Ordering::Relaxed);
    BASE.store(base, Ordering::Release);
    Ok((base, MI_SPACE))
}

impl Space {
    /// The forked child's view: the runtime is gone, memory is ordinary.
    pub fn enter_child(&mut self) {
        if let Some(rt) = self.rt.take() {
            // The regions' Drop would talk to the dead runtime: keep them forever.
            std::mem::forget(std::mem::take(&mut self.chunks));
            std::mem::forget(rt);
        }
    }

    pub fn runtime(&self) -> Option<&Runtime> {
        self.rt.as_ref()
    }

    /// Make every chunk that `[a, a+len)` touches usable.
    pub fn ensure_usable(&mut self, a: usize, len: usize) -> Result<(), String> {
        // Called with SPACE held: an allocation glibc makes meanwhile must not come back here.
        let _local = super::LocalScope::enter();
        let base = self.base;
        let first = (a - base) / CHUNK;
        let last = (a + len - base).div_ceil(CHUNK);
        for c in first..last {
            if self.registered[c / 64] & (1 << (c % 64)) != 0 {
                continue;
            }
            let at = base + c * CHUNK;
            if self.foreign[c / 64] & (1 << (c % 64)) != 0 {
                return Err(format!(
                    "{at:#x} is in a chunk holding a mapping farmem does not manage"
                ));
            }
            match &self.rt {
                Some(rt) => {
                    // SAFETY: the chunk is part of our reservation and not in use.
                    let r = unsafe { rt.create_region_at(at, CHUNK) }
                        .map_err(|e| format!("making far memory at {at:#x}: {e}"))?;
                    self.chunks.push(r);
                }
                None => {
                    // SAFETY: the chunk is part of our reservation and not in use.
                    unsafe { mem::sys_mprotect(at, CHUNK, libc::PROT_READ | libc::PROT_WRITE) }
                        .map_err(|e| format!("mprotect {at:#x}: errno {e}"))?;
                }
            }
            self.registered[c / 64] |= 1 << (c % 64);
            self.protect_reserved_in(at, at + CHUNK);
        }
        Ok(())
    }

    fn is_foreign(&self, addr: usize) -> bool {
        let c = (addr - self.base) / CHUNK;
        self.foreign[c / 64] & (1 << (c % 64)) != 0
    }

    /// `[a, a+len)` cut at chunk boundaries: `(start, end)` of each piece.
    fn chunk_runs(&self, a: usize, len: usize) -> impl Iterator<Item = (usize, usize)> {
        let (base, end) = (self.base, a + len);
        let mut at = a;
        std::iter::from_fn(move || {
            (at < end).then(|| {
                let to = ((at - base) / CHUNK * CHUNK + CHUNK + base).min(end);
                let run = (at, to);
                at = to;
                run
            })
        })
    }

    /// `[a, a+len)` (in the direct part) cut where what it holds changes: far memory,
    /// foreign chunks, lent ranges.
    pub fn pieces(&self, a: usize, len: usize) -> Vec<(usize, usize, Holds)> {
        let mut out: Vec<(usize, usize, Holds)> = Vec::new();
        let mut push = |at: usize, to: usize, h: Holds| match out.last_mut() {
            Some((s, l, lh)) if *lh == h && *s + *l == at => *l += to - at,
            _ => out.push((at, to - at, h)),
        };
        for (at, to) in self.chunk_runs(a, len) {
            if self.is_foreign(at) {
                push(at, to, Holds::Foreign);
                continue;
            }
            let mut p = at;
            let lent: Vec<(usize, usize)> = self
                .lent
                .range(..to)
                .rev()
                .take_while(|&(_, &e)| e > at)
                .map(|(&s, &e)| (s.max(at), e.min(to)))
                .collect();
            for (s, e) in lent.into_iter().rev() {
                if s > p {
                    push(p, s, Holds::Far);
                }
                push(s, e, Holds::Lent);
                p = e;
            }
            if p < to {
                push(p, to, Holds::Far);
            }
        }
        out
    }

    /// Lend `[a, a+len)` (page-aligned, in the direct part) to the kernel for a mapping the
    /// runtime cannot manage, which the caller makes next: its contents are dropped. Its
    /// chunks become far memory first if they were not (a mapping that spans a registered
    /// chunk and one that is not). Err: a chunk is foreign, or the runtime refused.
    pub fn lend(&mut self, a: usize, len: usize) -> Result<(), String> {
        self.ensure_usable(a, len)?;
        if let Some(rt) = &self.rt {
            rt.lend(a, len)
                .map_err(|e| format!("lending {len} bytes at {a:#x} to the kernel: {e}"))?;
        }
        self.note_allocated(a, len, false);
        farmem_runtime::disjoint::insert(&mut self.lent, a, a + len);
        Ok(())
    }

    /// Make the lent parts of `[a, a+len)` far memory again, inaccessible (`PROT_NONE`):
    /// the kernel's mappings there are replaced.
    pub fn take_back_lent(&mut self, a: usize, len: usize) -> Result<(), String> {
        if self.lent.is_empty() {
            return Ok(());
        }
        for (s, end) in farmem_runtime::disjoint::take(&mut self.lent, a, a + len) {
            let r = match &self.rt {
                // SAFETY: a lent range, which the program unmaps or replaces.
                Some(rt) => unsafe { rt.take_back(s, end - s) }.map_err(|e| e.to_string()),
                // SAFETY: as above; in a forked child the chunks are ordinary memory.
                None => unsafe { mem::map_anon_fixed(s, end - s, libc::PROT_NONE) }
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
            };
            r.map_err(|e| format!("taking back {s:#x}..{end:#x} from the kernel: {e}"))?;
        }
        Ok(())
    }

    /// Let the kernel map something the runtime cannot manage (a file, shared memory) at
    /// `[a, a+len)`, inside the direct part: possible where no chunk it touches is
    /// registered; those chunks become foreign. False: some chunk is far memory already.
    pub fn make_foreign(&mut self, a: usize, len: usize) -> bool {
        let (first, last) = (
            (a - self.base) / CHUNK,
            (a + len - self.base).div_ceil(CHUNK),
        );
        if (first..last).any(|c| self.registered[c / 64] & (1 << (c % 64)) != 0) {
            return false;
        }
        for c in first..last {
            self.foreign[c / 64] |= 1 << (c % 64);
        }
        // Never registered, these chunks need no reprotection; and none of their address
        // space is handed out again (what is free there stays unused: address space is
        // plentiful, and far memory there is impossible).
        let (from, to) = (first * CHUNK + self.base, last * CHUNK + self.base);
        farmem_runtime::disjoint::take(&mut self.reserved, from, to);
        let free: Vec<(usize, usize)> = self
            .by_addr
            .range(..to)
            .rev()
            .take_while(|&(&fs, &fl)| fs + fl > from)
            .map(|(&fs, &fl)| (fs, fl))
            .collect();
        for (fs, fl) in free {
            self.remove_free(fs, fl);
            self.insert_free(fs, from.saturating_sub(fs).min(fl));
            if fs + fl > to {
                self.insert_free(to, fs + fl - to);
            }
        }
        if self.top > from && self.top < to {
            self.top = to;
        }
        true
    }

    fn chunk_start(&self, addr: usize) -> usize {
        self.base + (addr - self.base) / CHUNK * CHUNK
    }

    /// Given back but not handed out again: its pages discarded by the caller, its
    /// protection left alone, its extent forgotten.
    fn take_back(&mut self, a: usize, len: usize) {
        self.note_allocated(a, len, false);
        farmem_runtime::disjoint::take(&mut self.reserved, a, a + len);
    }

    fn is_registered(&self, addr: usize) -> bool {
        let c = (addr - self.base) / CHUNK;
        self.registered[c / 64] & (1 << (c % 64)) != 0
    }

    /// The chunk `[from, to)` was just made readable and writable whole: its reservations'
    /// uncommitted parts become inaccessible again.
    fn protect_reserved_in(&mut self, from: usize, to: usize) {
        let parts: Vec<(usize, usize)> =
            farmem_runtime::disjoint::take(&mut self.reserved, from, to);
        for (s, e) in parts {
            if let Err(e) = self.set_protection(s, e - s, libc::PROT_NONE) {
                tracing::error!("protecting a reservation at {s:#x}: errno {e}");
            }
        }
    }

    /// `mprotect` of far memory, through the runtime where there is one (it must not read
    /// pages the program cannot).
    pub fn set_protection(&self, a: usize, len: usize, prot: i32) -> Result<(), i32> {
        match &self.rt {
            Some(rt) => rt.protect(a, len, prot),
            // SAFETY: part of our reservation, handed out to the program.
            None => unsafe { mem::sys_mprotect(a, len, prot) }.map(|_| ()),
        }
    }

    /// Hand out `len` bytes (page multiple) of address space that the program cannot
    /// access until it commits parts of it (`mprotect`, or a fixed mapping over it): an
    /// allocator's reservation, as V8's heap pages and the JVM's heap are made. Nothing is
    /// registered for it yet (registering writes page metadata: a JVM reserves its largest
    /// heap up front).
    pub fn reserve(&mut self, len: usize) -> Option<usize> {
        let a = if len >= CHUNK {
            let a = self.take_fresh(len)?;
            self.big.insert(a, a + len);
            a
        } else {
            self.take_range(len, PAGE_SIZE)?
        };
        self.reservations = true;
        let runs: Vec<(usize, usize)> = self.chunk_runs(a, len).collect();
        for (at, to) in runs {
            if self.is_registered(at) {
                // Free ranges of registered chunks are readable and writable.
                if let Err(e) = self.set_protection(at, to - at, libc::PROT_NONE) {
                    tracing::error!("protecting a reservation at {at:#x}: errno {e}");
                }
            } else {
                // Still part of the inaccessible reservation of the whole space.
                self.reserved.insert(at, to);
            }
        }
        Some(a)
    }

    /// `len` bytes from the top, in chunks of their own never registered: a large
    /// reservation may get files mapped into it at fixed addresses (the JVM maps its class
    /// data archive at the start of one), which only chunks that are not far memory can
    /// take (`make_foreign`).
    fn take_fresh(&mut self, len: usize) -> Option<usize> {
        let mut a = align_up(self.top, CHUNK);
        while a < self.end && self.is_registered(a) {
            a += CHUNK;
        }
        self.take_top(a, len)
    }

    /// Make `[a, a+len)` of the direct part (given back, or its contents discarded) hold
    /// no reservation any more: readable and writable where registered, as every free range
    /// of a registered chunk is.
    fn unreserve(&mut self, a: usize, len: usize) {
        if !self.reservations {
            return;
        }
        farmem_runtime::disjoint::take(&mut self.reserved, a, a + len);
        for (at, to) in self
            .chunk_runs(a, len)
            .filter(|&(at, _)| self.is_registered(at))
        {
            if let Err(e) = self.set_protection(at, to - at, libc::PROT_READ | libc::PROT_WRITE) {
                tracing::error!("unprotecting released far memory at {at:#x}: errno {e}");
            }
        }
    }

    fn insert_free(&mut self, s: usize, l: usize) {
        if l > 0 {
            self.by_addr.insert(s, l);
            self.by_size.insert((l, s));
        }
    }

    /// Tell the runtime that `[a, a+len)` is (or is no longer) an allocation, so that its
    /// speculative zero-fills stop at the end of it (`Runtime::mark_allocated`).
    pub fn note_allocated(&self, a: usize, len: usize, allocated: bool) {
        if let Some(rt) = &self.rt {
            if allocated {
                rt.mark_allocated(a, len);
            } else {
                rt.mark_freed(a, len);
            }
        }
    }

    fn remove_free(&mut self, s: usize, l: usize) {
        self.by_addr.remove(&s);
        self.by_size.remove(&(l, s));
    }

    /// Hand out `len` bytes (page multiple) aligned to `align` (a power of two, at least a
    /// page) from the direct part, all of it usable.
    pub fn alloc(&mut self, len: usize, align: usize) -> Option<usize> {
        self.alloc_usable(len, align, len)
    }

    /// As [`Space::alloc`], with only the first `usable` bytes made usable: the rest is room
    /// to grow into ([`Space::ensure_usable`] when it is used). Registering far memory
    /// writes its page metadata (8 bytes a page), so a large block's room is not registered
    /// until it is needed: sort's 1.36 GiB buffer got 4 GiB of room, 8 MiB of metadata.
    pub fn alloc_usable(&mut self, len: usize, align: usize, usable: usize) -> Option<usize> {
        let a = self.take_range(len, align)?;
        if let Err(e) = self.ensure_usable(a, usable) {
            tracing::error!("{e}");
            self.release(a, len);
            return None;
        }
        self.note_allocated(a, usable, true);
        Some(a)
    }

    /// Take `len` bytes aligned to `align` out of the free ranges (best fit) or from the
    /// top, registering nothing.
    fn take_range(&mut self, len: usize, align: usize) -> Option<usize> {
        let mut fit = None;
        for &(fl, fs) in self.by_size.range((len, 0)..).take(64) {
            let a = align_up(fs, align);
            if a + len <= fs + fl {
                fit = Some((fs, fl, a));
                break;
            }
        }
        if let Some((fs, fl, a)) = fit {
            self.remove_free(fs, fl);
            self.insert_free(fs, a - fs);
            self.insert_free(a + len, fs + fl - (a + len));
            return Some(a);
        }
        self.take_top(align_up(self.top, align), len)
    }

    /// `[a, a+len)` above the top (`a` at or past it): the top moves past it, and the gap
    /// below `a` becomes a free range.
    fn take_top(&mut self, a: usize, len: usize) -> Option<usize> {
        if a.checked_add(len)? > self.end {
            return None;
        }
        let old_top = self.top;
        self.top = a + len;
        self.insert_free(old_top, a - old_top);
        Some(a)
    }

    /// Take back `[a, a+len)` (already discarded by the caller). Parts already free are
    /// left as they are, so a repeated `munmap` cannot hand a range out twice.
    pub fn release(&mut self, a: usize, len: usize) {
        if let Err(e) = self.take_back_lent(a, len) {
            // Not handed out again: it may still hold the kernel's mapping.
            tracing::error!("{e}");
            return;
        }
        if !self.big.is_empty() {
            farmem_runtime::disjoint::take(&mut self.big, a, a + len);
            // The chunks of a live large reservation: what it gave back (an aligning
            // allocator trims its ends) stays out of use while it lives.
            let (from, to) = (self.chunk_start(a), self.chunk_start(a + len - 1) + CHUNK);
            if self
                .big
                .range(..to)
                .next_back()
                .is_some_and(|(_, &e)| e > from)
            {
                self.take_back(a, len);
                return;
            }
        }
        let pieces = self.pieces(a, len);
        if pieces.iter().any(|p| p.2 == Holds::Foreign) {
            // Address space of foreign chunks is not handed out again.
            for (s, l, _) in pieces.into_iter().filter(|p| p.2 == Holds::Far) {
                self.release(s, l);
            }
            return;
        }
        self.note_allocated(a, len, false);
        self.unreserve(a, len);
        let (mut s, mut e) = (a, a + len);
        while let Some((&fs, &fl)) = self.by_addr.range(..=e).next_back() {
            if fs + fl < s {
                break;
            }
            self.remove_free(fs, fl);
            s = s.min(fs);
            e = e.max(fs + fl);
        }
        if e >= self.top {
            // The end of the used space: lower the high-water mark instead (the chunks
            // stay registered and are reused first).
            self.top = s;
        } else {
            self.insert_free(s, e - s);
        }
    }

    /// Grow `[a, a+old)` to `new` bytes in place if the following range is free.
    pub fn grow_in_place(&mut self, a: usize, old: usize, new: usize) -> bool {
        let grown = self.grow_range(a, old, new);
        if grown {
            self.note_allocated(a, new, true);
        }
        grown
    }

    fn grow_range(&mut self, a: usize, old: usize, new: usize) -> bool {
        let (from, to) = (a + old, a + new);
        if from == self.top {
            if to > self.end || self.ensure_usable(from, to - from).is_err() {
                return false;
            }
            self.top = to;
            return true;
        }
        let Some((&fs, &fl)) = self.by_addr.range(..=from).next_back() else {
            return false;
        };
        if fs != from {
            return false; // `from` is in use (free ranges never start inside another)
        }
        if fs + fl >= to {
            if self.ensure_usable(from, to - from).is_err() {
                return false;
            }
            self.remove_free(fs, fl);
            self.insert_free(to, fs + fl - to);
            true
        } else if fs + fl == self.top
            && to <= self.end
            && self.ensure_usable(from, to - from).is_ok()
        {
            self.remove_free(fs, fl);
            self.top = to;
            true
        } else {
            false
        }
    }
}

/// Drop the contents of `[a, a+len)` (page-aligned) so that it reads as zeros.
pub fn discard(rt: Option<&Runtime>, a: usize, len: usize) {
    match rt {
        Some(rt) => {
            rt.discard(a, len);
        }
        None => {
            // SAFETY: the range is the caller's to drop (a free or an madvise of its own).
            let _ = unsafe { mem::sys_madvise(a, len, libc::MADV_DONTNEED) };
        }
    }
}

/// The runtime, cloned out of the lock (None in a forked child or before init).
pub fn runtime() -> Option<Runtime> {
    SPACE.lock().as_ref().and_then(|s| s.rt.clone())
}

pub fn page_round(len: usize) -> usize {
    align_up(len, PAGE_SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(base: usize) -> Space {
        Space {
            base,
            end: base + 4 * 64 * CHUNK,
            rt: None,
            chunks: Vec::new(),
            registered: vec![u64::MAX; 4],
            by_addr: BTreeMap::new(),
            by_size: BTreeSet::new(),
            top: base,
            large: BTreeMap::new(),
            reserved: BTreeMap::new(),
            reservations: false,
            big: BTreeMap::new(),
            foreign: vec![0; 4],
            lent: BTreeMap::new(),
        }
    }

    #[test]
    fn ranges_are_reused_coalesced_and_never_handed_out_twice() {
        let base = 1 << 30;
        let mut s = space(base);
        let a = s.alloc(4 * PAGE_SIZE, PAGE_SIZE).unwrap();
        let b = s.alloc(8 * PAGE_SIZE, PAGE_SIZE).unwrap();
        let c = s.alloc(4 * PAGE_SIZE, PAGE_SIZE).unwrap();
        assert_eq!(
            (a, b, c),
            (base, base + 4 * PAGE_SIZE, base + 12 * PAGE_SIZE)
        );
        s.release(b, 8 * PAGE_SIZE);
        s.release(b, 8 * PAGE_SIZE); // repeated munmap
        assert_eq!(s.alloc(2 * PAGE_SIZE, PAGE_SIZE), Some(b)); // best fit reuses the hole
        s.release(a, 4 * PAGE_SIZE);
        s.release(b, 2 * PAGE_SIZE);
        // a..c is one free range now.
        assert_eq!(s.by_addr.get(&a), Some(&(12 * PAGE_SIZE)));
        assert!(s.grow_in_place(c, 4 * PAGE_SIZE, 16 * PAGE_SIZE)); // at the top
        assert!(!s.grow_in_place(a, 12 * PAGE_SIZE, 13 * PAGE_SIZE) && s.by_addr.len() == 1);
        let d = s.alloc(PAGE_SIZE, 16 * PAGE_SIZE).unwrap();
        assert_eq!(d % (16 * PAGE_SIZE), 0);
        s.release(c, 16 * PAGE_SIZE);
        assert!(s.top <= c);
    }

    /// A block's room beyond its usable part is made usable only when it is used: here, when
    /// a freed range that was room is handed out again.
    #[test]
    fn room_is_made_usable_only_when_used() {
        // A real reservation: chunks made usable here are mprotected (no runtime).
        let len = 4 * CHUNK;
        let base = mem::map_anon(len, libc::PROT_NONE).unwrap() as usize;
        let mut s = space(base);
        s.end = base + len;
        s.registered = vec![0; 1];
        let usable = |s: &Space| (0..4).filter(|c| s.registered[0] & (1 << c) != 0).count();
        let a = s.alloc_usable(2 * CHUNK, PAGE_SIZE, CHUNK / 2).unwrap();
        assert_eq!((a, usable(&s)), (base, 1), "only the block's own chunk");
        let c = s.alloc(PAGE_SIZE, PAGE_SIZE).unwrap();
        assert_eq!((c, usable(&s)), (base + 2 * CHUNK, 2));
        s.release(a, 2 * CHUNK);
        let b = s.alloc_usable(2 * CHUNK, PAGE_SIZE, 2 * CHUNK).unwrap();
        assert_eq!(
            (b, usable(&s)),
            (base, 3),
            "room handed out again is made usable"
        );
        // SAFETY: the reservation is this test's; nothing refers to it any more.
        unsafe { mem::unmap(base as *mut u8, len) };
    }
}
