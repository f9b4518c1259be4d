//! `farmem bench programs`: unmodified programs from Debian's packages, natively, under
//! `farmem run` at a share of their peak memory (on each backend asked for), and under Linux
//! swap to zram and to a swap file with the same memory limit (a memory cgroup), side by side
//! in one run. Every run's output is compared
//! with the native one: a mismatch fails the benchmark.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::json;

use super::median;
use super::swap::{SwapBaseline, SwapKind};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Workloads: python, python-fork, sort, sqlite, memcached, c-fork (the fork test
    /// program, compiled with cc); also node (a V8 heap of small objects; package nodejs) and
    /// java (a HotSpot heap of small arrays, run from source; openjdk-17-jdk-headless).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "python,python-fork,sort,sqlite,memcached,c-fork"
    )]
    workloads: Vec<String>,
    /// Local memory, in percent of each program's native peak (plus 8 MiB for the program's
    /// code and stacks and the runtime's own memory; Linux swap's cgroup gets the same). The
    /// native peak is the most a memory cgroup holding the program's whole process tree is
    /// charged when it runs natively (forked workers and dirty file pages included), and at
    /// least its largest process's resident set.
    #[arg(long, value_delimiter = ',', default_value = "50,25")]
    local: Vec<u32>,
    /// Runs per point (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Data size of each workload, MiB (roughly its native peak).
    #[arg(long, default_value_t = 512)]
    size_mib: u64,
    /// Skip the Linux-swap runs.
    #[arg(long)]
    no_swap: bool,
    /// Where farmem keeps far pages (as `farmem run --backend`), one point each: by default
    /// `farmem run`'s own default (`tiered://`: LZ4 in DRAM, then a file under $TMPDIR or
    /// /var/tmp) and `local+lz4://` (LZ4 in DRAM only, as zram with `--zram-comp lz4`).
    #[arg(
        long = "backend",
        value_delimiter = ',',
        default_value = "tiered://,local+lz4://"
    )]
    backends: Vec<String>,
    /// Linux-swap baselines, one point each: `zram` (compressed RAM, `--zram-comp`) and
    /// `file` (a swap file, `--swap-file`, on the disk of farmem's far file).
    #[arg(long, value_delimiter = ',', default_value = "zram,file")]
    swap: Vec<String>,
    /// The swap file of the `file` baseline: created for each run and removed after it; it
    /// must not exist. Default: in $TMPDIR, else /var/tmp, where `tiered://` puts its file.
    #[arg(long, value_name = "PATH")]
    swap_file: Option<PathBuf>,
    /// zram's compressor for the Linux-swap runs (`default`: leave the kernel's choice).
    #[arg(long, default_value = "lz4")]
    zram_comp: String,
    /// Let the Linux-swap cgroup's OOM killer end a program whose limit is too tight, as
    /// Linux does by default (the run then reads OOM-killed). By default it is off (cgroup
    /// v1 `memory.oom_control`) and the benchmark ends each stall: a charge that fails parks
    /// the program's thread, the benchmark reclaims 128 KiB of the cgroup from outside and
    /// wakes it, so every point gets a time.
    #[arg(long)]
    oom_kill: bool,
    /// Also write the results as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

const WORKLOADS: [&str; 8] = [
    "python",
    "python-fork",
    "sort",
    "sqlite",
    "memcached",
    "c-fork",
    "node",
    "java",
];

/// The C program of the fork test: builds a heap, lets most of it be evicted, forks without
/// exec, and parent and child verify all of it.
const FORK_C: &str = include_str!("../../farmem-cli/tests/programs/fork.c");
/// The test programs' shared data pattern, which `fork.c` includes.
const PATTERN_H: &str = include_str!("../../farmem-cli/tests/programs/pattern.h");

/// A program run: argv, the files it needs, and whether its result is its stdout.
struct Workload {
    name: &'static str,
    argv: Vec<String>,
}

