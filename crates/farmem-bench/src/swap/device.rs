//! Swap devices: zram (an unused device, or a hot-added one) or a swap file; swapon and
//! swapoff; what /proc/swaps, zram and vmstat say.

use super::*;
use farmem_sys::mounts::unescape_octal;

pub(super) fn zram_sys(n: u32) -> PathBuf {
    PathBuf::from(format!("/sys/block/zram{n}"))
}

/// Picks a free zram device (zram0 when its disksize is 0, else a hot-added one), sizes it,
/// formats it and turns it on. Returns the device node and index.
pub(super) fn set_up_zram(ch: &mut Changes, bytes: u64) -> Result<(PathBuf, u32)> {
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
    if let Some(alg) = super::zram_compressor() {
        // Before the size: the compressor can only be chosen while the device is unused.
        write_sys(&sys.join("comp_algorithm"), &alg)
            .with_context(|| format!("choosing {alg} for /dev/zram{n}"))?;
    }
    write_sys(&sys.join("disksize"), &bytes.to_string())
        .with_context(|| format!("sizing /dev/zram{n} (needs root)"))?;
    let dev = zram_dev_node(ch, n)?;
    mkswap(&dev)?;
    swapon(&dev)?;
    ch.swap_active = Some(dev.clone());
    Ok((dev, n))
}

/// `/dev/zram<n>`, created (and recorded) if devtmpfs did not make it within 2 s.
pub(super) fn zram_dev_node(ch: &mut Changes, n: u32) -> Result<PathBuf> {
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
pub(super) fn set_up_file(ch: &mut Changes, path: &Path, bytes: u64) -> Result<PathBuf> {
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
pub(super) fn allocate(f: &File, bytes: u64) -> io::Result<()> {
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

pub(super) fn mkswap(dev: &Path) -> Result<()> {
    let d = dev.to_string_lossy();
    run_tool("mkswap", &[&d])
        .map(|_| ())
        .with_context(|| format!("mkswap {d} failed (needs root and util-linux)"))
}

pub(super) fn swapon(dev: &Path) -> Result<()> {
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

pub(super) fn swapoff(dev: &Path) -> Result<()> {
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
pub(super) struct SwapEntry {
    pub(super) path: String,
    pub(super) size: u64,
    pub(super) used: u64,
    pub(super) priority: i64,
}

pub(super) fn parse_swaps(s: &str) -> Vec<SwapEntry> {
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

pub(super) fn read_swaps() -> Result<Vec<SwapEntry>> {
    Ok(parse_swaps(
        &fs::read_to_string("/proc/swaps").context("reading /proc/swaps")?,
    ))
}

pub(super) fn swap_is_active(path: &str) -> bool {
    read_swaps().is_ok_and(|v| v.iter().any(|e| e.path == path))
}

/// The selected compression algorithm of a zram device: "lzo-rle" of "[lzo-rle] lzo lz4".
pub(super) fn selected_comp_algorithm(n: u32) -> Option<String> {
    let s = fs::read_to_string(zram_sys(n).join("comp_algorithm")).ok()?;
    let start = s.find('[')? + 1;
    let len = s[start..].find(']')?;
    Some(s[start..start + len].to_string())
}

/// (read, written) bytes of a zram device, from its block-layer `stat` (512-byte sectors).
pub(super) fn zram_io(n: u32) -> Option<(u64, u64)> {
    let s = fs::read_to_string(zram_sys(n).join("stat")).ok()?;
    let f: Vec<u64> = s
        .split_whitespace()
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    Some((f.get(2)? * 512, f.get(6)? * 512))
}

/// orig_data_size compr_data_size mem_used_total mem_limit mem_used_max same_pages ...
pub(super) fn zram_mm_stat(n: u32) -> Option<Vec<u64>> {
    let s = fs::read_to_string(zram_sys(n).join("mm_stat")).ok()?;
    s.split_whitespace().map(|x| x.parse().ok()).collect()
}

/// (pswpin, pswpout) from /proc/vmstat.
pub(super) fn read_vmstat_swap() -> Option<(u64, u64)> {
    let s = fs::read_to_string("/proc/vmstat").ok()?;
    let get = |k: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(' ')?.trim().parse().ok())
    };
    Some((get("pswpin")?, get("pswpout")?))
}
