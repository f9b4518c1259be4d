//! Message bodies: layouts, encoders and zero-copy decoders.
//!
//! Layouts (little endian):
//!
//! | kind | body |
//! |---|---|
//! | Hello | magic\[4] min_ver u16, max_ver u16, session\[16], nonce\[32], flags u8 (1: resume), tenant_len u8, tenant |
//! | Challenge | version u16, nonce\[32], instance u64 |
//! | Auth | proof\[32] |
//! | Welcome | proof\[32], resumed u8, session_pages u64, quota_pages u64, capacity_pages u64, max_batch u32, window_pages u32 |
//! | Read | n u32, n × (region u32, page u64) |
//! | Write | n u32, n × (region u32, crc u32, page u64), n × 4096 bytes |
//! | Free | region u32, first u64, count u64 |
//! | Stats, Close | empty |
//! | Goodbye (version 3) | free u8: 1 = free the session's pages at once when its last connection closes, 0 = cancel that |
//! | ReadOk | n u32, n × crc u32, n × 4096 bytes |
//! | WriteOk | new_pages u32, session_pages u64 |
//! | FreeOk | freed u64, session_pages u64 |
//! | StatsOk | session_pages, tenant_pages, quota_pages, server_pages, capacity_pages (u64 each) |
//! | GoodbyeOk (version 3) | empty |
//! | Error | code u16, len u16, message (UTF-8) |
//!
//! `Goodbye` is for a program that is about to exit: without it, a session whose connections
//! are all lost is kept for the server's session timeout so that the program can reconnect
//! and find its pages; with it, the server frees the pages as soon as the last connection
//! closes (or a lost one is noticed). Only a connection that agreed on version 3 or later may
//! send it; the server answers `GoodbyeOk` at once.

use crate::frame::{page_crc, ErrorCode, Header, Kind, ProtoError};
use crate::keys::{IoClass, PageKey, PAGE_SIZE};
use crate::layout::*;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello<'a> {
    pub min_version: u16,
    pub max_version: u16,
    /// The client's session: all its pages live under it. A new session is created on the
    /// first connection; the others (and reconnections) resume it.
    pub session: SessionId,
    pub nonce: Nonce,
    pub resume: bool,
    pub tenant: &'a str,
    /// The client's key share (version 4: the secure channel); after the tenant, flagged.
    pub share: Option<KeyShare>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Challenge {
    pub version: u16,
    pub nonce: Nonce,
    /// Random per server process: a client that sees it change knows the server restarted.
    pub instance: u64,
    /// The server's key share (version 4); the body is longer by it.
    pub share: Option<KeyShare>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Auth {
    pub proof: Proof,
    /// A connection joining an existing session proves the session's key (version 4).
    pub session_proof: Option<Proof>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Welcome {
    /// The server's proof that it knows the secret too.
    pub proof: Proof,
    /// The session existed (pages stored before are there).
    pub resumed: bool,
    pub session_pages: u64,
    pub quota_pages: u64,
    pub capacity_pages: u64,
    /// Most pages the server takes in one Read or Write.
    pub max_batch: u32,
    /// Most pages of requests and unsent responses the server holds for one connection;
    /// the client keeps its in-flight pages below this so the server never stops reading.
    pub window_pages: u32,
}

/// A batched read: the keys are decoded lazily from the frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadReq<'a> {
    table: &'a [u8],
}

impl<'a> ReadReq<'a> {
    pub fn len(&self) -> usize {
        self.table.len() / READ_KEY_LEN
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    pub fn key(&self, i: usize) -> PageKey {
        let e = &self.table[i * READ_KEY_LEN..(i + 1) * READ_KEY_LEN];
        PageKey {
            region: u32::from_le_bytes(e[0..4].try_into().expect("4 bytes")),
            page: u64::from_le_bytes(e[4..12].try_into().expect("8 bytes")),
        }
    }

    pub fn keys(&self) -> impl Iterator<Item = PageKey> + '_ {
        (0..self.len()).map(|i| self.key(i))
    }
}

/// A batched write: keys with their checksums, then the pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteReq<'a> {
    table: &'a [u8],
    data: &'a [u8],
}

