//! The Linux-swap baseline of the benchmarks: an unmodified program runs inside a memory
//! cgroup whose limit is the "local memory" size, with swap on zram (or on a swap file), so
//! farmem can be compared side by side with Linux swap (the stand-in for Fastswap).
//!
//! [`SwapBaseline::setup`] activates a swap device and creates a cgroup; [`SwapBaseline::run`]
//! runs a command inside it from its first instruction. Dropping the baseline (or
//! [`SwapBaseline::close`]), SIGINT / SIGTERM (a handler thread tears every live baseline down,
//! then exits with 130 / 143) and a panic (unwinding drops it) undo exactly what setup changed,
//! and nothing else: a zram device somebody else configured is never touched, other swap
//! devices stay on (they are reported, since they mix into the measurement).
//!
//! Baselines change machine-wide state, so they are serialized across processes by a lock on
//! [`LOCK_PATH`] held for the life of each one: a second setup waits for the first to be
//! dropped. (A thread holding a baseline that sets up another one gets an error instead of a
//! deadlock.)

// Used by the benchmarks (and this module's tests); the `farmem` command does not call it yet.
#![allow(dead_code)]

use std::ffi::{CStr, CString};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

/// The lock file serializing baselines (across processes) for the life of each one.
pub const LOCK_PATH: &str = "/tmp/farmem-swap-baseline.lock";
/// Cgroups are named `farmem-bench-<pid>-<n>`.
const CGROUP_PREFIX: &str = "farmem-bench-";
/// The swap priority of our device: the highest, so it is used before any other swap.
const SWAP_PRIORITY: libc::c_int = 32767;
/// `swapon(2)` flags (`<linux/swap.h>`; not exported by the libc crate).
const SWAP_FLAG_PREFER: libc::c_int = 0x8000;
const SWAP_FLAG_PRIO_MASK: libc::c_int = 0x7fff;
const ZRAM_CONTROL: &str = "/sys/class/zram-control";
/// How long teardown waits for the cgroup's tasks to die and for busy devices to be released.
const TEARDOWN_PATIENCE: Duration = Duration::from_secs(10);
const MIB: u64 = 1 << 20;

/// Where the swapped-out pages go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SwapKind {
    /// A zram device (compressed RAM): `/dev/zram0` if it is free, else one hot-added for us.
    Zram,
    /// A swap file created at this path (which must not exist) on a filesystem that supports
    /// swap files (ext4, xfs; not tmpfs or overlayfs).
    File(PathBuf),
}

impl fmt::Display for SwapKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SwapKind::Zram => f.write_str("zram"),
            SwapKind::File(_) => f.write_str("file"),
        }
    }
}

/// Counters of one run (since the last [`SwapBaseline::run`] began), whatever the kernel
/// exposes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SwapStats {
    /// Peak RAM charged to the cgroup (v1 `memory.max_usage_in_bytes`, v2 `memory.peak`).
    pub peak_mem: Option<u64>,
    /// Peak RAM + swap charged to the cgroup (v1 `memory.memsw.max_usage_in_bytes`).
    pub peak_mem_swap: Option<u64>,
    /// Peak swap charged to the cgroup (v2 `memory.swap.peak`).
    pub peak_swap: Option<u64>,
    /// Pages swapped out / in machine-wide (`/proc/vmstat` pswpout / pswpin).
    pub pages_swapped_out: Option<u64>,
    pub pages_swapped_in: Option<u64>,
    /// Bytes written to / read from the zram device.
    pub device_written: Option<u64>,
    pub device_read: Option<u64>,
    /// Peak RAM the zram device itself used for the compressed pages (not charged to the
    /// cgroup: count it when comparing memory footprints).
    pub zram_mem_used_max: Option<u64>,
}

impl SwapStats {
    /// Whether the run visibly swapped out anything.
    pub fn swapped_out(&self) -> bool {
        let pos = |v: Option<u64>| v.is_some_and(|v| v > 0);
        pos(self.device_written) || pos(self.pages_swapped_out) || pos(self.peak_swap)
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "peak_mem": self.peak_mem,
            "peak_mem_swap": self.peak_mem_swap,
            "peak_swap": self.peak_swap,
            "pages_swapped_out": self.pages_swapped_out,
            "pages_swapped_in": self.pages_swapped_in,
            "device_written": self.device_written,
            "device_read": self.device_read,
            "zram_mem_used_max": self.zram_mem_used_max,
        })
    }
}

/// A memory cgroup with a limit plus an active swap device; removed on drop, on SIGINT /
/// SIGTERM, and on panic.
pub struct SwapBaseline {
    inner: Arc<Inner>,
    info: Info,
    measure: Mutex<Measure>,
}

/// What a baseline is, fixed once set up.
struct Info {
    kind: SwapKind,
    swap_bytes: u64,
    mem_limit: u64,
    version: CgVersion,
    cgroup: PathBuf,
    device: PathBuf,
    zram_index: Option<u32>,
    swappiness: Option<u64>,
    other_swaps: Vec<SwapEntry>,
    notes: Vec<String>,
}

/// Counter values at the start of the current run.
#[derive(Default)]
struct Measure {
    vmstat: Option<(u64, u64)>,
    device: Option<(u64, u64)>,
    /// cgroup v2 (6.12+): `memory.peak` / `memory.swap.peak` opened and reset for this run;
    /// reading them through these descriptors gives the peak since the reset.
    peak_fd: Option<File>,
    swap_peak_fd: Option<File>,
}

/// The registered, shared part of a baseline: the record of what setup changed.
struct Inner {
    id: u64,
    owner: ThreadId,
    state: Mutex<Changes>,
}

