//! The integrity-under-churn workload, shared by the local-backend tests and the TCP tests
//! of `farmem-cli`: a region 8x its local budget, four threads doing random reads and writes
//! of checksummed records, hinted and unhinted accesses mixed, every read checked against
//! the thread's shadow copy. Any lost write, stale page or page refilled with zeros shows up
//! as a mismatch.

use super::*;
use crate::{Region, Runtime, FM_SEQ, FM_WRITE, PAGE_SIZE};

pub const BUDGET: usize = 8 << 20;
const REGION: usize = 64 << 20;
const THREADS: usize = 4;
const OPS_PER_THREAD: usize = 30_000;
const MAGIC: u64 = 0xF00D_CAFE_0000_0000;

/// A zone of the region holding fixed-size records. Zone A uses 64-byte records (each inside
/// one page); zone B uses 72-byte records starting at an odd offset, so many records straddle
/// a page boundary.
#[derive(Clone, Copy)]
struct Zone {
    start: usize,
    stride: usize,
    count: usize,
    /// Index of this zone's first record in the global numbering.
    first: usize,
}

struct Layout {
    zones: [Zone; 2],
}

impl Layout {
    fn new() -> Layout {
        let half = REGION / 2;
        let a = Zone {
            start: 0,
            stride: 64,
            count: half / 64,
            first: 0,
        };
        let b_start = half + 40;
        let b = Zone {
            start: b_start,
            stride: 72,
            count: (REGION - b_start) / 72,
            first: a.count,
        };
        Layout { zones: [a, b] }
    }

    fn total(&self) -> usize {
        self.zones[1].first + self.zones[1].count
    }

    /// (offset, length in bytes) of global record `i`.
    fn locate(&self, i: usize) -> (usize, usize) {
        let z = if i < self.zones[1].first {
            self.zones[0]
        } else {
            self.zones[1]
        };
        (z.start + (i - z.first) * z.stride, z.stride)
    }
}

/// Expected words of record `index` at `version` (version 0: never written, all zeros).
fn record_words(index: usize, version: u64, len: usize) -> Vec<u64> {
    let n = len / 8;
    if version == 0 {
        return vec![0; n];
    }
    let mut w = Vec::with_capacity(n);
    w.push(MAGIC ^ index as u64);
    w.push(version);
    for k in 2..n - 1 {
        w.push(mix(((index as u64) << 24) ^ (version << 4) ^ k as u64));
    }
    let sum = w.iter().fold(0x1234_5678u64, |acc, &x| mix(acc ^ x));
    w.push(sum);
    w
}

#[derive(Default)]
struct ThreadReport {
    mismatches: usize,
    details: Vec<String>,
    reads: usize,
    writes: usize,
    written_versions: Vec<(usize, u64)>,
}

fn check_record(
    r: &Region,
    lay: &Layout,
    i: usize,
    version: u64,
    rep: &mut ThreadReport,
    what: &str,
) -> bool {
    let (off, len) = lay.locate(i);
    let want = record_words(i, version, len);
    for (k, &w) in want.iter().enumerate() {
        let got = rd_at(r, off + k * 8);
        if got != w {
            rep.mismatches += 1;
            if rep.details.len() < 10 {
                rep.details.push(format!(
                    "{what}: record {i} (offset {off:#x}, page {}) version {version} word {k}: \
                     got {got:#018x}, want {w:#018x}, resident={}",
                    (off + k * 8) / PAGE_SIZE,
                    r.is_resident(off + k * 8)
                ));
            }
            return false;
        }
    }
    true
}

fn write_record(r: &Region, lay: &Layout, i: usize, version: u64) {
    let (off, len) = lay.locate(i);
    // Write the words in a scrambled order so a torn record (part old, part new) would not
    // checksum.
    let words = record_words(i, version, len);
    let n = words.len();
    for k in 0..n {
        let k = (k * 5 + 3) % n;
        wr_at(r, off + k * 8, words[k]);
    }
}

/// Random hint before a read of `len` bytes at `p` (or none).
fn read_hint(rng: &mut XorShift, p: *const u8, len: usize) {
    match rng.below(5) {
        0 => {}
        1 => crate::hint(p),
        2 => crate::hint_ex(p, len, 0, rng.range_i64(-32, 64) as i32, rng.below(8) as u8),
        3 => crate::hint_ex(p, len, FM_SEQ, rng.range_i64(0, 16) as i32, 0),
        _ => {
            // Hint only the first byte: a straddling record's second page faults unhinted.
            crate::hint_ex(p, 1, 0, 0, 0)
        }
    }
}

/// Random hint before a write of `len` bytes at `p` (or none, or only a read hint so the
/// write takes a write-protect fault).
fn write_hint(rng: &mut XorShift, p: *const u8, len: usize) {
    match rng.below(5) {
        0 => {}
        1 => crate::hint_write(p),
        2 => crate::hint_ex(
            p,
            len,
            FM_WRITE,
            rng.range_i64(-16, 32) as i32,
            rng.below(8) as u8,
        ),
        3 => crate::hint(p),
        _ => crate::hint_ex(p, len, FM_WRITE | FM_SEQ, 0, 0),
    }
}

