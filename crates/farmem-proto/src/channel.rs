//! The secure channel (protocol version 4): after the handshake every frame is sealed.
//!
//! The client's Hello and the server's Challenge each carry an ephemeral X25519 key share;
//! both proofs of the shared secret cover both shares (`auth.rs`), so a man in the middle
//! cannot swap them. Each side then derives, with HKDF-SHA256 from the key exchange's result
//! and the secret, salted with the whole transcript:
//!
//! - one AES-256-GCM key per direction;
//! - the session's own key ([`SessionKey`]), kept by a connection that creates a session.
//!
//! Knowing the secret is not enough to read a recorded connection (the exchange is
//! ephemeral), and knowing a session's id is not enough to join it.
//!
//! On the wire, after the Welcome, a frame is its 16-byte header in clear (its `len` counts
//! the body only), the body encrypted, and a 16-byte tag that authenticates header and body.
//! The nonce is the frame's number in its direction, so a frame dropped, replayed, reordered
//! or altered fails to open, and the connection ends.

use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM};
use ring::hkdf::{KeyType, Prk, Salt, HKDF_SHA256};
use x25519_dalek::{PublicKey, StaticSecret};

use crate::auth::{Secret, SessionKey, Transcript};
use crate::layout::{KeyShare, HEADER_LEN};

/// Bytes of the tag after each sealed body.
pub const TAG_LEN: usize = 16;

const KEYS_LABEL: &[u8] = b"farmem v4 keys";
const CLIENT_TO_SERVER: &[u8] = b"farmem v4 client to server";
const SERVER_TO_CLIENT: &[u8] = b"farmem v4 server to client";
const SESSION_KEY: &[u8] = b"farmem v4 session key";

/// Why the channel could not be set up, or a frame could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    #[error("the peer's key share is weak (a low-order point): refusing it")]
    WeakShare,
    #[error("a frame failed authentication (altered, replayed, reordered or dropped on the way)")]
    Forged,
    #[error("a frame is too short to carry its tag")]
    Truncated,
    #[error("this connection has sealed 2^64 frames")]
    Exhausted,
}

/// One side's ephemeral key for the exchange.
pub struct EphemeralKey(StaticSecret);

impl EphemeralKey {
    /// From 32 bytes of the caller's randomness (`farmem_sys::random`): this crate does no
    /// I/O, and tests can use fixed keys.
    pub fn from_random(bytes: [u8; 32]) -> EphemeralKey {
        EphemeralKey(StaticSecret::from(bytes))
    }

    /// The public share sent to the peer.
    pub fn share(&self) -> KeyShare {
        PublicKey::from(&self.0).to_bytes()
    }
}

/// Which end of the connection we are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

/// A connection's keys, once the handshake's proofs have been checked.
pub struct ChannelKeys {
    /// Seals what this side sends.
    pub sealer: Sealer,
    /// Opens what the peer sends.
    pub opener: Opener,
    /// The key of a session this connection creates (ignored when it joins one).
    pub new_session_key: SessionKey,
}

struct Len(usize);

impl KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

fn aead_key(prk: &Prk, label: &[u8]) -> LessSafeKey {
    let info = [label];
    let okm = prk
        .expand(&info, &AES_256_GCM)
        .expect("HKDF output of one AES key");
    LessSafeKey::new(UnboundKey::from(okm))
}

