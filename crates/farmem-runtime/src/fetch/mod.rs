//! Fetching: making absent pages present, for a hint (on the application thread), an
//! unhinted fault (on a fault thread), a fork's preparation, or read-ahead.
//!
//! A fetch goes through phases, the same for every caller: **lock** the pages (their words'
//! locks, ascending), **reserve** budget for them (`reclaim.rs`, reclaiming on this thread if
//! none is free), **submit** the backend read of the ones with a far copy, **install** each
//! contiguous run with one `UFFDIO_COPY` (zeros for pages never written) and publish their
//! new words, which releases the locks and wakes the waiters. Handing the pages to the
//! reclaim policy is queued for the control thread (`book.rs`).
//!
//! Modules, each calling only those below it:
//!
//! - [`demand`]: the entry point ([`demand::ensure`]): demanded pages and the synchronous
//!   read-ahead that goes with them.
//! - [`readahead`]: asynchronous read-ahead: batches read ahead of a sequential hinted
//!   stream or of a strided fault pattern, completed by whoever reaches them first.
//! - [`batches`]: the registry of those batches in flight (data only; the runtime state
//!   holds one).
//! - [`phases`]: submit and install, shared by both.
//! - [`request`]: the types they pass around.
//!
//! Spelling: *read-ahead* is any page fetched beyond the ones demanded; it is asynchronous
//! when it travels in the backend's prefetch class.

/// Set up every thread-local slot a fetch or an eviction uses, on a runtime thread before it
/// serves anything. A slot whose value needs dropping registers its destructor at its first
/// use, and glibc's registration takes the dynamic loader's lock. A program thread inside
/// `dlopen` holds that lock, and when it touches a far page there (python3 importing a C
/// module: the loader's `calloc` into the far heap) it waits for the fault thread: a fault
/// thread making its first read-ahead buffer then waited for the loader's lock for ever
/// (seen with python3 at 40 MiB, the control thread stuck the same way).
pub(crate) fn warm_thread_locals() {
    crate::backend::local::warm_thread_locals();
    crate::backend::codec::warm_thread_locals();
    demand::warm_thread_locals();
    phases::warm_thread_locals();
    readahead::warm_thread_locals();
}

pub(crate) mod batches;
pub(crate) mod demand;
pub(crate) mod phases;
pub(crate) mod readahead;
pub(crate) mod request;