/// Everything setup changed on the machine, each entry cleared once undone, so teardown is
/// idempotent and a failed step is retried by the next teardown.
#[derive(Default)]
struct Changes {
    version: Option<CgVersion>,
    zram_module_loaded: bool,
    zram_hot_added: Option<u32>,
    zram_configured: Option<u32>,
    /// The compression algorithm a free zram device had (reset restores the default).
    zram_comp_algorithm: Option<(u32, String)>,
    dev_node_created: Option<PathBuf>,
    swap_file_created: Option<PathBuf>,
    swap_active: Option<PathBuf>,
    v2_memory_enabled_in: Option<PathBuf>,
    cgroup: Option<PathBuf>,
    /// The lock on [`LOCK_PATH`]; released when the baseline is dropped.
    lock: Option<File>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CgVersion {
    V1,
    V2,
}

static REGISTRY: Mutex<Vec<Arc<Inner>>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(0);
/// Set (in signal context) as soon as SIGINT / SIGTERM arrives.
static SIGNALED: AtomicBool = AtomicBool::new(false);
/// Set by the handler thread when it starts tearing down.
static EXITING: AtomicBool = AtomicBool::new(false);
static HANDLER: OnceLock<std::result::Result<(), String>> = OnceLock::new();

/// A poisoned lock only means another thread panicked holding it; the data is still the best
/// record of what to undo.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl SwapBaseline {
    /// Sets up a swap device of `swap_bytes` (zram: a free device gets `disksize`, `mkswap`,
    /// `swapon` at priority 32767; file: created, allocated, mode 600, `mkswap`, `swapon`) and
    /// a fresh memory cgroup `farmem-bench-<pid>-<n>` limited to `mem_limit` bytes of RAM with
    /// unlimited swap (v1: `memory.limit_in_bytes`, `memory.memsw.limit_in_bytes` = -1; v2:
    /// `memory.max`, `memory.swap.max` = max, `memory.zswap.max` = 0). Waits while another
    /// baseline holds [`LOCK_PATH`]. On error nothing is left changed.
    pub fn setup(kind: SwapKind, swap_bytes: u64, mem_limit: u64) -> Result<SwapBaseline> {
        // SAFETY: geteuid has no preconditions.
        require_root(unsafe { libc::geteuid() })?;
        if swap_bytes < MIB {
            bail!("Linux-swap baseline: swap size {swap_bytes} B is too small (at least 1 MiB)");
        }
        if mem_limit < MIB {
            bail!("Linux-swap baseline: memory limit {mem_limit} B is too small (at least 1 MiB)");
        }
        let page = farmem::PAGE_SIZE as u64;
        let swap_bytes = swap_bytes / page * page;
        let mem_limit = mem_limit / page * page;
        let me = thread::current().id();
        if lock(&REGISTRY).iter().any(|i| i.owner == me) {
            bail!(
                "this thread already holds a Linux-swap baseline; drop it before setting up \
                 another (baselines are serialized by {LOCK_PATH})"
            );
        }
        install_signal_handler()?;
        let t0 = Instant::now();
        let machine_lock = acquire_machine_lock()?;
        park_if_exiting();
        // Everything read-only first: fail before changing anything.
        let plan = detect_cgroup()?;
        let other_swaps = read_swaps().unwrap_or_default();

        let inner = Arc::new(Inner {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            owner: me,
            state: Mutex::new(Changes {
                lock: Some(machine_lock),
                version: Some(plan.version),
                ..Changes::default()
            }),
        });
        // Held through setup, so a signal arriving meanwhile tears down after setup settles.
        let mut ch = lock(&inner.state);
        lock(&REGISTRY).push(inner.clone());
        let res = set_up(&mut ch, &kind, swap_bytes, mem_limit, &plan);
        let (device, zram_index, cgroup) = match res {
            Ok(v) => v,
            Err(e) => {
                for err in ch.teardown() {
                    tracing::warn!("undoing a failed Linux-swap baseline setup: {err:#}");
                }
                drop(ch);
                lock(&REGISTRY).retain(|i| i.id != inner.id);
                // A signal may have made a setup step fail: exit the way it asks.
                park_if_exiting();
                return Err(e);
            }
        };
        drop(ch);

        let mut notes = Vec::new();
        for s in &other_swaps {
            tracing::warn!(
                "another swap device is active and may mix into the Linux-swap measurement: {} \
                 ({}, priority {}, {} used)",
                s.path,
                human(s.size),
                s.priority,
                human(s.used)
            );
        }
        let swappiness = match plan.version {
            CgVersion::V1 => read_u64(&cgroup.join("memory.swappiness")),
            CgVersion::V2 => read_u64(Path::new("/proc/sys/vm/swappiness")),
        };
        if swappiness == Some(0) {
            tracing::warn!("swappiness is 0: the cgroup will hardly swap and may be OOM-killed");
        }
        if fs::read_to_string("/sys/module/zswap/parameters/enabled").is_ok_and(|s| s.trim() == "Y")
            && !cgroup.join("memory.zswap.max").exists()
        {
            notes.push("zswap enabled".to_string());
            tracing::warn!(
                "zswap is enabled: swapped-out pages are compressed in RAM before they reach \
                 the swap device (disable with echo N > /sys/module/zswap/parameters/enabled)"
            );
        }
        if plan.version == CgVersion::V1 && !cgroup.join("memory.memsw.usage_in_bytes").exists() {
            notes.push("no swap accounting".to_string());
            tracing::warn!(
                "memory.memsw.* is missing (swap accounting off, boot with swapaccount=1): swap \
                 use of the cgroup cannot be measured"
            );
        }
        let b = SwapBaseline {
            inner,
            info: Info {
                kind,
                swap_bytes,
                mem_limit,
                version: plan.version,
                cgroup,
                device,
                zram_index,
                swappiness,
                other_swaps,
                notes,
            },
            measure: Mutex::new(Measure::default()),
        };
        tracing::info!("set up {} in {:?}", b.describe(), t0.elapsed());
        Ok(b)
    }

    /// Runs `cmd` inside the cgroup from its first instruction (the child joins the cgroup
    /// between fork and exec) and returns its output, stdout and stderr captured (stdin is
    /// /dev/null unless `cmd` sets it). Resets the peak counters first, so [`Self::stats`] and
    /// [`Self::peak_bytes`] describe this run. A non-zero exit status is not an error.
    pub fn run(&self, mut cmd: Command) -> Result<Output> {
        let procs = self.info.cgroup.join("cgroup.procs");
        let cpath = CString::new(procs.as_os_str().as_bytes())
            .with_context(|| format!("cgroup path {} contains a NUL byte", procs.display()))?;
        self.begin_measurement();
        // SAFETY: the hook runs in the forked child before exec and only calls the
        // async-signal-safe open, write and close on a string allocated before the fork; it
        // allocates nothing and touches no lock.
        unsafe {
            cmd.pre_exec(move || enter_cgroup(&cpath));
        }
        let what = format!("{cmd:?}");
        let out = cmd.output();
        if let Ok(o) = &out {
            if matches!(o.status.signal(), Some(libc::SIGINT | libc::SIGTERM)) {
                // A Ctrl-C reaches the whole process group: the same signal may be on its
                // way to this process.
                wait_for(Duration::from_millis(500), || {
                    SIGNALED.load(Ordering::SeqCst)
                });
            }
        }
        // Signaled: let the handler finish the teardown and exit.
        park_if_exiting();
        out.with_context(|| {
            format!(
                "running {what} in the Linux-swap baseline cgroup {}",
                self.info.cgroup.display()
            )
        })
    }

