//! `libfarmem.so`: the runtime as a C library.
//!
//! - The C API declared in `include/farmem.h` (`capi`): one process-wide runtime configured
//!   from `FARMEM_*` variables, regions, hints and statistics.
//! - The transparent mode (`preload`) that `farmem run` preloads into unmodified programs:
//!   the `malloc` family, anonymous `mmap` and `pthread_create`, interposed so that the heap
//!   lives in far memory.
//! - The library's own allocator (`local_alloc`): glibc's, called by its internal names, so
//!   the runtime's data never lands in the far heap it manages.
//!
//! Both share one runtime: a hinted C program run under `farmem run` hints the transparent
//! mode's pages.

mod capi;
mod local_alloc;
mod preload;
