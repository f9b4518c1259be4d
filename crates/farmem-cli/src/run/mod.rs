//! `farmem run`: an unmodified program with part of its heap in far memory.
//!
//! The program is started with `libfarmem.so` preloaded (`LD_PRELOAD`) and `FARMEM_PRELOAD=1`,
//! which puts its heap in far memory (see the library's `preload` module). This process
//! stays as its parent: it passes the exit status and the signal the program died of
//! through, forwards termination signals, and reads the statistics the library writes at
//! exit.

mod cgroup;
mod library;
mod report;
mod stats_dir;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    after_help = "Examples:\n  farmem run --local-mem 512M -- python3 script.py\n  farmem run \
                  --local-mem 25% --measure-peak --stats -- sort -S 2G big.txt\n  farmem run \
                  --backend tcp://127.0.0.1:7070 --local-mem 1G -- memcached -m 4096\n\n\
                  The program's own output, exit status and signals pass through untouched. \
                  Programs it executes and children it makes with fork() run under farmem \
                  too, and --local-mem covers them all together, as one memory cgroup's \
                  limit does: each process takes a share (--fork-local-mem gives forked \
                  children budgets of their own instead). As root the program also runs in \
                  a memory cgroup of its own, with no limit, and the budget covers what \
                  that cgroup is charged (page tables, processes farmem does not run, file pages \
                  not yet written back or in use again), and farmem run reclaims the \
                  cgroup's page cache beyond the budget, as the limit would \
                  (FARMEM_TRIM_CACHE=0: not). A forked child keeps its far \
                  pages far (with a tcp:// backend its memory is brought back local)."
)]
pub struct Args {
    #[command(flatten)]
    pub opts: Options,
    /// The program and its arguments.
    // No `allow_hyphen_values`: an unknown option before the program is reported as one
    // (it used to become the program). Once the program's name is seen (or after `--`),
    // `trailing_var_arg` takes everything that follows as its arguments, options included.
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

/// How the program runs under farmem (shared with `farmem trace`).
#[derive(clap::Args, Debug)]
pub struct Options {
    /// Local memory for the program: a size (512M, 2G) or a percentage of the program's
    /// peak memory (25%), which needs --peak or --measure-peak. Default: half of this
    /// machine's memory. Like a memory cgroup's limit, it covers all of the program's
    /// anonymous memory and (as root) the file pages it has written and not yet written
    /// back: its heap gets what the rest (stacks, the runtime, memory farmem does not
    /// manage, dirty files) leaves, but never less than half (FARMEM_BUDGET_SCOPE=regions: the heap
    /// gets all of it). The far tiers' memory (compressed pages) is not counted, as zram's is
    /// not charged to a cgroup: --stats shows it.
    #[arg(long, value_name = "SIZE|PCT%")]
    local_mem: Option<String>,
    /// Local memory of each child the program makes with fork() without exec (it keeps its
    /// far pages far, with a runtime of its own): a size. Each process then has a budget of
    /// its own (the program and what it executes --local-mem each), so a parent with two
    /// workers may hold three budgets locally. Default: one budget, --local-mem, shared by
    /// every process of the program, as a cgroup's limit: free room is split evenly, and the
    /// processes that need room get up to a fair share back from larger ones (what those
    /// that do not evict leave, split evenly among them).
    #[arg(long, value_name = "SIZE")]
    fork_local_mem: Option<String>,
    /// The program's peak memory, for a percentage --local-mem (e.g. 4G).
    #[arg(long, value_name = "SIZE")]
    peak: Option<String>,
    /// Measure the peak first: run the program once without farmem (output discarded, no
    /// stdin), then again under farmem.
    #[arg(long)]
    measure_peak: bool,
    /// Where far memory lives. Default (or FARMEM_BACKEND if set): tiered://, far pages
    /// compressed (lz4) in the process up to 20% of this machine's memory
    /// (FARMEM_COMPRESSED_MAX: a size or a percentage), the rest (and pages that do not
    /// compress) in an unnamed file under --far-dir, gone when the program ends, killed or
    /// not. Others: file://DIR (all far pages in the file), local+lz4:// (all compressed in
    /// the process), local:// (raw in the process: saves no memory, measures the mechanism),
    /// tcp://[tenant@]host:port (a `farmem server`; token from FARMEM_TOKEN or
    /// FARMEM_TOKEN_FILE).
    #[arg(long, value_name = "URL")]
    backend: Option<String>,
    /// The compressor of the compressed far tier (tiered://, local+lz4://): lz4 (the
    /// default, fast), zstd or zstd:LEVEL (1-19; denser, slower). FARMEM_COMPRESSOR.
    #[arg(long, value_name = "NAME")]
    compressor: Option<String>,
    /// The directory of the far file (tiered:// and file:// without one): on a disk, with
    /// room. Default: $TMPDIR, else /var/tmp.
    #[arg(long, value_name = "DIR")]
    far_dir: Option<PathBuf>,
    /// Reclaim policy: priority (default: levels from the hints' ev_prio, highest evicted first; without such hints, as second-chance), second-chance (a page used since the hand last passed, or refaulted soon after its eviction, stays), fifo or lru.
    #[arg(long)]
    policy: Option<String>,
    /// Print a summary to stderr when the program ends.
    #[arg(long)]
    stats: bool,
    /// Write the summary as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    stats_json: Option<PathBuf>,
    /// Pre-fault allocations of up to SIZE bytes when they are made (default 64K when given
    /// without a value), so that first touches need no fault.
    #[arg(long, value_name = "SIZE", num_args = 0..=1, default_missing_value = "64K")]
    prefault: Option<String>,
    /// The libfarmem.so to preload (default: FARMEM_LIB, or the one next to this binary).
    #[arg(long, value_name = "PATH")]
    lib: Option<PathBuf>,
}

/// Resolve --local-mem to bytes: no more than this machine's memory.
fn budget(a: &Options, cmd: &[OsString]) -> Result<Option<u64>> {
    let Some(b) = requested_budget(a, cmd)? else {
        return Ok(None);
    };
    let physical = farmem_sys::mem::physical_memory();
    if b > physical {
        bail!(
            "--local-mem {}: {} is more than this machine's memory ({}); far memory is for \
             what does not fit locally",
            a.local_mem.as_deref().unwrap_or_default(),
            gib(b),
            gib(physical)
        );
    }
    Ok(Some(b))
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// --local-mem in bytes, as asked.
fn requested_budget(a: &Options, cmd: &[OsString]) -> Result<Option<u64>> {
    // Checked even where a size --local-mem makes it unused: a bad value is a mistake.
    let peak = a
        .peak
        .as_deref()
        .map(farmem_proto::size::parse_size)
        .transpose()
        .context("--peak")?;
    let Some(s) = a.local_mem.as_deref() else {
        return Ok(None);
    };
    let Some(pct) = s.trim().strip_suffix('%') else {
        let b = farmem_proto::size::parse_size(s).context("--local-mem")?;
        return Ok(Some(b));
    };
    let pct: f64 = pct
        .trim()
        .parse()
        .with_context(|| format!("--local-mem {s}: not a percentage"))?;
    if !(pct > 0.0 && pct <= 100.0) {
        bail!("--local-mem {s}: the percentage must be in (0, 100]");
    }
    let peak = match (peak, a.measure_peak) {
        (Some(p), _) => p,
        (None, true) => measure_peak(cmd)?,
        (None, false) => bail!(
            "--local-mem {s} is a share of the program's peak memory: give --peak SIZE, or \
             --measure-peak to measure it with a first run"
        ),
    };
    Ok(Some((peak as f64 * pct / 100.0) as u64))
}

/// Run the program once natively and return its peak resident set.
fn measure_peak(cmd: &[OsString]) -> Result<u64> {
    eprintln!(
        "farmem: measuring the peak memory of {:?} (first run, output discarded)",
        cmd[0]
    );
    let child = Command::new(&cmd[0])
        .args(&cmd[1..])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("starting {:?}", cmd[0]))?;
    let (status, rusage) = wait_with_rusage(child.id() as i32)?;
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        bail!(
            "the measuring run of {:?} failed (wait status {status:#x})",
            cmd[0]
        );
    }
    let peak = rusage.ru_maxrss as u64 * 1024;
    eprintln!(
        "farmem: peak resident memory {:.1} MiB",
        peak as f64 / (1 << 20) as f64
    );
    Ok(peak)
}

