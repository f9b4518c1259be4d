//! `farmem run` with real, unmodified programs from Debian packages: each one runs natively
//! and then under `farmem run` with a local budget well below its peak memory (25% of the
//! peak measured in the native run, or an absolute budget for the server), and the outputs
//! must be identical.
//!
//! Programs (absolute paths, never whatever is first on PATH): /usr/bin/python3 (package
//! python3), /usr/bin/sort (coreutils), /usr/bin/sqlite3 (sqlite3), /usr/bin/memcached
//! (memcached), /usr/bin/node (nodejs), /usr/bin/java (openjdk-17-jdk-headless),
//! /usr/bin/erl and /usr/bin/erlc (erlang-base), pandas for python3 (python3-pandas). A
//! missing one fails the test with the package to install.
//!
//! Sizes are chosen so that the whole file takes a few minutes on a 2-core machine, where a
//! program under farmem at 25% runs 1.5-40x slower than natively. Nothing here asserts timing;
//! the deadlines only turn a hang into a failure.

mod run_support;

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use run_support::{
    assert_same_stdout, describe_status, program_file, require, run, Finished, Mode, Prog, Running,
    Scratch,
};

/// Longest a single run may take before it counts as hung.
const DEADLINE: Duration = Duration::from_secs(600);

fn python3() -> Prog {
    // -I: isolated mode, so no PYTHON* variable or user site of the test machine changes
    // what runs.
    Prog::new(require("/usr/bin/python3", "python3"))
        .arg("-I")
        .env("PYTHONHASHSEED", "0")
}

/// Run natively (the reference output and the peak), then under farmem at 25% of that peak;
/// the outputs must be identical and far memory must really have been used.
fn native_then_quarter(label: &str, prog: &Prog, scratch: &Scratch) -> (Finished, Finished) {
    let native = run(label, prog, &Mode::Native, scratch, DEADLINE);
    native.assert_ok();
    let far = run(
        label,
        prog,
        &Mode::quarter_of(native.peak_rss),
        scratch,
        DEADLINE,
    );
    assert_same_stdout(&native, &far);
    far.assert_used_far_memory();
    (native, far)
}

/// Python building and checksumming about 1 GiB of lists, dicts and bytearrays.
///
/// py_heap.py 1000 peaks at about 1.05 GiB natively (3-7 s here); under farmem at 25%
/// (about 265 MiB local) it takes about 25-30 s.
#[test]
fn python_1gib_of_lists_dicts_bytearrays() {
    const MIB: u32 = 1000;
    let s = Scratch::new("py-heap");
    let prog = python3()
        .arg(program_file("py_heap.py"))
        .arg(MIB.to_string());
    let (native, _) = native_then_quarter("python3 py_heap.py", &prog, &s);
    let out = String::from_utf8_lossy(&native.stdout);
    assert!(
        out.contains("pass1") && out.contains("pass2"),
        "unexpected output: {out}"
    );
}

/// Python multiprocessing with the fork start method: the data is built in the parent
/// before the Pool forks its workers, so under farmem most of it has been evicted in the
/// parent when the workers read it.
///
/// py_fork_pool.py 400 3: 400 MiB of bytearrays and lists (peak about 450 MiB), 3 workers;
/// 1-3 s natively, about 16-21 s under farmem at 25%.
#[test]
fn python_multiprocessing_fork_pool() {
    let s = Scratch::new("py-fork");
    let prog = python3()
        .arg(program_file("py_fork_pool.py"))
        .arg("400")
        .arg("3");
    let (native, far) = native_then_quarter("python3 py_fork_pool.py", &prog, &s);
    let out = String::from_utf8_lossy(&native.stdout);
    assert!(
        out.contains("workers agree with parent True") && out.contains("more than one worker True"),
        "unexpected output: {out}"
    );
    eprintln!(
        "[run_programs] fork: {} far pages brought back for the forked workers",
        far.stat("fork_fetched_pages").unwrap_or(0)
    );
}

/// Language runtimes with heaps of their own (V8, the JVM) reserve their heap `PROT_NONE`
/// and commit it piece by piece: that memory must be far memory too, or their heaps escape
/// the budget. Evicted pages must then be a good part of the program's memory (before,
/// node at a quarter of its peak evicted nothing and held its whole heap).
fn assert_heap_was_far(native: &Finished, far: &Finished) {
    let evicted = far.stat("pages_evicted").unwrap_or(0) * 4096;
    assert!(
        evicted >= native.peak_rss / 2,
        "{}: {evicted} bytes evicted for a native peak of {} bytes: its heap was not far \
         memory",
        far.label,
        native.peak_rss
    );
}

