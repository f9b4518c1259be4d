//! Which CPUs take the completion interrupts of the disk a file is on.
//!
//! A disk with fewer queues than CPUs (virtio-blk with one queue, AHCI) interrupts one CPU
//! or a few. A thread waiting for a read on another CPU is woken from there with an
//! inter-processor interrupt, which on this VM adds 25-45 us to a read of ~80-100
//! (`probes/disk_read_wait.c`). NVMe gives each CPU a queue of its own: every CPU takes its
//! own completions and nothing is to be gained.
//!
//! Found from sysfs and procfs: the file's device (`/sys/dev/block/MAJ:MIN`), the PCI
//! function above it and its interrupts (`msi_irqs/`, or `irq`), their names and counts
//! (`/proc/interrupts`: a virtio device's idle `config` line is left out) and their
//! effective affinity (`/proc/irq/N/effective_affinity_list`). Stacked devices (device
//! mapper, RAID, loop) have no such function: no answer.

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

/// The CPUs taking the completions of the disk holding the file open as `fd`, when they are
/// not every online CPU; `None` when every CPU takes its own or it cannot be told.
pub fn completion_cpus(fd: RawFd) -> Option<Vec<u32>> {
    // SAFETY: fstat writes into the zeroed stat buffer it is given; a bad descriptor fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    let (major, minor) = (libc::major(st.st_dev), libc::minor(st.st_dev));
    let dev = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    let irqs = device_irqs(&dev)?;
    let interrupts = std::fs::read_to_string("/proc/interrupts").ok()?;
    let lines = parse_interrupts(&interrupts);
    let mut cpus = Vec::new();
    for irq in completion_irqs(&irqs, &lines) {
        let dir = PathBuf::from(format!("/proc/irq/{irq}"));
        let list = std::fs::read_to_string(dir.join("effective_affinity_list"))
            .or_else(|_| std::fs::read_to_string(dir.join("smp_affinity_list")))
            .ok()?;
        cpus.extend(parse_cpu_list(&list)?);
    }
    cpus.sort_unstable();
    cpus.dedup();
    let online = parse_cpu_list(&std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?)?;
    (!cpus.is_empty() && online.iter().any(|c| !cpus.contains(c))).then_some(cpus)
}

/// The interrupts of the nearest device above `dev` (in sysfs) that has any.
fn device_irqs(dev: &Path) -> Option<Vec<u32>> {
    let mut dir = Some(dev);
    while let Some(d) = dir {
        if d == Path::new("/sys/devices") || d.parent().is_none() {
            break;
        }
        if let Ok(rd) = std::fs::read_dir(d.join("msi_irqs")) {
            let mut irqs: Vec<u32> = rd
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect();
            irqs.sort_unstable();
            return (!irqs.is_empty()).then_some(irqs);
        }
        let subsystem = std::fs::read_link(d.join("subsystem")).ok();
        if subsystem.is_some_and(|s| s.file_name().is_some_and(|n| n == "pci")) {
            // A PCI function without MSI: its one legacy interrupt.
            let irq: u32 = std::fs::read_to_string(d.join("irq"))
                .ok()?
                .trim()
                .parse()
                .ok()?;
            return (irq != 0).then(|| vec![irq]);
        }
        dir = d.parent();
    }
    None
}

/// One line of `/proc/interrupts` for a numbered interrupt.
#[derive(Debug, PartialEq)]
struct Line {
    irq: u32,
    total: u64,
    name: String,
}

fn parse_interrupts(text: &str) -> Vec<Line> {
    let mut lines = text.lines();
    let ncpus = lines.next().map_or(0, |h| h.split_whitespace().count());
    lines
        .filter_map(|l| {
            let (irq, rest) = l.split_once(':')?;
            let irq = irq.trim().parse().ok()?;
            let mut f = rest.split_whitespace();
            let total = f
                .by_ref()
                .take(ncpus)
                .map(|c| c.parse::<u64>().unwrap_or(0))
                .sum();
            // After the counts: the chip, the hardware interrupt, the trigger, the name.
            let name = f.last().unwrap_or("").to_string();
            Some(Line { irq, total, name })
        })
        .collect()
}

/// Of a device's interrupts, those that carry completions: not a virtio device's
/// configuration line, and (once the device has been used) ones that have fired.
fn completion_irqs(irqs: &[u32], lines: &[Line]) -> Vec<u32> {
    let mine: Vec<&Line> = lines
        .iter()
        .filter(|l| irqs.contains(&l.irq) && !l.name.ends_with("-config"))
        .collect();
    let fired: Vec<u32> = mine.iter().filter(|l| l.total > 0).map(|l| l.irq).collect();
    if fired.is_empty() {
        mine.iter().map(|l| l.irq).collect()
    } else {
        fired
    }
}

/// "0-3,8,10-11" as CPU numbers.
fn parse_cpu_list(s: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<u32>().ok()?..=b.parse::<u32>().ok()?),
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cpu_lists() {
        assert_eq!(parse_cpu_list("0-2,5,7-8\n"), Some(vec![0, 1, 2, 5, 7, 8]));
        assert_eq!(parse_cpu_list("1"), Some(vec![1]));
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn picks_the_completion_lines_of_a_device() {
        let text = "           CPU0       CPU1\n\
            35:          0          1  PCI-MSIX-0000:00:02.0   0-edge      virtio1-config\n\
            36:          0   40551717  PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0\n\
            37:          5          0  PCI-MSIX-0000:00:03.0   0-edge      virtio2-config\n\
           LOC:        100        200   Local timer interrupts\n";
        let lines = parse_interrupts(text);
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[1],
            Line {
                irq: 36,
                total: 40551717,
                name: "virtio1-req.0".into()
            }
        );
        assert_eq!(completion_irqs(&[35, 36], &lines), vec![36]);
        // A device not used yet: every line but the configuration one.
        let idle = parse_interrupts(&text.replace("40551717", "0"));
        assert_eq!(completion_irqs(&[35, 36], &idle), vec![36]);
    }

    #[test]
    fn answers_for_a_real_file_or_says_it_cannot() {
        // Whatever the machine: no panic, and an answer is a strict subset of the CPUs.
        let f = std::fs::File::open("/proc/self/exe").expect("own executable");
        if let Some(cpus) = completion_cpus(std::os::fd::AsRawFd::as_raw_fd(&f)) {
            let online =
                parse_cpu_list(&std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap())
                    .unwrap();
            assert!(!cpus.is_empty() && cpus.len() < online.len(), "{cpus:?}");
        }
    }
}
