//! The load client of the memcached workload (`farmem bench memcached-client`, internal):
//! store N keys with deterministic values through memcached's text protocol, read them all
//! back and verify every byte. Prints one line (the keys and a digest) that must be the same
//! natively and under farmem.

use std::io::{BufRead, BufReader, Read, Write};
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

fn value(k: u64, len: usize) -> Vec<u8> {
    let mut x = k.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b'a' + (x % 26) as u8
        })
        .collect()
}

fn connect(port: u16) -> Result<TcpStream> {
    let t0 = Instant::now();
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => return Ok(s),
            Err(e) if t0.elapsed() < Duration::from_secs(30) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(e).context(format!("connecting to memcached on port {port}")),
        }
    }
}

pub fn run(a: Args) -> Result<()> {
    let s = connect(a.port)?;
    s.set_nodelay(true)?;
    let mut w = s.try_clone()?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    for k in 0..a.keys {
        let v = value(k, a.value_bytes);
        write!(w, "set key{k} 0 0 {}\r\n", v.len())?;
        w.write_all(&v)?;
        w.write_all(b"\r\n")?;
        line.clear();
        r.read_line(&mut line)?;
        if line.trim_end() != "STORED" {
            bail!("set key{k}: memcached answered {:?}", line.trim_end());
        }
    }
    let mut digest: u64 = 0xcbf2_9ce4_8422_2325;
    for k in 0..a.keys {
        write!(w, "get key{k}\r\n")?;
        line.clear();
        r.read_line(&mut line)?;
        let want = value(k, a.value_bytes);
        let header = format!("VALUE key{k} 0 {}", want.len());
        if line.trim_end() != header {
            bail!(
                "get key{k}: expected {header:?}, got {:?} (evicted or lost)",
                line.trim_end()
            );
        }
        let mut got = vec![0u8; want.len() + 2];
        r.read_exact(&mut got)?;
        if got[..want.len()] != want[..] {
            bail!("get key{k}: the value differs from what was stored");
        }
        line.clear();
        r.read_line(&mut line)?;
        if line.trim_end() != "END" {
            bail!("get key{k}: missing END");
        }
        for &b in &want[..64] {
            digest = (digest ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    println!(
        "memcached: {} keys of {} bytes verified, digest {digest:016x}",
        a.keys, a.value_bytes
    );
    Ok(())
}
