//! What a fetch is asked to do and what it holds while doing it.

use std::time::Duration;

use crate::backend::io::Completion;
use crate::page::word::PageWord;

/// Who is asking, which decides whether the caller may sleep on a locked page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// An application thread's hint: waits for pages locked by others.
    Hint,
    /// A runtime thread serving a userfaultfd event: never waits (it would stall every other
    /// fault); reports `busy` so the event is retried later.
    Fault,
}

pub(crate) struct Request {
    /// First demanded virtual page and how many (all of them must end up present).
    pub first: usize,
    pub count: usize,
    /// Demanded pages must be writable.
    pub write: bool,
    /// Optional extra pages after (positive) or before (negative) the demanded range.
    pub readahead: isize,
    /// Install read-ahead pages writable (sequential writers) instead of write-protected.
    pub readahead_writable: bool,
    pub prio: u8,
    pub mode: Mode,
    /// How long the read-ahead stays useful (its stream's pace; `None`: not known).
    pub readahead_useful_for: Option<Duration>,
    /// The read-ahead follows a stream predicted well so far: its pages join the policy as
    /// demanded ones (a protected band may take them: a sequential loop larger than the
    /// budget faults once per window, and its band would otherwise take one page in 256).
    pub readahead_trusted: bool,
    /// A fault at the front of memory being filled in order: its read-ahead may zero-fill
    /// fresh pages up to here (exclusive), past its block (0: no such front).
    pub fresh_end: usize,
}

impl Request {
    /// Demand `count` pages from `first`, with nothing more.
    pub(crate) fn demand(first: usize, count: usize, write: bool, mode: Mode) -> Request {
        Request {
            first,
            count,
            write,
            readahead: 0,
            readahead_writable: false,
            prio: 0,
            mode,
            readahead_useful_for: None,
            readahead_trusted: false,
            fresh_end: 0,
        }
    }
}

#[derive(Default, Debug)]
pub(crate) struct Outcome {
    /// A demanded page is locked by another thread (Fault mode only).
    pub busy: bool,
    /// Pages installed (demanded and read-ahead).
    pub installed: usize,
    /// Present pages whose write protection was lifted.
    pub unprotected: usize,
}

/// A page locked for fetching.
#[derive(Clone, Copy)]
pub(crate) struct Locked {
    pub vpn: usize,
    /// Its word before it was locked.
    pub old: PageWord,
    /// Install it writable (else write-protected, so the first write is noticed).
    pub writable: bool,
}

/// A backend read in flight for one class of pages.
pub(crate) struct InFlight {
    pub completion: Completion,
    pub pages: usize,
}
