//! Thin, documented wrappers over the Linux interfaces the runtime uses.

pub mod mem;
pub mod signals;
pub mod uffd;