/// node (V8): a Map of a million small objects and strings, read at random, verified.
/// node_heap.js 600000: about 220 MiB natively (1 s); at 25% it faults through V8's
/// collections (5-15 s). Linux swap to zram at the same limit was OOM-killed here.
#[test]
fn node_heap_of_small_objects() {
    let s = Scratch::new("node-heap");
    let prog = Prog::new(require("/usr/bin/node", "nodejs"))
        .arg(program_file("node_heap.js"))
        .arg("600000");
    let (native, far) = native_then_quarter("node node_heap.js", &prog, &s);
    assert!(
        String::from_utf8_lossy(&native.stdout).contains("600000 entries verified"),
        "unexpected output: {}",
        String::from_utf8_lossy(&native.stdout)
    );
    assert_heap_was_far(&native, &far);
}

/// java (HotSpot, G1): 192 MiB of large arrays and a map of small objects, read at random,
/// every word verified; run from source (the JDK's source launcher).
#[test]
fn java_heap_of_arrays_and_objects() {
    let s = Scratch::new("java-heap");
    let prog = Prog::new(require("/usr/bin/java", "openjdk-17-jdk-headless"))
        .arg("-Xmx1g")
        .arg(program_file("java_heap.java"))
        .arg("192");
    let (native, far) = native_then_quarter("java java_heap.java", &prog, &s);
    assert!(
        String::from_utf8_lossy(&native.stdout).contains("192 MiB verified"),
        "unexpected output: {}",
        String::from_utf8_lossy(&native.stdout)
    );
    assert_heap_was_far(&native, &far);
}

/// pandas and numpy (analytics): a DataFrame of a million rows grouped, sorted and merged,
/// and a numpy array of zeros mostly never written. About 280 MiB natively (7 s), 9-10 s at
/// 25%.
#[test]
fn pandas_dataframe_groupby_sort_merge() {
    let s = Scratch::new("pandas");
    let probe = std::process::Command::new(require("/usr/bin/python3", "python3"))
        .args(["-I", "-c", "import pandas"])
        .output()
        .expect("python3");
    assert!(
        probe.status.success(),
        "pandas missing: install python3-pandas ({})",
        String::from_utf8_lossy(&probe.stderr)
    );
    let prog = python3()
        .arg(program_file("pandas_frame.py"))
        .arg("1000000");
    let (native, far) = native_then_quarter("python3 pandas_frame.py", &prog, &s);
    let out = String::from_utf8_lossy(&native.stdout);
    assert!(
        out.starts_with("1000000 50000 4000.0 "),
        "unexpected output: {out}"
    );
    assert_heap_was_far(&native, &far);
}

/// Erlang (BEAM): a map and an ETS table of 150,000 entries, read at random, every value
/// checked, then a command run through a port. About 210 MiB natively (0.8 s), 10-15 s at
/// 25%. BEAM's helper `erl_child_setup` closes every descriptor it did not open at start,
/// the runtime's userfaultfd among them before farmem kept its descriptors out of the way,
/// and its next `fork` then waited for ever.
#[test]
fn erlang_map_ets_and_a_port_command() {
    let s = Scratch::new("erl-heap");
    let beam = s.path("beam");
    std::fs::create_dir_all(&beam).unwrap();
    let erlc = std::process::Command::new(require("/usr/bin/erlc", "erlang-base"))
        .arg("-o")
        .arg(&beam)
        .arg(program_file("erl_heap.erl"))
        .output()
        .expect("erlc");
    assert!(
        erlc.status.success(),
        "erlc: {}",
        String::from_utf8_lossy(&erlc.stderr)
    );
    // A crash dump goes to the scratch directory, not the crate's (the test's working
    // directory), where a failed run once left one to be committed.
    let dump = s.path("erl_crash.dump");
    let prog = Prog::new(require("/usr/bin/erl", "erlang-base"))
        .env("ERL_CRASH_DUMP", dump.to_str().unwrap())
        .arg("-noshell")
        .arg("-pa")
        .arg(beam.to_str().unwrap())
        .arg("-run")
        .arg("erl_heap")
        .arg("main")
        .arg("150000");
    let (native, far) = native_then_quarter("erl erl_heap", &prog, &s);
    let out = String::from_utf8_lossy(&native.stdout);
    assert!(
        out.contains("150000 entries verified") && out.contains("port command ran"),
        "unexpected output: {out}"
    );
    assert_heap_was_far(&native, &far);
}

