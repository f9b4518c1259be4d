//! The machine-changing tests need root, a memory cgroup controller and zram (this crate's
//! test environment). They re-execute this test binary for the workload and for the
//! process that gets interrupted: the `helper_*` tests, ignored and inert unless
//! `FARMEM_SWAP_HELPER` names them.

use super::*;
use farmem_sys::mounts::parse_mountinfo;
use std::io::{BufRead, BufReader, Read};
use std::process::{ExitStatus, Stdio};
use std::sync::mpsc;

const HELPER_ENV: &str = "FARMEM_SWAP_HELPER";

/// Serializes this binary's machine-changing tests. (Not the file lock: the helper
/// processes some tests start need it, and the checks after teardown take it.)
fn test_lock() -> MutexGuard<'static, ()> {
    static L: Mutex<()> = Mutex::new(());
    lock(&L)
}

/// This test binary, running only the helper `name`.
fn helper(name: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("current_exe"));
    c.args([
        &format!("swap::tests::{name}"),
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    c.env(HELPER_ENV, name);
    c
}

fn is_helper(name: &str) -> bool {
    std::env::var(HELPER_ENV).is_ok_and(|v| v == name)
}

fn splitmix(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn checksum(words: usize) -> u64 {
    (0..words as u64).fold(0, |s, i| s.rotate_left(1) ^ splitmix(i))
}

/// The workload run inside the cgroup: fills `FARMEM_SWAP_MIB` MiB with pseudo-random
/// words (incompressible), reads them back in the same order (so the first pages come
/// back from swap), verifies every word and prints the checksum.
#[test]
#[ignore = "helper process of the swap baseline tests"]
fn helper_workload() {
    if !is_helper("helper_workload") {
        return;
    }
    let mib: usize = std::env::var("FARMEM_SWAP_MIB").unwrap().parse().unwrap();
    let n = mib << 17;
    let mut v = vec![0u64; n];
    for (i, w) in v.iter_mut().enumerate() {
        *w = splitmix(i as u64);
    }
    let mut sum = 0u64;
    let mut bad = 0usize;
    for (i, &w) in v.iter().enumerate() {
        bad += usize::from(w != splitmix(i as u64));
        sum = sum.rotate_left(1) ^ w;
    }
    assert_eq!(bad, 0, "words read back wrong");
    println!("workload ok words={n} checksum={sum:016x}");
}

/// A graph's adjacency built from `FARMEM_SWAP_UPDATES` skewed edges into rows over
/// `FARMEM_SWAP_MIB` MiB (the suite's csrbuild shape: degree counts, then every edge
/// written at its row's cursor), the shape that stalls a tight v1 cgroup: reclaim keeps
/// finding the hot rows referenced and runs out of retries. Then a check that every edge is
/// in its row.
#[test]
#[ignore = "helper process of the swap baseline tests"]
fn helper_scatter() {
    if !is_helper("helper_scatter") {
        return;
    }
    let mib: u64 = std::env::var("FARMEM_SWAP_MIB").unwrap().parse().unwrap();
    let edges: u64 = std::env::var("FARMEM_SWAP_UPDATES")
        .unwrap()
        .parse()
        .unwrap();
    let mut scale = 1;
    while (2u64 << scale) * 8 <= (mib << 20) / 4 {
        scale += 1;
    }
    let nodes = 1usize << scale;
    // R-MAT's skew: each level's bit is 1 with probability 61/256; then scattered.
    let node = |e: u64, salt: u64| {
        let mut x = 0u64;
        for level in 0..scale {
            x = x << 1 | u64::from(splitmix(e ^ salt ^ (level << 40)) & 255 >= 195);
        }
        (splitmix(x) % nodes as u64) as usize
    };
    let mut off = vec![0u64; nodes + 1];
    for e in 0..edges {
        off[node(e, 0) + 1] += 1;
    }
    for i in 0..nodes {
        off[i + 1] += off[i];
    }
    let mut adj = vec![u32::MAX; ((mib << 20) * 3 / 16).max(edges) as usize];
    let mut cur = off.clone();
    for e in 0..edges {
        let s = node(e, 0);
        adj[cur[s] as usize] = node(e, 1) as u32;
        cur[s] += 1;
    }
    let mut bad = 0;
    for e in 0..edges {
        let (s, d) = (node(e, 0), node(e, 1) as u32);
        bad += usize::from(!adj[off[s] as usize..off[s + 1] as usize].contains(&d));
    }
    assert_eq!(bad, 0, "edges lost or misplaced");
    println!("scatter ok edges={edges}");
}

/// Sets up a baseline (`FARMEM_SWAP_KIND`: "zram" or a swap file path), reports it and runs
/// a long sleep in it, to be interrupted by the test that started it.
#[test]
#[ignore = "helper process of the swap baseline tests"]
fn helper_hold() {
    if !is_helper("helper_hold") {
        return;
    }
    let kind = match std::env::var("FARMEM_SWAP_KIND").unwrap().as_str() {
        "zram" => SwapKind::Zram,
        p => SwapKind::File(PathBuf::from(p)),
    };
    let b = SwapBaseline::setup(kind, 64 * MIB, 32 * MIB).unwrap();
    println!(
        "READY\t{}\t{}",
        b.cgroup_dir().display(),
        b.swap_device().display()
    );
    io::stdout().flush().unwrap();
    let mut sleep = Command::new("sleep");
    sleep.arg("300");
    let out = b.run(sleep);
    println!("NOT INTERRUPTED {out:?}");
    std::process::exit(3);
}

fn run_workload(b: &SwapBaseline, mib: usize) {
    let mut c = helper("helper_workload");
    c.env("FARMEM_SWAP_MIB", mib.to_string());
    let t = Instant::now();
    let out = b.run(c).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "workload failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let n = mib << 17;
    let want = format!("workload ok words={n} checksum={:016x}", checksum(n));
    assert!(
        // libtest may print the test name on the same line.
        stdout.lines().any(|l| l.ends_with(&want)),
        "expected {want:?} in:\n{stdout}"
    );
    println!("workload of {mib} MiB ran in {:?}", t.elapsed());
}

/// The zram device behind `dev` ("/dev/zram3" -> 3).
fn zram_index(dev: &Path) -> Option<u32> {
    dev.to_str()?.strip_prefix("/dev/zram")?.parse().ok()
}

/// Nothing of a baseline is left: no cgroup, no swap, zram back to size 0 (or removed).
/// Checked under the machine lock, so no live baseline (of another process running these
/// tests) is in view, only leftovers.
fn assert_gone(cgroup: &Path, dev: &Path) {
    let _machine = acquire_machine_lock().unwrap();
    assert!(!cgroup.exists(), "cgroup {} left behind", cgroup.display());
    assert!(
        !swap_is_active(&dev.to_string_lossy()),
        "swap {} still active",
        dev.display()
    );
    match zram_index(dev) {
        Some(0) => assert_eq!(read_u64(&zram_sys(0).join("disksize")), Some(0)),
        Some(n) => assert!(!zram_sys(n).exists(), "hot-added zram{n} left behind"),
        None => assert!(!dev.exists(), "swap file {} left behind", dev.display()),
    }
}

fn scratch_file(tag: &str) -> PathBuf {
    PathBuf::from(format!(
        "/var/tmp/farmem-swap-test-{}-{tag}.swap",
        std::process::id()
    ))
}

#[test]
fn zram_baseline_swaps_and_cleans_up() {
    let _g = test_lock();
    let t = Instant::now();
    let b = SwapBaseline::setup(SwapKind::Zram, 256 * MIB, 64 * MIB).unwrap();
    let setup_time = t.elapsed();
    println!("{} (setup {setup_time:?})", b.describe());
    let (cg, dev) = (b.cgroup_dir().to_path_buf(), b.swap_device().to_path_buf());
    assert!(cg.is_dir());
    assert!(swap_is_active(&dev.to_string_lossy()));
    let limit_file = match b.info.version {
        CgVersion::V1 => "memory.limit_in_bytes",
        CgVersion::V2 => "memory.max",
    };
    assert_eq!(read_u64(&cg.join(limit_file)), Some(64 * MIB));

    run_workload(&b, 160);
    let st = b.stats();
    println!("stats: {}", st.to_json());
    let peak = b.peak_bytes().expect("peak usage");
    assert_eq!(st.peak_mem, Some(peak));
    assert!(
        peak <= 65 * MIB,
        "peak {} above the 64 MiB limit",
        human(peak)
    );
    assert!(st.swapped_out(), "no swap-out seen: {st:?}");
    let written = st.device_written.expect("zram stat");
    assert!(
        written > 64 * MIB,
        "only {} written to zram",
        human(written)
    );
    assert!(st.device_read.unwrap() > 0, "nothing swapped back in");
    if let Some(ms) = st.peak_mem_swap {
        assert!(ms > 100 * MIB, "memory + swap peak {} too low", human(ms));
    }

    let t = Instant::now();
    drop(b);
    println!("teardown {:?}", t.elapsed());
    assert_gone(&cg, &dev);
}

/// A tight limit and skewed random writes: the kernel's reclaim runs out of retries and the
/// cgroup's OOM killer (on by default in Linux) would end the program; with the killer off
/// and nobody to end the stall, it would wait for ever. The relief ends each stall: the
/// program finishes with every write in place, never more than an eighth past the limit.
#[test]
fn tight_limit_stalls_are_relieved_and_the_program_finishes() {
    let _g = test_lock();
    let limit = 6 * MIB;
    let b = SwapBaseline::setup(SwapKind::Zram, 256 * MIB, limit).unwrap();
    let (cg, dev) = (b.cgroup_dir().to_path_buf(), b.swap_device().to_path_buf());
    // The shape stalls the kernel's reclaim in most runs here (0-466 stalls a run): run it
    // until one has stalled, so that the relief is what is tested.
    let mut stalls = 0;
    for run in 0..5 {
        let mut c = helper("helper_scatter");
        c.env("FARMEM_SWAP_MIB", "8")
            .env("FARMEM_SWAP_UPDATES", "800000")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let t = Instant::now();
        let (status, out) = b
            .run_with(c, |c| {
                let mut child = c.spawn()?;
                let status = wait_timeout(&mut child, Duration::from_secs(120));
                let mut out = String::new();
                child.stdout.take().unwrap().read_to_string(&mut out)?;
                Ok((status.unwrap_or_default(), (status, out)))
            })
            .unwrap();
        let st = b.stats();
        println!("run {run}, {:?}: {}", t.elapsed(), st.to_json());
        let status = status.expect("the program stalled for 120 s: its stalls were not relieved");
        assert!(
            status.success() && out.contains("scatter ok"),
            "the program did not finish right: {status}\n{out}"
        );
        assert_eq!(b.oom_kills(), Some(0));
        let peak = st.peak_mem.expect("peak");
        assert!(
            peak <= limit + limit / 8,
            "peak {} more than an eighth past the limit",
            human(peak)
        );
        stalls += st.oom_stalls.unwrap_or(0);
        if stalls > 0 {
            break;
        }
    }
    assert!(stalls > 0, "no OOM stall to relieve in 5 runs");
    drop(b);
    assert_gone(&cg, &dev);
}

/// With nothing the kernel can reclaim (no swap device), the relief lets the program past the
/// limit by at most an eighth of it, then turns the OOM killer back on: the program is
/// killed, as Linux would have killed it, rather than stall for ever.
#[test]
fn with_nothing_to_reclaim_the_program_is_killed_past_an_eighth() {
    let _g = test_lock();
    let b = SwapBaseline::setup(SwapKind::None, 64 * MIB, 16 * MIB).unwrap();
    let mut c = helper("helper_workload");
    c.env("FARMEM_SWAP_MIB", "64");
    let t = Instant::now();
    let out = b.run(c).unwrap();
    let st = b.stats();
    println!("{:?}: {}", t.elapsed(), st.to_json());
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{}", out.status);
    assert_eq!(b.oom_kills(), Some(1));
    assert!(st.oom_overruns.unwrap_or(0) > 0, "{st:?}");
    let peak = st.peak_mem.expect("peak");
    assert!(peak <= 18 * MIB + 256 * 1024, "peak {}", human(peak));
}

#[test]
fn file_baseline_swaps_and_cleans_up() {
    let _g = test_lock();
    let path = scratch_file("file");
    let t = Instant::now();
    let b = SwapBaseline::setup(SwapKind::File(path.clone()), 128 * MIB, 32 * MIB).unwrap();
    println!("{} (setup {:?})", b.describe(), t.elapsed());
    let (cg, dev) = (b.cgroup_dir().to_path_buf(), b.swap_device().to_path_buf());
    assert_eq!(dev, fs::canonicalize(&path).unwrap());
    let m = fs::metadata(&dev).unwrap();
    assert_eq!(m.permissions().mode() & 0o777, 0o600);
    assert_eq!(m.len(), 128 * MIB);
    assert!(swap_is_active(&dev.to_string_lossy()));

    run_workload(&b, 96);
    let st = b.stats();
    println!("stats: {}", st.to_json());
    assert!(b.peak_bytes().unwrap() <= 33 * MIB);
    assert!(
        st.pages_swapped_out.unwrap() > 0,
        "no swap-out seen: {st:?}"
    );
    if let Some(ms) = st.peak_mem_swap {
        assert!(ms > 48 * MIB, "memory + swap peak {} too low", human(ms));
    }
    let t = Instant::now();
    b.close().unwrap();
    println!("teardown {:?}", t.elapsed());
    assert_gone(&cg, &dev);
    assert!(!path.exists());
}

/// Starts `helper_hold` in a process group of its own, waits until its sleep runs in the
/// cgroup, sends `sig` (to the whole group, as Ctrl-C does, if `group`) and checks that the
/// process exited with 128 + sig leaving nothing behind.
fn interrupted_baseline_cleans_up(kind: &str, sig: libc::c_int, group: bool) {
    let _g = test_lock();
    let mut cmd = helper("helper_hold");
    cmd.env("FARMEM_SWAP_KIND", kind)
        .stdout(Stdio::piped())
        .process_group(0);
    // SAFETY: signal is async-signal-safe. Undoes an inherited SIG_IGN (tests started in
    // the background), which the baseline respects.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGTERM, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut guard = TermOnDrop(cmd.spawn().unwrap());
    let child = &mut guard.0;
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
            let _ = tx.send(line);
        }
    });
    // Generous: the helper may wait for another process's baseline.
    let deadline = Instant::now() + Duration::from_secs(300);
    let (cg, dev) = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => {
                // libtest may print the test name before it on the same line.
                let ready = l.split_once("READY\t").map(|(_, r)| r.split('\t'));
                if let Some([cg, dev]) = ready.map(|f| f.collect::<Vec<_>>()).as_deref() {
                    break (PathBuf::from(cg), PathBuf::from(dev));
                }
            }
            Err(_) => panic!("helper exited or never set up: {:?}", child.try_wait()),
        }
    };
    let name = cg.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with(&format!("{CGROUP_PREFIX}{}-", child.id())));
    assert!(swap_is_active(&dev.to_string_lossy()));
    assert!(
        wait_for(Duration::from_secs(10), || read_pids(&cg)
            .is_ok_and(|p| !p.is_empty())),
        "the sleep never appeared in {}",
        cg.display()
    );
    let t = Instant::now();
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill has no memory-safety preconditions; the pid is our live child, the
    // leader of its own process group.
    assert_eq!(
        unsafe { libc::kill(if group { -pid } else { pid }, sig) },
        0
    );
    let status = wait_timeout(child, Duration::from_secs(60));
    println!("signal {sig} -> {status:?} after {:?}", t.elapsed());
    assert_eq!(status.and_then(|s| s.code()), Some(128 + sig));
    assert_gone(&cg, &dev);
}

