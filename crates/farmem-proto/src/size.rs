//! Sizes as people write them (`4096`, `64K`, `512M`, `2G`, `1.5T`): one syntax for token
//! files, command lines and `FARMEM_*` variables.

/// A size that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid size '{0}': expected e.g. 4096, 512M, 2G")]
pub struct SizeError(pub String);

/// Parse a size: `4096`, `64K`, `512M`, `2G`, `1T` (binary units, optional `B`/`iB`).
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1 << 30),
        Some('t' | 'T') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let bad = || SizeError(s.to_string());
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    if !v.is_finite() || v < 0.0 {
        return Err(bad());
    }
    Ok((v * mult as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 65536);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1G").is_err());
    }
}