impl<'a> WriteReq<'a> {
    pub fn len(&self) -> usize {
        self.table.len() / WRITE_KEY_LEN
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    pub fn key(&self, i: usize) -> PageKey {
        let e = &self.table[i * WRITE_KEY_LEN..(i + 1) * WRITE_KEY_LEN];
        PageKey {
            region: u32::from_le_bytes(e[0..4].try_into().expect("4 bytes")),
            page: u64::from_le_bytes(e[8..16].try_into().expect("8 bytes")),
        }
    }

    pub fn crc(&self, i: usize) -> u32 {
        let e = &self.table[i * WRITE_KEY_LEN..(i + 1) * WRITE_KEY_LEN];
        u32::from_le_bytes(e[4..8].try_into().expect("4 bytes"))
    }

    pub fn page(&self, i: usize) -> &'a [u8] {
        &self.data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]
    }

    /// Index of the first page whose contents do not match its checksum.
    pub fn first_bad_page(&self) -> Option<usize> {
        (0..self.len()).find(|&i| page_crc(self.page(i)) != self.crc(i))
    }
}

/// The session's fate when its last connection closes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Goodbye {
    /// `true`: free its pages at once then; `false`: keep them for the session timeout, as
    /// without a Goodbye (cancels an earlier `true`).
    pub free_at_close: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreeReq {
    pub region: u32,
    pub first: u64,
    /// `u64::MAX` frees the whole region.
    pub count: u64,
}

/// Pages read: checksums, then the pages, in the order of the request's keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadOk<'a> {
    crcs: &'a [u8],
    data: &'a [u8],
}

impl<'a> ReadOk<'a> {
    pub fn len(&self) -> usize {
        self.crcs.len() / 4
    }

    pub fn is_empty(&self) -> bool {
        self.crcs.is_empty()
    }

    pub fn crc(&self, i: usize) -> u32 {
        u32::from_le_bytes(self.crcs[i * 4..i * 4 + 4].try_into().expect("4 bytes"))
    }

