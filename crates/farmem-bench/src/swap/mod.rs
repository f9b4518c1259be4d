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

mod cgroup;
mod device;
mod oom_relief;
mod signals;
mod sysfs;
#[cfg(test)]
mod tests;

use cgroup::*;
use device::*;
use oom_relief::OomRelief;
use signals::*;
pub use signals::{install_cleanup_handler, kill_group_on_signal};
use sysfs::*;

use std::ffi::{CStr, CString};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output};
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
    /// No swap device: only the cgroup, to measure what a process tree uses the way the
    /// baselines are measured (farmem's runs, with a limit no run reaches).
    None,
}

impl fmt::Display for SwapKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SwapKind::Zram => f.write_str("zram"),
            SwapKind::File(_) => f.write_str("file"),
            SwapKind::None => f.write_str("none"),
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
    /// OOM stalls (v1, OOM killer off) the benchmark ended, how many times it raised the
    /// limit for a moment to do so, and how long the program was seen parked in them
    /// ([`oom_relief`]).
    pub oom_stalls: Option<u64>,
    pub oom_overruns: Option<u64>,
    pub oom_parked_us: Option<u64>,
}

impl SwapStats {
    /// Whether the run visibly swapped out anything.
    pub fn swapped_out(&self) -> bool {
        let pos = |v: Option<u64>| v.is_some_and(|v| v > 0);
        pos(self.device_written) || pos(self.pages_swapped_out) || pos(self.peak_swap)
    }

    /// Memory the run used at its peak: the cgroup's peak plus zram's own (0 if unknown).
    pub fn mem_used(&self) -> u64 {
        self.peak_mem.unwrap_or(0) + self.zram_mem_used_max.unwrap_or(0)
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
            "oom_stalls": self.oom_stalls,
            "oom_overruns": self.oom_overruns,
            "oom_parked_us": self.oom_parked_us,
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
    /// The OOM relief's counts (stalls, overruns, time parked).
    oom: Option<(u64, u64, Duration)>,
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
    /// The cgroup's OOM relief (v1 with the OOM killer off); stopped before the cgroup goes.
    relief: Option<OomRelief>,
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

/// The compressor zram baselines use (none: the kernel's default), so that compressed DRAM
/// is compared with compressed DRAM of the same algorithm.
static ZRAM_COMPRESSOR: Mutex<Option<String>> = Mutex::new(None);

/// Make the zram devices set up from now on use `alg` (e.g. `lz4`).
pub fn use_zram_compressor(alg: Option<&str>) {
    *lock(&ZRAM_COMPRESSOR) = alg.map(str::to_owned);
}

fn zram_compressor() -> Option<String> {
    lock(&ZRAM_COMPRESSOR).clone()
}

/// Whether the baselines' cgroups keep their OOM killer (off by default, see
/// [`use_oom_killer`]).
static OOM_KILLER: AtomicBool = AtomicBool::new(false);

/// Let the cgroups set up from now on OOM-kill a program whose limit is too tight, as Linux
/// does by default. Off (the default), a v1 cgroup gets `memory.oom_control` = 1 and an
/// [`OomRelief`]: a charge that fails parks the faulting thread, a thread of ours reclaims
/// for it from outside, and the program goes on, so every point has a time. cgroup v2 has no
/// such switch.
pub fn use_oom_killer(on: bool) {
    OOM_KILLER.store(on, Ordering::Relaxed);
}

fn oom_killer() -> bool {
    OOM_KILLER.load(Ordering::Relaxed)
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
        let page = farmem_runtime::PAGE_SIZE as u64;
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
        match (plan.version, oom_killer()) {
            (CgVersion::V1, false) => notes.push("OOM killer off, its stalls relieved".into()),
            (CgVersion::V2, false) => {
                notes.push("OOM killer on (cgroup v2 cannot turn it off)".into());
                tracing::warn!(
                    "cgroup v2 has no switch for the OOM killer: a tight limit may still kill \
                     the program"
                );
            }
            (_, true) => {}
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
    pub fn run(&self, cmd: Command) -> Result<Output> {
        self.run_with(cmd, |c| c.output().map(|o| (o.status, o)))
    }

    /// As [`Self::run`], with the caller's way of starting and waiting for the command
    /// (`start` gets it ready to spawn, inside the cgroup, and returns its exit status and
    /// whatever else it measured).
    pub fn run_with<T>(
        &self,
        mut cmd: Command,
        start: impl FnOnce(&mut Command) -> io::Result<(ExitStatus, T)>,
    ) -> Result<T> {
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
        let out = start(&mut cmd);
        if let Ok((status, _)) = &out {
            if matches!(status.signal(), Some(libc::SIGINT | libc::SIGTERM)) {
                // A Ctrl-C reaches the whole process group: the same signal may be on its
                // way to this process.
                wait_for(Duration::from_millis(500), || {
                    SIGNALED.load(Ordering::SeqCst)
                });
            }
        }
        // Signaled: let the handler finish the teardown and exit.
        park_if_exiting();
        out.map(|(_, t)| t).with_context(|| {
            format!(
                "running {what} in the Linux-swap baseline cgroup {}",
                self.info.cgroup.display()
            )
        })
    }

    /// How many processes the cgroup's OOM killer has killed since it was created (v1
    /// `memory.oom_control`, v2 `memory.events`), if the kernel says.
    pub fn oom_kills(&self) -> Option<u64> {
        let file = match self.info.version {
            CgVersion::V1 => "memory.oom_control",
            CgVersion::V2 => "memory.events",
        };
        let text = fs::read_to_string(self.info.cgroup.join(file)).ok()?;
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == "oom_kill").then(|| v.trim().parse().ok()).flatten()
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
        if let (Some((s0, o0, p0)), Some((s1, o1, p1))) = (m.oom, self.oom_counts()) {
            s.oom_stalls = Some(s1 - s0);
            s.oom_overruns = Some(o1 - o0);
            s.oom_parked_us = Some(p1.saturating_sub(p0).as_micros() as u64);
        }
        s
    }

    /// The OOM relief's counts so far (stalls, overruns, time parked), if the cgroup has one.
    fn oom_counts(&self) -> Option<(u64, u64, Duration)> {
        let ch = lock(&self.inner.state);
        ch.relief
            .as_ref()
            .map(|r| (r.stalls(), r.overruns(), r.parked()))
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
    #[cfg(test)]
    pub fn cgroup_dir(&self) -> &Path {
        &self.info.cgroup
    }

    /// The active swap device or file, as `/proc/swaps` names it.
    #[cfg(test)]
    pub fn swap_device(&self) -> &Path {
        &self.info.device
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
        m.oom = self.oom_counts();
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
        SwapKind::None => (PathBuf::from("(none)"), None),
    };
    let cgroup = create_cgroup(ch, plan, mem_limit, swap_bytes)?;
    Ok((device, zram_index, cgroup))
}

impl Changes {
    /// Undoes every recorded change still in place, in reverse order of setup; returns what
    /// failed (those records stay, so a later call retries them). Never panics.
    fn teardown(&mut self) -> Vec<anyhow::Error> {
        let mut errs = Vec::new();
        self.relief = None;
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
