//! The memory cgroup: where it goes (v1 or v2, under this process's own), its limits,
//! entering it and removing it.

use super::*;
use farmem_sys::mounts::{cgroup_dir_in, own_cgroup, parse_mountinfo, Stale};

/// Where the baseline's cgroup goes.
pub(super) struct CgroupPlan {
    pub(super) version: CgVersion,
    /// The directory the cgroup is created in: v1, the memory cgroup of this process (so its
    /// own limits still apply); v2, the nearest ancestor with the memory controller enabled
    /// for its children.
    pub(super) parent: PathBuf,
    /// v2: the root in which `+memory` must be written to `cgroup.subtree_control` first.
    pub(super) enable_memory_in: Option<PathBuf>,
}

pub(super) fn detect_cgroup() -> Result<CgroupPlan> {
    let mounts = parse_mountinfo(
        &fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?,
    );
    let own = fs::read_to_string("/proc/self/cgroup").context("reading /proc/self/cgroup")?;
    if let Some(m) = mounts.iter().find(|m| m.is_v1_with("memory")) {
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
pub(super) fn create_cgroup(
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
            if !oom_killer() {
                ch.relief = Some(OomRelief::start(&dir, mem_limit)?);
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
pub(super) fn check_v1_ancestors(parent: &Path, mem_limit: u64, swap_bytes: u64) {
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
pub(super) fn sweep_stale_cgroups(parent: &Path) {
    for (dir, what) in farmem_sys::mounts::sweep_stale_cgroups(parent, CGROUP_PREFIX) {
        match what {
            Stale::Removed => tracing::warn!("removed the stale cgroup {}", dir.display()),
            Stale::StillUsed => {
                tracing::warn!("stale cgroup {} still has tasks; left alone", dir.display())
            }
            Stale::Failed(err) => tracing::warn!("stale cgroup {}: {err}", dir.display()),
        }
    }
}

pub(super) fn read_pids(dir: &Path) -> io::Result<Vec<libc::pid_t>> {
    Ok(fs::read_to_string(dir.join("cgroup.procs"))?
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect())
}

/// Kills what is left in the cgroup, waits for it to empty and removes it.
pub(super) fn remove_cgroup(dir: &Path, version: CgVersion) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    // Child cgroups first (`farmem run` makes one for its program's tree): a cgroup with
    // children cannot be removed.
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup(&e.path(), version)?;
            }
        }
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
pub(super) fn enter_cgroup(procs: &CStr) -> io::Result<()> {
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
pub(super) fn open_reset_peak(path: &Path) -> Option<File> {
    let mut f = OpenOptions::new().read(true).write(true).open(path).ok()?;
    f.write_all(b"reset\n").ok()?;
    Some(f)
}
