//! What the threads of a process are doing, as `/proc` shows it: for reports of a stall
//! (the runtime's watchdog, the tests' deadline), so that a hang seen once says where it is.

use std::path::Path;

/// The fields of a `/proc/PID/stat` (or task `stat`) line after the command name, which may
/// hold spaces and parentheses: state, ppid, pgrp, ...
pub fn stat_fields(stat: &str) -> Vec<&str> {
    stat.rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect()
}

/// One line on every thread of the process at `proc_dir` (`/proc/self`, `/proc/PID`): its
/// id, command, state, wait channel, system call and (readable as root) kernel stack.
pub fn describe(proc_dir: &Path) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(proc_dir.join("task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .map(|t| {
            let read = |f: &str| std::fs::read_to_string(t.path().join(f)).unwrap_or_default();
            let stat = read("stat");
            let syscall = read("syscall");
            let stack: Vec<String> = read("stack")
                .lines()
                .take(8)
                .map(|l| l.split_whitespace().nth(1).unwrap_or(l).to_string())
                .collect();
            format!(
                "thread {} {:?} state {} wchan {} syscall {} stack {}",
                t.file_name().to_string_lossy(),
                read("comm").trim(),
                stat_fields(&stat).first().unwrap_or(&"?"),
                read("wchan"),
                syscall.split_whitespace().next().unwrap_or("?"),
                stack.join(" < "),
            )
        })
        .collect()
}