/// Derive the connection's keys from our ephemeral key, the peer's share, the secret and the
/// transcript (which both proofs covered).
pub fn derive(
    role: Role,
    mine: EphemeralKey,
    peer: &KeyShare,
    secret: &Secret,
    transcript: &Transcript,
) -> Result<ChannelKeys, ChannelError> {
    let shared = mine.0.diffie_hellman(&PublicKey::from(*peer));
    if !shared.was_contributory() {
        return Err(ChannelError::WeakShare);
    }
    let mut salt = KEYS_LABEL.to_vec();
    salt.extend_from_slice(&transcript.bytes());
    let mut ikm = shared.as_bytes().to_vec();
    ikm.extend_from_slice(secret.bytes());
    let prk = Salt::new(HKDF_SHA256, &salt).extract(&ikm);
    let (mine_label, peer_label) = match role {
        Role::Client => (CLIENT_TO_SERVER, SERVER_TO_CLIENT),
        Role::Server => (SERVER_TO_CLIENT, CLIENT_TO_SERVER),
    };
    let mut session = [0u8; 32];
    let info = [SESSION_KEY];
    prk.expand(&info, Len(32))
        .and_then(|okm| okm.fill(&mut session))
        .expect("HKDF output of 32 bytes");
    Ok(ChannelKeys {
        sealer: Sealer {
            key: aead_key(&prk, mine_label),
            next: 0,
        },
        opener: Opener {
            key: aead_key(&prk, peer_label),
            next: 0,
        },
        new_session_key: SessionKey(session),
    })
}

fn nonce(n: u64) -> Nonce {
    let mut b = [0u8; 12];
    b[4..].copy_from_slice(&n.to_le_bytes());
    Nonce::assume_unique_for_key(b)
}

/// Seals the frames one side sends, in order.
pub struct Sealer {
    key: LessSafeKey,
    next: u64,
}

impl Sealer {
    /// Encrypt `body` in place; the tag to send after it. `header` is the frame's header as
    /// sent (authenticated, not encrypted).
    pub fn seal(
        &mut self,
        header: &[u8; HEADER_LEN],
        body: &mut [u8],
    ) -> Result<[u8; TAG_LEN], ChannelError> {
        let n = self.next;
        self.next = n.checked_add(1).ok_or(ChannelError::Exhausted)?;
        let tag: Tag = self
            .key
            .seal_in_place_separate_tag(nonce(n), Aad::from(header), body)
            .map_err(|_| ChannelError::Exhausted)?;
        let mut out = [0u8; TAG_LEN];
        out.copy_from_slice(tag.as_ref());
        Ok(out)
    }
}

/// Opens the frames the peer sends, in order.
pub struct Opener {
    key: LessSafeKey,
    next: u64,
}

