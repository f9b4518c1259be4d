//! The key-value service itself: where the table and the objects lie in the region, the
//! request sequence, and the loader and request loop that run against a region.

use anyhow::{bail, Result};
use farmem_runtime::{FM_WRITE, PAGE_SIZE};

/// Bytes of one hash-table entry: an 8-byte key, a 4-byte value (the user id part), 4 bytes
/// of padding (AIFM's entries are a 12-byte key and a 4-byte value).
const ENTRY: usize = 16;
/// Entries per bucket: a bucket is one 64-byte cache line, so it never straddles a page.
pub const BUCKET_ENTRIES: usize = 4;
pub const BUCKET: usize = ENTRY * BUCKET_ENTRIES;
/// Share of the table's entries that hold a key: high enough to be a real table, low enough
/// that almost every lookup ends in its first bucket.
const LOAD: f64 = 0.75;
/// Marks an empty entry (keys are below the number of keys).
const EMPTY: u64 = u64::MAX;

/// What the program tells the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// `hint(bucket)` before each bucket, `hint_ex(object, size, 0, 0, ev_prio)` before the
    /// object: Eden's priority reclaim hint (objects are evicted first). The loader writes
    /// the objects with their `ev_prio` too.
    Prio,
    /// Only the objects are hinted, with their `ev_prio`; the table is read with plain loads
    /// (its misses are page faults) and the loader writes everything with plain stores: a
    /// program that marks only what it reads once.
    Objprio,
    /// The same two hints as `prio` with eviction priority 0 for everything (Eden "NP").
    Hint,
    /// Plain loads and stores; misses arrive as page faults.
    Unhinted,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Prio => "prio",
            Mode::Objprio => "objprio",
            Mode::Hint => "hint",
            Mode::Unhinted => "unhinted",
        }
    }

    /// Does the mode pass an eviction priority (so that it is swept over `--ev-prio`)?
    pub fn uses_prio(self) -> bool {
        matches!(self, Mode::Prio | Mode::Objprio)
    }

    /// `None`: objects are not hinted; else the `ev_prio` of the object hint.
    fn object_prio(self, ev_prio: u8) -> Option<u8> {
        match self {
            Mode::Prio | Mode::Objprio => Some(ev_prio),
            Mode::Hint => Some(0),
            Mode::Unhinted => None,
        }
    }

    fn hints_table(self) -> bool {
        matches!(self, Mode::Prio | Mode::Hint)
    }

    /// The loader's write hints: `None` for plain stores, else the objects' `ev_prio`.
    fn fill_prio(self, ev_prio: u8) -> Option<u8> {
        match self {
            Mode::Prio => Some(ev_prio),
            Mode::Hint => Some(0),
            Mode::Objprio | Mode::Unhinted => None,
        }
    }
}

/// The shape of a service: what the sweep varies besides the policy, mode and local share.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Share of the footprint taken by the hash table, percent.
    pub table_pct: f64,
    /// Bytes of one object.
    pub object: usize,
    /// Hash-table lookups per request.
    pub lookups: usize,
    /// The loader's order.
    pub load: Load,
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "table {}%, {}-byte objects, {} lookups, {} load",
            self.table_pct,
            self.object,
            self.lookups,
            self.load.name()
        )
    }
}

/// In which order the loader writes the table and the objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Load {
    /// All objects, then the table.
    ObjectsFirst,
    /// The table and the objects in proportion, chunk by chunk.
    Interleaved,
}

impl Load {
    pub fn name(self) -> &'static str {
        match self {
            Load::ObjectsFirst => "objects-first",
            Load::Interleaved => "interleaved",
        }
    }
}

pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The user-id part stored under `key`.
fn value_of(key: u64, seed: u64) -> u32 {
    (splitmix(key ^ seed.rotate_left(32)) >> 32) as u32
}

/// Word `j` of object `id`: distinct per object and per position, so a page of another
/// object, a stale page or a zeroed page changes the checksum.
fn object_word(id: usize, j: usize) -> u64 {
    splitmix(((id as u64) << 24 | j as u64) ^ 0x0B1E_C7DA_7A00_0000)
}

fn checksum(words: &[u64]) -> u64 {
    words.iter().fold(0u64, |s, &w| s.wrapping_add(w))
}

/// Where everything is in the region.
pub struct Layout {
    pub shape: Shape,
    pub nbuckets: usize,
    pub table_bytes: usize,
    pub nkeys: usize,
    /// Distinct request ids: each owns `lookups` consecutive keys.
    pub nreqs: usize,
    pub nobjects: usize,
    pub region_bytes: usize,
}

