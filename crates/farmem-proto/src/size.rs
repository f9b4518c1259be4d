//! Sizes as people write them (`4096`, `64K`, `512M`, `2G`, `1.5T`): one syntax for token
//! files, command lines and `FARMEM_*` variables.

/// A size that does not parse, or that no 64-bit byte count can hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("invalid size '{0}': expected e.g. 4096, 512M, 2G")]
    Syntax(String),
    #[error("size '{0}' is too large: more than 16 EiB (2^64 bytes)")]
    TooLarge(String),
}

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
    let num = num.trim();
    let bad = || SizeError::Syntax(s.to_string());
    let too_large = || SizeError::TooLarge(s.to_string());
    // Whole numbers exactly (a float would round 2^64 - 1 and accept it rounded up).
    if !num.is_empty() && num.bytes().all(|b| b.is_ascii_digit()) {
        let v: u64 = num.parse().map_err(|_| too_large())?;
        return v.checked_mul(mult).ok_or_else(too_large);
    }
    let v: f64 = num.parse().map_err(|_| bad())?;
    if !v.is_finite() || v < 0.0 {
        return Err(bad());
    }
    let bytes = v * mult as f64;
    // 2^64 is the first value `as u64` would silently saturate.
    if bytes >= 18_446_744_073_709_551_616.0 {
        return Err(too_large());
    }
    Ok(bytes as u64)
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
        assert_eq!(parse_size(" 3 T ").unwrap(), 3 << 40);
        assert!(matches!(parse_size("lots"), Err(SizeError::Syntax(_))));
        assert!(matches!(parse_size("-1G"), Err(SizeError::Syntax(_))));
        assert!(matches!(parse_size("inf"), Err(SizeError::Syntax(_))));
    }

    #[test]
    fn sizes_beyond_64_bits_are_errors() {
        assert_eq!(parse_size("18446744073709551615").unwrap(), u64::MAX);
        assert_eq!(parse_size("16777215T").unwrap(), 16_777_215 << 40);
        for s in [
            "18446744073709551616",
            "99999999999T",
            "16777216T",
            "16777216.0T",
            "1e30",
            "99999999999999999999999999K",
        ] {
            let e = parse_size(s).unwrap_err();
            assert!(matches!(e, SizeError::TooLarge(_)), "{s}: {e:?}");
            assert!(e.to_string().contains("too large"), "{e}");
        }
    }
}
