//! Why `farmem server` could not start, or stopped with an error.
//!
//! Each message names what the server was doing or the option at fault; the cause, where
//! there is one, is the error's `source()`, so a report that prints the chain (as the
//! `farmem` binary does) reads `--capacity`, caused by `invalid size 'x': ...`.

use std::io;
use std::path::PathBuf;

use farmem_proto::size::SizeError;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A size option (`--capacity`, `--default-quota`, `--max-bandwidth`) that does not parse.
    #[error("{option}")]
    Size {
        option: &'static str,
        #[source]
        cause: SizeError,
    },
    /// An option whose value parses but cannot be used (the message names the option).
    #[error("{0}")]
    BadOption(&'static str),
    /// An address option (`--listen`, `--metrics`) that does not resolve.
    #[error("{option} '{addr}'")]
    Resolve {
        option: &'static str,
        addr: String,
        #[source]
        cause: io::Error,
    },
    /// An address option that resolves, but to nothing.
    #[error("{option} '{addr}' resolves to no address")]
    NoAddress { option: &'static str, addr: String },
    /// The token file could not be read (the message names it and says why).
    #[error("{0}")]
    TokenFile(String),
    /// The token file does not parse.
    #[error("token file {}: {cause}", path.display())]
    TokenSyntax { path: PathBuf, cause: String },
    /// Neither `--token-file` nor `FARMEM_TOKEN`.
    #[error(
        "no secret to authenticate clients with: give --token-file FILE, or set \
         FARMEM_TOKEN (make one with: head -c 32 /dev/urandom | base64)"
    )]
    NoSecret,
    /// The metrics endpoint (`--stats ADDR`) did not answer with metrics.
    #[error("{0}")]
    Scrape(String),
    /// A system call failed while the server was doing `what`.
    #[error("{what}")]
    Sys {
        what: String,
        #[source]
        cause: io::Error,
    },
    /// A system call failed where the error says enough by itself.
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl ServerError {
    /// For `map_err`: an I/O error while doing `what`.
    pub(crate) fn sys(what: impl Into<String>) -> impl FnOnce(io::Error) -> ServerError {
        let what = what.into();
        move |cause| ServerError::Sys { what, cause }
    }

    /// For `map_err`: a size option that does not parse.
    pub(crate) fn size(option: &'static str) -> impl FnOnce(SizeError) -> ServerError {
        move |cause| ServerError::Size { option, cause }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_option_and_keep_the_cause() {
        let e = farmem_proto::size::parse_size("x")
            .map_err(ServerError::size("--capacity"))
            .unwrap_err();
        assert_eq!(e.to_string(), "--capacity");
        let cause = std::error::Error::source(&e).expect("the cause");
        assert_eq!(
            cause.to_string(),
            "invalid size 'x': expected e.g. 4096, 512M, 2G"
        );
        let e = ServerError::sys("binding 127.0.0.1:1")(io::Error::from_raw_os_error(98));
        assert_eq!(e.to_string(), "binding 127.0.0.1:1");
        assert_eq!(
            std::error::Error::source(&e).map(|c| c.to_string()),
            Some("Address already in use (os error 98)".into())
        );
    }
}
