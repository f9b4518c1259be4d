//! Far-memory backends: where pages live when they are not local.
//!
//! The interface is batched and asynchronous: a request carries many pages and returns a
//! [`Completion`] that the runtime waits on when it needs the result, so a network backend
//! can pipeline while the runtime prepares the next batch. Every request has a priority
//! class; backends serve demand before prefetch before write-back (Fastswap separates its
//! queues the same way).

pub(crate) mod awake;
pub(crate) mod codec;
pub(crate) mod compressibility;
pub(crate) mod error;
pub(crate) mod file;
pub(crate) mod index;
pub(crate) mod io;
pub(crate) mod local;
pub(crate) mod pins;
pub(crate) mod slabs;
pub(crate) mod spec;
pub mod tcp;
pub(crate) mod tiered;
pub(crate) mod uring;

use std::sync::Arc;

pub use codec::Codec;
pub use error::BackendError;
pub use farmem_proto::{IoClass, PageKey};
pub use file::check_dir as check_far_dir;
pub use io::{Backend, Completer, Completion, FarUsage, IoDone, PageBuf};
pub use spec::{compressed_max, default_far_dir, far_file_max, BackendSpec, TcpSpec};

/// Build (and for remote backends, connect) the backend a configuration names; its
/// compressed tiers use `codec`.
pub fn from_spec(spec: &BackendSpec, codec: Codec) -> Result<Arc<dyn Backend>, BackendError> {
    Ok(match spec {
        BackendSpec::Local { lz4 } => Arc::new(local::LocalBackend::new(
            lz4.then_some(codec),
            local_store_cap(),
        )?),
        BackendSpec::File { dir, max_bytes } => {
            let max = match max_bytes {
                Some(m) => *m,
                None => spec::far_file_max().map_err(config_error)?,
            };
            Arc::new(file::FileBackend::new(dir, max)?)
        }
        BackendSpec::Tiered {
            dir,
            compressed_max,
        } => {
            let cap = match compressed_max {
                Some(c) => *c,
                None => spec::compressed_max().map_err(config_error)?,
            };
            let file_max = spec::far_file_max().map_err(config_error)?;
            Arc::new(tiered::TieredBackend::new(
                codec,
                cap as usize,
                dir,
                file_max,
            )?)
        }
        BackendSpec::Tcp(t) => Arc::new(tcp::TcpBackend::connect(t.clone())?),
    })
}

/// The most memory an in-process store may hold: the machine's memory (far pages kept in
/// this process can never outgrow it; beyond it they stay local and the pressure shows).
fn local_store_cap() -> usize {
    (farmem_sys::mem::physical_memory() as usize).max(1 << 30)
}

fn config_error(e: crate::error::Error) -> BackendError {
    BackendError::Failed(e.to_string())
}
