//! The load client of the memcached workload (`farmem bench memcached-client`, internal):
//! store N keys with deterministic values through memcached's text protocol, read them all
//! back and verify every byte. Prints one line (the keys and a digest) that must be the same
//! natively and under farmem.

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
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
    let mut digest: u64 = 0xcbf2_9ce4_8422_2325;
    let mut got = vec![0u8; a.value_bytes + 2];
    for first in (0..a.keys).step_by(PIPELINE as usize) {
        let last = (first + PIPELINE).min(a.keys);
        for k in first..last {
            write!(w, "get key{k}\r\n")?;
        }
        w.flush()?;
        for k in first..last {
            line.clear();
            r.read_line(&mut line)?;
            let want = value(&pool, k, a.value_bytes);
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