/// bash writing through descriptors of its choosing (`exec 5>>log`, `exec 3>file`, as
/// configure scripts do) with an array of 60,000 strings mostly far. The runtime's control
/// socket thread once waited in `accept`, which holds the lowest free descriptor number
/// for the whole wait: `exec 3>file` failed with "Device or resource busy".
///
/// Without `SHELL` in its environment (as under CI, cron or systemd), bash looks its user
/// up at start, and glibc's `fork` then reads the NSS configuration from the heap after the
/// runtime's prepare handler: far by then, that fault waited for ever at the fork gate
/// (`fork_window.rs`), every run.
#[test]
fn bash_redirections_onto_descriptors_of_its_choosing() {
    let s = Scratch::new("bash-redirect");
    let dir = s.path("files");
    std::fs::create_dir_all(&dir).unwrap();
    let prog = Prog::new(require("/usr/bin/bash", "bash"))
        .arg(program_file("redirect.sh"))
        .arg(dir.to_str().unwrap())
        .env_remove("SHELL");
    let (native, far) = native_then_quarter("bash redirect.sh", &prog, &s);
    let out = String::from_utf8_lossy(&native.stdout);
    assert!(
        out.contains("through 3: entry 3000") && out.contains("heap checked"),
        "unexpected output: {out}"
    );
    assert_heap_was_far(&native, &far);
}

/// Deterministic lines for sort: a pseudo-random hex key, the line number, some text.
fn write_sort_input(path: &std::path::Path, lines: u64) -> u64 {
    let mut w = BufWriter::new(std::fs::File::create(path).unwrap());
    let mut x: u64 = 1;
    for i in 0..lines {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // Every 16th key repeats an earlier one, so the whole-line comparison decides too.
        let key = if i % 16 == 15 { x >> 40 } else { x >> 3 };
        writeln!(w, "{key:016x} {i} the quick brown fox {}", x % 9973).unwrap();
    }
    w.flush().unwrap();
    std::fs::metadata(path).unwrap().len()
}

fn sha256(path: &std::path::Path) -> String {
    let sum = require("/usr/bin/sha256sum", "coreutils");
    let out = std::process::Command::new(sum).arg(path).output().unwrap();
    assert!(out.status.success(), "sha256sum {}", path.display());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// GNU sort of a file larger than the local budget, entirely in memory (-S 1G).
///
/// 1.2 M lines, about 59 MiB (peak about 130 MiB): 1-1.5 s natively, about 50 s under farmem
/// at 25% (about 33 MiB local).
#[test]
fn gnu_sort_in_memory() {
    const LINES: u64 = 1_200_000;
    let s = Scratch::new("sort");
    let input = s.path("input.txt");
    let size = write_sort_input(&input, LINES);
    let sort = require("/usr/bin/sort", "coreutils");
    let (native_out, far_out) = (s.path("native.sorted"), s.path("farmem.sorted"));
    let prog = |out: &std::path::Path| {
        Prog::new(&sort)
            .env("LC_ALL", "C")
            .arg("-S")
            .arg("1G")
            .arg("-o")
            .arg(out)
            .arg(&input)
    };
    let native = run(
        "sort -S 1G",
        &prog(&native_out),
        &Mode::Native,
        &s,
        DEADLINE,
    );
    native.assert_ok();
    let far = run(
        "sort -S 1G",
        &prog(&far_out),
        &Mode::quarter_of(native.peak_rss),
        &s,
        DEADLINE,
    );
    far.assert_ok();
    far.assert_used_far_memory();
    assert!(
        (size as f64) > far.stat("budget_bytes").unwrap() as f64,
        "the input ({size} bytes) should be larger than the local budget"
    );
    assert_eq!(std::fs::metadata(&native_out).unwrap().len(), size);
    let (a, b) = (sha256(&native_out), sha256(&far_out));
    assert_eq!(
        a, b,
        "sorted output differs: native sha256 {a}, under farmem {b}"
    );
}

/// An in-memory SQLite database of a few hundred MiB, filled by a recursive CTE, then
/// aggregate queries (GROUP BY, SUM, COUNT, MIN, MAX) over it.
const SQLITE_SCRIPT: &str = "\
PRAGMA page_size = 4096;
CREATE TABLE t(id INTEGER PRIMARY KEY, grp INTEGER, val INTEGER, pad TEXT);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1000000)
INSERT INTO t
  SELECT x, (x * 7919) % 997, (x * 2654435761) % 1000003,
         printf('%.*c', 150 + x % 100, char(65 + x % 26))
  FROM c;
