//! Typed errors of the runtime library.

use std::io;

use crate::backend::error::BackendError;

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
    /// The backend failed; `what` says what the runtime was doing, if more than the source
    /// says.
    #[error("backend {backend}: {}{source}", context_prefix(.what))]
    Backend {
        backend: String,
        what: Option<String>,
        #[source]
        source: BackendError,
    },
    /// A page written by the program has no far copy: fetching it would hand the program
    /// zeros it never wrote, so the runtime refuses.
    #[error("page at {0:#x} was written but has no far copy; refusing to zero it")]
    NoFarCopy(usize),
    #[error("invalid argument: {0}")]
    Invalid(String),
}

fn context_prefix(what: &Option<String>) -> String {
    what.as_deref()
        .map(|w| format!("{w}: "))
        .unwrap_or_default()
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn sys(what: &'static str, source: io::Error) -> Error {
        Error::Sys { what, source }
    }

    pub(crate) fn backend(backend: String, what: Option<String>, source: BackendError) -> Error {
        Error::Backend {
            backend,
            what,
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_error_keeps_its_source() {
        let e = Error::backend(
            "local".into(),
            Some("reading 1 page(s) of region 3".into()),
            BackendError::Failed("disk on fire".into()),
        );
        assert_eq!(
            e.to_string(),
            "backend local: reading 1 page(s) of region 3: disk on fire"
        );
        let src = std::error::Error::source(&e).expect("a source");
        assert!(matches!(
            src.downcast_ref::<BackendError>(),
            Some(BackendError::Failed(_))
        ));
        let bare = Error::backend("tcp://a@b:1".into(), None, BackendError::Full("q".into()));
        assert_eq!(bare.to_string(), "backend tcp://a@b:1: far memory full: q");
    }
}
