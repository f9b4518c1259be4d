//! `farmem demo`: the main job in miniature (on the embedded backend unless told otherwise),
//! checking its own result.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use farmem_proto::size::parse_size;
use farmem_runtime::config::parse_budget;
use farmem_runtime::{BackendSpec, Config, Runtime, PAGE_SIZE};

#[derive(clap::Args)]
pub struct Args {
    /// Data set size (bytes; K/M/G suffixes).
    #[arg(long, default_value = "1G")]
    size: String,
    /// Local memory budget: bytes (256M) or percent of the data set (25%).
    #[arg(long, default_value = "25%")]
    local_mem: String,
    /// Far-memory backend: local://, local+lz4:// or tcp://[TENANT@]HOST:PORT (a farmem
    /// server; its secret in FARMEM_TOKEN or FARMEM_TOKEN_FILE).
    #[arg(long, default_value = "local://")]
    backend: String,
}

/// The value stored in word `w` of the data set (deterministic, non-zero, page-varying).
fn value(w: u64) -> u64 {
    (w ^ 0x9E37_79B9_7F4A_7C15).wrapping_mul(0xBF58_476D_1CE4_E5B9) | 1
}

pub fn run(a: Args) -> Result<()> {
    let size = parse_size(&a.size).context("--size")? as usize;
    let local = match a.local_mem.trim().strip_suffix('%') {
        Some(p) => {
            let pct: f64 = p.trim().parse().context("--local-mem percentage")?;
            if !(pct > 0.0 && pct <= 100.0) {
                bail!("--local-mem percentage must be in (0, 100]");
            }
            (size as f64 * pct / 100.0) as u64
        }
        None => parse_budget(&a.local_mem).context("--local-mem")?,
    };
    let cfg = Config {
        local_mem: local,
        backend: BackendSpec::parse(&a.backend)?,
        // Other settings (FARMEM_EVICT_BATCH, ...) come from the environment.
        ..Config::from_env().context("FARMEM_* settings")?
    };
    let rt = Runtime::new(cfg).context("starting the farmem runtime")?;
    let region = rt.create_region(size).context("creating the region")?;
    let words = region.len() / 8;
    let pages = region.len() / PAGE_SIZE;
    let p = region.as_mut_ptr() as *mut u64;
    println!(
        "farmem demo: {} MiB of data, {} MiB local ({:.0}%), backend {}",
        region.len() >> 20,
        local >> 20,
        100.0 * local as f64 / region.len() as f64,
        rt.backend_name()
    );

    // 1. Write every word with plain stores: unhinted faults, eviction as the budget fills.
    let t = Instant::now();
    for w in 0..words {
        // SAFETY: w < words, inside the region; nothing else accesses it.
        unsafe { p.add(w).write(value(w as u64)) };
    }
    report("write (unhinted)", pages, t);

    // 2. Read it back unhinted: sequential faults get read-ahead.
    let t = Instant::now();
    let mut bad = verify(p, words, |_| {});
    report("verify (unhinted)", pages, t);

    // 3. Read it back with one hint per page asking for 63 pages of read-ahead.
    let t = Instant::now();
    bad += verify(p, words, |w| {
        if w % (PAGE_SIZE / 8) == 0 {
            // SAFETY: pointer arithmetic inside the region.
            farmem_runtime::hint_ex(unsafe { p.add(w) }, 8, farmem_runtime::FM_SEQ, 63, 0);
        }
    });
    report("verify (hinted, readahead 63)", pages, t);

    let s = rt.stats();
    println!("{s}");
    if bad != 0 {
        bail!("{bad} words read back wrong");
    }
    if s.pages_evicted == 0 && local < region.len() as u64 {
        bail!("nothing was evicted although the data set exceeds local memory");
    }
    println!(
        "OK: all {} MiB read back correctly twice; peak resident {} MiB within the {} MiB budget",
        region.len() >> 20,
        (s.peak_resident_pages * PAGE_SIZE as u64) >> 20,
        local >> 20
    );
    Ok(())
}

fn verify(p: *const u64, words: usize, mut before: impl FnMut(usize)) -> u64 {
    let mut bad = 0;
    for w in 0..words {
        before(w);
        // SAFETY: w < words, inside the region.
        if unsafe { p.add(w).read() } != value(w as u64) {
            bad += 1;
        }
    }
    bad
}

fn report(what: &str, pages: usize, t: Instant) {
    let s = t.elapsed().as_secs_f64();
    println!(
        "  {what:<28} {s:>7.2} s  {:>10.0} pages/s",
        pages as f64 / s
    );
}