    /// Peak RAM usage of the cgroup since the last run began (v1 `memory.max_usage_in_bytes`;
    /// v2 `memory.peak`, since the cgroup was created on kernels before 6.12).
    pub fn peak_bytes(&self) -> Option<u64> {
        let m = lock(&self.measure);
        match self.info.version {
            CgVersion::V1 => read_u64(&self.info.cgroup.join("memory.max_usage_in_bytes")),
            CgVersion::V2 => match &m.peak_fd {
                Some(f) => read_u64_at(f),
                None => read_u64(&self.info.cgroup.join("memory.peak")),
            },
        }
    }

    /// The counters of the current (or last) run.
    pub fn stats(&self) -> SwapStats {
        let cg = &self.info.cgroup;
        let mut s = SwapStats {
            peak_mem: self.peak_bytes(),
            ..SwapStats::default()
        };
        let m = lock(&self.measure);
        match self.info.version {
            CgVersion::V1 => {
                s.peak_mem_swap = read_u64(&cg.join("memory.memsw.max_usage_in_bytes"));
            }
            CgVersion::V2 => {
                s.peak_swap = match &m.swap_peak_fd {
                    Some(f) => read_u64_at(f),
                    None => read_u64(&cg.join("memory.swap.peak")),
                };
            }
        }
        if let (Some((in0, out0)), Some((in1, out1))) = (m.vmstat, read_vmstat_swap()) {
            s.pages_swapped_in = Some(in1.saturating_sub(in0));
            s.pages_swapped_out = Some(out1.saturating_sub(out0));
        }
        if let Some(n) = self.info.zram_index {
            if let (Some((r0, w0)), Some((r1, w1))) = (m.device, zram_io(n)) {
                s.device_read = Some(r1.saturating_sub(r0));
                s.device_written = Some(w1.saturating_sub(w0));
            }
            s.zram_mem_used_max = zram_mm_stat(n).and_then(|v| v.get(4).copied());
        }
        s
    }

    /// E.g. "linux-swap-zram (limit 256 MiB, swap 2 GiB on /dev/zram0, cgroup v1, swappiness
    /// 60)", plus any other active swap device, which mixes into the measurement.
    pub fn describe(&self) -> String {
        let i = &self.info;
        let mut s = format!(
            "linux-swap-{} (limit {}, swap {} on {}, cgroup {}",
            i.kind,
            human(i.mem_limit),
            human(i.swap_bytes),
            i.device.display(),
            match i.version {
                CgVersion::V1 => "v1",
                CgVersion::V2 => "v2",
            }
        );
        if let Some(sw) = i.swappiness {
            s += &format!(", swappiness {sw}");
        }
        for n in &i.notes {
            s += ", ";
            s += n;
        }
        s += ")";
        if !i.other_swaps.is_empty() {
            let others: Vec<String> = i
                .other_swaps
                .iter()
                .map(|e| format!("{} ({}, priority {})", e.path, human(e.size), e.priority))
                .collect();
            s += &format!("; other active swap: {}", others.join(", "));
        }
        s
    }

    /// The cgroup directory the commands run in.
    pub fn cgroup_dir(&self) -> &Path {
        &self.info.cgroup
    }

    /// The active swap device or file, as `/proc/swaps` names it.
    pub fn swap_device(&self) -> &Path {
        &self.info.device
    }

    pub fn mem_limit(&self) -> u64 {
        self.info.mem_limit
    }

    pub fn swap_bytes(&self) -> u64 {
        self.info.swap_bytes
    }

    /// Tears down now and reports what could not be undone (dropping does the same but can
    /// only log).
    pub fn close(self) -> Result<()> {
        let errs = lock(&self.inner.state).teardown();
        if errs.is_empty() {
            Ok(())
        } else {
            let msg: Vec<String> = errs.iter().map(|e| format!("{e:#}")).collect();
            Err(anyhow!(
                "Linux-swap baseline cleanup incomplete: {}",
                msg.join("; ")
            ))
        }
    }

    fn begin_measurement(&self) {
        let cg = &self.info.cgroup;
        let mut m = lock(&self.measure);
        match self.info.version {
            CgVersion::V1 => {
                // Writing 0 resets a v1 watermark to the current usage.
                for f in [
                    "memory.max_usage_in_bytes",
                    "memory.memsw.max_usage_in_bytes",
                ] {
                    let p = cg.join(f);
                    if p.exists() {
                        if let Err(e) = write_sys(&p, "0") {
                            tracing::debug!("{e:#}");
                        }
                    }
                }
            }
            CgVersion::V2 => {
                m.peak_fd = open_reset_peak(&cg.join("memory.peak"));
                m.swap_peak_fd = open_reset_peak(&cg.join("memory.swap.peak"));
            }
        }
        m.vmstat = read_vmstat_swap();
        if let Some(n) = self.info.zram_index {
            m.device = zram_io(n);
            // Any write resets the watermark to the current value.
            let _ = write_sys(&zram_sys(n).join("mem_used_max"), "0");
        }
    }
}

impl Drop for SwapBaseline {
    fn drop(&mut self) {
        park_if_exiting();
        let t0 = Instant::now();
        let mut ch = lock(&self.inner.state);
        for e in ch.teardown() {
            tracing::warn!("Linux-swap baseline cleanup: {e:#}");
        }
        // Released even if something could not be undone: the next baseline picks other
        // resources rather than waiting forever.
        ch.lock = None;
        drop(ch);
        lock(&REGISTRY).retain(|i| i.id != self.inner.id);
        tracing::info!("removed {} in {:?}", self.describe(), t0.elapsed());
    }
}

