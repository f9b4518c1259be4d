//! The suite's workloads: small C programs kept in `crates/farmem-bench/workloads/` (built
//! with `cc` into the output directory, twice: plain, and hinted with a few `fm_hint` calls),
//! and Debian's memcached with a Zipf GET load generator.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use super::mode::Mode;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum Workload {
    /// Page-granular sequential scans of a large array (Eden/Fastswap microbenchmark).
    Seqscan,
    /// The same array scanned page by page in pseudo-random orders.
    Randscan,
    /// AIFM/Eden web front end: 32 Zipf(0.8) hash-table lookups then one 8 KiB object read.
    Kvs,
    /// A columnar table: filters and group-by aggregations over its columns.
    Dataframe,
    /// Parallel sort of a large integer array (sort the parts, merge).
    Psort,
    /// Debian's memcached, loaded then read with Zipf(0.8) GETs (transparent modes only).
    Memcached,
    /// A graph's CSR adjacency built from an R-MAT edge stream: random increments, then
    /// random writes into the array being built (a collapse shape for paging).
    Csrbuild,
    /// A CPython-style hash table grown by inserts (index rebuilt at random at each
    /// doubling), then a few random lookups (a collapse shape for paging).
    Dictgrow,
}

/// The shared header of the C workloads and the farmem header they include.
const COMMON_H: &str = include_str!("../../workloads/common.h");
const FARMEM_H: &str = include_str!("../../../../include/farmem.h");

/// memcached's value size: small objects, as a cache holds.
const MEMCACHED_VALUE: u64 = 4096;
/// Bytes memcached uses per item of [`MEMCACHED_VALUE`] (slab chunk, header, key), roughly:
/// sizes the key count so the footprint is about the requested size.
const MEMCACHED_ITEM_COST: u64 = 4800;

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Seqscan => "seqscan",
            Workload::Randscan => "randscan",
            Workload::Kvs => "kvs",
            Workload::Dataframe => "dataframe",
            Workload::Psort => "psort",
            Workload::Memcached => "memcached",
            Workload::Csrbuild => "csrbuild",
            Workload::Dictgrow => "dictgrow",
        }
    }

    /// Data size at `--scale 1`, MiB: seconds to a minute natively on a small machine.
    pub fn default_mib(self) -> u64 {
        match self {
            Workload::Dataframe => 2048,
            // Random writes at memory latency: 256 MiB takes ~19 s natively here.
            Workload::Csrbuild => 128,
            _ => 1024,
        }
    }

    /// What one operation of its throughput is.
    pub fn unit(self) -> &'static str {
        match self {
            Workload::Seqscan | Workload::Randscan => "pages",
            Workload::Kvs => "requests",
            Workload::Dataframe => "rows",
            Workload::Psort => "elements",
            Workload::Memcached => "GETs",
            Workload::Csrbuild => "edges",
            Workload::Dictgrow => "operations",
        }
    }

    fn source(self) -> Option<&'static str> {
        Some(match self {
            Workload::Seqscan => include_str!("../../workloads/seqscan.c"),
            Workload::Randscan => include_str!("../../workloads/randscan.c"),
            Workload::Kvs => include_str!("../../workloads/kvs.c"),
            Workload::Dataframe => include_str!("../../workloads/dataframe.c"),
            Workload::Psort => include_str!("../../workloads/psort.c"),
            Workload::Csrbuild => include_str!("../../workloads/csrbuild.c"),
            Workload::Dictgrow => include_str!("../../workloads/dictgrow.c"),
            Workload::Memcached => return None,
        })
    }

    /// Whether the workload runs in `mode` (memcached has no hinted build).
    pub fn supports(self, mode: Mode) -> bool {
        !(self == Workload::Memcached && mode.hinted())
    }

    /// Environment of its hinted runs: hints with eviction priorities want the policy that
    /// reads them.
    pub fn hinted_env(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Workload::Kvs => &[("FARMEM_POLICY", "priority")],
            _ => &[],
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A run's command line, and for a server its load client: the client's output is the run's
/// report; the server is stopped with SIGTERM once the client is done.
pub struct Launch {
    pub argv: Vec<OsString>,
    pub client: Option<Vec<OsString>>,
}

/// Where the workloads' executables are.
pub struct Programs {
    dir: PathBuf,
}

impl Programs {
    /// Writes the sources of `workloads` into `dir/src` and compiles them into `dir`.
    pub fn build(dir: &Path, workloads: &[Workload]) -> Result<Programs> {
        let src = dir.join("src");
        std::fs::create_dir_all(&src).with_context(|| format!("creating {}", src.display()))?;
        for (name, text) in [("common.h", COMMON_H), ("farmem.h", FARMEM_H)] {
            write(&src.join(name), text)?;
        }
        for &w in workloads {
            let Some(text) = w.source() else {
                if w == Workload::Memcached && !Path::new("/usr/bin/memcached").exists() {
                    bail!("the memcached workload needs /usr/bin/memcached: install the Debian package memcached (or leave it out with --workloads)");
                }
                continue;
            };
            let c = src.join(format!("{}.c", w.name()));
            write(&c, text)?;
            for hinted in [false, true] {
                let exe = dir.join(exe_name(w, hinted));
                let mut cc = Command::new("cc");
                cc.args(["-O2", "-pthread", "-Wall", "-I"]).arg(&src);
                if !hinted {
                    cc.arg("-DFARMEM_NO_HINTS");
                }
                cc.arg("-o").arg(&exe).arg(&c);
                let out = cc.output().context(
                    "running cc to build the workloads (install the Debian package gcc)",
                )?;
                if !out.status.success() {
                    bail!(
                        "compiling {} failed:\n{}",
                        c.display(),
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            }
        }
        Ok(Programs {
            dir: dir.to_path_buf(),
        })
    }

    /// How to start one run of `w` on `mib` MiB of data.
    pub fn launch(&self, w: Workload, mib: u64, hinted: bool, port: u16) -> Launch {
        match w {
            Workload::Memcached => memcached_launch(mib, port),
            _ => Launch {
                argv: vec![
                    self.dir.join(exe_name(w, hinted)).into_os_string(),
                    mib.to_string().into(),
                ],
                client: None,
            },
        }
    }
}

fn exe_name(w: Workload, hinted: bool) -> String {
    format!("{}-{}", w.name(), if hinted { "hinted" } else { "plain" })
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// memcached (the program under test) and its load client (`farmem bench memcached-client`,
/// started by the suite outside the mode: not under farmem, not in the swap cgroup).
fn memcached_launch(mib: u64, port: u16) -> Launch {
    let me = std::env::current_exe()
        .map(OsString::from)
        .unwrap_or_else(|_| "farmem".into());
    let keys = (mib << 20) / MEMCACHED_ITEM_COST;
    // Gets: as many as there are keys, times 4 (a hot set served many times).
    let gets = keys * 4;
    let s = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
    let mut client = vec![me];
    client.extend(s(&[
        "bench",
        "memcached-client",
        "--port",
        &port.to_string(),
    ]));
    client.extend(s(&["--keys", &keys.to_string(), "--value-bytes"]));
    client.extend(s(&[
        &MEMCACHED_VALUE.to_string(),
        "--gets",
        &gets.to_string(),
    ]));
    client.extend(s(&["--zipf", "0.8"]));
    Launch {
        argv: s(&[
            "/usr/bin/memcached",
            "-u",
            "root",
            "-U",
            "0",
            "-l",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-m",
            &(mib * 2 + 64).to_string(),
            "-t",
            "2",
        ]),
        client: Some(client),
    }
}

/// A free TCP port on loopback (for memcached).
pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}
