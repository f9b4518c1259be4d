//! Frames: the header every frame starts with, the kinds of frame, and why a frame is
//! refused.

use crate::keys::{class_from_u8, class_to_u8, IoClass, PAGE_SIZE};
use crate::layout::*;

/// The CRC32C of a page (hardware-accelerated where the CPU has it).
#[inline]
pub fn page_crc(page: &[u8]) -> u32 {
    crc32c::crc32c(page)
}

/// Frame kinds. Handshake kinds come first, then requests (client to server), then responses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    Hello = 1,
    Challenge = 2,
    Auth = 3,
    Welcome = 4,
    Read = 16,
    Write = 17,
    Free = 18,
    Stats = 19,
    Close = 20,
    /// Version 3: what the server does with the session when its last connection closes.
    Goodbye = 21,
    ReadOk = 32,
    WriteOk = 33,
    FreeOk = 34,
    StatsOk = 35,
    GoodbyeOk = 36,
    Error = 47,
}

impl Kind {
    pub fn from_u8(v: u8) -> Option<Kind> {
        use Kind::*;
        Some(match v {
            1 => Hello,
            2 => Challenge,
            3 => Auth,
            4 => Welcome,
            16 => Read,
            17 => Write,
            18 => Free,
            19 => Stats,
            20 => Close,
            21 => Goodbye,
            32 => ReadOk,
            33 => WriteOk,
            34 => FreeOk,
            35 => StatsOk,
            36 => GoodbyeOk,
            47 => Error,
            _ => return None,
        })
    }

    /// A request the client sends after the handshake.
    pub fn is_request(self) -> bool {
        (16..32).contains(&(self as u8))
    }

    /// A response the server sends after the handshake.
    pub fn is_response(self) -> bool {
        self as u8 >= 32
    }

    /// Largest legal body of a frame of this kind: anything longer is refused from the header
    /// alone, before a byte of the body is buffered.
    pub fn max_body(self) -> usize {
        use Kind::*;
        match self {
            Hello => HELLO_FIXED + MAX_TENANT_LEN + KEY_SHARE_LEN,
            Challenge => CHALLENGE_LEN + KEY_SHARE_LEN,
            Auth => AUTH_LEN + SESSION_PROOF_LEN,
            Welcome => WELCOME_LEN,
            Read => 4 + MAX_BATCH_PAGES * READ_KEY_LEN,
            Write => 4 + MAX_BATCH_PAGES * (WRITE_KEY_LEN + PAGE_SIZE),
            Free => FREE_LEN,
            Stats | Close | GoodbyeOk => 0,
            Goodbye => GOODBYE_LEN,
            ReadOk => 4 + MAX_BATCH_PAGES * READ_OK_PAGE_LEN,
            WriteOk => WRITE_OK_LEN,
            FreeOk => FREE_OK_LEN,
            StatsOk => STATS_OK_LEN,
            Error => 4 + MAX_ERROR_LEN,
        }
    }
}

/// Largest body of any frame.
pub fn max_frame_body() -> usize {
    Kind::Write.max_body().max(Kind::ReadOk.max_body())
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub len: u32,
    pub kind: Kind,
    pub class: IoClass,
    pub id: u64,
    /// A prefetch Read's deadline, in [`USEFUL_FOR_UNIT_US`] units after it reaches the
    /// server (0: none).
    pub useful_for: u16,
}

impl Header {
    pub fn new(kind: Kind, class: IoClass, id: u64, len: usize) -> Header {
        Header {
            len: len as u32,
            kind,
            class,
            id,
            useful_for: 0,
        }
    }

    /// How long the request stays useful after it reaches the server, if it says.
    pub fn useful_for(&self) -> Option<std::time::Duration> {
        (self.useful_for != 0)
            .then(|| std::time::Duration::from_micros(self.useful_for as u64 * USEFUL_FOR_UNIT_US))
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.len.to_le_bytes());
        out.push(self.kind as u8);
        out.push(class_to_u8(self.class));
        out.extend_from_slice(&self.useful_for.to_le_bytes());
        out.extend_from_slice(&self.id.to_le_bytes());
    }

    /// Decode and validate a header: known kind, valid class, `useful_for` only on a
    /// prefetch Read, body within the kind's limit.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, ProtoError> {
        let len = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let kind = Kind::from_u8(b[4]).ok_or(ProtoError::UnknownKind(b[4]))?;
        let class = class_from_u8(b[5]).ok_or(ProtoError::BadClass(b[5]))?;
        let useful_for = u16::from_le_bytes([b[6], b[7]]);
        if useful_for != 0 && (kind != Kind::Read || class != IoClass::Prefetch) {
            return Err(ProtoError::Flags(useful_for));
        }
        let id = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
        if len as usize > kind.max_body() {
            return Err(ProtoError::Oversized {
                kind,
                len: len as usize,
                max: kind.max_body(),
            });
        }
        Ok(Header {
            len,
            kind,
            class,
            id,
            useful_for,
        })
    }

    /// Header plus body length.
    pub fn frame_len(&self) -> usize {
        HEADER_LEN + self.len as usize
    }
}