/// The fallible part of setup; every change is recorded in `ch` as soon as it is made.
fn set_up(
    ch: &mut Changes,
    kind: &SwapKind,
    swap_bytes: u64,
    mem_limit: u64,
    plan: &CgroupPlan,
) -> Result<(PathBuf, Option<u32>, PathBuf)> {
    let (device, zram_index) = match kind {
        SwapKind::Zram => {
            let (dev, n) = set_up_zram(ch, swap_bytes)?;
            (dev, Some(n))
        }
        SwapKind::File(p) => (set_up_file(ch, p, swap_bytes)?, None),
    };
    let cgroup = create_cgroup(ch, plan, mem_limit, swap_bytes)?;
    Ok((device, zram_index, cgroup))
}

impl Changes {
    /// Undoes every recorded change still in place, in reverse order of setup; returns what
    /// failed (those records stay, so a later call retries them). Never panics.
    fn teardown(&mut self) -> Vec<anyhow::Error> {
        let mut errs = Vec::new();
        if let Some(dir) = self.cgroup.clone() {
            match remove_cgroup(&dir, self.version.unwrap_or(CgVersion::V1)) {
                Ok(()) => self.cgroup = None,
                Err(e) => errs.push(e),
            }
        }
        if let Some(root) = self.v2_memory_enabled_in.clone() {
            match write_sys(&root.join("cgroup.subtree_control"), "-memory") {
                Ok(()) => self.v2_memory_enabled_in = None,
                Err(e) => errs.push(e.context("disabling the memory controller we enabled")),
            }
        }
        if let Some(dev) = self.swap_active.clone() {
            match swapoff(&dev) {
                Ok(()) => self.swap_active = None,
                Err(e) => errs.push(e),
            }
        }
        if self.swap_active.is_some() {
            // The device still holds pages: leave it configured rather than fail worse.
            return errs;
        }
        if let Some(n) = self.zram_configured {
            match retry_busy(|| write_sys(&zram_sys(n).join("reset"), "1")) {
                Ok(()) => self.zram_configured = None,
                Err(e) => errs.push(e.context(format!("resetting /dev/zram{n}"))),
            }
        }
        if let (Some((n, alg)), None) = (self.zram_comp_algorithm.clone(), self.zram_configured) {
            if self.zram_hot_added != Some(n) && selected_comp_algorithm(n).as_ref() != Some(&alg) {
                if let Err(e) = write_sys(&zram_sys(n).join("comp_algorithm"), &alg) {
                    errs.push(e.context(format!("restoring the compression of /dev/zram{n}")));
                }
            }
            self.zram_comp_algorithm = None;
        }
        if let (Some(n), None) = (self.zram_hot_added, self.zram_configured) {
            let ctl = Path::new(ZRAM_CONTROL).join("hot_remove");
            match retry_busy(|| write_sys(&ctl, &n.to_string())) {
                Ok(()) => self.zram_hot_added = None,
                Err(e) => errs.push(e.context(format!("removing the hot-added /dev/zram{n}"))),
            }
        }
        if let (Some(p), None) = (self.dev_node_created.clone(), self.zram_hot_added) {
            match fs::remove_file(&p) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    errs.push(anyhow!("removing the device node {}: {e}", p.display()))
                }
                _ => self.dev_node_created = None,
            }
        }
        if let Some(p) = self.swap_file_created.clone() {
            match fs::remove_file(&p) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    errs.push(anyhow!("removing the swap file {}: {e}", p.display()))
                }
                _ => self.swap_file_created = None,
            }
        }
        if self.zram_module_loaded
            && self.zram_configured.is_none()
            && self.zram_hot_added.is_none()
        {
            match run_tool("modprobe", &["-r", "zram"]) {
                Ok(_) => self.zram_module_loaded = false,
                Err(e) => errs.push(e.context("unloading the zram module we loaded")),
            }
        }
        errs
    }
}

fn require_root(euid: u32) -> Result<()> {
    if euid != 0 {
        bail!(
            "Linux swap baselines need root (swapon, zram and memory cgroup setup); run as root \
             (effective uid is {euid})"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Signals

/// Installs (once) a thread that, on SIGINT or SIGTERM, tears down every live baseline and
/// exits with 128 + the signal number (also once no baseline is live any more: the handler
/// stays for the life of the process). Signals the process ignores (e.g. SIGINT of a
/// background job) stay ignored.
fn install_signal_handler() -> Result<()> {
    let r = HANDLER.get_or_init(|| {
        let sigs: Vec<libc::c_int> = [libc::SIGINT, libc::SIGTERM]
            .into_iter()
            .filter(|&s| !signal_ignored(s))
            .collect();
        if sigs.is_empty() {
            return Ok(());
        }
        let mut signals = signal_hook::iterator::Signals::new(&sigs).map_err(|e| e.to_string())?;
        thread::Builder::new()
            .name("farmem-swap-signals".into())
            .spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    EXITING.store(true, Ordering::SeqCst);
                    let n = cleanup_all();
                    let name = if sig == libc::SIGINT {
                        "SIGINT"
                    } else {
                        "SIGTERM"
                    };
                    let _ = writeln!(
                        io::stderr(),
                        "farmem: {name}: removed {n} Linux-swap baseline(s); exiting"
                    );
                    std::process::exit(128 + sig);
                }
            })
            .map_err(|e| e.to_string())?;
        // Only once the thread that acts on it runs: whoever sees the flag waits for it.
        for &sig in &sigs {
            signal_hook::flag::register(sig, &SIGNALED).map_err(|e| e.to_string())?;
        }
        Ok(())
    });
    r.clone()
        .map_err(|e| anyhow!("installing the SIGINT/SIGTERM cleanup handler failed: {e}"))
}

fn signal_ignored(sig: libc::c_int) -> bool {
    // SAFETY: an all-zero sigaction is a valid out-parameter.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action only queries the current disposition into `old`.
    let r = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
    r == 0 && old.sa_sigaction == libc::SIG_IGN
}

/// Once the signal handler is tearing down, other threads must not go on (a thread returning
/// from `main` would end the process half-way through the teardown): they wait here for the
/// handler to exit the process.
fn park_if_exiting() {
    while SIGNALED.load(Ordering::SeqCst) || EXITING.load(Ordering::SeqCst) {
        thread::park();
    }
}

/// Tears down every registered baseline; returns how many there were.
fn cleanup_all() -> usize {
    let all: Vec<Arc<Inner>> = lock(&REGISTRY).clone();
    for inner in &all {
        for e in lock(&inner.state).teardown() {
            tracing::warn!("Linux-swap baseline cleanup: {e:#}");
            let _ = writeln!(io::stderr(), "farmem: Linux-swap baseline cleanup: {e:#}");
        }
    }
    all.len()
}

