//! Completion plumbing of the TCP backend: a runtime request larger than the server's batch
//! travels as several parts (frames); a [`Join`] completes the runtime's [`Completion`] when
//! the last part is answered. [`Oneshot`] carries the reply of a control request (free,
//! stats, close).

use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::backend::error::BackendError;
use crate::backend::io::{Completer, IoDone, PageBuf};
use farmem_proto::PageKey;
use farmem_proto::{FreeOk, StatsOk};
use farmem_sys::mem::PAGE_SIZE;

/// One runtime request split into parts.
///
/// The parts read or write disjoint page ranges of one buffer. A part's pages are touched by
/// one thread at a time: the submitter while it sends the part, or the connection's receiver
/// while it receives the part's reply or re-sends it after a reconnection (the receiver does
/// both, in turn). The buffer stays in place until the last part is done.
pub(crate) struct Join {
    /// Start of the buffer's pages; the allocation never moves while the join lives.
    base: *mut u8,
    st: Mutex<JoinState>,
}

struct JoinState {
    remaining: usize,
    err: Option<BackendError>,
    keys: Vec<PageKey>,
    buf: Option<PageBuf>,
    completer: Option<Completer>,
}

// SAFETY: the raw pointer refers to the PageBuf owned by `st` (which is Send); access to the
// pages follows the one-thread-per-part discipline documented on the type.
unsafe impl Send for Join {}
// SAFETY: as above; the state is behind a mutex.
unsafe impl Sync for Join {}

impl Join {
    pub fn new(keys: Vec<PageKey>, mut buf: PageBuf, completer: Completer, parts: usize) -> Join {
        assert!(parts > 0);
        let base = buf.bytes_mut().as_mut_ptr();
        Join {
            base,
            st: Mutex::new(JoinState {
                remaining: parts,
                err: None,
                keys,
                buf: Some(buf),
                completer: Some(completer),
            }),
        }
    }

    /// Pages `[start, start + n)` of the buffer, to fill from the wire.
    ///
    /// # Safety
    /// The caller handles the part owning these pages, which is not done yet (see the type).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn pages_mut(&self, start: usize, n: usize) -> &mut [u8] {
        // SAFETY: in bounds (parts cover the buffer's length) and exclusive per the contract.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(start * PAGE_SIZE), n * PAGE_SIZE) }
    }

    /// Pages `[start, start + n)`, to send.
    ///
    /// # Safety
    /// As for [`Join::pages_mut`].
    pub unsafe fn pages(&self, start: usize, n: usize) -> &[u8] {
        // SAFETY: as above; reading only.
        unsafe { std::slice::from_raw_parts(self.base.add(start * PAGE_SIZE), n * PAGE_SIZE) }
    }

    /// A part finished; the last one completes the request (with the first error, if any).
    pub fn part_done(&self, r: Result<(), BackendError>) {
        let mut st = self.st.lock();
        if let Err(e) = r {
            st.err.get_or_insert(e);
        }
        st.remaining -= 1;
        if st.remaining > 0 {
            return;
        }
        let completer = st.completer.take().expect("completed once");
        let result = match st.err.take() {
            Some(e) => Err(e),
            None => Ok(IoDone {
                keys: std::mem::take(&mut st.keys),
                buf: st.buf.take().expect("buffer present"),
            }),
        };
        drop(st);
        completer.complete(result);
    }
}

/// Reply to a control request.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Reply {
    Freed(FreeOk),
    Stats(StatsOk),
    /// The server noted the session's fate at its last connection's close.
    Goodbye,
}

#[derive(Default)]
pub(crate) struct Oneshot {
    v: Mutex<Option<Result<Reply, BackendError>>>,
    cv: Condvar,
}

impl Oneshot {
    pub fn set(&self, r: Result<Reply, BackendError>) {
        *self.v.lock() = Some(r);
        self.cv.notify_all();
    }

    /// The reply, or `None` if none came within `timeout`.
    pub fn wait(&self, timeout: Duration) -> Option<Result<Reply, BackendError>> {
        let mut g = self.v.lock();
        let deadline = std::time::Instant::now() + timeout;
        while g.is_none() {
            if self.cv.wait_until(&mut g, deadline).timed_out() {
                break;
            }
        }
        g.take()
    }
}
