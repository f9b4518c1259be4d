//! Which backend a runtime uses, as named by `FARMEM_BACKEND` or `--backend`:
//! `local://`, `local+lz4://`, `file://DIR`, `tiered://[DIR]` or `tcp://[tenant@]host:port`.

use std::path::PathBuf;
use std::time::Duration;

use farmem_proto::auth::Secret;
use farmem_proto::valid_tenant;

use crate::env::{env, env_num};
use crate::error::{Error, Result};

/// Which far-memory backend to use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendSpec {
    /// Pages kept in this process, outside the regions (the embedded default).
    Local { lz4: bool },
    /// Pages in an unnamed file in a directory on a disk, of at most `max_bytes` (else
    /// `FARMEM_FAR_FILE_MAX`, else as large as the disk allows).
    File {
        dir: PathBuf,
        max_bytes: Option<u64>,
    },
    /// Compressed in this process up to a cap, the rest in a file in a directory on a disk
    /// (`farmem run`'s default). The cap: `compressed_max` bytes, else
    /// `FARMEM_COMPRESSED_MAX`, else 20% of physical memory.
    Tiered {
        dir: PathBuf,
        compressed_max: Option<u64>,
    },
    /// A `farmem server` over TCP.
    Tcp(TcpSpec),
}

/// Where a TCP backend connects and how it authenticates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpSpec {
    /// `host:port` of the server.
    pub addr: String,
    /// Tenant name (from `tcp://tenant@host:port`, else `FARMEM_TENANT`, else `default`).
    pub tenant: String,
    /// The secret; `None` means: from `FARMEM_TOKEN`, else from the file `FARMEM_TOKEN_FILE`.
    pub token: Option<Secret>,
    /// How long to keep trying to reconnect after the server is lost before stopping the
    /// program (`FARMEM_RECONNECT_S`, default 30 s).
    pub reconnect_window: Duration,
}

/// A request unanswered this long means its connection is dead: the receiver reconnects and
/// sends it again.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

impl TcpSpec {
    pub fn url(&self) -> String {
        format!("tcp://{}@{}", self.tenant, self.addr)
    }

    /// The longest a request may take when all is well: unanswered until its connection is
    /// declared dead, the reconnection window, the answer to the request sent again, and
    /// some slack for a loaded machine.
    pub fn longest_wait(&self) -> Duration {
        2 * REQUEST_TIMEOUT + self.reconnect_window + Duration::from_secs(30)
    }
}

impl BackendSpec {
    /// Parse `local://`, `local+lz4://` (or without `://`), or `tcp://[tenant@]host:port`.
    pub fn parse(s: &str) -> Result<BackendSpec> {
        let s = s.trim();
        if let Some(rest) = s.strip_prefix("tcp://") {
            return parse_tcp(rest).map(BackendSpec::Tcp);
        }
        if let Some(dir) = s.strip_prefix("file://") {
            if dir.is_empty() {
                return Err(Error::Config(
                    "backend 'file://' needs a directory: file:///var/tmp".into(),
                ));
            }
            return Ok(BackendSpec::File {
                dir: dir.into(),
                max_bytes: None,
            });
        }
        if let Some(dir) = s.strip_prefix("tiered://") {
            let dir = if dir.is_empty() {
                default_far_dir()
            } else {
                dir.into()
            };
            return Ok(BackendSpec::Tiered {
                dir,
                compressed_max: None,
            });
        }
        match s.trim_end_matches("://") {
            "" | "local" => Ok(BackendSpec::Local { lz4: false }),
            "local+lz4" => Ok(BackendSpec::Local { lz4: true }),
            other => Err(Error::Config(format!(
                "unknown backend '{other}': expected local://, local+lz4://, file://DIR, \
                 tiered://[DIR] or tcp://[tenant@]host:port"
            ))),
        }
    }
}

/// Where far files go when no directory is named: `$TMPDIR`, else `/var/tmp` (on a disk
/// on Debian, where `/tmp` may be memory).
pub fn default_far_dir() -> PathBuf {
    env("TMPDIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp"))
}

