//! The farmem wire protocol between the runtime's TCP backend and `farmem server`: pure
//! encoding and decoding, no I/O, so it can be fuzzed and tested alone.
//!
//! A connection opens with a handshake, then carries framed requests and responses:
//!
//! ```text
//! client                                    server
//!   Hello  (versions, tenant, session, nonce) ─►
//!        ◄─ Challenge (version, nonce, server instance)
//!   Auth   (HMAC(secret, both nonces, ...))   ─►
//!        ◄─ Welcome (server's own proof, session state, limits)   or Error, then close
//!   Read / Write / Free / Stats / Close / Goodbye   ─►   (many in flight, each with an id)
//!        ◄─ ReadOk / WriteOk / FreeOk / StatsOk / GoodbyeOk / Error   (same id, any order)
//! ```
//!
//! Every frame starts with a 16-byte little-endian header `len u32 | kind u8 | class u8 |
//! useful_for u16 | id u64` followed by `len` bytes of body. `useful_for` is 0 except on a
//! prefetch-class Read (version 2): how long, in units of [`USEFUL_FOR_UNIT_US`], the pages
//! stay useful once the request reaches the server. A server that cannot start serving it in
//! that time answers `Late` instead of spending bandwidth on pages that would arrive after
//! the program needed them (Canvas drops prefetches that cannot return in time). The server may answer out of order (it
//! serves demand reads before prefetches before write-backs), so responses are matched by id.
//! Every page on the wire carries its CRC32C; both ends check it. The secret itself never
//! crosses the wire: each side proves it knows it with an HMAC-SHA256 over fresh nonces.

//!
//! Also here, because both ends read them: the token file format (`tokens`) and the size
//! syntax it and the command lines share (`size`). Nothing in this crate does I/O.

pub mod auth;
pub mod channel;
mod frame;
mod keys;
mod layout;
mod messages;
pub mod size;
#[cfg(test)]
mod tests;
pub mod tokens;

pub use frame::*;
pub use keys::*;
pub use layout::*;
pub use messages::*;