CREATE INDEX t_val ON t(val);
PRAGMA page_count;
SELECT COUNT(*), SUM(val), SUM(length(pad)) FROM t;
SELECT grp, COUNT(*), SUM(val), MIN(val), MAX(val), SUM(length(pad))
  FROM t GROUP BY grp ORDER BY grp;
SELECT substr(pad, 1, 1) AS c, COUNT(*), SUM(val % 1000) FROM t GROUP BY c ORDER BY c;
SELECT COUNT(*), SUM(id) FROM t WHERE val BETWEEN 1000 AND 500000;
SELECT val % 7, COUNT(DISTINCT grp), SUM(id % 1000) FROM t GROUP BY val % 7 ORDER BY 1;
";

/// 1 M rows, about 240 MiB of database pages (peak about 250 MiB): 5-12 s natively, 14-17 s
/// under farmem at 25% (about 62 MiB local).
#[test]
fn sqlite3_in_memory_aggregates() {
    let s = Scratch::new("sqlite");
    let script = s.path("script.sql");
    std::fs::write(&script, SQLITE_SCRIPT).unwrap();
    let prog = Prog::new(require("/usr/bin/sqlite3", "sqlite3"))
        .arg("-bail")
        .arg(":memory:")
        .stdin(&script);
    let (native, _) = native_then_quarter("sqlite3 :memory:", &prog, &s);
    let out = String::from_utf8_lossy(&native.stdout);
    let pages: u64 = out.lines().next().unwrap().trim().parse().unwrap();
    assert!(
        pages * 4096 > 200 << 20,
        "the database should be a few hundred MiB, it is {pages} pages"
    );
}

// ----- memcached -----

/// Keys stored in memcached, and the size of their values: about 100 KiB each, 6000 of them
/// (about 586 MiB), against a 64 MiB local budget.
const MC_KEYS: u32 = 6000;
const MC_BUDGET: &str = "64M";

/// The value of key `i`: 98-102 KiB of pseudo-random bytes.
fn mc_value(i: u32) -> Vec<u8> {
    let len = 98 * 1024 + (i as usize * 7919) % 4096;
    let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// A memcached text-protocol client.
struct Mc {
    r: BufReader<TcpStream>,
    w: BufWriter<TcpStream>,
}

impl Mc {
    fn new(s: TcpStream) -> Mc {
        // Generous: a stuck server fails the test instead of blocking it.
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(120))).unwrap();
        s.set_nodelay(true).unwrap();
        Mc {
            r: BufReader::new(s.try_clone().unwrap()),
            w: BufWriter::with_capacity(256 << 10, s),
        }
    }

    fn line(&mut self) -> std::io::Result<String> {
        let mut l = String::new();
        if self.r.read_line(&mut l)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(l)
    }

    fn set(&mut self, key: &str, val: &[u8]) -> std::io::Result<String> {
        write!(self.w, "set {key} 0 0 {}\r\n", val.len())?;
        self.w.write_all(val)?;
        self.w.write_all(b"\r\n")?;
        self.w.flush()?;
        self.line()
    }

    fn get(&mut self, key: &str) -> std::io::Result<Option<Vec<u8>>> {
        write!(self.w, "get {key}\r\n")?;
        self.w.flush()?;
        let head = self.line()?;
        if head == "END\r\n" {
            return Ok(None);
        }
        let f: Vec<&str> = head.split_whitespace().collect();
        if f.len() != 4 || f[0] != "VALUE" || f[1] != key {
            return Err(std::io::Error::other(format!("bad reply {head:?}")));
        }
        let len: usize = f[3].parse().map_err(std::io::Error::other)?;
        let mut v = vec![0; len + 2];
        self.r.read_exact(&mut v)?;
        if &v[len..] != b"\r\n" {
            return Err(std::io::Error::other("value not followed by CRLF"));
        }
        v.truncate(len);
        let end = self.line()?;
        if end != "END\r\n" {
            return Err(std::io::Error::other(format!("expected END, got {end:?}")));
        }
        Ok(Some(v))
    }

    fn stats(&mut self) -> std::io::Result<Vec<(String, String)>> {
        self.w.write_all(b"stats\r\n")?;
        self.w.flush()?;
        let mut out = Vec::new();
        loop {
            let l = self.line()?;
            if l == "END\r\n" {
                return Ok(out);
            }
            let mut f = l.split_whitespace().skip(1);
            if let (Some(k), Some(v)) = (f.next(), f.next()) {
                out.push((k.to_string(), v.to_string()));
            }
        }
    }
}