impl Opener {
    /// Decrypt and check a frame's body followed by its tag, in place; the body. Any change
    /// to the header, the body or the tag, or a frame out of its turn, is
    /// [`ChannelError::Forged`].
    pub fn open<'a>(
        &mut self,
        header: &[u8; HEADER_LEN],
        body_and_tag: &'a mut [u8],
    ) -> Result<&'a mut [u8], ChannelError> {
        if body_and_tag.len() < TAG_LEN {
            return Err(ChannelError::Truncated);
        }
        let n = self.next;
        self.next = n.checked_add(1).ok_or(ChannelError::Exhausted)?;
        self.key
            .open_in_place(nonce(n), Aad::from(header), body_and_tag)
            .map_err(|_| ChannelError::Forged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Ends {
        client: ChannelKeys,
        server: ChannelKeys,
    }

    fn handshake(client_secret: &str, server_secret: &str, mitm: bool) -> Ends {
        let c = EphemeralKey::from_random([1u8; 32]);
        let s = EphemeralKey::from_random([2u8; 32]);
        let (cs, ss) = (c.share(), s.share());
        // A man in the middle gives each side its own share instead of the other's.
        let m = EphemeralKey::from_random([3u8; 32]).share();
        let (to_server, to_client) = if mitm { (m, m) } else { (cs, ss) };
        let session = [4u8; 16];
        let (cn, sn) = ([5u8; 32], [6u8; 32]);
        let t = |client_share, server_share| Transcript {
            tenant: "alice",
            session: &session,
            client_nonce: &cn,
            server_nonce: &sn,
            client_share,
            server_share,
        };
        let client = derive(
            Role::Client,
            c,
            &to_client,
            &Secret::from_text(client_secret).unwrap(),
            &t(&cs, &to_client),
        )
        .unwrap();
        let server = derive(
            Role::Server,
            s,
            &to_server,
            &Secret::from_text(server_secret).unwrap(),
            &t(&to_server, &ss),
        )
        .unwrap();
        Ends { client, server }
    }

    fn seal(s: &mut Sealer, header: [u8; HEADER_LEN], body: &[u8]) -> Vec<u8> {
        let mut b = body.to_vec();
        let tag = s.seal(&header, &mut b).unwrap();
        b.extend_from_slice(&tag);
        b
    }

    #[test]
    fn frames_travel_both_ways_in_order() {
        let mut e = handshake("s3cret", "s3cret", false);
        assert_eq!(e.client.new_session_key, e.server.new_session_key);
        for i in 0..3u8 {
            let h = [i; HEADER_LEN];
            let mut wire = seal(&mut e.client.sealer, h, b"page contents");
            assert_ne!(&wire[..13], b"page contents", "encrypted");
            let body = e.server.opener.open(&h, &mut wire).unwrap();
            assert_eq!(body, b"page contents");
            let mut back = seal(&mut e.server.sealer, h, &[]);
            assert!(e.client.opener.open(&h, &mut back).unwrap().is_empty());
        }
    }

    #[test]
    fn any_alteration_is_detected() {
        let mut e = handshake("s3cret", "s3cret", false);
        let h = [7u8; HEADER_LEN];
        let wire = seal(&mut e.client.sealer, h, &[9u8; 100]);
        // Each byte of body and tag flipped, and the header changed: every one refused (the
        // opener's counter moves on with each try, so each try is on a fresh opener).
        for i in 0..wire.len() {
            let mut e2 = handshake("s3cret", "s3cret", false);
            let mut w = seal(&mut e2.client.sealer, h, &[9u8; 100]);
            w[i] ^= 0x40;
            assert_eq!(e2.server.opener.open(&h, &mut w), Err(ChannelError::Forged));
        }
        let mut w = wire.clone();
        let mut other = h;
        other[0] ^= 1;
        assert_eq!(
            e.server.opener.open(&other, &mut w),
            Err(ChannelError::Forged)
        );
        let mut short = vec![0u8; TAG_LEN - 1];
        assert_eq!(
            e.server.opener.open(&h, &mut short),
            Err(ChannelError::Truncated)
        );
    }

    #[test]
    fn replayed_or_reordered_frames_fail() {
        let mut e = handshake("s3cret", "s3cret", false);
        let h = [1u8; HEADER_LEN];
        let first = seal(&mut e.client.sealer, h, b"one");
        let second = seal(&mut e.client.sealer, h, b"two");
        let mut w = second.clone();
        assert_eq!(e.server.opener.open(&h, &mut w), Err(ChannelError::Forged));
        let mut e = handshake("s3cret", "s3cret", false);
        let first_again = seal(&mut e.client.sealer, h, b"one");
        assert_eq!(first_again, first, "the same keys and counter");
        let mut w = first.clone();
        e.server.opener.open(&h, &mut w).unwrap();
        let mut w = first.clone();
        assert_eq!(
            e.server.opener.open(&h, &mut w),
            Err(ChannelError::Forged),
            "replay"
        );
    }

    #[test]
    fn a_different_secret_or_swapped_shares_give_unrelated_keys() {
        for (a, b, mitm) in [("s3cret", "other", false), ("s3cret", "s3cret", true)] {
            let mut e = handshake(a, b, mitm);
            assert_ne!(e.client.new_session_key, e.server.new_session_key);
            let h = [0u8; HEADER_LEN];
            let mut w = seal(&mut e.client.sealer, h, b"x");
            assert_eq!(e.server.opener.open(&h, &mut w), Err(ChannelError::Forged));
        }
    }

    #[test]
    fn a_low_order_share_is_refused() {
        let t = Transcript {
            tenant: "t",
            session: &[0; 16],
            client_nonce: &[0; 32],
            server_nonce: &[0; 32],
            client_share: &[0; 32],
            server_share: &[0; 32],
        };
        let r = derive(
            Role::Server,
            EphemeralKey::from_random([2u8; 32]),
            &[0u8; 32],
            &Secret::from_text("x").unwrap(),
            &t,
        );
        assert!(matches!(r, Err(ChannelError::WeakShare)));
    }
}