impl Layout {
    pub fn new(size: usize, shape: Shape) -> Result<Layout> {
        let Shape {
            table_pct,
            object,
            lookups,
            ..
        } = shape;
        let table_bytes = (size as f64 * table_pct / 100.0) as usize / PAGE_SIZE * PAGE_SIZE;
        let nbuckets = table_bytes / BUCKET;
        let nreqs = (nbuckets as f64 * BUCKET_ENTRIES as f64 * LOAD) as usize / lookups;
        let nobjects = (size - table_bytes) / object;
        if nreqs < 64 || nobjects < 64 {
            bail!(
                "--size of {} KiB with a table of {table_pct}%, {object}-byte objects and \
                 {lookups} lookups leaves {nreqs} request ids and {nobjects} objects: make it \
                 larger",
                size >> 10
            );
        }
        if u32::try_from(nobjects).is_err() || u32::try_from(nreqs).is_err() {
            bail!("--size is too large");
        }
        Ok(Layout {
            shape,
            nbuckets,
            table_bytes,
            nkeys: nreqs * lookups,
            nreqs,
            nobjects,
            region_bytes: table_bytes + nobjects * object,
        })
    }

    /// The first bucket of `key`'s probe sequence.
    #[inline(always)]
    pub fn bucket_of(&self, key: u64) -> usize {
        ((splitmix(key) as u128 * self.nbuckets as u128) >> 64) as usize
    }

    fn object_words(&self) -> usize {
        self.shape.object / 8
    }
}

/// Everything shared by the points of one shape: the layout, the table as it is written
/// into every region, the objects' checksums and the request sequence.
pub struct Workload {
    pub layout: Layout,
    /// The hash table's bytes, built once in ordinary memory and copied into each region
    /// (building it in place would measure random writes into far memory instead).
    table: Vec<[u64; 2]>,
    /// Expected checksum of each object.
    sums: Vec<u64>,
    /// (request id, the object its lookups must lead to): warm-up requests, then timed ones.
    pub reqs: Vec<(u32, u32)>,
    pub warmup: usize,
}

impl Workload {
    pub fn new(layout: Layout, zipf: f64, seed: u64, warmup: usize, timed: usize) -> Workload {
        let l = &layout;
        let lookups = l.shape.lookups as u64;
        // Open addressing over buckets with linear probing: a key goes into the first bucket
        // of its probe sequence with a free entry.
        let mut table = vec![[EMPTY, 0u64]; l.nbuckets * BUCKET_ENTRIES];
        for key in 0..l.nkeys as u64 {
            let mut b = l.bucket_of(key);
            'probe: loop {
                for e in &mut table[b * BUCKET_ENTRIES..(b + 1) * BUCKET_ENTRIES] {
                    if e[0] == EMPTY {
                        *e = [key, value_of(key, seed) as u64];
                        break 'probe;
                    }
                }
                b = (b + 1) % l.nbuckets;
            }
        }
        let words = l.object_words();
        let sums = (0..l.nobjects)
            .map(|id| (0..words).fold(0u64, |s, j| s.wrapping_add(object_word(id, j))))
            .collect();
        // Zipf(s) over request ids by inverse CDF: rank k (0 the most popular) has weight
        // 1 / (k + 1)^s. As in AIFM, the rank is the request id; its keys and its object are
        // spread over the table and the array by hashing, so popularity has no address order.
        let mut cdf = Vec::with_capacity(l.nreqs);
        let mut total = 0.0f64;
        for k in 0..l.nreqs {
            total += 1.0 / ((k + 1) as f64).powf(zipf);
            cdf.push(total);
        }
        let mut x = seed;
        let reqs = (0..warmup + timed)
            .map(|_| {
                x = x.wrapping_add(1);
                let u = (splitmix(x) >> 11) as f64 / (1u64 << 53) as f64 * total;
                let r = cdf.partition_point(|&c| c <= u).min(l.nreqs - 1);
                let uid = (0..lookups).fold(0u32, |s, i| {
                    s.wrapping_add(value_of(r as u64 * lookups + i, seed))
                });
                (r as u32, (uid as usize % l.nobjects) as u32)
            })
            .collect();
        Workload {
            layout,
            table,
            sums,
            reqs,
            warmup,
        }
    }
}

