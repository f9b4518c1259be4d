//! The TCP backend: pages live in a `farmem server`, reached over TCP
//! (`FARMEM_BACKEND=tcp://[tenant@]host:port`).
//!
//! Three connections, one per priority class, as Fastswap separates its queue pairs: demand
//! reads never queue behind a megabyte of write-back on the wire, and the server serves each
//! tenant's demand before prefetch before write-back. Each connection pipelines many
//! requests; a runtime request larger than the server's batch goes as several frames.
//!
//! All of this process's pages live in one server-side *session* (a random 128-bit id), in
//! the tenant's namespace: region ids need not be unique across programs. When a connection
//! breaks, it is re-established with backoff and the session resumed; unanswered requests
//! are re-sent. If the server stays unreachable past the reconnect window, or comes back
//! without the session while it held pages, the backend is dead: every request fails with
//! [`BackendError::Unavailable`] and the runtime stops the program with that message, so a
//! page is never replaced by zeros.

mod client;
mod conn;
mod handshake;
mod join;
mod shared;

pub use client::TcpBackend;