    pub fn page(&self, i: usize) -> &'a [u8] {
        &self.data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteOk {
    /// Pages the write added (the others overwrote pages already stored).
    pub new_pages: u32,
    pub session_pages: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreeOk {
    pub freed: u64,
    pub session_pages: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct StatsOk {
    pub session_pages: u64,
    pub tenant_pages: u64,
    pub quota_pages: u64,
    pub server_pages: u64,
    pub capacity_pages: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorMsg<'a> {
    pub code: ErrorCode,
    pub message: &'a str,
}

/// A decoded frame; variable parts borrow from the body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    Hello(Hello<'a>),
    Challenge(Challenge),
    Auth(Auth),
    Welcome(Welcome),
    Read(ReadReq<'a>),
    Write(WriteReq<'a>),
    Free(FreeReq),
    Stats,
    Close,
    Goodbye(Goodbye),
    ReadOk(ReadOk<'a>),
    WriteOk(WriteOk),
    FreeOk(FreeOk),
    StatsOk(StatsOk),
    GoodbyeOk,
    Error(ErrorMsg<'a>),
}

/// Bounds-checked reader over a body.
struct Cursor<'a> {
    b: &'a [u8],
    kind: Kind,
}

impl<'a> Cursor<'a> {
    fn bad(&self, what: &'static str) -> ProtoError {
        ProtoError::Malformed {
            kind: self.kind,
            what,
        }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], ProtoError> {
        if self.b.len() < n {
            return Err(self.bad(what));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], ProtoError> {
        Ok(self.take(N, what)?.try_into().expect("exact length"))
    }

    /// An array that is there, or nothing left (an optional last field).
    fn optional_array<const N: usize>(
        &mut self,
        what: &'static str,
    ) -> Result<Option<[u8; N]>, ProtoError> {
        if self.b.is_empty() {
            Ok(None)
        } else {
            self.array(what).map(Some)
        }
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, ProtoError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, ProtoError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn end(&self) -> Result<(), ProtoError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(self.bad("trailing bytes"))
        }
    }

    /// A page count for a batch: 1..=MAX_BATCH_PAGES.
    fn count(&mut self) -> Result<usize, ProtoError> {
        let n = self.u32("page count")? as usize;
        if n == 0 || n > MAX_BATCH_PAGES {
            return Err(self.bad("page count out of range"));
        }
        Ok(n)
    }
}

/// Decode the body of a frame whose header was validated by [`Header::decode`].
pub fn decode<'a>(h: &Header, body: &'a [u8]) -> Result<Frame<'a>, ProtoError> {
    let mut c = Cursor {
        b: body,
        kind: h.kind,
    };
    if body.len() != h.len as usize {
        return Err(c.bad("body length differs from the header"));
    }
    let f = match h.kind {
        Kind::Hello => {
            if c.array::<4>("magic")? != MAGIC {
                return Err(ProtoError::BadMagic);
            }
            let min_version = c.u16("versions")?;
            let max_version = c.u16("versions")?;
            if min_version > max_version {
                return Err(c.bad("version range is empty"));
            }
            let session = c.array("session")?;
            let nonce = c.array("nonce")?;
            let flags = c.u8("flags")?;
            if flags & !(HELLO_RESUME | HELLO_SHARE) != 0 {
                return Err(c.bad("unknown hello flags"));
            }
            let tlen = c.u8("tenant length")? as usize;
            let tenant = std::str::from_utf8(c.take(tlen, "tenant")?)
                .map_err(|_| c.bad("tenant is not UTF-8"))?;
            if !valid_tenant(tenant) {
                return Err(c.bad("invalid tenant name"));
            }
            let share = if flags & HELLO_SHARE != 0 {
                Some(c.array("key share")?)
            } else {
                None
            };
            Frame::Hello(Hello {
                min_version,
                max_version,
                session,
                nonce,
                resume: flags & HELLO_RESUME != 0,
                tenant,
                share,
            })
        }
        Kind::Challenge => Frame::Challenge(Challenge {
            version: c.u16("version")?,
            nonce: c.array("nonce")?,
            instance: c.u64("instance")?,
            share: c.optional_array("key share")?,
        }),
        Kind::Auth => Frame::Auth(Auth {
            proof: c.array("proof")?,
            session_proof: c.optional_array("session proof")?,
        }),
        Kind::Welcome => {
            let proof = c.array("proof")?;
            let resumed = match c.u8("resumed")? {
                0 => false,
                1 => true,
                _ => return Err(c.bad("resumed flag")),
            };
            Frame::Welcome(Welcome {
                proof,
                resumed,
                session_pages: c.u64("session pages")?,
                quota_pages: c.u64("quota")?,
                capacity_pages: c.u64("capacity")?,
                max_batch: c.u32("max batch")?,
                window_pages: c.u32("window")?,
            })
        }
        Kind::Read => {
            let n = c.count()?;
            Frame::Read(ReadReq {
                table: c.take(n * READ_KEY_LEN, "keys")?,
            })
        }
        Kind::Write => {
            let n = c.count()?;
            Frame::Write(WriteReq {
                table: c.take(n * WRITE_KEY_LEN, "keys")?,
                data: c.take(n * PAGE_SIZE, "pages")?,
            })
        }
        Kind::Free => {
            let f = FreeReq {
                region: c.u32("region")?,
                first: c.u64("first page")?,
                count: c.u64("count")?,
            };
            if f.count == 0 {
                return Err(c.bad("empty range"));
            }
            Frame::Free(f)
        }
        Kind::Stats => Frame::Stats,
        Kind::Close => Frame::Close,
        Kind::Goodbye => Frame::Goodbye(Goodbye {
            free_at_close: match c.u8("free flag")? {
                0 => false,
                1 => true,
                _ => return Err(c.bad("free flag is neither 0 nor 1")),
            },
        }),
        Kind::GoodbyeOk => Frame::GoodbyeOk,
        Kind::ReadOk => {
            let n = c.count()?;
            Frame::ReadOk(ReadOk {
                crcs: c.take(n * 4, "checksums")?,
                data: c.take(n * PAGE_SIZE, "pages")?,
            })
        }
        Kind::WriteOk => Frame::WriteOk(WriteOk {
            new_pages: c.u32("new pages")?,
            session_pages: c.u64("session pages")?,
        }),
        Kind::FreeOk => Frame::FreeOk(FreeOk {
            freed: c.u64("freed")?,
            session_pages: c.u64("session pages")?,
        }),
        Kind::StatsOk => Frame::StatsOk(StatsOk {
            session_pages: c.u64("stats")?,
            tenant_pages: c.u64("stats")?,
            quota_pages: c.u64("stats")?,
            server_pages: c.u64("stats")?,
            capacity_pages: c.u64("stats")?,
        }),
        Kind::Error => {
            let code = c.u16("code")?;
            let code = ErrorCode::from_u16(code).ok_or(c.bad("unknown error code"))?;
            let len = c.u16("message length")? as usize;
            if len > MAX_ERROR_LEN {
                return Err(c.bad("message too long"));
            }
            let message = std::str::from_utf8(c.take(len, "message")?)
                .map_err(|_| c.bad("message is not UTF-8"))?;
            Frame::Error(ErrorMsg { code, message })
        }
    };
    c.end()?;
    Ok(f)
}

/// Number of pages in a ReadOk of body length `len` (so a client can read the page data
/// straight into its buffer after the checksums); `None` if no page count fits.
pub fn read_ok_pages(len: u32) -> Option<usize> {
    let len = len as usize;
    let n = len.checked_sub(4)? / READ_OK_PAGE_LEN;
    ((1..=MAX_BATCH_PAGES).contains(&n) && 4 + n * READ_OK_PAGE_LEN == len).then_some(n)
}

fn head(out: &mut Vec<u8>, kind: Kind, class: IoClass, id: u64, len: usize) {
    Header::new(kind, class, id, len).encode(out);
}

pub fn encode_hello(out: &mut Vec<u8>, h: &Hello) {
    assert!(valid_tenant(h.tenant), "tenant name checked by the caller");
    let share_len = h.share.map_or(0, |s| s.len());
    head(
        out,
        Kind::Hello,
        IoClass::Demand,
        0,
        HELLO_FIXED + h.tenant.len() + share_len,
    );
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&h.min_version.to_le_bytes());
    out.extend_from_slice(&h.max_version.to_le_bytes());
    out.extend_from_slice(&h.session);
    out.extend_from_slice(&h.nonce);
    let flags =
        if h.resume { HELLO_RESUME } else { 0 } | if h.share.is_some() { HELLO_SHARE } else { 0 };
    out.push(flags);
    out.push(h.tenant.len() as u8);
    out.extend_from_slice(h.tenant.as_bytes());
    out.extend(h.share.iter().flatten());
}

pub fn encode_challenge(out: &mut Vec<u8>, c: &Challenge) {
    let share_len = c.share.map_or(0, |s| s.len());
    head(
        out,
        Kind::Challenge,
        IoClass::Demand,
        0,
        CHALLENGE_LEN + share_len,
    );
    out.extend_from_slice(&c.version.to_le_bytes());
    out.extend_from_slice(&c.nonce);
    out.extend_from_slice(&c.instance.to_le_bytes());
    out.extend(c.share.iter().flatten());
}

pub fn encode_auth(out: &mut Vec<u8>, a: &Auth) {
    let extra = a.session_proof.map_or(0, |p| p.len());
    head(out, Kind::Auth, IoClass::Demand, 0, AUTH_LEN + extra);
    out.extend_from_slice(&a.proof);
    out.extend(a.session_proof.iter().flatten());
}

pub fn encode_welcome(out: &mut Vec<u8>, w: &Welcome) {
    head(out, Kind::Welcome, IoClass::Demand, 0, WELCOME_LEN);
    out.extend_from_slice(&w.proof);
    out.push(w.resumed as u8);
    out.extend_from_slice(&w.session_pages.to_le_bytes());
    out.extend_from_slice(&w.quota_pages.to_le_bytes());
    out.extend_from_slice(&w.capacity_pages.to_le_bytes());
    out.extend_from_slice(&w.max_batch.to_le_bytes());
    out.extend_from_slice(&w.window_pages.to_le_bytes());
}

/// A Read of `keys` (1..=MAX_BATCH_PAGES of them).
pub fn encode_read(out: &mut Vec<u8>, id: u64, class: IoClass, keys: &[PageKey]) {
    encode_read_useful_for(out, id, class, keys, 0);
}

/// A Read whose pages stay useful for `useful_for` units of [`super::USEFUL_FOR_UNIT_US`]
/// after it reaches the server (0: no deadline; only prefetch reads of version 2 have one).
pub fn encode_read_useful_for(
    out: &mut Vec<u8>,
    id: u64,
    class: IoClass,
    keys: &[PageKey],
    useful_for: u16,
) {
    assert!(!keys.is_empty() && keys.len() <= MAX_BATCH_PAGES);
    assert!(useful_for == 0 || class == IoClass::Prefetch);
    let mut h = Header::new(Kind::Read, class, id, 4 + keys.len() * READ_KEY_LEN);
    h.useful_for = useful_for;
    h.encode(out);
    out.extend_from_slice(&(keys.len() as u32).to_le_bytes());
    for k in keys {
        out.extend_from_slice(&k.region.to_le_bytes());
        out.extend_from_slice(&k.page.to_le_bytes());
    }
}

/// Header and key table of a Write of `keys` whose pages are `data` (checksummed here); the
/// caller sends `data` right after, so the pages need not be copied into the frame.
pub fn encode_write_head(
    out: &mut Vec<u8>,
    id: u64,
    class: IoClass,
    keys: &[PageKey],
    data: &[u8],
) {
    assert!(!keys.is_empty() && keys.len() <= MAX_BATCH_PAGES);
    assert_eq!(data.len(), keys.len() * PAGE_SIZE, "one page per key");
    head(
        out,
        Kind::Write,
        class,
        id,
        4 + keys.len() * (WRITE_KEY_LEN + PAGE_SIZE),
    );
    out.extend_from_slice(&(keys.len() as u32).to_le_bytes());
    for (k, page) in keys.iter().zip(data.chunks_exact(PAGE_SIZE)) {
        out.extend_from_slice(&k.region.to_le_bytes());
        out.extend_from_slice(&page_crc(page).to_le_bytes());
        out.extend_from_slice(&k.page.to_le_bytes());
    }
}

pub fn encode_free(out: &mut Vec<u8>, id: u64, f: &FreeReq) {
    head(out, Kind::Free, IoClass::WriteBack, id, FREE_LEN);
    out.extend_from_slice(&f.region.to_le_bytes());
    out.extend_from_slice(&f.first.to_le_bytes());
    out.extend_from_slice(&f.count.to_le_bytes());
}

pub fn encode_goodbye(out: &mut Vec<u8>, id: u64, g: &Goodbye) {
    head(out, Kind::Goodbye, IoClass::Demand, id, GOODBYE_LEN);
    out.push(g.free_at_close as u8);
}

/// Stats, Close or GoodbyeOk.
pub fn encode_empty(out: &mut Vec<u8>, kind: Kind, id: u64) {
    assert!(kind.max_body() == 0, "{kind:?} has a body");
    head(out, kind, IoClass::Demand, id, 0);
}

/// Header and checksums of a ReadOk of `crcs.len()` pages; the pages follow.
pub fn encode_read_ok_head(out: &mut Vec<u8>, id: u64, class: IoClass, crcs: &[u32]) {
    assert!(!crcs.is_empty() && crcs.len() <= MAX_BATCH_PAGES);
    head(
        out,
        Kind::ReadOk,
        class,
        id,
        4 + crcs.len() * READ_OK_PAGE_LEN,
    );
    out.extend_from_slice(&(crcs.len() as u32).to_le_bytes());
    for c in crcs {
        out.extend_from_slice(&c.to_le_bytes());
    }
}

pub fn encode_write_ok(out: &mut Vec<u8>, id: u64, class: IoClass, w: &WriteOk) {
    head(out, Kind::WriteOk, class, id, WRITE_OK_LEN);
    out.extend_from_slice(&w.new_pages.to_le_bytes());
    out.extend_from_slice(&w.session_pages.to_le_bytes());
}

pub fn encode_free_ok(out: &mut Vec<u8>, id: u64, f: &FreeOk) {
    head(out, Kind::FreeOk, IoClass::WriteBack, id, FREE_OK_LEN);
    out.extend_from_slice(&f.freed.to_le_bytes());
    out.extend_from_slice(&f.session_pages.to_le_bytes());
}

pub fn encode_stats_ok(out: &mut Vec<u8>, id: u64, s: &StatsOk) {
    head(out, Kind::StatsOk, IoClass::Demand, id, STATS_OK_LEN);
    for v in [
        s.session_pages,
        s.tenant_pages,
        s.quota_pages,
        s.server_pages,
        s.capacity_pages,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// An Error frame; the message is cut to [`MAX_ERROR_LEN`] bytes at a character boundary.
pub fn encode_error(out: &mut Vec<u8>, id: u64, class: IoClass, code: ErrorCode, msg: &str) {
    let mut end = msg.len().min(MAX_ERROR_LEN);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    let msg = &msg[..end];
    head(out, Kind::Error, class, id, 4 + msg.len());
    out.extend_from_slice(&(code as u16).to_le_bytes());
    out.extend_from_slice(&(msg.len() as u16).to_le_bytes());
    out.extend_from_slice(msg.as_bytes());
}