fn acquire_machine_lock() -> Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .open(LOCK_PATH)
        .with_context(|| format!("opening the lock file {LOCK_PATH}"))?;
    let fd = f.as_raw_fd();
    // SAFETY: fd is an open descriptor owned by `f` for the duration of the call.
    if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(f);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
        return Err(e).with_context(|| format!("locking {LOCK_PATH}"));
    }
    tracing::info!("waiting for {LOCK_PATH}: another Linux-swap baseline is live");
    loop {
        // SAFETY: as above.
        if unsafe { libc::flock(fd, libc::LOCK_EX) } == 0 {
            return Ok(f);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e).with_context(|| format!("locking {LOCK_PATH}"));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Swap devices

fn zram_sys(n: u32) -> PathBuf {
    PathBuf::from(format!("/sys/block/zram{n}"))
}

/// Picks a free zram device (zram0 when its disksize is 0, else a hot-added one), sizes it,
/// formats it and turns it on. Returns the device node and index.
fn set_up_zram(ch: &mut Changes, bytes: u64) -> Result<(PathBuf, u32)> {
    let control = Path::new(ZRAM_CONTROL);
    if !zram_sys(0).exists() && !control.exists() {
        let was_loaded = Path::new("/sys/module/zram").exists();
        run_tool("modprobe", &["zram"]).context(
            "zram is not available (no /sys/block/zram0, and `modprobe zram` failed); enable \
             CONFIG_ZRAM or use a swap file baseline",
        )?;
        ch.zram_module_loaded = !was_loaded;
        wait_for(Duration::from_secs(2), || {
            zram_sys(0).exists() || control.exists()
        });
    }
    let n = if zram_sys(0).exists() && read_u64(&zram_sys(0).join("disksize")) == Some(0) {
        0
    } else {
        let hot_add = control.join("hot_add");
        if !hot_add.exists() {
            let why = if zram_sys(0).exists() {
                format!(
                    "/dev/zram0 is in use (disksize {}{})",
                    human(read_u64(&zram_sys(0).join("disksize")).unwrap_or(0)),
                    if swap_is_active("/dev/zram0") {
                        ", active swap"
                    } else {
                        ""
                    }
                )
            } else {
                "no zram device exists".to_string()
            };
            bail!(
                "{why} and {} is missing, so no zram device can be added; free it (swapoff \
                 /dev/zram0; echo 1 > /sys/block/zram0/reset) or use a swap file baseline",
                hot_add.display()
            );
        }
        let s = fs::read_to_string(&hot_add)
            .with_context(|| format!("adding a zram device through {}", hot_add.display()))?;
        let n: u32 = s
            .trim()
            .parse()
            .with_context(|| format!("{} returned {s:?}", hot_add.display()))?;
        ch.zram_hot_added = Some(n);
        tracing::info!("/dev/zram0 is in use by someone else; hot-added /dev/zram{n}");
        n
    };
    let sys = zram_sys(n);
    ch.zram_comp_algorithm = selected_comp_algorithm(n).map(|a| (n, a));
    ch.zram_configured = Some(n);
    write_sys(&sys.join("disksize"), &bytes.to_string())
        .with_context(|| format!("sizing /dev/zram{n} (needs root)"))?;
    let dev = zram_dev_node(ch, n)?;
    mkswap(&dev)?;
    swapon(&dev)?;
    ch.swap_active = Some(dev.clone());
    Ok((dev, n))
}

/// `/dev/zram<n>`, created (and recorded) if devtmpfs did not make it within 2 s.
fn zram_dev_node(ch: &mut Changes, n: u32) -> Result<PathBuf> {
    let dev = PathBuf::from(format!("/dev/zram{n}"));
    let numbers = fs::read_to_string(zram_sys(n).join("dev"))
        .with_context(|| format!("reading the device number of zram{n}"))?;
    let (maj, min) = numbers
        .trim()
        .split_once(':')
        .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))
        .ok_or_else(|| anyhow!("bad device number {numbers:?} for zram{n}"))?;
    let rdev = libc::makedev(maj, min);
    wait_for(Duration::from_secs(2), || dev.exists());
    match fs::metadata(&dev) {
        Ok(m) if m.file_type().is_block_device() && m.rdev() == rdev => Ok(dev),
        Ok(_) => bail!(
            "{} is not the block device {maj}:{min} of zram{n}; fix /dev",
            dev.display()
        ),
        Err(_) => {
            let c = CString::new(dev.as_os_str().as_bytes())?;
            // SAFETY: c is a valid NUL-terminated path; mknod only creates a node.
            if unsafe { libc::mknod(c.as_ptr(), libc::S_IFBLK | 0o600, rdev) } != 0 {
                return Err(io::Error::last_os_error())
                    .with_context(|| format!("creating the device node {}", dev.display()));
            }
            ch.dev_node_created = Some(dev.clone());
            Ok(dev)
        }
    }
}

/// Creates a swap file of `bytes` at `path` (which must not exist) and turns it on. Returns
/// its canonical path (as `/proc/swaps` shows it).
fn set_up_file(ch: &mut Changes, path: &Path, bytes: u64) -> Result<PathBuf> {
    let path = std::path::absolute(path)
        .with_context(|| format!("resolving the swap file path {}", path.display()))?;
    if fs::symlink_metadata(&path).is_ok() {
        bail!(
            "swap file {} already exists; refusing to overwrite it (remove it or pick another \
             path)",
            path.display()
        );
    }
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("creating the swap file {}", path.display()))?;
    ch.swap_file_created = Some(path.clone());
    // As /proc/swaps will name it.
    let path = fs::canonicalize(&path).unwrap_or(path);
    ch.swap_file_created = Some(path.clone());
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 600 {}", path.display()))?;
    allocate(&f, bytes).with_context(|| {
        format!(
            "allocating {} for the swap file {}",
            human(bytes),
            path.display()
        )
    })?;
    f.sync_all()
        .with_context(|| format!("syncing the swap file {}", path.display()))?;
    drop(f);
    mkswap(&path)?;
    swapon(&path).map_err(|e| {
        e.context(
            "the filesystem may not support swap files (tmpfs, overlayfs, NFS, btrfs without \
             nocow do not); put the swap file on ext4 or xfs",
        )
    })?;
    ch.swap_active = Some(path.clone());
    Ok(path)
}

