//! Reading settings: `FARMEM_*` environment variables, sizes and budgets. A leaf: the
//! configuration and the backend specifications both read the environment through it.

use farmem_sys::mem::physical_memory;

use crate::error::{Error, Result};

/// Parse a size (`4096`, `512M`, `2G`; see [`farmem_proto::size`]).
pub(crate) fn parse_size(s: &str) -> Result<u64> {
    farmem_proto::size::parse_size(s).map_err(|e| Error::Config(e.to_string()))
}

/// Parse a budget (`FARMEM_LOCAL_MEM`, `--local-mem`): a size, or a percentage of physical memory (`25%`).
pub fn parse_budget(s: &str) -> Result<u64> {
    if let Some(p) = s.trim().strip_suffix('%') {
        let pct: f64 = p
            .trim()
            .parse()
            .map_err(|_| Error::Config(format!("invalid percentage '{s}'")))?;
        if !(0.0..=100.0).contains(&pct) || pct == 0.0 {
            return Err(Error::Config(format!(
                "percentage '{s}' must be in (0, 100]"
            )));
        }
        return Ok((physical_memory() as f64 * pct / 100.0) as u64);
    }
    parse_size(s)
}

pub(crate) fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

pub(crate) fn env_num<T: std::str::FromStr>(name: &str) -> Result<Option<T>> {
    match env(name) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| Error::Config(format!("{name}='{v}' is not a valid number"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse() {
        assert_eq!(parse_budget("512M").unwrap(), 512 << 20);
        assert!(parse_budget("lots").is_err());
        assert!(parse_budget("0%").is_err());
        assert!(parse_budget("25%").unwrap() > 0);
    }
}