/// Ends a helper left running by a failed test the clean way (SIGTERM), so it does not
/// keep its baseline (and the lock).
struct TermOnDrop(std::process::Child);

impl Drop for TermOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            // SAFETY: kill has no memory-safety preconditions; the pid is our live child.
            unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
            wait_timeout(&mut self.0, Duration::from_secs(30));
        }
    }
}

fn wait_timeout(child: &mut std::process::Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn ctrl_c_mid_run_cleans_up_zram() {
    interrupted_baseline_cleans_up("zram", libc::SIGINT, true);
}

#[test]
fn sigterm_mid_run_cleans_up_swap_file() {
    let path = scratch_file("sigterm");
    interrupted_baseline_cleans_up(path.to_str().unwrap(), libc::SIGTERM, false);
    assert!(!path.exists());
}

/// A zram0 configured by somebody else is left exactly as it was: the baseline uses a
/// hot-added device and removes it.
#[test]
fn busy_zram0_is_left_alone() {
    let _g = test_lock();
    let zram0 = zram_sys(0);
    let hot_add = Path::new(ZRAM_CONTROL).join("hot_add");
    {
        let _machine = acquire_machine_lock().unwrap();
        if read_u64(&zram0.join("disksize")) != Some(0) || !hot_add.exists() {
            eprintln!("skipped: needs a free zram0 and {}", hot_add.display());
            return;
        }
        write_sys(&zram0.join("disksize"), &(32 * MIB).to_string()).unwrap();
    }
    struct ResetZram0;
    impl Drop for ResetZram0 {
        fn drop(&mut self) {
            let _ = write_sys(&zram_sys(0).join("reset"), "1");
        }
    }
    let _reset = ResetZram0;
    {
        let b = SwapBaseline::setup(SwapKind::Zram, 64 * MIB, 32 * MIB).unwrap();
        println!("{}", b.describe());
        let (cg, dev) = (b.cgroup_dir().to_path_buf(), b.swap_device().to_path_buf());
        let n = zram_index(&dev).unwrap();
        assert_ne!(n, 0, "used the busy zram0");
        assert_eq!(read_u64(&zram0.join("disksize")), Some(32 * MIB));
        drop(b);
        assert_gone(&cg, &dev);
        assert_eq!(read_u64(&zram0.join("disksize")), Some(32 * MIB));
        assert!(!swap_is_active("/dev/zram0"));
    }
}

/// A panic while a baseline is live removes it (the unwinding drops it).
#[test]
fn panic_cleans_up() {
    let _g = test_lock();
    let mut seen = None;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let b = SwapBaseline::setup(SwapKind::Zram, 16 * MIB, 16 * MIB).unwrap();
        seen = Some((b.cgroup_dir().to_path_buf(), b.swap_device().to_path_buf()));
        panic!("a benchmark failed");
    }));
    assert!(r.is_err());
    let (cg, dev) = seen.unwrap();
    assert_gone(&cg, &dev);
}