/// Allocates every block of the file (swap files must have no holes): fallocate, or zeros
/// where the filesystem does not support it.
fn allocate(f: &File, bytes: u64) -> io::Result<()> {
    let len =
        libc::off_t::try_from(bytes).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: the descriptor is open for writing for the duration of the call.
    if unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if !matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)
    ) {
        return Err(e);
    }
    let zeros = vec![0u8; MIB as usize];
    let mut off = 0u64;
    while off < bytes {
        let n = (bytes - off).min(MIB) as usize;
        f.write_all_at(&zeros[..n], off)?;
        off += n as u64;
    }
    Ok(())
}

fn mkswap(dev: &Path) -> Result<()> {
    let d = dev.to_string_lossy();
    run_tool("mkswap", &[&d])
        .map(|_| ())
        .with_context(|| format!("mkswap {d} failed (needs root and util-linux)"))
}

fn swapon(dev: &Path) -> Result<()> {
    let c = CString::new(dev.as_os_str().as_bytes())?;
    let flags = SWAP_FLAG_PREFER | (SWAP_PRIORITY & SWAP_FLAG_PRIO_MASK);
    // SAFETY: c is a valid NUL-terminated path.
    if unsafe { libc::swapon(c.as_ptr(), flags) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    let hint = match e.raw_os_error() {
        Some(libc::EPERM) => " (needs root / CAP_SYS_ADMIN)",
        Some(libc::EBUSY) => " (already in use as swap)",
        _ => "",
    };
    bail!("swapon {} failed: {e}{hint}", dev.display())
}

fn swapoff(dev: &Path) -> Result<()> {
    let name = dev.to_string_lossy();
    if !swap_is_active(&name) {
        return Ok(());
    }
    let c = CString::new(dev.as_os_str().as_bytes())?;
    // SAFETY: c is a valid NUL-terminated path.
    if unsafe { libc::swapoff(c.as_ptr()) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if !swap_is_active(&name) {
        return Ok(());
    }
    bail!(
        "swapoff {name} failed: {e} (pages on it could not be brought back into memory; free \
         memory and run swapoff {name} by hand)"
    )
}

/// One line of `/proc/swaps`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SwapEntry {
    path: String,
    size: u64,
    used: u64,
    priority: i64,
}

fn parse_swaps(s: &str) -> Vec<SwapEntry> {
    s.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 5 {
                return None;
            }
            Some(SwapEntry {
                path: unescape_octal(f[0]),
                size: f[2].parse::<u64>().ok()? * 1024,
                used: f[3].parse::<u64>().ok()? * 1024,
                priority: f[4].parse().ok()?,
            })
        })
        .collect()
}

fn read_swaps() -> Result<Vec<SwapEntry>> {
    Ok(parse_swaps(
        &fs::read_to_string("/proc/swaps").context("reading /proc/swaps")?,
    ))
}

fn swap_is_active(path: &str) -> bool {
    read_swaps().is_ok_and(|v| v.iter().any(|e| e.path == path))
}

/// The selected compression algorithm of a zram device: "lzo-rle" of "[lzo-rle] lzo lz4".
fn selected_comp_algorithm(n: u32) -> Option<String> {
    let s = fs::read_to_string(zram_sys(n).join("comp_algorithm")).ok()?;
    let start = s.find('[')? + 1;
    let len = s[start..].find(']')?;
    Some(s[start..start + len].to_string())
}

/// (read, written) bytes of a zram device, from its block-layer `stat` (512-byte sectors).
fn zram_io(n: u32) -> Option<(u64, u64)> {
    let s = fs::read_to_string(zram_sys(n).join("stat")).ok()?;
    let f: Vec<u64> = s
        .split_whitespace()
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    Some((f.get(2)? * 512, f.get(6)? * 512))
}

/// orig_data_size compr_data_size mem_used_total mem_limit mem_used_max same_pages ...
fn zram_mm_stat(n: u32) -> Option<Vec<u64>> {
    let s = fs::read_to_string(zram_sys(n).join("mm_stat")).ok()?;
    s.split_whitespace().map(|x| x.parse().ok()).collect()
}

/// (pswpin, pswpout) from /proc/vmstat.
fn read_vmstat_swap() -> Option<(u64, u64)> {
    let s = fs::read_to_string("/proc/vmstat").ok()?;
    let get = |k: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(' ')?.trim().parse().ok())
    };
    Some((get("pswpin")?, get("pswpout")?))
}

// ---------------------------------------------------------------------------------------------
// Cgroups

/// Where the baseline's cgroup goes.
struct CgroupPlan {
    version: CgVersion,
    /// The directory the cgroup is created in: v1, the memory cgroup of this process (so its
    /// own limits still apply); v2, the nearest ancestor with the memory controller enabled
    /// for its children.
    parent: PathBuf,
    /// v2: the root in which `+memory` must be written to `cgroup.subtree_control` first.
    enable_memory_in: Option<PathBuf>,
}

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, PartialEq, Eq)]
struct Mount {
    root: String,
    point: PathBuf,
    fstype: String,
    super_opts: String,
}

fn parse_mountinfo(s: &str) -> Vec<Mount> {
    s.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let lf: Vec<&str> = left.split(' ').collect();
            let rf: Vec<&str> = right.split(' ').collect();
            Some(Mount {
                root: unescape_octal(lf.get(3)?),
                point: PathBuf::from(unescape_octal(lf.get(4)?)),
                fstype: rf.first()?.to_string(),
                super_opts: rf.get(2).unwrap_or(&"").to_string(),
            })
        })
        .collect()
}

/// This process's cgroup path: in the v1 hierarchy holding `controller`, or (None) in v2.
fn own_cgroup(proc_cgroup: &str, controller: Option<&str>) -> Option<String> {
    proc_cgroup.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (id, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        let hit = match controller {
            Some(c) => ctrls.split(',').any(|x| x == c),
            None => id == "0" && ctrls.is_empty(),
        };
        hit.then(|| path.to_string())
    })
}

/// The directory of cgroup `path` under mount `m`, or None when the mount does not show it.
fn cgroup_dir_in(m: &Mount, path: &str) -> Option<PathBuf> {
    let rel = if m.root == "/" {
        path
    } else {
        let rest = path.strip_prefix(m.root.as_str())?;
        if !(rest.is_empty() || rest.starts_with('/')) {
            return None;
        }
        rest
    };
    let dir = m.point.join(rel.trim_start_matches('/'));
    dir.is_dir().then_some(dir)
}