/// Start memcached (natively or under farmem) on a free loopback port and connect to it.
fn start_memcached(mode: &Mode, scratch: &Scratch) -> (Running, Mc) {
    let memcached = require("/usr/bin/memcached", "memcached");
    // The port is found free, then given to memcached: another process may take it in
    // between, so a memcached that exits at once is retried on another port.
    for _attempt in 0..5 {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut prog = Prog::new(&memcached)
            .arg("-U")
            .arg("0")
            .arg("-l")
            .arg("127.0.0.1")
            .arg("-p")
            .arg(port.to_string())
            .arg("-m")
            .arg("2048")
            .arg("-t")
            .arg("2")
            .arg("-c")
            .arg("64");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            prog = prog.arg("-u").arg("root");
        }
        let mut srv = Running::spawn("memcached", &prog, mode, scratch);
        let t0 = Instant::now();
        loop {
            if let Some(f) = srv.has_exited() {
                eprintln!(
                    "[run_programs] {} ended at start-up ({}), retrying: {}",
                    f.label,
                    describe_status(f.status),
                    f.stderr
                );
                break;
            }
            if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
                return (srv, Mc::new(s));
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "{} does not accept connections on port {port} after 120 s; stderr:\n{}",
                srv.label,
                srv.stderr_so_far()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    panic!("memcached ({}) could not start on a free port", mode.name());
}

/// Store every key, read every key back (in another order) and check each value byte for
/// byte, then stop the server with SIGTERM and wait for it to exit.
fn memcached_round(mode: &Mode, scratch: &Scratch) -> Finished {
    let (srv, mut mc) = start_memcached(mode, scratch);
    let label = srv.label.clone();
    let ctx = |what: &str, e: std::io::Error| -> ! {
        panic!(
            "{label}: {what}: {e}; server stderr:\n{}",
            srv.stderr_so_far()
        )
    };
    let t0 = Instant::now();
    let mut stored = 0u64;
    for i in 0..MC_KEYS {
        let v = mc_value(i);
        stored += v.len() as u64;
        let r = mc
            .set(&format!("key:{i}"), &v)
            .unwrap_or_else(|e| ctx(&format!("set key:{i}"), e));
        assert_eq!(r, "STORED\r\n", "{label}: set key:{i}");
    }
    let t_set = t0.elapsed();
    // 7 is coprime with MC_KEYS: every key once, far from the order they were written.
    for k in 0..MC_KEYS {
        let i = (k * 7 + 3) % MC_KEYS;
        let key = format!("key:{i}");
        let got = mc
            .get(&key)
            .unwrap_or_else(|e| ctx(&format!("get {key}"), e))
            .unwrap_or_else(|| panic!("{label}: {key} is missing"));
        let want = mc_value(i);
        if got != want {
            let at = got.iter().zip(&want).position(|(a, b)| a != b);
            panic!(
                "{label}: {key}: wrong value: {} bytes, expected {}, first difference at {at:?}",
                got.len(),
                want.len()
            );
        }
    }
    let t_get = t0.elapsed() - t_set;
    let stats = mc.stats().unwrap_or_else(|e| ctx("stats", e));
    let stat = |k: &str| stats.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(
        stat("curr_items").as_deref(),
        Some(MC_KEYS.to_string().as_str()),
        "{label}: curr_items"
    );
    eprintln!(
        "[run_programs] {label}: stored {MC_KEYS} values, {:.1} MiB, in {:.2} s; read and \
         verified them all in {:.2} s",
        stored as f64 / (1u64 << 20) as f64,
        t_set.as_secs_f64(),
        t_get.as_secs_f64()
    );
    drop(mc);
    srv.signal(libc::SIGTERM);
    let f = srv.finish(t0.elapsed() + Duration::from_secs(120));
    f.print();
    f
}

/// memcached as a server: natively (a check of the client), then under farmem with a local
/// budget far below the data it holds. Every value must come back intact, and SIGTERM to
/// `farmem run` must stop memcached and end `farmem run` the same way as natively.
#[test]
fn memcached_store_and_read_back() {
    let s = Scratch::new("memcached");
    let native = memcached_round(&Mode::Native, &s);
    let far = memcached_round(&Mode::absolute(MC_BUDGET), &s);
    assert_eq!(
        describe_status(far.status),
        describe_status(native.status),
        "after SIGTERM, farmem run should end as memcached does natively; farmem stderr:\n{}",
        far.stderr
    );
    far.assert_used_far_memory();
}