/// A failing setup (swap file on tmpfs) undoes what it did: no file, no cgroup.
#[test]
fn failed_setup_leaves_nothing() {
    let _g = test_lock();
    let shm = Path::new("/dev/shm");
    let on_tmpfs = parse_mountinfo(&fs::read_to_string("/proc/self/mountinfo").unwrap())
        .iter()
        .any(|m| m.point == shm && m.fstype == "tmpfs");
    if !on_tmpfs {
        eprintln!("skipped: /dev/shm is not tmpfs");
        return;
    }
    let path = shm.join(format!("farmem-swap-test-{}.swap", std::process::id()));
    let e = SwapBaseline::setup(SwapKind::File(path.clone()), 16 * MIB, 16 * MIB)
        .err()
        .expect("swap on tmpfs must fail");
    let msg = format!("{e:#}");
    println!("{msg}");
    assert!(msg.contains("swapon"), "{msg}");
    assert!(!path.exists(), "swap file left behind");
    let plan = detect_cgroup().unwrap();
    let mine = format!("{CGROUP_PREFIX}{}-", std::process::id());
    let left: Vec<_> = fs::read_dir(&plan.parent)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&mine))
        .collect();
    assert!(left.is_empty(), "cgroups left behind: {left:?}");
    assert!(lock(&REGISTRY).is_empty());
}

