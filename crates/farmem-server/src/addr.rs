//! Addresses given on the command line (`--listen`, `--metrics`).

use std::net::{SocketAddr, ToSocketAddrs};

use crate::error::ServerError;

/// The first address `addr` resolves to; `option` names it in errors.
pub(crate) fn resolve(addr: &str, option: &'static str) -> Result<SocketAddr, ServerError> {
    addr.to_socket_addrs()
        .map_err(|cause| ServerError::Resolve {
            option,
            addr: addr.to_string(),
            cause,
        })?
        .next()
        .ok_or_else(|| ServerError::NoAddress {
            option,
            addr: addr.to_string(),
        })
}
