//! The private directory where a run's processes leave their statistics: `farmem-run-PID-N`
//! in the temporary directory, removed when the run ends. A `farmem run` killed with SIGKILL
//! (a process group killed whole, an OOM kill) cannot remove its own, so each run first
//! removes those of runs that are gone: the test suite alone left 15 per pass.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

const PREFIX: &str = "farmem-run-";
/// The file of the budget the run's processes share (`FARMEM_TREE`).
pub const TREE_FILE: &str = "tree-budget";

/// Make this run's directory, after removing those of dead runs.
pub fn make() -> Result<PathBuf> {
    let base = std::env::temp_dir();
    sweep(&base);
    for i in 0..100u32 {
        let d = base.join(format!("{PREFIX}{}-{i}", std::process::id()));
        match std::fs::create_dir(&d) {
            Ok(()) => {
                // Made here, once: each process only opens it to append its line.
                let stats = d.join(farmem_runtime::STATS_FILE);
                std::fs::File::create(&stats)
                    .with_context(|| format!("creating {}", stats.display()))?;
                return Ok(d);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("creating {}", d.display())),
        }
    }
    bail!("cannot create a statistics directory in {}", base.display())
}

/// The run's process id a directory name says, if it is one of ours.
fn owner_pid(name: &str) -> Option<i32> {
    let rest = name.strip_prefix(PREFIX)?;
    let (pid, n) = rest.split_once('-')?;
    n.parse::<u32>().ok()?;
    pid.parse::<i32>().ok().filter(|&p| p > 0)
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists; nothing is sent.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Remove the directories of runs whose process is gone, when they hold nothing but the
/// statistics files a run writes (`stats.jsonl`, `faults.*` of `farmem trace`) and its tree
/// budget file. Best effort: a
/// directory that cannot be read or removed is left.
fn sweep(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(owner_pid) else {
            continue;
        };
        if alive(pid) || !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let dir = e.path();
        if only_statistics(&dir) {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

fn only_statistics(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().all(|e| {
        let n = e.file_name();
        let n = n.to_string_lossy();
        e.file_type().is_ok_and(|t| t.is_file())
            && (n == farmem_runtime::STATS_FILE || n.starts_with("faults.") || n == TREE_FILE)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    const STATS: &str = farmem_runtime::STATS_FILE;

    #[test]
    fn names_of_runs_are_recognized() {
        assert_eq!(owner_pid("farmem-run-123-0"), Some(123));
        assert_eq!(owner_pid("farmem-run-123-45"), Some(123));
        assert_eq!(owner_pid("farmem-run-cli-123-x"), None);
        assert_eq!(owner_pid("farmem-run-123"), None);
        assert_eq!(owner_pid("farmem-run-programs-1-2-x"), None);
        assert_eq!(owner_pid("other-123-0"), None);
    }

    /// A dead run's directory of statistics goes; a live run's, a dead run's holding
    /// anything else, and other names stay.
    #[test]
    fn only_dead_runs_statistics_are_swept() {
        let base = std::env::temp_dir().join(format!("farmem-sweep-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        // A process that has certainly ended: a child we waited for.
        let mut c = std::process::Command::new("true").spawn().unwrap();
        c.wait().unwrap();
        let dead = c.id();
        let me = std::process::id();
        let mk = |name: &str, files: &[&str]| {
            let d = base.join(name);
            std::fs::create_dir(&d).unwrap();
            for f in files {
                std::fs::write(d.join(f), "{}").unwrap();
            }
            d
        };
        let gone = mk(
            &format!("farmem-run-{dead}-0"),
            &[STATS, "faults.7", TREE_FILE],
        );
        let empty = mk(&format!("farmem-run-{dead}-1"), &[]);
        let live = mk(&format!("farmem-run-{me}-0"), &[STATS]);
        let other = mk(&format!("farmem-run-{dead}-2"), &[STATS, "notes.txt"]);
        let unrelated = mk(&format!("farmem-test-{dead}-0"), &[STATS]);
        sweep(&base);
        assert!(!gone.exists() && !empty.exists());
        assert!(live.exists() && other.exists() && unrelated.exists());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
