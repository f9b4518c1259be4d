//! The fixed sizes of the wire format: versions, header and body lengths, batch limits, and
//! the byte strings of the handshake.

use crate::keys::PAGE_SIZE;

/// First bytes of a `Hello`.
pub const MAGIC: [u8; 4] = *b"FMEM";
/// Protocol versions this build speaks: 4 only, the first with the secure channel (key
/// shares in the handshake, every later frame sealed). Older versions sent pages and
/// session ids in clear with a checksum anyone could recompute; they are refused.
pub const VERSION_MIN: u16 = 4;
pub const VERSION_MAX: u16 = 4;
/// First version with the secure channel.
pub const VERSION_SECURE: u16 = 4;
/// First version whose prefetch reads may carry `useful_for`.
pub const VERSION_USEFUL_FOR: u16 = 2;
/// First version with `Goodbye` (and its reply `GoodbyeOk`).
pub const VERSION_GOODBYE: u16 = 3;
/// Unit of a header's `useful_for`, microseconds (the field reaches about one second).
pub const USEFUL_FOR_UNIT_US: u64 = 16;
pub const HEADER_LEN: usize = 16;
/// Most pages in one Read, Write or ReadOk frame.
pub const MAX_BATCH_PAGES: usize = 1024;
/// Longest tenant name.
pub const MAX_TENANT_LEN: usize = 64;
/// Longest error message.
pub const MAX_ERROR_LEN: usize = 1024;
/// Size of a key entry in a Read (region u32, page u64).
pub const READ_KEY_LEN: usize = 12;
/// Size of a key entry in a Write (region u32, crc u32, page u64).
pub const WRITE_KEY_LEN: usize = 16;
/// Bytes per page in a ReadOk (crc u32 plus the page).
pub const READ_OK_PAGE_LEN: usize = 4 + PAGE_SIZE;

/// Fixed body lengths (see the layouts in `messages.rs`).
pub const HELLO_FIXED: usize = 4 + 2 + 2 + 16 + 32 + 1 + 1;
pub const CHALLENGE_LEN: usize = 2 + 32 + 8;
pub const AUTH_LEN: usize = 32;
/// The optional parts of the handshake (version 4): a key share, a session proof.
pub const KEY_SHARE_LEN: usize = 32;
pub const SESSION_PROOF_LEN: usize = 32;
/// Hello flags.
pub const HELLO_RESUME: u8 = 1;
pub const HELLO_SHARE: u8 = 2;
pub const WELCOME_LEN: usize = 32 + 1 + 8 + 8 + 8 + 4 + 4;
pub const FREE_LEN: usize = 4 + 8 + 8;
pub const GOODBYE_LEN: usize = 1;
pub const WRITE_OK_LEN: usize = 4 + 8;
pub const FREE_OK_LEN: usize = 8 + 8;
pub const STATS_OK_LEN: usize = 5 * 8;

pub type SessionId = [u8; 16];
pub type Nonce = [u8; 32];
pub type Proof = [u8; 32];
/// An X25519 public key, one side's share of the key exchange.
pub type KeyShare = [u8; 32];

/// Tenant names: 1 to 64 characters of `A-Z a-z 0-9 . _ -` (they appear in logs and metric
/// labels, so nothing that needs escaping).
pub fn valid_tenant(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= MAX_TENANT_LEN
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}
