//! Small helpers for sysfs, cgroupfs and external tools.

use super::*;

/// Writes `value` to an existing sysfs / cgroupfs file (never creates one).
pub(super) fn write_sys(path: &Path, value: &str) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    f.write_all(value.as_bytes())
        .with_context(|| format!("writing {value} to {}", path.display()))
}

pub(super) fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

pub(super) fn read_u64_at(f: &File) -> Option<u64> {
    let mut buf = [0u8; 32];
    let n = f.read_at(&mut buf, 0).ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()
}

/// Retries `f` while it fails with EBUSY (a device briefly held open by udev, for example).
pub(super) fn retry_busy(mut f: impl FnMut() -> Result<()>) -> Result<()> {
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

pub(super) fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
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
pub(super) fn run_tool(name: &str, args: &[&str]) -> Result<Output> {
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

/// 268435456 -> "256 MiB", 1610612736 -> "1.5 GiB".
pub(super) fn human(b: u64) -> String {
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