#[test]
fn refuses_to_overwrite_an_existing_file() {
    let _g = test_lock();
    let path = scratch_file("exists");
    fs::write(&path, b"precious").unwrap();
    let e = SwapBaseline::setup(SwapKind::File(path.clone()), 16 * MIB, 16 * MIB)
        .err()
        .expect("must refuse");
    let content = fs::read(&path).unwrap();
    fs::remove_file(&path).unwrap();
    assert!(format!("{e:#}").contains("already exists"), "{e:#}");
    assert_eq!(content, b"precious");
}

#[test]
fn teardown_is_idempotent() {
    let mut ch = Changes::default();
    assert!(ch.teardown().is_empty());
    assert!(ch.teardown().is_empty());
}

#[test]
fn non_root_is_refused() {
    let e = require_root(1000).unwrap_err().to_string();
    assert!(e.contains("need root"), "{e}");
    require_root(0).unwrap();
}

#[test]
fn parses_proc_swaps() {
    let s = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n\
             /dev/zram0                              partition\t262140\t\t1024\t\t32767\n\
             /var/tmp/my\\040swap                     file\t\t1048572\t\t0\t\t-2\n";
    assert_eq!(
        parse_swaps(s),
        vec![
            SwapEntry {
                path: "/dev/zram0".into(),
                size: 262140 * 1024,
                used: 1024 * 1024,
                priority: 32767
            },
            SwapEntry {
                path: "/var/tmp/my swap".into(),
                size: 1048572 * 1024,
                used: 0,
                priority: -2
            },
        ]
    );
}

#[test]
fn formats_sizes() {
    assert_eq!(human(256 * MIB), "256 MiB");
    assert_eq!(human(2 << 30), "2 GiB");
    assert_eq!(human(3 << 29), "1.5 GiB");
    assert_eq!(human(1536), "1.5 KiB");
    assert_eq!(human(100), "100 B");
}