/// Most bytes the compressed tier of `tiered://` holds: `FARMEM_COMPRESSED_MAX` (a size or a
/// percentage of physical memory), by default 20% of physical memory (zswap's default pool).
pub fn compressed_max() -> Result<u64> {
    env_size("FARMEM_COMPRESSED_MAX", crate::env::parse_budget)
        .map(|v| v.unwrap_or(farmem_sys::mem::physical_memory() / 5))
}

/// Most bytes a far file may hold when its backend names no limit: `FARMEM_FAR_FILE_MAX` (a
/// size), else no limit of our own (a full disk refuses writes, and the pages stay local).
pub fn far_file_max() -> Result<u64> {
    env_size("FARMEM_FAR_FILE_MAX", crate::env::parse_size).map(|v| v.unwrap_or(1 << 50))
}

/// Variable `name` read with `parse`, its name in the error.
fn env_size(name: &str, parse: fn(&str) -> Result<u64>) -> Result<Option<u64>> {
    env(name)
        .map(|v| {
            parse(&v).map_err(|e| match e {
                Error::Config(m) => Error::Config(format!("{name}: {m}")),
                other => other,
            })
        })
        .transpose()
}

fn parse_tcp(rest: &str) -> Result<TcpSpec> {
    let bad = |why: &str| {
        Error::Config(format!(
            "backend 'tcp://{rest}': {why} (expected tcp://[tenant@]host:port)"
        ))
    };
    let (tenant, addr) = match rest.split_once('@') {
        Some((t, a)) => (Some(t.to_string()), a),
        None => (None, rest),
    };
    let addr = addr.trim_end_matches('/');
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    if host.is_empty() {
        return Err(bad("no host"));
    }
    port.parse::<u16>()
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| bad("invalid port"))?;
    let tenant = tenant
        .or_else(|| env("FARMEM_TENANT"))
        .unwrap_or_else(|| "default".into());
    if !valid_tenant(&tenant) {
        return Err(bad(&format!(
            "tenant '{tenant}' must be 1-64 characters of A-Z a-z 0-9 . _ -"
        )));
    }
    let reconnect_s: f64 = env_num("FARMEM_RECONNECT_S")?.unwrap_or(30.0);
    if !(0.0..=86400.0).contains(&reconnect_s) {
        return Err(Error::Config(format!(
            "FARMEM_RECONNECT_S={reconnect_s} must be between 0 and 86400"
        )));
    }
    Ok(TcpSpec {
        addr: addr.to_string(),
        tenant,
        token: None,
        reconnect_window: Duration::from_secs_f64(reconnect_s),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_parse() {
        assert_eq!(
            BackendSpec::parse("local://").unwrap(),
            BackendSpec::Local { lz4: false }
        );
        assert_eq!(
            BackendSpec::parse("local+lz4://").unwrap(),
            BackendSpec::Local { lz4: true }
        );
        assert!(BackendSpec::parse("nfs://x").is_err());
        assert_eq!(
            BackendSpec::parse("file:///var/tmp").unwrap(),
            BackendSpec::File {
                dir: "/var/tmp".into(),
                max_bytes: None
            }
        );
        assert!(BackendSpec::parse("file://").is_err());
        assert_eq!(
            BackendSpec::parse("tiered:///srv/far").unwrap(),
            BackendSpec::Tiered {
                dir: "/srv/far".into(),
                compressed_max: None
            }
        );
        assert!(matches!(
            BackendSpec::parse("tiered://").unwrap(),
            BackendSpec::Tiered { .. }
        ));
        let BackendSpec::Tcp(t) = BackendSpec::parse("tcp://alice@127.0.0.1:7070").unwrap() else {
            panic!("not tcp")
        };
        assert_eq!(
            (t.tenant.as_str(), t.addr.as_str()),
            ("alice", "127.0.0.1:7070")
        );
        assert_eq!(t.url(), "tcp://alice@127.0.0.1:7070");
        let BackendSpec::Tcp(t) = BackendSpec::parse("tcp://[::1]:9/").unwrap() else {
            panic!("not tcp")
        };
        assert_eq!(t.addr, "[::1]:9");
        for bad in [
            "tcp://host",
            "tcp://:80",
            "tcp://h:0",
            "tcp://h:x",
            "tcp://a b@h:1",
        ] {
            assert!(BackendSpec::parse(bad).is_err(), "{bad}");
        }
    }
}