const PY_BUILD: &str = r#"
import hashlib, sys
mib = int(sys.argv[1])
n = mib * 1024 * 1024 // 240
h = hashlib.sha256()
lists = [[i, i * 7, str(i)] for i in range(n // 4)]
d = {i: (i * 31) % 1000003 for i in range(n // 4)}
blobs = [bytearray((i % 251,)) * 1024 for i in range(n // 8)]
for l in lists[::97]: h.update(repr(l).encode())
for k in range(0, len(d), 89): h.update(str(d[k]).encode())
for b in blobs[::13]: h.update(b)
print(len(lists), len(d), len(blobs), h.hexdigest())
"#;

const PY_FORK: &str = r#"
import hashlib, os, sys, time, multiprocessing as mp
_fork = os.fork
def timed_fork():
    t = time.perf_counter()
    pid = _fork()
    if pid:
        sys.stderr.write("fork-us %d\n" % ((time.perf_counter() - t) * 1e6))
    return pid
os.fork = timed_fork
mib = int(sys.argv[1])
data = [bytes((i % 251,)) * 4096 for i in range(mib * 256 * 7 // 8)]
def part(r):
    h = hashlib.sha256()
    for i in range(*r): h.update(data[i])
    return h.hexdigest()
if __name__ == "__main__":
    n = len(data)
    with mp.get_context("fork").Pool(2) as p:
        print(p.map(part, [(0, n // 2), (n // 2, n)]))
"#;

/// A V8 heap (node): a Map of small objects and strings built, read at random, verified.
const NODE_HEAP: &str = r#"
const mib = Number(process.argv[2]);
const n = Math.floor(mib * 1048576 / 320);
const m = new Map();
for (let i = 0; i < n; i++) m.set('k' + i, { a: i, b: 'v'.repeat(20) + i, c: [i, i * 2, i * 3] });
let sum = 0;
for (let r = 0, x = 12345; r < 2 * n; r++) {
  x = (x * 1103515245 + 12345) % 2147483648;
  sum += m.get('k' + (x % n)).a;
}
for (let i = 0; i < n; i++) {
  const o = m.get('k' + i);
  if (o.a !== i || o.b !== 'v'.repeat(20) + i || o.c[2] !== i * 3) { console.log('lost', i); process.exit(1); }
}
console.log(n, 'entries verified, sum', sum);
"#;

/// A HotSpot heap (G1): a HashMap of small byte arrays built, read at random, verified.
const JAVA_HEAP: &str = r#"
public class Heap {
    public static void main(String[] args) {
        int n = (int) (Long.parseLong(args[0]) * 1048576 / 400);
        java.util.HashMap<Integer, byte[]> m = new java.util.HashMap<>();
        for (int i = 0; i < n; i++) {
            byte[] b = new byte[200];
            b[0] = (byte) i; b[199] = (byte) (i >> 8);
            m.put(i, b);
        }
        long sum = 0;
        java.util.Random r = new java.util.Random(7);
        for (int k = 0; k < 2 * n; k++) { byte[] b = m.get(r.nextInt(n)); sum += b[0] + b[199]; }
        for (int i = 0; i < n; i++) {
            byte[] b = m.get(i);
            if (b[0] != (byte) i || b[199] != (byte) (i >> 8)) { System.out.println("lost " + i); System.exit(1); }
        }
        System.out.println(n + " entries verified, sum " + sum);
    }
}
"#;

fn write(dir: &Path, name: &str, text: &str) -> Result<String> {
    let p = dir.join(name);
    std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    Ok(p.to_string_lossy().into_owned())
}

fn need(path: &str, package: &str) -> Result<()> {
    if !Path::new(path).exists() {
        bail!("{path} is missing: install the Debian package {package}");
    }
    Ok(())
}

fn workload(name: &str, dir: &Path, mib: u64) -> Result<Workload> {
    let sh = |s: String| vec!["/bin/sh".to_string(), "-c".to_string(), s];
    let argv = match name {
        "python" => {
            need("/usr/bin/python3", "python3")?;
            let s = write(dir, "build.py", PY_BUILD)?;
            vec!["/usr/bin/python3".into(), s, mib.to_string()]
        }
        "python-fork" => {
            need("/usr/bin/python3", "python3")?;
            let s = write(dir, "fork.py", PY_FORK)?;
            vec!["/usr/bin/python3".into(), s, mib.to_string()]
        }
        "sort" => {
            // Lines of ~11 bytes; sort's in-memory representation is several times larger.
            // The keys come from the Park-Miller generator, whose products stay below 2^53,
            // so awk's doubles compute it exactly: distinct keys in random order. (The glibc
            // constants used before overflowed the doubles and repeated a cycle of 16 K
            // values, so the merge walked the text at a fixed stride, as no real input does.)
            let input = dir.join("numbers.txt");
            if !input.exists() {
                let lines = mib * 1024 * 1024 / 64;
                let gen = format!(
                    "awk 'BEGIN {{ x = 12345; for (i = 0; i < {lines}; i++) {{ x = (x * \
                     48271) % 2147483647; print x }} }}' > {}",
                    input.display()
                );
                let st = Command::new("/bin/sh").arg("-c").arg(&gen).status()?;
                if !st.success() {
                    bail!("generating the sort input failed");
                }
            }
            let out = dir.join("sorted.txt");
            sh(format!(
                "/usr/bin/sort -n -S 4G -o {o} {i} && /usr/bin/md5sum < {o} && rm -f {o}",
                o = out.display(),
                i = input.display()
            ))
        }
        "sqlite" => {
            need("/usr/bin/sqlite3", "sqlite3")?;
            let rows = mib * 1024 * 1024 / 200;
            let sql = format!(
                "CREATE TABLE t(id INTEGER PRIMARY KEY, grp INTEGER, val INTEGER, pad TEXT);\n\
                 WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {rows})\n\
                 INSERT INTO t SELECT x, x % 97, (x * 7919) % 100003, printf('%050d', x) FROM c;\n\
                 CREATE INDEX t_grp ON t(grp, val);\n\
                 SELECT grp, COUNT(*), SUM(val), MIN(pad), MAX(val) FROM t GROUP BY grp ORDER BY grp;\n\
                 SELECT COUNT(*), SUM(val % 13), AVG(id) FROM t WHERE val > 50000;\n"
            );
            let f = write(dir, "db.sql", &sql)?;
            sh(format!("/usr/bin/sqlite3 :memory: < {f}"))
        }
        "memcached" => {
            need("/usr/bin/memcached", "memcached")?;
            let me = std::env::current_exe()?;
            let keys = mib * 1024 / 100; // 100 KiB values
                                         // The load client runs without farmem (it is not the program under test);
                                         // memcached is killed once the client is done: its orderly shutdown takes ~1 s of
                                         // sleeping that would swamp the measurement.
            sh(format!(
                "P=$((20000 + $$ % 20000)); /usr/bin/memcached -u root -U 0 -l 127.0.0.1 -p $P \
                 -m {} -t 2 -I 2m & M=$!; env -u LD_PRELOAD -u FARMEM_PRELOAD {} bench \
                 memcached-client --port $P --keys {keys}; R=$?; kill -KILL $M; wait $M; exit $R",
                mib * 2,
                me.display()
            ))
        }
        "node" => {
            need("/usr/bin/node", "nodejs")?;
            let s = write(dir, "heap.js", NODE_HEAP)?;
            // V8 sizes its heap limit from the memory cgroup's limit and fails at it (under
            // Linux swap: "JavaScript heap out of memory"); a limit that never binds, as a
            // user who runs it under a memory limit sets, so that both sides page.
            let limit = format!("--max-old-space-size={}", 2 * mib + 256);
            vec!["/usr/bin/node".into(), limit, s, mib.to_string()]
        }
        "java" => {
            need("/usr/bin/java", "openjdk-17-jdk-headless")?;
            let s = write(dir, "Heap.java", JAVA_HEAP)?;
            // A heap limit that never binds: memory is what the local budget allows. And one
            // collector on both sides: the JVM picks its own from the memory it sees, the
            // serial one under a memory cgroup's limit of less than 1792 MiB, G1 (the server
            // default) under farmem, which leaves the machine's memory in view.
            let xmx = format!("-Xmx{}m", 2 * mib + 256);
            vec![
                "/usr/bin/java".into(),
                xmx,
                "-XX:+UseG1GC".into(),
                s,
                mib.to_string(),
            ]
        }
        "c-fork" => {
            write(dir, "pattern.h", PATTERN_H)?;
            let src = write(dir, "fork.c", FORK_C)?;
            let exe = dir.join("fork");
            let st = Command::new("cc")
                .args(["-O2", "-o"])
                .arg(&exe)
                .arg(&src)
                .status()
                .context("running cc to build the fork program (install the Debian package gcc)")?;
            if !st.success() {
                bail!("compiling {src} failed");
            }
            vec![
                exe.to_string_lossy().into_owned(),
                "simple".into(),
                mib.to_string(),
            ]
        }
        other => bail!("unknown workload '{other}' ({})", WORKLOADS.join(", ")),
    };
    Ok(Workload {
        name: WORKLOADS
            .iter()
            .find(|&&w| w == name)
            .copied()
            .expect("every workload built above is in WORKLOADS"),
        argv,
    })
}

#[derive(Clone)]
struct RunResult {
    secs: f64,
    stdout: Vec<u8>,
    peak_rss: u64,
    /// Memory the run used at its peak, far copies included: for farmem the program's peak
    /// resident set (its far pages are in it with an embedded backend) plus what a memory
    /// server holds for it; for Linux the cgroup's peak plus zram's peak memory.
    mem_used: u64,
    /// What each `fork()` of the program took, microseconds (the programs that fork say so
    /// on stderr as `fork-us N`).
    fork_us: Vec<f64>,
    /// farmem: the most pages the main process ever held locally, bytes.
    peak_local: Option<u64>,
    /// Linux swap: OOM stalls the benchmark ended by reclaiming from outside (its OOM
    /// killer is off, see `--oom-kill`).
    oom_stalls: u64,
    /// And how long the program was seen parked in them, ms.
    oom_parked_ms: f64,
}

/// The `fork-us N` lines of a program's stderr.
fn fork_times(stderr: &[u8]) -> Vec<f64> {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter_map(|l| l.strip_prefix("fork-us ")?.trim().parse().ok())
        .collect()
}

/// Read the child's stdout and stderr to the end, then reap it with wait4: its status, its
/// output, its stderr and its peak resident set (the largest among it and the descendants
/// it waited for).
fn wait_rusage(mut child: std::process::Child) -> Result<(i32, Vec<u8>, Vec<u8>, u64)> {
    use std::io::Read;
    let err = child.stderr.take().map(|mut e| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = e.read_to_end(&mut v);
            v
        })
    });
    let mut stdout = Vec::new();
    if let Some(mut o) = child.stdout.take() {
        o.read_to_end(&mut stdout)?;
    }
    let stderr = err
        .map(|t| t.join().unwrap_or_default())
        .unwrap_or_default();
    let pid = child.id() as i32;
    let mut status = 0;
    // SAFETY: rusage is plain old data.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: reaping our own child with valid out-pointers.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if r == pid {
            break;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            bail!(
                "waiting for the program: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    Ok((status, stdout, stderr, ru.ru_maxrss as u64 * 1024))
}

/// The program natively, in a memory cgroup with no limit it reaches: its peak is what such
/// a cgroup is charged at most, the limit's measure for the whole tree (forked workers, a
/// shell, the dirty pages of a file written), and at least the largest process's resident
/// set (its code is in that, not in the charge). The largest process alone, the measure
/// before, left python3's multiprocessing job at "100%" with 471 MiB for a tree that needs
/// more: 2.8x native under farmem and as slow under Linux's limit.
fn run_native(w: &Workload) -> Result<RunResult> {
    let machine = farmem_sys::mem::physical_memory();
    let cg = SwapBaseline::setup(SwapKind::None, 1 << 20, machine)?;
    let mut cmd = Command::new(&w.argv[0]);
    cmd.args(&w.argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let t0 = Instant::now();
    let (st, stdout, stderr, peak) = cg.run_with(cmd, |c| {
        let (st, stdout, stderr, peak) =
            wait_rusage(c.spawn()?).map_err(|e| std::io::Error::other(format!("{e:#}")))?;
        Ok((
            std::process::ExitStatus::from_raw(st),
            (st, stdout, stderr, peak),
        ))
    })?;
    let secs = t0.elapsed().as_secs_f64();
    let tree_peak = cg.stats().mem_used();
    cg.close()?;
    if !(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0) {
        bail!("{} failed natively (wait status {st:#x})", w.name);
    }
    Ok(RunResult {
        secs,
        stdout,
        peak_rss: peak,
        mem_used: tree_peak.max(peak),
        fork_us: fork_times(&stderr),
        peak_local: None,
        oom_stalls: 0,
        oom_parked_ms: 0.0,
    })
}

fn run_farmem(w: &Workload, local: u64, backend: &str, dir: &Path) -> Result<RunResult> {
    let me = std::env::current_exe()?;
    let json = dir.join("stats.json");
    let _ = std::fs::remove_file(&json);
    // In a memory cgroup of its own, with no limit it reaches: its peak is measured as Linux
    // swap's is, forked children and the `farmem run` supervisor included.
    let machine = farmem_sys::mem::physical_memory();
    let cg = SwapBaseline::setup(SwapKind::None, 1 << 20, machine)?;
    let mut cmd = Command::new(me);
    cmd.arg("run")
        .arg("--local-mem")
        .arg(local.to_string())
        .arg("--backend")
        .arg(backend)
        .arg("--stats-json")
        .arg(&json)
        .arg("--")
        .args(&w.argv)
        .stdin(Stdio::null());
    let t0 = Instant::now();
    let out = cg.run(cmd)?;
    let secs = t0.elapsed().as_secs_f64();
    let tree_peak = cg.stats().mem_used();
    cg.close()?;
    if !out.status.success() {
        bail!(
            "{} failed under farmem run: {}\n{}",
            w.name,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stats: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&json).context("reading farmem run's --stats-json")?,
    )?;
    let peak = stats["peak_rss_bytes"].as_u64().unwrap_or(0);
    let remote = if backend.starts_with("tcp://") {
        stats["stats"]["backend_bytes"].as_u64().unwrap_or(0)
    } else {
        0 // an embedded backend's far pages are in the process's resident set
    };
    let peak_local = stats["stats"]["peak_resident_pages"]
        .as_u64()
        .map(|p| p * farmem_runtime::PAGE_SIZE as u64);
    Ok(RunResult {
        secs,
        stdout: out.stdout,
        peak_rss: peak,
        // The cgroup's peak, as on Linux's side: the resident set also counts the program's
        // code and libraries (10 MiB for python3), pages neither cgroup is charged for.
        mem_used: if tree_peak > 0 { tree_peak } else { peak } + remote,
        fork_us: fork_times(&out.stderr),
        peak_local,
        oom_stalls: 0,
        oom_parked_ms: 0.0,
    })
}

fn run_swap(w: &Workload, kind: &SwapKind, limit: u64, peak: u64) -> Result<RunResult> {
    let base = SwapBaseline::setup(kind.clone(), 2 * peak + (256 << 20), limit)?;
    let mut cmd = Command::new(&w.argv[0]);
    cmd.args(&w.argv[1..]).stdin(Stdio::null());
    let t0 = Instant::now();
    let out = base.run(cmd)?;
    let secs = t0.elapsed().as_secs_f64();
    let st = base.stats();
    let mem_used = st.mem_used();
    base.close()?;
    // With `--oom-kill`, Linux swap cannot always run the program at this limit: the
    // cgroup's OOM killer ends it (directly, or the shell reports its child's SIGKILL as
    // 137). That is a result.
    use std::os::unix::process::ExitStatusExt;
    if out.status.signal() == Some(libc::SIGKILL) || out.status.code() == Some(137) {
        return Ok(RunResult {
            secs: f64::INFINITY,
            stdout: Vec::new(),
            peak_rss: 0,
            mem_used,
            fork_us: Vec::new(),
            peak_local: None,
            oom_stalls: st.oom_stalls.unwrap_or(0),
            oom_parked_ms: st.oom_parked_us.unwrap_or(0) as f64 / 1e3,
        });
    }
    if !out.status.success() {
        bail!(
            "{} failed under Linux swap (limit {} MiB): {}\n{}",
            w.name,
            limit >> 20,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(RunResult {
        secs,
        stdout: out.stdout,
        peak_rss: 0,
        mem_used,
        fork_us: fork_times(&out.stderr),
        peak_local: None,
        oom_stalls: st.oom_stalls.unwrap_or(0),
        oom_parked_ms: st.oom_parked_us.unwrap_or(0) as f64 / 1e3,
    })
}

pub fn run(a: Args) -> Result<()> {
    if a.repeat == 0 || a.local.iter().any(|&p| p == 0 || p > 100) {
        bail!("--repeat must be positive and --local percentages in 1..=100");
    }
    super::swap::use_zram_compressor((a.zram_comp != "default").then_some(a.zram_comp.as_str()));
    super::swap::use_oom_killer(a.oom_kill);
    let dir = std::env::temp_dir().join(format!("farmem-bench-programs-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let res = run_in(&a, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    res
}

/// One way of running a program short of memory.
enum Mode {
    Farmem(String),
    Swap(SwapKind),
}

impl Mode {
    /// Its column name: the backend without `://`, or the kind of swap.
    fn label(&self) -> String {
        match self {
            Mode::Farmem(b) => b.split("://").next().unwrap_or(b).to_string(),
            Mode::Swap(SwapKind::Zram) => "zram".into(),
            Mode::Swap(SwapKind::File(_)) => "swapfile".into(),
            Mode::Swap(SwapKind::None) => "cgroup".into(),
        }
    }

    fn describe(&self) -> String {
        match self {
            Mode::Farmem(b) => format!("farmem run --backend {b}"),
            Mode::Swap(k) => format!("Linux swap ({k})"),
        }
    }
}

fn modes(a: &Args) -> Result<Vec<Mode>> {
    let mut m: Vec<Mode> = a.backends.iter().map(|b| Mode::Farmem(b.clone())).collect();
    if !a.no_swap {
        for s in &a.swap {
            m.push(Mode::Swap(match s.as_str() {
                "zram" => SwapKind::Zram,
                "file" => SwapKind::File(a.swap_file.clone().unwrap_or_else(|| {
                    farmem_runtime::default_far_dir()
                        .join(format!("farmem-bench-swapfile-{}", std::process::id()))
                })),
                other => bail!("--swap {other}: expected zram or file"),
            }));
        }
    }
    Ok(m)
}

fn run_in(a: &Args, dir: &Path) -> Result<()> {
    let modes = modes(a)?;
    let mut rows = Vec::new();
    let mut all_json = Vec::new();
    for name in &a.workloads {
        let w = workload(name, dir, a.size_mib)?;
        eprint!("{}: native run to measure the peak ... ", w.name);
        let reference = run_native(&w)?;
        let peak = reference.mem_used.max(16 << 20);
        eprintln!(
            "{:.2} s, peak {} MiB (the tree's cgroup; largest process {} MiB)",
            reference.secs,
            peak >> 20,
            reference.peak_rss >> 20
        );
        let mut times: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        let mut mem: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        let mut forks: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        // Per farmem point: the main process's peak local memory over its budget (worst run).
        let mut over: BTreeMap<String, f64> = BTreeMap::new();
        for rep in 0..a.repeat {
            let r = if rep == 0 {
                reference.clone()
            } else {
                run_native(&w)?
            };
            times.entry("native".into()).or_default().push(r.secs);
            forks.entry("native".into()).or_default().extend(&r.fork_us);
            for &pct in &a.local {
                let local = crate::limits::limit(peak, pct as f64);
                // One run per mode in turn, so that drifts of the machine hit all alike.
                for mode in &modes {
                    let key = format!("{} {pct}%", mode.label());
                    eprint!(
                        "{} rep {}/{}: {} at {pct}% ({} MiB) ... ",
                        w.name,
                        rep + 1,
                        a.repeat,
                        mode.describe(),
                        local >> 20
                    );
                    let r = match mode {
                        Mode::Farmem(backend) => run_farmem(&w, local, backend, dir)?,
                        Mode::Swap(kind) => run_swap(&w, kind, local, peak)?,
                    };
                    if r.secs.is_finite() {
                        eprint!("{:.2} s, {} MiB used", r.secs, r.mem_used >> 20);
                        if r.oom_stalls > 0 {
                            eprint!(
                                ", {} OOM stalls relieved ({:.0} ms parked)",
                                r.oom_stalls, r.oom_parked_ms
                            );
                        }
                        eprintln!();
                    } else {
                        eprintln!("OOM-killed");
                    }
                    if r.secs.is_finite() && r.stdout != reference.stdout {
                        bail!(
                            "{}: output under {} at {pct}% differs from the native one: {:?} \
                             instead of {:?}",
                            w.name,
                            mode.describe(),
                            String::from_utf8_lossy(&r.stdout),
                            String::from_utf8_lossy(&reference.stdout)
                        );
                    }
                    times.entry(key.clone()).or_default().push(r.secs);
                    forks.entry(key.clone()).or_default().extend(&r.fork_us);
                    if let Some(p) = r.peak_local {
                        let o = over.entry(key.clone()).or_insert(0.0);
                        *o = o.max(p as f64 / local as f64);
                    }
                    mem.entry(key).or_default().push(r.mem_used as f64);
                }
            }
        }
        let med: BTreeMap<String, f64> = times
            .iter()
            .map(|(k, v)| (k.clone(), median(v.clone())))
            .collect();
        // Runs the OOM killer ended are infinite here and null in the JSON.
        let finite = |v: f64| v.is_finite().then_some(v);
        let runs: BTreeMap<&String, Vec<Option<f64>>> = times
            .iter()
            .map(|(k, v)| (k, v.iter().map(|&x| finite(x)).collect()))
            .collect();
        let meds: BTreeMap<&String, Option<f64>> =
            med.iter().map(|(k, &v)| (k, finite(v))).collect();
        let mem_med: BTreeMap<String, f64> = mem
            .iter()
            .map(|(k, v)| (k.clone(), median(v.clone())))
            .collect();
        let fork_med: BTreeMap<String, f64> = forks
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| (k.clone(), median(v.clone())))
            .collect();
        all_json.push(json!({
            "workload": w.name,
            "peak_rss_bytes": peak,
            "median_s": meds,
            "runs_s": runs,
            "median_mem_used_bytes": mem_med,
            "median_fork_us": fork_med,
            "peak_local_over_budget": over,
        }));
        rows.push((w.name, peak, med, mem_med, fork_med, over));
    }
    println!(
        "\nmedian wall time in seconds (ratio to native), and memory used at the peak in MiB \
         (the peak of a memory cgroup holding the whole process tree, forked children \
         included: for farmem its compressed far pages count, a far file does not; for Linux \
         zram's memory is added); data size {} MiB; limit at N%: N% of the native peak (the \
         tree's cgroup peak, at least its largest resident set) plus {} MiB, for both sides; farmem on {}; zram with {}",
        a.size_mib,
        crate::limits::PROCESS_ALLOWANCE >> 20,
        a.backends.join(", "),
        a.zram_comp
    );
    let mut cols = vec!["native".to_string()];
    for &p in &a.local {
        for m in &modes {
            cols.push(format!("{} {p}%", m.label()));
        }
    }
    print!("{:<12} {:>9}", "workload", "peak MiB");
    for c in &cols {
        print!(" {c:>18}");
    }
    println!();
    for (name, peak, med, mem_med, _, _) in &rows {
        print!("{name:<12} {:>9.0}", *peak as f64 / (1 << 20) as f64);
        let native = med["native"];
        for c in &cols {
            let v = med[c];
            let used = mem_med
                .get(c)
                .map(|m| format!(" {:.0}M", m / (1 << 20) as f64))
                .unwrap_or_default();
            if v.is_finite() {
                print!(" {:>18}", format!("{v:.2} ({:.1}x){used}", v / native));
            } else {
                print!(" {:>18}", "OOM-killed");
            }
        }
        println!();
    }
    if rows.iter().any(|r| !r.4.is_empty()) {
        println!(
            "\nfork(): median time in microseconds (ratio to native); farmem: the main \
             process's peak local memory over its budget (worst run)"
        );
        print!("{:<12}", "workload");
        for c in &cols {
            print!(" {c:>18}");
        }
        println!();
        for (name, _, _, _, fork_med, over) in rows.iter().filter(|r| !r.4.is_empty()) {
            print!("{name:<12}");
            let native = fork_med.get("native").copied().unwrap_or(f64::NAN);
            for c in &cols {
                let cell = match fork_med.get(c) {
                    Some(v) => format!("{v:.0} ({:.1}x)", v / native),
                    None => "-".into(),
                };
                let budget = over
                    .get(c)
                    .map(|o| format!(" {:.0}%", o * 100.0))
                    .unwrap_or_default();
                print!(" {:>18}", cell + &budget);
            }
            println!();
        }
    }
    if let Some(f) = &a.json {
        std::fs::write(f, serde_json::to_string_pretty(&all_json)? + "\n")?;
    }
    Ok(())
}
