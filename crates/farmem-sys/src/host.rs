//! Facts about the machine the command runs on.

/// A `/proc/meminfo` field (e.g. "MemTotal"), in KiB.
pub fn meminfo_kib(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_memory_fields() {
        let total = super::meminfo_kib("MemTotal").expect("MemTotal");
        let avail = super::meminfo_kib("MemAvailable").expect("MemAvailable");
        assert!(total > 0 && avail <= total, "{avail} of {total}");
        assert_eq!(super::meminfo_kib("Mem"), None, "a prefix is not a field");
    }
}