/// wait4 on `pid`, retrying on EINTR. Returns the wait status and the child's rusage.
fn wait_with_rusage(pid: i32) -> Result<(i32, libc::rusage)> {
    farmem_sys::process::wait_with_rusage(pid).context("waiting for the program")
}

/// Check up front that userfaultfd works here, so the user gets the fix, not a failed run.
fn check_userfaultfd() -> Result<()> {
    farmem_sys::uffd::Uffd::open(0)
        .map(|_| ())
        .context("farmem needs userfaultfd")
}

/// The program's command, set up to run under farmem: library preloaded, configuration in
/// the environment (checked here first), statistics written to `stats_dir`.
pub struct Prepared {
    pub cmd: Command,
    pub local: Option<u64>,
    /// The tree's memory cgroup, removed when dropped: keep it until the program ends.
    pub cgroup: Option<cgroup::TreeCgroup>,
    /// The tree's budget file, when its processes share one.
    pub tree: Option<PathBuf>,
}

impl Prepared {
    /// Keep the tree's page cache within its budget while the program runs (farmem-runtime's
    /// `cache_trim`), where it has a cgroup and `FARMEM_TRIM_CACHE` is not `0`.
    pub fn start_trim(&self) -> Option<farmem_runtime::cache_trim::Trimming> {
        if std::env::var_os("FARMEM_TRIM_CACHE").is_some_and(|v| v == "0") {
            return None;
        }
        let (cg, tree) = (self.cgroup.as_ref()?, self.tree.as_ref()?);
        let started = farmem_runtime::cache_trim::CacheTrim::open(cg.dir(), tree)
            .and_then(farmem_runtime::cache_trim::Trimming::start);
        match started {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!("the program's page cache will not be kept within its budget: {e}");
                None
            }
        }
    }
}

