//! How a backend request fails.

#[derive(Debug, Clone, thiserror::Error)]
pub enum BackendError {
    /// The far tier cannot take more pages; the caller keeps them local.
    #[error("far memory full: {0}")]
    Full(String),
    /// The request failed (I/O, protocol, missing page...).
    #[error("{0}")]
    Failed(String),
    /// The far tier is gone for good (server unreachable past the reconnect window, or it
    /// lost this program's pages): pages held there are lost and the program must stop.
    #[error("{0}")]
    Unavailable(String),
    /// A prefetch read was dropped unserved: its pages would have arrived after they were
    /// needed. Nothing is lost; whoever needs them reads them on demand.
    #[error("{0}")]
    Late(String),
}
