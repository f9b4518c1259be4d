//! Typed errors of the runtime library.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration: {0}")]
    Config(String),
    #[error("{what}: {source}")]
    Sys {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("backend {backend}: {msg}")]
    Backend { backend: String, msg: String },
    #[error("far memory is full: {0}")]
    BackendFull(String),
    #[error("address {0:#x} is not in a far-memory region")]
    NotInRegion(usize),
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("runtime is shutting down")]
    ShuttingDown,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn sys(what: &'static str, source: io::Error) -> Error {
        Error::Sys { what, source }
    }
}