pub fn prepare(a: &Options, program: &[OsString], stats_dir: &Path) -> Result<Prepared> {
    let lib_env = std::env::var_os("FARMEM_LIB").map(PathBuf::from);
    let lib = library::find_lib(a.lib.as_deref().or(lib_env.as_deref()))?;
    check_userfaultfd()?;
    let local = budget(a, program)?;
    let backend = backend_url(a)?;
    if let Some(p) = &a.policy {
        farmem_runtime::PolicyKind::parse(p).context("--policy")?;
    }
    let mut cmd = Command::new(&program[0]);
    cmd.args(&program[1..]);
    let mut cgroup = None;
    let mut tree_file = None;
    let preload = match std::env::var_os("LD_PRELOAD") {
        Some(old) if !old.is_empty() => {
            let mut v = lib.clone().into_os_string();
            v.push(":");
            v.push(old);
            v
        }
        _ => lib.clone().into_os_string(),
    };
    cmd.env("LD_PRELOAD", preload)
        .env("FARMEM_PRELOAD", "1")
        .env("FARMEM_STATS_DIR", stats_dir);
    if let Some(b) = local {
        cmd.env("FARMEM_LOCAL_MEM", b.to_string());
    }
    cmd.env("FARMEM_BACKEND", &backend);
    if let Some(c) = &a.compressor {
        farmem_runtime::backend::Codec::parse(c)
            .map_err(|e| anyhow::anyhow!("--compressor: {e}"))?;
        cmd.env("FARMEM_COMPRESSOR", c);
    }
    if let Some(f) = &a.fork_local_mem {
        let b = farmem_proto::size::parse_size(f).context("--fork-local-mem")?;
        cmd.env("FARMEM_FORK_LOCAL_MEM", b.to_string());
    } else {
        // One budget for the program's processes (farmem-runtime's `tree_budget`).
        let tree = stats_dir.join(stats_dir::TREE_FILE);
        let pages = local.map(|b| b / farmem_sys::mem::PAGE_SIZE as u64);
        farmem_runtime::tree_budget::create(&tree, pages)
            .with_context(|| format!("creating {}", tree.display()))?;
        cmd.env("FARMEM_TREE", &tree);
        tree_file = Some(tree);
        // And what the tree's cgroup is charged, where one can be made (a FARMEM_CGROUP
        // given to farmem run is the user's choice: empty for none).
        if std::env::var_os("FARMEM_CGROUP").is_none() {
            cgroup = cgroup::TreeCgroup::create();
        }
        if let Some(c) = &cgroup {
            c.join_on_spawn(&mut cmd);
            cmd.env("FARMEM_CGROUP", c.dir());
        }
    }
    if let Some(p) = &a.policy {
        cmd.env("FARMEM_POLICY", p);
    }
    if let Some(p) = &a.prefault {
        farmem_proto::size::parse_size(p).context("--prefault")?;
        cmd.env("FARMEM_PREFAULT", p);
    }
    // The config the program will see must be valid: check it here, with this process's
    // view of the same variables, so a bad value is reported before anything runs.
    check_config(local, &backend)?;
    Ok(Prepared {
        cmd,
        local,
        cgroup,
        tree: tree_file,
    })
}