fn worker(r: &Region, lay: &Layout, tid: usize) -> ThreadReport {
    let mut rng = XorShift::new(0xABCD + tid as u64 * 7919);
    let total = lay.total();
    // This thread owns records i with i % THREADS == tid; shadow[i / THREADS] = version.
    let owned = (total - tid).div_ceil(THREADS);
    let mut shadow = vec![0u32; owned];
    let mut written: Vec<usize> = Vec::new();
    let mut rep = ThreadReport::default();
    for _ in 0..OPS_PER_THREAD {
        // Prefer records written before (re-reads and re-writes are what can go stale).
        let slot = if !written.is_empty() && rng.chance(60) {
            written[rng.below(written.len())]
        } else {
            rng.below(owned)
        };
        let i = slot * THREADS + tid;
        let (off, len) = lay.locate(i);
        let p = at(r, off);
        let version = shadow[slot] as u64;
        if rng.chance(45) {
            // Read-modify-write: verify the old contents, then write the next version.
            write_hint(&mut rng, p, len);
            check_record(r, lay, i, version, &mut rep, "before write");
            write_record(r, lay, i, version + 1);
            if version == 0 {
                written.push(slot);
            }
            shadow[slot] += 1;
            rep.writes += 1;
        } else {
            read_hint(&mut rng, p, len);
            check_record(r, lay, i, version, &mut rep, "read");
            rep.reads += 1;
        }
    }
    rep.written_versions = written
        .iter()
        .map(|&s| (s * THREADS + tid, shadow[s] as u64))
        .collect();
    rep
}

/// Run the workload on a runtime whose budget is [`BUDGET`]; panics on any mismatch.
pub fn churn(rt: Runtime) {
    let budget = budget_pages(&rt);
    let r = rt.create_region(REGION).unwrap();
    assert_eq!(r.len(), REGION);
    let lay = Layout::new();
    let reports: Vec<ThreadReport> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let (r, lay) = (&r, &lay);
                s.spawn(move || worker(r, lay, t))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });

    let mut mismatches = 0;
    let mut details = Vec::new();
    let mut versions = std::collections::HashMap::new();
    for rep in &reports {
        mismatches += rep.mismatches;
        details.extend(rep.details.iter().cloned());
        assert!(
            rep.reads > 1000 && rep.writes > 1000,
            "both reads and writes ran"
        );
        for &(i, v) in &rep.written_versions {
            versions.insert(i, v);
        }
    }
    assert_eq!(
        mismatches,
        0,
        "records differ from the shadow copies:\n{}",
        details.join("\n")
    );

    // Final pass over every record (sequential, with read-ahead hints on every other page).
    let mut rep = ThreadReport::default();
    for i in 0..lay.total() {
        let (off, _) = lay.locate(i);
        if off % (2 * PAGE_SIZE) < 64 {
            crate::hint_ex(at(&r, off), 64, 0, 8, 0);
        }
        let v = versions.get(&i).copied().unwrap_or(0);
        check_record(&r, &lay, i, v, &mut rep, "final pass");
    }
    assert_eq!(
        rep.mismatches,
        0,
        "final pass found stale or lost records:\n{}",
        rep.details.join("\n")
    );

    let s = rt.stats();
    eprintln!("{s}");
    assert!(s.pages_evicted > 0, "eviction happened: {s}");
    assert!(
        s.pages_written_back > 0,
        "dirty pages were written back: {s}"
    );
    assert!(
        s.pages_fetched > 0,
        "pages were fetched back from the backend: {s}"
    );
    assert!(s.unhinted_faults > 0, "unhinted accesses faulted: {s}");
    assert!(s.hint_misses > 0, "hints fetched pages: {s}");
    assert!(
        s.peak_resident_pages as usize <= budget,
        "resident set exceeded the budget: peak {} > {budget} pages",
        s.peak_resident_pages
    );
    assert_eq!(s.bytes_read, s.pages_fetched * PAGE_SIZE as u64);
    assert_eq!(s.bytes_written, s.pages_written_back * PAGE_SIZE as u64);
    if rt.backend_name().starts_with("local+lz4") {
        // Pages are mostly zeros around the few records written: they must compress.
        let distinct_pages: std::collections::HashSet<usize> = versions
            .keys()
            .map(|&i| lay.locate(i).0 / PAGE_SIZE)
            .collect();
        assert!(
            (s.backend_bytes as usize) < distinct_pages.len() * PAGE_SIZE / 2,
            "lz4 backend holds {} bytes for at most {} pages written",
            s.backend_bytes,
            distinct_pages.len()
        );
    }
}
