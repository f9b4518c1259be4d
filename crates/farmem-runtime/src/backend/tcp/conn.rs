//! One connection of the TCP backend: requests are written by the submitting thread (no
//! hand-off), replies are read by the connection's receiver thread, which completes them.
//!
//! Every request stays in `pending` until its reply has been read in full, so when the
//! connection breaks the receiver reconnects (resuming the session) and re-sends exactly the
//! unanswered requests: reads and writes are idempotent, and a page is never the subject of
//! two requests at once (the runtime holds its lock), so replaying cannot reorder anything.
//!
//! Locks: `writer` before `pending`, never the other way round; the receiver needs only
//! `pending`, so it keeps draining replies while a submitter is blocked writing, and the
//! server, which stops reading a connection whose replies pile up, can always make progress.
//! The client also keeps its in-flight pages below the window the server announced.

use std::collections::BTreeMap;
use std::io::{IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use farmem_proto::channel::{Opener, Sealer, TAG_LEN};
use farmem_proto::{self as p, ErrorCode, Frame, FreeReq, Header, IoClass, Kind, PageKey};
use farmem_sys::mem::PAGE_SIZE;

use super::handshake::{self, ConnectError, Opened};
use super::join::{Join, Oneshot, Reply};
use super::shared::{Peer, Shared};
use crate::backend::error::BackendError;
use crate::backend::spec::REQUEST_TIMEOUT;
use crate::stats::add;

/// The receiver wakes this often to notice shutdown and stalled requests.
const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// A write blocked this long means the connection is dead.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// What a request asks for.
pub(crate) enum Op<'a> {
    /// Pages to read, and (prefetch reads) how long they stay useful, in the protocol's
    /// units (0: no deadline).
    Read(&'a [PageKey], u16),
    /// Keys and their pages (`keys.len()` pages at `data`).
    Write(&'a [PageKey], &'a [u8]),
    Free(FreeReq),
    Stats,
    Close,
    /// Free the session's pages when its last connection closes (or, `false`, not).
    Goodbye(bool),
}

/// Who is told when the reply comes.
#[derive(Clone)]
pub(crate) enum Done {
    Read {
        join: Arc<Join>,
        start: usize,
        n: usize,
    },
    Write {
        join: Arc<Join>,
    },
    Reply(Arc<Oneshot>),
}

impl Done {
    pub fn fail(self, e: BackendError) {
        match self {
            Done::Read { join, .. } | Done::Write { join } => join.part_done(Err(e)),
            Done::Reply(o) => o.set(Err(e)),
        }
    }
}

/// Page data that follows a request's head on the wire (a part of a [`Join`]'s buffer).
#[derive(Clone, Copy)]
struct RawPages {
    ptr: *const u8,
    len: usize,
}

struct Req {
    /// Encoded header and key table, re-sent as is after a reconnection.
    head: Arc<[u8]>,
    data: Option<RawPages>,
    pages: usize,
    done: Done,
}

// SAFETY: `data` points into a Join's buffer, which outlives the request (the join completes
// only after this request is answered) and is read only by the thread handling the request.
unsafe impl Send for Req {}

struct Pending {
    map: BTreeMap<u64, Req>,
    next_id: u64,
    inflight_pages: usize,
    /// When a reply last arrived (or a request was queued on an idle connection).
    last_progress: Instant,
}

/// The sending half of a connection: its socket, and the channel's sealer (frames must be
/// sealed in the order they go out, so both live under one lock).
struct Writer {
    stream: TcpStream,
    sealer: Sealer,
    /// The body being sealed (reused).
    buf: Vec<u8>,
}

pub(crate) struct Conn {
    pub role: IoClass,
    sh: Arc<Shared>,
    writer: Mutex<Option<Writer>>,
    pending: Mutex<Pending>,
    window_cv: Condvar,
    /// Most pages in flight (half the server's window).
    window: AtomicUsize,
    /// Protocol version of the current connection (0 before the first).
    version: AtomicU16,
}

/// Why the receiver stopped reading.
enum RecvError {
    /// The backend is being dropped.
    Closing,
    /// The connection broke: reconnect.
    Io(String),
    /// The server broke the protocol: it cannot be trusted with the program's pages.
    Protocol(String),
}

fn role_name(c: IoClass) -> &'static str {
    match c {
        IoClass::Demand => "demand",
        IoClass::Prefetch => "prefetch",
        IoClass::WriteBack => "write-back",
    }
}