pub fn run(a: Args) -> Result<()> {
    let stats_dir = tempdir()?;
    let mut prepared = prepare(&a.opts, &a.cmd, &stats_dir)?;
    let forward = signals::Forwarder::install()?;
    let t0 = Instant::now();
    let child = match prepared.cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            // As a shell does: 127 for a program that is not there, 126 for one that cannot
            // be executed.
            eprintln!("farmem run: cannot start {:?}: {e}", a.cmd[0]);
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            std::process::exit(code);
        }
    };
    let pid = child.id() as i32;
    forward.set_child(pid);
    let trim = prepared.start_trim();
    let (status, ru) = wait_with_rusage(pid)?;
    forward.set_child(0);
    let wall = t0.elapsed();
    let trimmed = trim.map(|t| t.totals());
    drop(prepared.cgroup);

    let ended = Ended {
        pid,
        status,
        wall,
        rusage: ru,
        local: prepared.local,
        trimmed,
    };
    let stats = write_stats(&a.opts, &stats_dir, &ended);
    let _ = std::fs::remove_dir_all(&stats_dir);
    stats?;
    signals::pass_status_through(status)
}

/// How the program ended.
pub struct Ended {
    pub pid: i32,
    /// Wait status.
    pub status: i32,
    pub wall: std::time::Duration,
    pub rusage: libc::rusage,
    pub local: Option<u64>,
    /// Reclaims of the tree's page cache and the bytes they took (`cache_trim`).
    pub trimmed: Option<(u64, u64)>,
}

/// The statistics `--stats` and `--stats-json` ask for, from what the program's processes
/// wrote to `stats_dir`.
pub fn write_stats(a: &Options, stats_dir: &Path, e: &Ended) -> Result<()> {
    if !a.stats && a.stats_json.is_none() {
        return Ok(());
    }
    let mut rep = report::Report::collect(stats_dir, e.pid, e.status, e.wall, &e.rusage, e.local);
    rep.trimmed = e.trimmed;
    if a.stats {
        eprint!("{}", rep.human());
    }
    if let Some(f) = &a.stats_json {
        std::fs::write(f, rep.json())
            .with_context(|| format!("writing statistics to {}", f.display()))?;
    }
    Ok(())
}

/// wait4 without blocking: the wait status and rusage once `pid` has ended.
pub fn try_wait_with_rusage(pid: i32) -> Result<Option<(i32, libc::rusage)>> {
    farmem_sys::process::try_wait_with_rusage(pid).context("waiting for the program")
}