fn detect_cgroup() -> Result<CgroupPlan> {
    let mounts = parse_mountinfo(
        &fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?,
    );
    let own = fs::read_to_string("/proc/self/cgroup").context("reading /proc/self/cgroup")?;
    if let Some(m) = mounts
        .iter()
        .find(|m| m.fstype == "cgroup" && m.super_opts.split(',').any(|o| o == "memory"))
    {
        let parent = own_cgroup(&own, Some("memory"))
            .and_then(|p| cgroup_dir_in(m, &p))
            .unwrap_or_else(|| m.point.clone());
        return Ok(CgroupPlan {
            version: CgVersion::V1,
            parent,
            enable_memory_in: None,
        });
    }
    let has_memory = |dir: &Path, file: &str| {
        fs::read_to_string(dir.join(file))
            .is_ok_and(|s| s.split_whitespace().any(|c| c == "memory"))
    };
    if let Some(m) = mounts
        .iter()
        .find(|m| m.fstype == "cgroup2" && has_memory(&m.point, "cgroup.controllers"))
    {
        let own_dir = own_cgroup(&own, None)
            .and_then(|p| cgroup_dir_in(m, &p))
            .unwrap_or_else(|| m.point.clone());
        // A non-root cgroup with processes cannot hand controllers to children, so the
        // cgroup goes under the nearest ancestor that already does (or the root).
        let mut dir = if own_dir == m.point {
            Some(own_dir.as_path())
        } else {
            own_dir.parent()
        };
        while let Some(d) = dir {
            if has_memory(d, "cgroup.subtree_control") {
                return Ok(CgroupPlan {
                    version: CgVersion::V2,
                    parent: d.to_path_buf(),
                    enable_memory_in: None,
                });
            }
            if d == m.point {
                break;
            }
            dir = d.parent();
        }
        return Ok(CgroupPlan {
            version: CgVersion::V2,
            parent: m.point.clone(),
            enable_memory_in: Some(m.point.clone()),
        });
    }
    bail!(
        "memory cgroup controller not found at /sys/fs/cgroup/memory (cgroup v1) nor in a cgroup \
         v2 hierarchy (/sys/fs/cgroup/cgroup.controllers); Linux swap baselines need cgroup v1 \
         memory or cgroup v2 with the memory controller (mount -t cgroup -o memory none \
         /sys/fs/cgroup/memory, or boot with cgroup_enable=memory)"
    )
}

/// Creates `farmem-bench-<pid>-<n>` in the plan's parent with the limits of the baseline.
fn create_cgroup(
    ch: &mut Changes,
    plan: &CgroupPlan,
    mem_limit: u64,
    swap_bytes: u64,
) -> Result<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    sweep_stale_cgroups(&plan.parent);
    if let Some(root) = &plan.enable_memory_in {
        write_sys(&root.join("cgroup.subtree_control"), "+memory").with_context(|| {
            format!(
                "enabling the memory controller for the children of {} (move the processes \
                 out of that cgroup, or enable it by hand)",
                root.display()
            )
        })?;
        ch.v2_memory_enabled_in = Some(root.clone());
    }
    let pid = std::process::id();
    let dir = loop {
        let d = plan.parent.join(format!(
            "{CGROUP_PREFIX}{pid}-{}",
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        match fs::create_dir(&d) {
            Ok(()) => break d,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("creating the memory cgroup {} (needs root)", d.display())
                })
            }
        }
    };
    ch.cgroup = Some(dir.clone());
    let limit = mem_limit.to_string();
    match plan.version {
        CgVersion::V1 => {
            write_sys(&dir.join("memory.limit_in_bytes"), &limit)?;
            // Unlimited RAM + swap, so the limit pushes pages to swap instead of OOM.
            let memsw = dir.join("memory.memsw.limit_in_bytes");
            if memsw.exists() {
                write_sys(&memsw, "-1")?;
            }
            check_v1_ancestors(&plan.parent, mem_limit, swap_bytes);
        }
        CgVersion::V2 => {
            write_sys(&dir.join("memory.max"), &limit)?;
            for (f, v) in [("memory.swap.max", "max"), ("memory.zswap.max", "0")] {
                let p = dir.join(f);
                if p.exists() {
                    write_sys(&p, v)?;
                }
            }
        }
    }
    Ok(dir)
}

/// Warns when a v1 ancestor's limits are tighter than the baseline's.
fn check_v1_ancestors(parent: &Path, mem_limit: u64, swap_bytes: u64) {
    let mut dir = Some(parent);
    while let Some(d) = dir {
        let Some(l) = read_u64(&d.join("memory.limit_in_bytes")) else {
            break;
        };
        if l < mem_limit {
            tracing::warn!(
                "{} limits memory to {}, below the baseline's {}",
                d.display(),
                human(l),
                human(mem_limit)
            );
        }
        if let Some(sw) = read_u64(&d.join("memory.memsw.limit_in_bytes")) {
            if sw < mem_limit.saturating_add(swap_bytes) {
                tracing::warn!(
                    "{} limits memory + swap to {}: the baseline may not be able to swap all \
                     it needs",
                    d.display(),
                    human(sw)
                );
            }
        }
        dir = d.parent();
    }
}

/// Removes empty `farmem-bench-<pid>-*` cgroups left by processes that no longer exist.
fn sweep_stale_cgroups(parent: &Path) {
    let Ok(rd) = fs::read_dir(parent) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(CGROUP_PREFIX)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let dir = e.path();
        match read_pids(&dir) {
            Ok(p) if p.is_empty() => match fs::remove_dir(&dir) {
                Ok(()) => tracing::warn!("removed the stale cgroup {}", dir.display()),
                Err(err) => tracing::warn!("stale cgroup {}: {err}", dir.display()),
            },
            _ => tracing::warn!("stale cgroup {} still has tasks; left alone", dir.display()),
        }
    }
}

fn read_pids(dir: &Path) -> io::Result<Vec<libc::pid_t>> {
    Ok(fs::read_to_string(dir.join("cgroup.procs"))?
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect())
}

