//! Thin, documented wrappers over the Linux interfaces farmem uses: memory mappings and
//! futexes, userfaultfd, signal masks, randomness, processes and facts about the machine.
//! Shared by the runtime, the C library, the memory server and the tools; depends on
//! nothing of farmem.

pub mod disk_irqs;
pub mod fds;
pub mod host;
pub mod mem;
pub mod mounts;
pub mod proc_file;
pub mod process;
pub mod random;
pub mod sched;
pub mod secret_file;
pub mod signals;
pub mod threads;
pub mod uffd;