/// Write the table and the objects into a fresh region, page runs at a time, with write
/// hints where the mode has them (as a loader would). In `prio` mode the objects are written
/// with their eviction priority too: the program knows what its objects are from the start.
///
/// # Safety
/// `base` must point to `w.layout.region_bytes` writable bytes, 8-byte aligned, that nothing
/// else uses meanwhile (a far-memory region, or ordinary memory in tests).
pub unsafe fn fill(w: &Workload, base: *mut u8, mode: Mode, ev_prio: u8) {
    let l = &w.layout;
    const CHUNK: usize = 64 * PAGE_SIZE;
    let hint = |p: *mut u8, len: usize, prio: u8| {
        if mode.fill_prio(ev_prio).is_some() {
            farmem_runtime::hint_ex(p, len, FM_WRITE, 0, prio);
        }
    };
    let obj_base = l.table_bytes;
    let obj_bytes = l.nobjects * l.shape.object;
    let obj_words = l.object_words();
    let prio = mode.fill_prio(ev_prio).unwrap_or(0);
    let mut words = vec![0u64; CHUNK / 8];
    let mut write_objects = |start: usize| {
        let len = CHUNK.min(obj_bytes - start);
        for (i, wd) in words[..len / 8].iter_mut().enumerate() {
            let at = start / 8 + i;
            *wd = object_word(at / obj_words, at % obj_words);
        }
        // SAFETY: `obj_base + start + len` is within the region of `region_bytes`.
        let p = unsafe { base.add(obj_base + start) };
        hint(p, len, prio);
        // SAFETY: as above; `words` holds at least `len` bytes and is not in the region.
        unsafe { std::ptr::copy_nonoverlapping(words.as_ptr() as *const u8, p, len) };
    };
    let src = w.table.as_ptr() as *const u8;
    let write_table = |start: usize| {
        let len = CHUNK.min(l.table_bytes - start);
        // SAFETY: the table occupies the first `table_bytes` of the region; the image has
        // exactly `table_bytes` bytes (nbuckets * BUCKET).
        let (from, to) = unsafe { (src.add(start), base.add(start)) };
        hint(to, len, 0);
        // SAFETY: as above; ordinary memory and the region do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(from, to, len) };
    };
    match l.shape.load {
        // Objects first, the index last: a service that builds its index once the data is
        // loaded, so every policy starts with the index local.
        Load::ObjectsFirst => {
            (0..obj_bytes).step_by(CHUNK).for_each(write_objects);
            (0..l.table_bytes).step_by(CHUNK).for_each(write_table);
        }
        // A service that inserts as it loads: the table and the objects grow together, so
        // their pages arrive mixed and the index is not all newer than the data.
        Load::Interleaved => {
            let mut t = 0;
            for o in (0..obj_bytes).step_by(CHUNK) {
                write_objects(o);
                while t < l.table_bytes && t * obj_bytes <= o * l.table_bytes {
                    write_table(t);
                    t += CHUNK;
                }
            }
            (t..l.table_bytes).step_by(CHUNK).for_each(write_table);
        }
    }
}