/// If `buf` starts with a complete frame, its header and total length; `Ok(None)` if more
/// bytes are needed; an error as soon as the header is invalid (so a peer sending garbage is
/// refused after 16 bytes, and an oversized frame before its body is buffered).
pub fn split_frame(buf: &[u8]) -> Result<Option<(Header, usize)>, ProtoError> {
    let Some(hb) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let h = Header::decode(hb.try_into().expect("header length"))?;
    if buf.len() < h.frame_len() {
        return Ok(None);
    }
    Ok(Some((h, h.frame_len())))
}

/// Why a frame was refused. Any of these closes the connection: the peer is broken or
/// hostile, and nothing it sends afterwards can be trusted to be aligned on a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("invalid priority class {0}")]
    BadClass(u8),
    #[error("reserved header field {0:#x} set (a deadline on a frame other than a prefetch read)")]
    Flags(u16),
    #[error("{kind:?} frame of {len} bytes exceeds the {max}-byte limit")]
    Oversized { kind: Kind, len: usize, max: usize },
    #[error("malformed {kind:?} frame: {what}")]
    Malformed { kind: Kind, what: &'static str },
    #[error("not a farmem peer (bad magic)")]
    BadMagic,
}

/// Error codes carried by `Error` frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    /// The request was well-formed but makes no sense (e.g. a page index out of range).
    BadRequest = 1,
    /// Wrong secret, unknown tenant, or a handshake step out of order.
    AuthFailed = 2,
    /// No protocol version in common.
    Version = 3,
    /// A resumed session that the server does not have (it restarted, or the session expired).
    SessionUnknown = 4,
    /// A page that the server does not hold.
    NotFound = 5,
    /// A page whose checksum does not match its contents.
    Checksum = 6,
    /// The tenant's quota would be exceeded.
    QuotaExceeded = 7,
    /// The server's capacity would be exceeded.
    CapacityExceeded = 8,
    /// The server is shutting down.
    ShuttingDown = 9,
    /// The server has too many connections or tenants.
    TooBusy = 10,
    /// A prefetch read that waited past its `useful_for` was dropped unserved.
    Late = 11,
}

impl ErrorCode {
    pub fn from_u16(v: u16) -> Option<ErrorCode> {
        use ErrorCode::*;
        Some(match v {
            1 => BadRequest,
            2 => AuthFailed,
            3 => Version,
            4 => SessionUnknown,
            5 => NotFound,
            6 => Checksum,
            7 => QuotaExceeded,
            8 => CapacityExceeded,
            9 => ShuttingDown,
            10 => TooBusy,
            11 => Late,
            _ => return None,
        })
    }

    /// Name used in logs and metrics labels.
    pub fn name(self) -> &'static str {
        use ErrorCode::*;
        match self {
            BadRequest => "bad_request",
            AuthFailed => "auth_failed",
            Version => "version",
            SessionUnknown => "session_unknown",
            NotFound => "not_found",
            Checksum => "checksum",
            QuotaExceeded => "quota_exceeded",
            CapacityExceeded => "capacity_exceeded",
            ShuttingDown => "shutting_down",
            TooBusy => "too_busy",
            Late => "late",
        }
    }

    /// Every code, for metrics.
    pub const ALL: [ErrorCode; 11] = [
        ErrorCode::BadRequest,
        ErrorCode::AuthFailed,
        ErrorCode::Version,
        ErrorCode::SessionUnknown,
        ErrorCode::NotFound,
        ErrorCode::Checksum,
        ErrorCode::QuotaExceeded,
        ErrorCode::CapacityExceeded,
        ErrorCode::ShuttingDown,
        ErrorCode::TooBusy,
        ErrorCode::Late,
    ];
}