/// Kills what is left in the cgroup, waits for it to empty and removes it.
fn remove_cgroup(dir: &Path, version: CgVersion) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let kill_file = dir.join("cgroup.kill");
    if version == CgVersion::V2 && kill_file.exists() {
        let _ = write_sys(&kill_file, "1");
    }
    let deadline = Instant::now() + TEARDOWN_PATIENCE;
    loop {
        let pids = match read_pids(dir) {
            Ok(p) => p,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                return Err(e).with_context(|| format!("listing the tasks of {}", dir.display()))
            }
        };
        if pids.is_empty() {
            match fs::remove_dir(dir) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!("rmdir {}: {e}; retrying", dir.display());
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("removing the cgroup {}", dir.display()))
                }
            }
        } else {
            if Instant::now() >= deadline {
                bail!(
                    "tasks {pids:?} of {} did not exit within {:?} of SIGKILL; rmdir it once \
                     they are gone",
                    dir.display(),
                    TEARDOWN_PATIENCE
                );
            }
            for pid in pids {
                // SAFETY: kill has no memory-safety preconditions; pid was just read from the
                // cgroup, which only holds processes we started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Moves the calling process into the cgroup whose `cgroup.procs` is `procs` ("0" means the
/// writer). Runs between fork and exec: async-signal-safe calls only, no allocation.
fn enter_cgroup(procs: &CStr) -> io::Result<()> {
    // SAFETY: procs is a valid NUL-terminated path.
    let fd = unsafe { libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is open and the buffer is one valid byte.
    let n = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
    let err = (n != 1).then(io::Error::last_os_error);
    // SAFETY: fd is open and closed exactly once.
    unsafe { libc::close(fd) };
    err.map_or(Ok(()), Err)
}

/// v2: opens a peak file and resets it for this descriptor (kernel 6.12+).
fn open_reset_peak(path: &Path) -> Option<File> {
    let mut f = OpenOptions::new().read(true).write(true).open(path).ok()?;
    f.write_all(b"reset\n").ok()?;
    Some(f)
}

// ---------------------------------------------------------------------------------------------
// Small helpers

/// Writes `value` to an existing sysfs / cgroupfs file (never creates one).
fn write_sys(path: &Path, value: &str) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    f.write_all(value.as_bytes())
        .with_context(|| format!("writing {value} to {}", path.display()))
}

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn read_u64_at(f: &File) -> Option<u64> {
    let mut buf = [0u8; 32];
    let n = f.read_at(&mut buf, 0).ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()
}

/// Retries `f` while it fails with EBUSY (a device briefly held open by udev, for example).
fn retry_busy(mut f: impl FnMut() -> Result<()>) -> Result<()> {
    let deadline = Instant::now() + TEARDOWN_PATIENCE;
    loop {
        match f() {
            Err(e)
                if Instant::now() < deadline
                    && e.chain().any(|c| {
                        c.downcast_ref::<io::Error>()
                            .is_some_and(|io| io.raw_os_error() == Some(libc::EBUSY))
                    }) =>
            {
                thread::sleep(Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Runs a system tool (looked up in PATH, then /usr/sbin and /sbin), capturing its output.
fn run_tool(name: &str, args: &[&str]) -> Result<Output> {
    let path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            anyhow!("{name} not found in PATH, /usr/sbin or /sbin (util-linux / kmod)")
        })?;
    let out = Command::new(&path)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("running {}", path.display()))?;
    if !out.status.success() {
        bail!(
            "{name} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

/// Undoes the octal escapes (`\040` for a space) of /proc/swaps and mountinfo.
fn unescape_octal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let code = (b[i] == b'\\' && i + 3 < b.len())
            .then(|| &b[i + 1..i + 4])
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .map(|d| d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0')))
            .and_then(|v| u8::try_from(v).ok());
        if let Some(c) = code {
            out.push(c);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// 268435456 -> "256 MiB", 1610612736 -> "1.5 GiB".
fn human(b: u64) -> String {
    for (unit, name) in [(1u64 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")] {
        if b >= unit {
            return if b.is_multiple_of(unit) {
                format!("{} {name}", b / unit)
            } else {
                format!("{:.1} {name}", b as f64 / unit as f64)
            };
        }
    }
    format!("{b} B")
}

#[cfg(test)]
mod tests {
    //! The machine-changing tests need root, a memory cgroup controller and zram (this crate's
    //! test environment). They re-execute this test binary for the workload and for the
    //! process that gets interrupted: the `helper_*` tests, ignored and inert unless
    //! `FARMEM_SWAP_HELPER` names them.

    use super::*;
    use std::io::{BufRead, BufReader};
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
            &format!("swap_baseline::tests::{name}"),
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
    fn parses_mountinfo_and_cgroup_paths() {
        let mi = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                  41 31 0:38 /docker/ab /sys/fs/cgroup/un\\040ified rw - cgroup2 cgroup2 rw\n";
        let m = parse_mountinfo(mi);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].point, PathBuf::from("/sys/fs/cgroup/memory"));
        assert_eq!(m[0].super_opts, "rw,memory");
        assert_eq!(m[1].root, "/docker/ab");
        assert_eq!(m[1].point, PathBuf::from("/sys/fs/cgroup/un ified"));
        assert_eq!(m[1].fstype, "cgroup2");
        let pc = "5:devices:/\n4:memory:/a/b\n1:name=systemd:/\n0::/user.slice\n";
        assert_eq!(own_cgroup(pc, Some("memory")).as_deref(), Some("/a/b"));
        assert_eq!(own_cgroup(pc, None).as_deref(), Some("/user.slice"));
        assert_eq!(own_cgroup("0::/\n", Some("memory")), None);
        // A mount of a subtree shows only cgroups inside it.
        let sub = Mount {
            root: "/docker/ab".into(),
            point: PathBuf::from("/"),
            fstype: "cgroup2".into(),
            super_opts: String::new(),
        };
        assert_eq!(cgroup_dir_in(&sub, "/docker/abc"), None);
        assert_eq!(cgroup_dir_in(&sub, "/other"), None);
        assert_eq!(cgroup_dir_in(&sub, "/docker/ab"), Some(PathBuf::from("/")));
    }

    #[test]
    fn formats_sizes() {
        assert_eq!(human(256 * MIB), "256 MiB");
        assert_eq!(human(2 << 30), "2 GiB");
        assert_eq!(human(3 << 29), "1.5 GiB");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(100), "100 B");
        assert_eq!(unescape_octal("a\\040b\\\\c\\0"), "a b\\\\c\\0");
    }
}
