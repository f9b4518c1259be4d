//! Where things are mounted and which cgroup this process is in: `/proc/self/mountinfo` and
//! `/proc/self/cgroup`, parsed once here for the runner and the benchmarks.

use std::path::{Path, PathBuf};

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, PartialEq, Eq)]
pub struct Mount {
    /// The directory of the mounted file system shown at `point` (not "/" for a bind mount
    /// or a cgroup namespace's view of a subtree).
    pub root: String,
    pub point: PathBuf,
    pub fstype: String,
    pub super_opts: String,
}

impl Mount {
    /// A cgroup v1 hierarchy holding `controller`.
    pub fn is_v1_with(&self, controller: &str) -> bool {
        self.fstype == "cgroup" && self.super_opts.split(',').any(|o| o == controller)
    }
}

/// Every mount of a mountinfo text
/// ("id parent maj:min root mountpoint opts [optional...] - fstype source superopts").
pub fn parse_mountinfo(s: &str) -> Vec<Mount> {
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

/// This process's mounts, empty if they cannot be read.
pub fn own_mounts() -> Vec<Mount> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|s| parse_mountinfo(&s))
        .unwrap_or_default()
}

/// The cgroup path in a `/proc/<pid>/cgroup` text: in the v1 hierarchy holding
/// `controller`, or (None) in v2.
pub fn own_cgroup(proc_cgroup: &str, controller: Option<&str>) -> Option<String> {
    proc_cgroup.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (id, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        let hit = match controller {
            Some(c) => ctrls.split(',').any(|x| x == c),
            None => id == "0" && ctrls.is_empty(),
        };
        hit.then(|| path.trim_end().to_string())
    })
}

/// The directory of cgroup `path` under mount `m`, or None when the mount does not show it.
pub fn cgroup_dir_in(m: &Mount, path: &str) -> Option<PathBuf> {
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

/// What became of a stale cgroup found by [`sweep_stale_cgroups`].
#[derive(Debug)]
pub enum Stale {
    Removed,
    /// Its maker is gone but processes are still in it: left alone.
    StillUsed,
    Failed(std::io::Error),
}

/// Remove the cgroups in `parent` named `<prefix><pid>` or `<prefix><pid>-...` whose maker
/// `pid` no longer exists and that no process is in (left by a maker killed before it could
/// remove them). Returns each one found, with what became of it.
pub fn sweep_stale_cgroups(parent: &Path, prefix: &str) -> Vec<(PathBuf, Stale)> {
    let Ok(rd) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let dir = e.path();
        let empty =
            std::fs::read_to_string(dir.join("cgroup.procs")).is_ok_and(|p| p.trim().is_empty());
        let what = if !empty {
            Stale::StillUsed
        } else {
            match std::fs::remove_dir(&dir) {
                Ok(()) => Stale::Removed,
                Err(err) => Stale::Failed(err),
            }
        };
        out.push((dir, what));
    }
    out
}

/// Undoes the octal escapes (`\040` for a space) of /proc/swaps and mountinfo.
pub fn unescape_octal(s: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo_and_cgroup_paths() {
        let mi = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                  41 31 0:38 /docker/ab /sys/fs/cgroup/un\\040ified rw - cgroup2 cgroup2 rw\n";
        let m = parse_mountinfo(mi);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].point, PathBuf::from("/sys/fs/cgroup/memory"));
        assert_eq!(m[0].super_opts, "rw,memory");
        assert!(m[0].is_v1_with("memory") && !m[1].is_v1_with("memory"));
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
    fn undoes_octal_escapes() {
        assert_eq!(unescape_octal("a\\040b\\\\c\\0"), "a b\\\\c\\0");
    }

    #[test]
    fn stale_cgroups_of_dead_makers_are_removed_and_live_ones_kept() {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let mounts = own_mounts();
        let Some(parent) = mounts
            .iter()
            .find(|m| m.is_v1_with("memory"))
            .and_then(|m| cgroup_dir_in(m, &own_cgroup(&own, Some("memory"))?))
        else {
            eprintln!("skipped: no cgroup v1 memory hierarchy here");
            return;
        };
        let prefix = format!("farmem-sweeptest-{}-", std::process::id());
        let mut child = std::process::Command::new("true").spawn().unwrap();
        child.wait().unwrap();
        let dead = parent.join(format!("{prefix}{}-0", child.id()));
        let live = parent.join(format!("{prefix}{}", std::process::id()));
        if std::fs::create_dir(&dead).is_err() {
            eprintln!("skipped: cannot make cgroups in {}", parent.display());
            return;
        }
        std::fs::create_dir(&live).unwrap();
        let found = sweep_stale_cgroups(&parent, &prefix);
        let live_kept = live.exists();
        let _ = std::fs::remove_dir(&live);
        assert!(!dead.exists(), "{found:?}");
        assert!(
            matches!(found.as_slice(), [(d, Stale::Removed)] if *d == dead),
            "{found:?}"
        );
        assert!(live_kept, "the cgroup of a live maker stays");
    }
}