/// The backend the program gets: --backend, else FARMEM_BACKEND, else `tiered://` in
/// --far-dir (or the default directory). Checked here: a far-file directory that cannot
/// serve (missing, in memory, read-only, full) is an error before the program starts.
fn backend_url(a: &Options) -> Result<String> {
    use farmem_runtime::BackendSpec;
    let env = std::env::var("FARMEM_BACKEND")
        .ok()
        .filter(|s| !s.is_empty());
    let mut url = match (&a.backend, env) {
        (Some(b), _) => b.clone(),
        (None, Some(e)) => e,
        (None, None) => "tiered://".to_string(),
    };
    let spec = BackendSpec::parse(&url).context("--backend")?;
    let dir = match spec {
        BackendSpec::Tiered { .. } if url.trim() == "tiered://" => {
            let d = a
                .far_dir
                .clone()
                .unwrap_or_else(farmem_runtime::default_far_dir);
            url = format!("tiered://{}", d.display());
            d
        }
        BackendSpec::Tiered { dir, .. } | BackendSpec::File { dir, .. } => {
            if a.far_dir.is_some() {
                bail!("--far-dir and a backend that names its directory ({url}): give one");
            }
            dir
        }
        _ if a.far_dir.is_some() => {
            bail!("--far-dir is for the tiered:// and file:// backends, not {url}")
        }
        _ => return Ok(url),
    };
    farmem_runtime::check_far_dir(&dir).map_err(|e| anyhow::anyhow!("{e} (--far-dir)"))?;
    if matches!(spec_of(&url)?, BackendSpec::Tiered { .. }) {
        farmem_runtime::compressed_max()?;
    }
    farmem_runtime::far_file_max()?;
    Ok(url)
}

fn spec_of(url: &str) -> Result<farmem_runtime::BackendSpec> {
    farmem_runtime::BackendSpec::parse(url).context("--backend")
}

fn check_config(local: Option<u64>, backend: &str) -> Result<()> {
    let mut c = farmem_runtime::Config::default();
    if let Some(b) = local {
        c.local_mem = b;
    }
    c.backend = farmem_runtime::BackendSpec::parse(backend)?;
    c.validate().context("--local-mem")?;
    Ok(())
}

/// A private directory for the statistics files of this run (see `stats_dir.rs`).
pub fn tempdir() -> Result<PathBuf> {
    stats_dir::make()
}

mod signals {
    //! Signals between this process and the program.

    use std::sync::atomic::{AtomicI32, Ordering};
    use std::sync::Arc;

    use anyhow::{Context, Result};
    use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
    use signal_hook::iterator::Signals;

    pub struct Forwarder {
        child: Arc<AtomicI32>,
    }

    impl Forwarder {
        /// Catch termination signals for the program's lifetime. SIGTERM and SIGHUP are
        /// forwarded to it; SIGINT and SIGQUIT come from the terminal, which sends them to
        /// the program as well, so this process only survives them and lets the program
        /// decide.
        pub fn install() -> Result<Forwarder> {
            let child = Arc::new(AtomicI32::new(0));
            let mut sigs = Signals::new([SIGTERM, SIGHUP, SIGINT, SIGQUIT])
                .context("installing signal handlers")?;
            let c = child.clone();
            std::thread::Builder::new()
                .name("farmem-run-signals".into())
                .spawn(move || {
                    for s in sigs.forever() {
                        let pid = c.load(Ordering::Acquire);
                        if pid > 0 && (s == SIGTERM || s == SIGHUP) {
                            // SAFETY: signalling our own child.
                            unsafe { libc::kill(pid, s) };
                        }
                    }
                })
                .context("starting the signal thread")?;
            Ok(Forwarder { child })
        }

        pub fn set_child(&self, pid: i32) {
            self.child.store(pid, Ordering::Release);
        }
    }

    /// Exit the way the program did: same exit code, or death by the same signal.
    pub fn pass_status_through(status: i32) -> Result<()> {
        if libc::WIFEXITED(status) {
            std::process::exit(libc::WEXITSTATUS(status));
        }
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            // SAFETY: restoring the default action and raising the signal on ourselves;
            // no core dump of this process is wanted, so limit it to zero first.
            unsafe {
                let no_core = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::setrlimit(libc::RLIMIT_CORE, &no_core);
                libc::signal(sig, libc::SIG_DFL);
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, sig);
                libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
                libc::raise(sig);
            }
            std::process::exit(128 + sig);
        }
        std::process::exit(1)
    }
}