/// Serve `reqs`: the lookups, then the object, verified. Returns an error naming the request
/// when a key is missing or an object reads back wrong.
///
/// # Safety
/// `base` must point to `w.layout.region_bytes` readable bytes, 8-byte aligned, filled by
/// [`fill`] and not written meanwhile.
pub unsafe fn serve(
    w: &Workload,
    base: *const u8,
    reqs: &[(u32, u32)],
    mode: Mode,
    ev_prio: u8,
) -> Result<()> {
    let l = &w.layout;
    let lookups = l.shape.lookups as u64;
    let obj_prio = mode.object_prio(ev_prio);
    let hint_table = mode.hints_table();
    for (n, &(r, expect_obj)) in reqs.iter().enumerate() {
        let mut uid = 0u32;
        for i in 0..lookups {
            let key = r as u64 * lookups + i;
            let mut b = l.bucket_of(key);
            let mut probes = 0;
            let value = 'probe: loop {
                // SAFETY: b < nbuckets, so the bucket is inside the table at the start of the
                // region; the region stays mapped while `base` is used.
                let bucket = unsafe { base.add(b * BUCKET) } as *const [u64; 2];
                if hint_table {
                    farmem_runtime::hint(bucket);
                }
                for e in 0..BUCKET_ENTRIES {
                    // SAFETY: entry e < BUCKET_ENTRIES of an in-bounds bucket, 16-byte aligned
                    // (the region is page-aligned). Volatile: the loads are the workload.
                    let [k, v] = unsafe { bucket.add(e).read_volatile() };
                    if k == key {
                        break 'probe v as u32;
                    }
                    if k == EMPTY {
                        bail!("request {n}: key {key} not found in the hash table (bucket {b})");
                    }
                }
                b = (b + 1) % l.nbuckets;
                probes += 1;
                if probes > l.nbuckets {
                    bail!("request {n}: key {key} not found (the table has no empty entry)");
                }
            };
            uid = uid.wrapping_add(value);
        }
        let obj = uid as usize % l.nobjects;
        if obj != expect_obj as usize {
            bail!(
                "request {n}: the hash table led to object {obj}, expected {expect_obj} (a \
                 table page read back wrong)"
            );
        }
        // SAFETY: obj < nobjects: the object lies inside the region.
        let p = unsafe { base.add(l.table_bytes + obj * l.shape.object) };
        if let Some(prio) = obj_prio {
            farmem_runtime::hint_ex(p, l.shape.object, 0, 0, prio);
        }
        // SAFETY: the object is inside the region, 8-byte aligned, and nothing writes it
        // while this request reads it (the runtime only moves whole pages behind the
        // program's back, preserving their contents).
        let words = unsafe { std::slice::from_raw_parts(p as *const u64, l.object_words()) };
        let sum = checksum(std::hint::black_box(words));
        if sum != w.sums[obj] {
            bail!(
                "request {n}: object {obj} read back wrong (checksum {sum:#018x}, expected \
                 {:#018x})",
                w.sums[obj]
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: Shape = Shape {
        table_pct: 35.0,
        object: 8192,
        lookups: 32,
        load: Load::ObjectsFirst,
    };

    /// A small workload served from ordinary memory (hints outside a region do nothing), so
    /// that the checks can be shown to catch wrong data.
    fn plain(shape: Shape, mode: Mode) -> (Workload, Vec<u64>) {
        let layout = Layout::new(2 << 20, shape).unwrap();
        let w = Workload::new(layout, 0.8, 7, 100, 400);
        let mut mem = vec![0u64; w.layout.region_bytes / 8];
        // SAFETY: `mem` has `region_bytes` bytes, 8-byte aligned, and is used only here.
        unsafe { fill(&w, mem.as_mut_ptr() as *mut u8, mode, 7) };
        (w, mem)
    }

    /// Serve `reqs` from `mem`, filled by `plain`.
    fn serve_plain(w: &Workload, mem: &[u64], reqs: &[(u32, u32)], mode: Mode) -> Result<()> {
        assert_eq!(mem.len() * 8, w.layout.region_bytes);
        // SAFETY: `mem` has `region_bytes` bytes, 8-byte aligned, borrowed for the call.
        unsafe { serve(w, mem.as_ptr() as *const u8, reqs, mode, 7) }
    }

    #[test]
    fn requests_are_served_and_wrong_data_is_caught() {
        let shapes = [
            SHAPE,
            Shape {
                table_pct: 10.0,
                object: 4096,
                lookups: 8,
                load: Load::Interleaved,
            },
        ];
        for shape in shapes {
            for mode in [Mode::Prio, Mode::Objprio, Mode::Hint, Mode::Unhinted] {
                let (w, mut mem) = plain(shape, mode);
                serve_plain(&w, &mem, &w.reqs, mode).unwrap();
                // One word of the object the first request reads.
                let obj = w.reqs[0].1 as usize;
                let at = (w.layout.table_bytes + obj * shape.object) / 8 + 100;
                mem[at] ^= 1;
                let e = serve_plain(&w, &mem, &w.reqs[..1], mode).unwrap_err();
                assert!(e.to_string().contains("read back wrong"), "{e}");
                mem[at] ^= 1;
                // A zeroed table page: its keys are not found.
                let key = w.reqs[0].0 as u64 * shape.lookups as u64;
                let page = w.layout.bucket_of(key) * BUCKET / PAGE_SIZE * PAGE_SIZE / 8;
                mem[page..page + PAGE_SIZE / 8].fill(0);
                assert!(serve_plain(&w, &mem, &w.reqs[..1], mode).is_err());
            }
        }
    }

    #[test]
    fn zipf_requests_are_skewed_and_reproducible() {
        let l = || Layout::new(4 << 20, SHAPE).unwrap();
        let a = Workload::new(l(), 0.8, 1, 0, 20_000);
        let b = Workload::new(l(), 0.8, 1, 0, 20_000);
        assert_eq!(a.reqs, b.reqs);
        let n = a.layout.nreqs as u32;
        let top = a.reqs.iter().filter(|r| r.0 < n / 100).count();
        // Zipf(0.8): the most popular 1% of request ids take far more than 1% of requests.
        assert!(top > 20_000 / 10, "{top}");
        assert!(a.reqs.iter().all(|r| r.0 < n));
    }
}
