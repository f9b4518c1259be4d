//! A memory cgroup for the program's process tree, with no limit: it only counts. The
//! runtime in each process reads what the tree is charged (`FARMEM_CGROUP`, see
//! farmem-runtime's `cgroup_charge`), so that `--local-mem` covers what a cgroup's limit
//! covers: page tables, processes farmem does not run, pages shared after fork.
//!
//! Made under the cgroup `farmem run` is in (so a cgroup around `farmem run` still counts
//! the program), only where this process may: root, with the memory controller (v1, or v2
//! where the parent delegates it). Anywhere else the program runs without one and the budget
//! covers the processes' own memory, as before; nothing fails for it. A `farmem run` killed
//! with SIGKILL leaves its cgroup behind (empty once the program has ended): the next one
//! started in the same cgroup removes it.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use farmem_sys::mounts;

const PREFIX: &str = "farmem-run-";

/// The cgroup, removed when dropped (once its processes have ended).
pub struct TreeCgroup {
    dir: PathBuf,
}

impl TreeCgroup {
    /// Make the cgroup, or None (with the reason in the log) where this process cannot.
    pub fn create() -> Option<TreeCgroup> {
        match parent_dir() {
            Some(parent) => {
                // Those of earlier runs killed before they could remove theirs.
                mounts::sweep_stale_cgroups(&parent, PREFIX);
                let dir = parent.join(format!("{PREFIX}{}", std::process::id()));
                match std::fs::create_dir(&dir) {
                    Ok(()) => Some(TreeCgroup { dir }),
                    Err(e) => {
                        tracing::debug!("no cgroup for the tree: {}: {e}", dir.display());
                        None
                    }
                }
            }
            None => {
                tracing::debug!("no cgroup for the tree: no memory controller to use here");
                None
            }
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Start `cmd` inside the cgroup: it joins between fork and exec, so everything the
    /// program allocates is charged there.
    pub fn join_on_spawn(&self, cmd: &mut Command) {
        let Ok(procs) = CString::new(self.dir.join("cgroup.procs").as_os_str().as_bytes()) else {
            return;
        };
        // SAFETY: the hook runs in the child between fork and exec and only calls open,
        // write and close (async-signal-safe) on memory allocated before the fork. A
        // failure leaves the program outside the cgroup; its runtime then finds itself not
        // in it and does without (`CgroupCharge::open`).
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd >= 0 {
                    // "0": the writing process itself.
                    libc::write(fd, b"0".as_ptr().cast(), 1);
                    libc::close(fd);
                }
                Ok(())
            });
        }
    }
}

impl Drop for TreeCgroup {
    fn drop(&mut self) {
        // The program's last processes may still be exiting (a daemon it left behind keeps
        // the cgroup busy: then it stays, empty of charges once that process ends).
        for _ in 0..50 {
            match std::fs::remove_dir(&self.dir) {
                Ok(()) => return,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => {
                    tracing::debug!("removing {}: {e}", self.dir.display());
                    return;
                }
            }
        }
        // A daemon the program started (`redis-server --daemonize yes`, `tmux new -d`) is
        // the usual reason: it keeps running, under farmem, after the program ended.
        let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        tracing::warn!(
            "{} process(es) of the program still run after it ended (a daemon it started?): \
             its memory cgroup {} stays until they end, and a later farmem run removes it",
            procs.lines().count(),
            self.dir.display()
        );
    }
}

/// The directory of this process's memory cgroup, if this process may make cgroups in it.
fn parent_dir() -> Option<PathBuf> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mounts = mounts::own_mounts();
    // v1: a hierarchy with the memory controller.
    if let Some(m) = mounts.iter().find(|m| m.is_v1_with("memory")) {
        let dir = mounts::cgroup_dir_in(m, &mounts::own_cgroup(&own, Some("memory"))?)?;
        return dir.join("memory.usage_in_bytes").exists().then_some(dir);
    }
    // v2: the unified hierarchy, if the parent hands the memory controller to children.
    let m = mounts.iter().find(|m| m.fstype == "cgroup2")?;
    let dir = mounts::cgroup_dir_in(m, &mounts::own_cgroup(&own, None)?)?;
    let delegated = std::fs::read_to_string(dir.join("cgroup.subtree_control")).ok()?;
    delegated
        .split_whitespace()
        .any(|c| c == "memory")
        .then_some(dir)
}