/// Seal and send one request: its header in clear, its body (the rest of `head`, then the
/// pages) encrypted, then the tag. The plaintext stays in the request for a re-send.
fn write_req(w: &mut Writer, head: &[u8], data: Option<RawPages>) -> std::io::Result<()> {
    let data: &[u8] = match data {
        // SAFETY: see `Req`: the pages are alive and not written while the request is sent.
        Some(d) => unsafe { std::slice::from_raw_parts(d.ptr, d.len) },
        None => &[],
    };
    let header: &[u8; p::HEADER_LEN] = head[..p::HEADER_LEN].try_into().expect("a header");
    w.buf.clear();
    w.buf.extend_from_slice(&head[p::HEADER_LEN..]);
    w.buf.extend_from_slice(data);
    let tag = w
        .sealer
        .seal(header, &mut w.buf)
        .map_err(std::io::Error::other)?;
    let mut bufs = [
        IoSlice::new(header),
        IoSlice::new(&w.buf),
        IoSlice::new(&tag),
    ];
    let s = &mut w.stream;
    let mut slices = &mut bufs[..];
    while !slices.is_empty() {
        match s.write_vectored(slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl Conn {
    pub fn new(role: IoClass, sh: Arc<Shared>) -> Conn {
        Conn {
            role,
            sh,
            writer: Mutex::new(None),
            pending: Mutex::new(Pending {
                map: BTreeMap::new(),
                next_id: 0,
                inflight_pages: 0,
                last_progress: Instant::now(),
            }),
            window_cv: Condvar::new(),
            window: AtomicUsize::new(1),
            version: AtomicU16::new(0),
        }
    }

    /// Send a request; `done` hears of its reply (or of the backend's death).
    pub fn submit(&self, class: IoClass, op: Op, done: Done) {
        let pages = match &op {
            Op::Read(k, _) | Op::Write(k, _) => k.len(),
            _ => 1,
        };
        let id = {
            let mut p = self.pending.lock();
            // Room in the window comes with the answers the receiver reads: bounded, so a
            // stuck receiver or server ends in an error, not a hang.
            let limit = self.sh.spec.longest_wait();
            let deadline = Instant::now() + limit;
            loop {
                if let Some(msg) = self.sh.dead_msg() {
                    drop(p);
                    done.fail(BackendError::Unavailable(msg));
                    return;
                }
                let window = self.window.load(Ordering::Relaxed);
                if p.inflight_pages == 0 || p.inflight_pages + pages <= window {
                    break;
                }
                if self.window_cv.wait_until(&mut p, deadline).timed_out() {
                    drop(p);
                    done.fail(BackendError::Unavailable(format!(
                        "far-memory server {}: no room for a request in {} s (the server, or \
                         the thread that receives its answers, is stuck)",
                        self.sh.spec.addr,
                        limit.as_secs_f64()
                    )));
                    return;
                }
            }
            p.inflight_pages += pages;
            p.next_id += 1;
            p.next_id
        };
        let mut head = Vec::new();
        let mut data = None;
        match op {
            Op::Read(keys, useful_for) => {
                // A server older than deadlines would refuse the field: it serves every
                // prefetch, late or not, as before.
                let useful_for = if self.version.load(Ordering::Relaxed) >= p::VERSION_USEFUL_FOR {
                    useful_for
                } else {
                    0
                };
                p::encode_read_useful_for(&mut head, id, class, keys, useful_for)
            }
            Op::Write(keys, pages) => {
                p::encode_write_head(&mut head, id, class, keys, pages);
                data = Some(RawPages {
                    ptr: pages.as_ptr(),
                    len: pages.len(),
                });
            }
            Op::Free(f) => p::encode_free(&mut head, id, &f),
            Op::Stats => p::encode_empty(&mut head, Kind::Stats, id),
            Op::Close => p::encode_empty(&mut head, Kind::Close, id),
            Op::Goodbye(free_at_close) => {
                p::encode_goodbye(&mut head, id, &p::Goodbye { free_at_close })
            }
        }
        let head: Arc<[u8]> = head.into();
        add(&self.sh.counters.requests, 1);
        let mut w = self.writer.lock();
        {
            let mut p = self.pending.lock();
            if p.map.is_empty() {
                p.last_progress = Instant::now();
            }
            // In the map before it is on the wire: the reply may come back at once.
            p.map.insert(
                id,
                Req {
                    head: head.clone(),
                    data,
                    pages,
                    done,
                },
            );
        }
        // Without a stream the connection is being re-established: the reconnection sends
        // every pending request, this one included.
        if let Some(wr) = w.as_mut() {
            if let Err(e) = write_req(wr, &head, data) {
                tracing::debug!("{} connection: write failed: {e}", role_name(self.role));
                let _ = wr.stream.shutdown(Shutdown::Both);
                *w = None;
            }
        }
    }

    /// Take a finished request out of `pending`, releasing its window.
    fn finish(&self, id: u64) -> Option<Req> {
        let mut p = self.pending.lock();
        let r = p.map.remove(&id)?;
        p.inflight_pages -= r.pages;
        p.last_progress = Instant::now();
        drop(p);
        self.window_cv.notify_all();
        Some(r)
    }

    /// Fail every pending request (the backend died or is closing).
    pub fn fail_all(&self, msg: &str) {
        let reqs: Vec<Req> = {
            let mut p = self.pending.lock();
            p.inflight_pages = 0;
            std::mem::take(&mut p.map).into_values().collect()
        };
        self.window_cv.notify_all();
        for r in reqs {
            r.done.fail(BackendError::Unavailable(msg.to_string()));
        }
    }

    /// Close the socket (the receiver sees EOF).
    pub fn shutdown(&self) {
        if let Some(w) = self.writer.lock().take() {
            let _ = w.stream.shutdown(Shutdown::Both);
        }
    }

    /// Open a connection for this backend's session: joining it with the session's key if a
    /// connection created it, else creating it (`resume`: the server must already know it).
    /// A connection that creates the session keeps its key for the others.
    pub fn open(&self, resume: bool) -> Result<Opened, ConnectError> {
        let _one_at_a_time = self.sh.handshakes.lock();
        let key = self.sh.session_key.lock().clone();
        let spec = &self.sh.spec;
        let o = handshake::open(
            &spec.addr,
            &spec.tenant,
            &self.sh.secret,
            &self.sh.session,
            resume,
            key.as_ref(),
        )?;
        if !o.welcome.resumed {
            *self.sh.session_key.lock() = Some(o.keys.new_session_key.clone());
        }
        Ok(o)
    }

    /// Adopt a freshly opened connection: publish its writer, send what is pending, and
    /// return the stream and the opener the receiver reads with.
    pub fn install(&self, o: Opened) -> std::io::Result<(TcpStream, Opener)> {
        let w = &o.welcome;
        self.window.store(
            (w.window_pages as usize / 2).clamp(1, 8192),
            Ordering::Relaxed,
        );
        self.sh.note_welcome(w, o.instance);
        self.version.store(o.version, Ordering::Relaxed);
        let s = o.stream;
        s.set_read_timeout(Some(POLL_INTERVAL))?;
        s.set_write_timeout(Some(WRITE_TIMEOUT))?;
        // Both out of the program's way (it may close every descriptor it did not open).
        let reader = TcpStream::from(farmem_sys::fds::keep_copy(s.as_fd())?);
        let mut guard = self.writer.lock();
        let resend: Vec<(Arc<[u8]>, Option<RawPages>)> = self
            .pending
            .lock()
            .map
            .values()
            .map(|r| (r.head.clone(), r.data))
            .collect();
        let mut w = Writer {
            stream: s,
            sealer: o.keys.sealer,
            buf: Vec::new(),
        };
        let mut ok = true;
        for (head, data) in &resend {
            let mut head = head.clone();
            if o.version < p::VERSION_USEFUL_FOR && head[6..8] != [0, 0] {
                // Reconnected to an older server: the deadline goes, the read stays.
                let mut h = head.to_vec();
                h[6..8].fill(0);
                head = h.into();
            }
            if let Err(e) = write_req(&mut w, &head, *data) {
                tracing::debug!("re-sending after reconnection failed: {e}");
                let _ = w.stream.shutdown(Shutdown::Both);
                ok = false;
                break;
            }
        }
        if !resend.is_empty() {
            add(&self.sh.counters.resent, resend.len() as u64);
        }
        *guard = ok.then_some(w);
        self.window_cv.notify_all();
        Ok((reader, o.keys.opener))
    }

    /// The receiver thread: read replies until the backend closes or dies, reconnecting
    /// when the connection breaks.
    pub fn receive_loop(self: Arc<Self>, mut stream: TcpStream, mut opener: Opener) {
        let mut scratch = Vec::new();
        loop {
            let err = match self.receive_one(&mut stream, &mut opener, &mut scratch) {
                Ok(()) => continue,
                Err(RecvError::Closing) => return,
                Err(e) => e,
            };
            if self.sh.is_closing() {
                return;
            }
            match err {
                RecvError::Io(why) => match self.reconnect(&why) {
                    Ok((s, o)) => {
                        stream = s;
                        opener = o;
                    }
                    Err(None) => return,
                    Err(Some(msg)) => {
                        self.sh.die(msg);
                        return;
                    }
                },
                RecvError::Protocol(why) => {
                    self.sh.die(format!(
                        "far-memory server {} broke the protocol ({why}); its replies cannot \
                         be trusted with this program's pages",
                        self.sh.spec.addr
                    ));
                    return;
                }
                RecvError::Closing => return,
            }
        }
    }

    /// Fill `buf` from the stream, waking every POLL_INTERVAL to notice shutdown or a
    /// stalled connection.
    fn read_full(&self, s: &mut TcpStream, buf: &mut [u8]) -> Result<(), RecvError> {
        let mut got = 0;
        while got < buf.len() {
            match s.read(&mut buf[got..]) {
                Ok(0) => return Err(RecvError::Io("connection closed by the server".into())),
                Ok(k) => got += k,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    if self.sh.is_closing() {
                        return Err(RecvError::Closing);
                    }
                    let p = self.pending.lock();
                    if !p.map.is_empty() && p.last_progress.elapsed() > REQUEST_TIMEOUT {
                        return Err(RecvError::Io(format!(
                            "no reply for {} s",
                            REQUEST_TIMEOUT.as_secs()
                        )));
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(RecvError::Io(e.to_string())),
            }
        }
        Ok(())
    }

    /// Read and dispatch one reply: its header, then its sealed body, opened in place (an
    /// altered frame fails to open, and the server cannot be trusted any more).
    fn receive_one(
        &self,
        s: &mut TcpStream,
        opener: &mut Opener,
        scratch: &mut Vec<u8>,
    ) -> Result<(), RecvError> {
        let mut hb = [0u8; p::HEADER_LEN];
        self.read_full(s, &mut hb)?;
        let h = Header::decode(&hb).map_err(|e| RecvError::Protocol(e.to_string()))?;
        if !h.kind.is_response() {
            return Err(RecvError::Protocol(format!(
                "unexpected {:?} frame",
                h.kind
            )));
        }
        // The request stays pending until its reply is in: if the connection breaks midway,
        // it is re-sent.
        let done = self
            .pending
            .lock()
            .map
            .get(&h.id)
            .map(|r| r.done.clone())
            .ok_or_else(|| RecvError::Protocol(format!("reply to unknown request {}", h.id)))?;
        if h.kind == Kind::ReadOk {
            let Done::Read { join, start, n } = done else {
                return Err(RecvError::Protocol(
                    "pages sent for a request that is no read".into(),
                ));
            };
            if p::read_ok_pages(h.len) != Some(n) {
                return Err(RecvError::Protocol(format!(
                    "{n} pages asked, a reply of {} bytes received",
                    h.len
                )));
            }
            // Page count, then one checksum per page, then the pages.
            let body = self.read_sealed(s, opener, &hb, h.len as usize, scratch)?;
            if u32::from_le_bytes(body[..4].try_into().expect("4 bytes")) as usize != n {
                return Err(RecvError::Protocol(
                    "page count differs from the length".into(),
                ));
            }
            let (meta, pages) = body.split_at(4 + n * 4);
            // SAFETY: this thread handles the part [start, start+n) now (see `Join`).
            let dst = unsafe { join.pages_mut(start, n) };
            dst.copy_from_slice(pages);
            let scratch = meta;
            let bad = (0..n).find(|&i| {
                let at = 4 + i * 4;
                let want = u32::from_le_bytes(scratch[at..at + 4].try_into().expect("4 bytes"));
                p::page_crc(&dst[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]) != want
            });
            if self.finish(h.id).is_none() {
                return Ok(()); // failed meanwhile (the backend died): already answered
            }
            add(&self.sh.counters.pages_read, n as u64);
            join.part_done(match bad {
                None => Ok(()),
                Some(i) => {
                    add(&self.sh.counters.checksum_errors, 1);
                    Err(BackendError::Failed(format!(
                        "page {i} of a read from {} arrived with a bad checksum",
                        self.sh.spec.addr
                    )))
                }
            });
            return Ok(());
        }
        let body = self.read_sealed(s, opener, &hb, h.len as usize, scratch)?;
        let f = p::decode(&h, body).map_err(|e| RecvError::Protocol(e.to_string()))?;
        let Some(req) = self.finish(h.id) else {
            return Ok(()); // failed meanwhile (the backend died): already answered
        };
        match (f, req.done) {
            (Frame::WriteOk(w), Done::Write { join }) => {
                self.sh.note_stored(w.session_pages, w.new_pages > 0);
                add(&self.sh.counters.pages_written, req.pages as u64);
                join.part_done(Ok(()));
            }
            (Frame::FreeOk(f), Done::Reply(o)) => {
                self.sh.note_stored(f.session_pages, false);
                o.set(Ok(Reply::Freed(f)));
            }
            (Frame::StatsOk(st), Done::Reply(o)) => o.set(Ok(Reply::Stats(st))),
            (Frame::GoodbyeOk, Done::Reply(o)) => o.set(Ok(Reply::Goodbye)),
            (Frame::Error(e), done) => done.fail(self.sh.error_from(e.code, e.message)),
            (f, done) => {
                done.fail(BackendError::Failed("mismatched reply".into()));
                return Err(RecvError::Protocol(format!(
                    "reply {:?} does not match its request",
                    frame_kind(&f)
                )));
            }
        }
        Ok(())
    }

    /// Read a body of `len` bytes and its tag into `scratch` and open it; the plaintext body.
    fn read_sealed<'s>(
        &self,
        s: &mut TcpStream,
        opener: &mut Opener,
        header: &[u8; p::HEADER_LEN],
        len: usize,
        scratch: &'s mut Vec<u8>,
    ) -> Result<&'s mut [u8], RecvError> {
        // Grown once and never shrunk: a resize down and up again would zero a megabyte of
        // pages for every reply after a small one.
        let wire = len + TAG_LEN;
        if scratch.len() < wire {
            scratch.resize(wire, 0);
        }
        let buf = &mut scratch[..wire];
        self.read_full(s, buf)?;
        opener
            .open(header, buf)
            .map_err(|e| RecvError::Protocol(e.to_string()))
    }

    /// Re-establish the connection within the reconnect window. `Err(None)`: the backend is
    /// closing; `Err(Some(msg))`: give up, the server is gone for good.
    fn reconnect(&self, why: &str) -> Result<(TcpStream, Opener), Option<String>> {
        self.shutdown();
        let spec = &self.sh.spec;
        tracing::warn!(
            "{} connection to far-memory server {} lost ({why}); reconnecting",
            role_name(self.role),
            spec.addr
        );
        add(&self.sh.counters.reconnects, 1);
        let start = Instant::now();
        let mut delay = Duration::from_millis(10);
        let mut resume = true;
        let mut last;
        loop {
            if self.sh.is_closing() {
                return Err(None);
            }
            if let Some(msg) = self.sh.dead_msg() {
                return Err(Some(msg));
            }
            match self.open(resume) {
                Ok(o) => {
                    if self.sh.instance_changed(o.instance) && self.sh.holds_pages() {
                        return Err(Some(self.sh.lost_pages_msg("it restarted")));
                    }
                    tracing::info!(
                        "{} connection to {} re-established",
                        role_name(self.role),
                        spec.addr
                    );
                    return self.install(o).map_err(|e| Some(e.to_string()));
                }
                Err(ConnectError::Rejected(ErrorCode::SessionUnknown, m)) => {
                    if self.sh.holds_pages() {
                        return Err(Some(self.sh.lost_pages_msg(&m)));
                    }
                    // Nothing was stored there yet: start the session afresh.
                    resume = false;
                    continue;
                }
                Err(ConnectError::Rejected(code, m))
                    if !matches!(code, ErrorCode::TooBusy | ErrorCode::ShuttingDown) =>
                {
                    return Err(Some(format!(
                        "far-memory server {} refused to reconnect: {m} ({})",
                        spec.addr,
                        code.name()
                    )));
                }
                Err(e) => last = e.to_string(),
            }
            let elapsed = start.elapsed();
            if elapsed >= spec.reconnect_window {
                return Err(Some(format!(
                    "far-memory server {} unreachable for {:.0} s (last error: {last}); the \
                     pages this program keeps there cannot be fetched",
                    spec.addr,
                    spec.reconnect_window.as_secs_f64()
                )));
            }
            std::thread::sleep(delay.min(spec.reconnect_window - elapsed));
            delay = (delay * 2).min(Duration::from_secs(1));
        }
    }
}

fn frame_kind(f: &Frame) -> &'static str {
    match f {
        Frame::ReadOk(_) => "ReadOk",
        Frame::WriteOk(_) => "WriteOk",
        Frame::FreeOk(_) => "FreeOk",
        Frame::StatsOk(_) => "StatsOk",
        Frame::Error(_) => "Error",
        _ => "handshake",
    }
}

impl Peer for Conn {
    fn fail_all(&self, msg: &str) {
        Conn::fail_all(self, msg)
    }

    fn shutdown(&self) {
        Conn::shutdown(self)
    }
}
