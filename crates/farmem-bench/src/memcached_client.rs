//! The load client of the memcached workload (`farmem bench memcached-client`, internal):
//! store N keys with deterministic values through memcached's text protocol, read them all
//! back and verify every byte. Prints one line (the keys and a digest) that must be the same
//! natively and under farmem. With `--gets`, the read phase is a Zipf GET workload instead.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// memcached's port on 127.0.0.1.
    #[arg(long)]
    port: u16,
    /// Keys to store (values of 100 KiB each).
    #[arg(long)]
    keys: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 100 << 10)]
    value_bytes: usize,
    /// After the load phase, this many GETs of keys drawn from Zipf(--zipf) (ranks scrambled
    /// over the keys), each verified, instead of reading every key back once; prints
    /// `result=` and `ops= secs=` lines for `farmem bench suite`.
    #[arg(long, default_value_t = 0)]
    gets: u64,
    /// Zipf exponent of the GET phase (AIFM and Eden: 0.8).
    #[arg(long, default_value_t = 0.8)]
    zipf: f64,
}

/// Pseudo-random letters shared by every value: each value is a window of this pool chosen by
/// its key, with the key written at its start, so values differ per key while making one
/// costs a copy rather than a random-number loop (the client must not be the bottleneck).
fn pool(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len + 4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b'a' + (x % 26) as u8
        })
        .collect()
}

fn value(pool: &[u8], k: u64, len: usize) -> Vec<u8> {
    let off = (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52) as usize; // 0..4096
    let mut v = pool[off..off + len].to_vec();
    let tag = format!("{k:016x}");
    let n = tag.len().min(len);
    v[..n].copy_from_slice(&tag.as_bytes()[..n]);
    v
}

fn connect(port: u16) -> Result<TcpStream> {
    let t0 = Instant::now();
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => return Ok(s),
            Err(e) if t0.elapsed() < Duration::from_secs(30) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e).context(format!("connecting to memcached on port {port}")),
        }
    }
}

/// Requests sent before their replies are read: enough to keep memcached busy, few enough
/// that neither side's socket buffer fills while the other waits.
const PIPELINE: u64 = 8;

pub fn run(a: Args) -> Result<()> {
    let s = connect(a.port)?;
    s.set_nodelay(true)?;
    let mut w = BufWriter::with_capacity(1 << 20, s.try_clone()?);
    let mut r = BufReader::with_capacity(1 << 20, s);
    let pool = pool(a.value_bytes);
    let mut line = String::new();
    let t0 = Instant::now();
    for first in (0..a.keys).step_by(PIPELINE as usize) {
        let last = (first + PIPELINE).min(a.keys);
        for k in first..last {
            let v = value(&pool, k, a.value_bytes);
            write!(w, "set key{k} 0 0 {}\r\n", v.len())?;
            w.write_all(&v)?;
            w.write_all(b"\r\n")?;
        }
        w.flush()?;
        for k in first..last {
            line.clear();
            r.read_line(&mut line)?;
            if line.trim_end() != "STORED" {
                bail!("set key{k}: memcached answered {:?}", line.trim_end());
            }
        }
    }
    let stored = t0.elapsed();
    if a.gets > 0 {
        let keys = zipf_keys(a.keys, a.gets, a.zipf)?;
        let t1 = Instant::now();
        let digest = get_all(&mut w, &mut r, &pool, a.value_bytes, &keys)?;
        let secs = t1.elapsed().as_secs_f64();
        eprintln!("memcached client: stored in {:.2} s", stored.as_secs_f64());
        println!(
            "result={} keys of {} bytes, {} Zipf({}) GETs verified, digest {digest:016x}",
            a.keys, a.value_bytes, a.gets, a.zipf
        );
        println!("ops={} secs={secs:.6}", a.gets);
        return Ok(());
    }
    let all: Vec<u64> = (0..a.keys).collect();
    let digest = get_all(&mut w, &mut r, &pool, a.value_bytes, &all)?;
    // The timing goes to stderr: stdout must be the same natively and under farmem.
    eprintln!(
        "memcached client: stored in {:.2} s, read back and verified in {:.2} s",
        stored.as_secs_f64(),
        (t0.elapsed() - stored).as_secs_f64()
    );
    println!(
        "memcached: {} keys of {} bytes verified, digest {digest:016x}",
        a.keys, a.value_bytes
    );
    Ok(())
}

/// GETs `keys` pipelined, verifying every value; a digest of what was read.
fn get_all(
    w: &mut impl Write,
    r: &mut impl BufRead,
    pool: &[u8],
    value_bytes: usize,
    keys: &[u64],
) -> Result<u64> {
    let mut digest: u64 = 0xcbf2_9ce4_8422_2325;
    let mut got = vec![0u8; value_bytes + 2];
    let mut line = String::new();
    for batch in keys.chunks(PIPELINE as usize) {
        for k in batch {
            write!(w, "get key{k}\r\n")?;
        }
        w.flush()?;
        for &k in batch {
            line.clear();
            r.read_line(&mut line)?;
            let want = value(pool, k, value_bytes);
            let header = format!("VALUE key{k} 0 {}", want.len());
            if line.trim_end() != header {
                bail!(
                    "get key{k}: expected {header:?}, got {:?} (evicted or lost)",
                    line.trim_end()
                );
            }
            r.read_exact(&mut got)?;
            if got[..want.len()] != want[..] || &got[want.len()..] != b"\r\n" {
                bail!("get key{k}: the value differs from what was stored");
            }
            line.clear();
            r.read_line(&mut line)?;
            if line.trim_end() != "END" {
                bail!("get key{k}: missing END");
            }
            for &b in &want[..want.len().min(64)] {
                digest = (digest ^ b as u64).wrapping_mul(0x100_0000_01b3);
            }
        }
    }
    Ok(digest)
}

/// `n` keys of `0..keys` drawn from Zipf(`s`) by inverse CDF (rank k, 0 the most popular, has
/// weight 1 / (k + 1)^s), deterministic; ranks are scrambled by a multiplicative hash so the
/// popular keys are spread over memcached's memory, not stored first.
fn zipf_keys(keys: u64, n: u64, s: f64) -> Result<Vec<u64>> {
    if keys == 0 || !(s >= 0.0 && s.is_finite()) {
        bail!("--gets needs --keys > 0 and a finite --zipf >= 0");
    }
    let mut cdf = Vec::with_capacity(keys as usize);
    let mut total = 0.0f64;
    for k in 0..keys {
        total += 1.0 / ((k + 1) as f64).powf(s);
        cdf.push(total);
    }
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    Ok((0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = (x >> 11) as f64 / (1u64 << 53) as f64 * total;
            let rank = cdf.partition_point(|&c| c <= u).min(keys as usize - 1) as u64;
            // An odd multiplier is a bijection modulo 2^64; cycle-walk into 0..keys.
            let mut k = rank;
            loop {
                k = k.wrapping_mul(0x9E37_79B9_7F4A_7C15) & (keys.next_power_of_two() - 1);
                if k < keys {
                    break k;
                }
            }
        })
        .collect())
}
