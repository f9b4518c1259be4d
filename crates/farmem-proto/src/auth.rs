//! Challenge-response authentication: each side proves it knows the shared secret with an
//! HMAC-SHA256 over both sides' fresh nonces, both sides' key shares, the tenant and the
//! session. The secret never crosses the wire, a recorded exchange cannot be replayed (the
//! other side's nonce is new each time), the proofs bind the key exchange (a man in the middle
//! who swaps key shares cannot prove anything), and the two proofs use different labels so
//! one cannot be reflected as the other. A connection that joins an existing session also
//! proves the session's key (`channel.rs`), which only the session's creator holds.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::layout::{KeyShare, Nonce, Proof, SessionId};

type HmacSha256 = Hmac<Sha256>;

const CLIENT_LABEL: &[u8] = b"farmem v4 client proof";
const SERVER_LABEL: &[u8] = b"farmem v4 server proof";
const SESSION_LABEL: &[u8] = b"farmem v4 session proof";

/// A shared secret. Its `Debug` output is redacted so it cannot leak into logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// A secret from text (a token file's line or `FARMEM_TOKEN`); surrounding whitespace is
    /// not part of it. `None` if nothing is left.
    pub fn from_text(s: &str) -> Option<Secret> {
        let t = s.trim();
        (!t.is_empty()).then(|| Secret(t.as_bytes().to_vec()))
    }

    fn mac(&self, label: &[u8]) -> HmacSha256 {
        keyed(&self.0, label)
    }

    /// The secret's bytes, for the key schedule.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

fn keyed(key: &[u8], label: &[u8]) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    m.update(label);
    m
}

/// A session's own key, derived by the connection that created the session and held only by
/// its client (and the server): joining the session takes a proof of it, not just its id.
#[derive(Clone, PartialEq, Eq)]
pub struct SessionKey(pub(crate) [u8; 32]);

impl SessionKey {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKey(<redacted>)")
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// What the proofs cover, and what the channel's keys are derived from (with the secret
/// and the key exchange's result).
pub struct Transcript<'a> {
    pub tenant: &'a str,
    pub session: &'a SessionId,
    pub client_nonce: &'a Nonce,
    pub server_nonce: &'a Nonce,
    pub client_share: &'a KeyShare,
    pub server_share: &'a KeyShare,
}

impl Transcript<'_> {
    /// The transcript as bytes (lengths make it unambiguous).
    pub(crate) fn bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(1 + self.tenant.len() + 16 + 4 * 32);
        b.push(self.tenant.len() as u8);
        b.extend_from_slice(self.tenant.as_bytes());
        b.extend_from_slice(self.session);
        b.extend_from_slice(self.client_nonce);
        b.extend_from_slice(self.server_nonce);
        b.extend_from_slice(self.client_share);
        b.extend_from_slice(self.server_share);
        b
    }

    fn mac_over(&self, mut m: HmacSha256) -> HmacSha256 {
        m.update(&self.bytes());
        m
    }

    fn proof(&self, secret: &Secret, label: &[u8]) -> Proof {
        self.mac_over(secret.mac(label))
            .finalize()
            .into_bytes()
            .into()
    }

    fn verify(&self, secret: &Secret, label: &[u8], proof: &Proof) -> bool {
        // Constant time: how much of a guessed proof is right must not show in the timing.
        self.mac_over(secret.mac(label)).verify_slice(proof).is_ok()
    }

    /// A joining connection's proof that it holds the session's key.
    pub fn session_proof(&self, key: &SessionKey) -> Proof {
        self.mac_over(keyed(key.bytes(), SESSION_LABEL))
            .finalize()
            .into_bytes()
            .into()
    }

    pub fn verify_session(&self, key: &SessionKey, proof: &Proof) -> bool {
        self.mac_over(keyed(key.bytes(), SESSION_LABEL))
            .verify_slice(proof)
            .is_ok()
    }

    pub fn client_proof(&self, secret: &Secret) -> Proof {
        self.proof(secret, CLIENT_LABEL)
    }

    pub fn server_proof(&self, secret: &Secret) -> Proof {
        self.proof(secret, SERVER_LABEL)
    }

    pub fn verify_client(&self, secret: &Secret, proof: &Proof) -> bool {
        self.verify(secret, CLIENT_LABEL, proof)
    }

    pub fn verify_server(&self, secret: &Secret, proof: &Proof) -> bool {
        self.verify(secret, SERVER_LABEL, proof)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHARES: (KeyShare, KeyShare) = ([8u8; 32], [9u8; 32]);

    fn transcript<'a>(t: &'a str, s: &'a SessionId, c: &'a Nonce, n: &'a Nonce) -> Transcript<'a> {
        Transcript {
            tenant: t,
            session: s,
            client_nonce: c,
            server_nonce: n,
            client_share: &SHARES.0,
            server_share: &SHARES.1,
        }
    }

    #[test]
    fn proofs_verify_only_with_the_same_secret_and_transcript() {
        let secret = Secret::from_text("  hunter2\n").unwrap();
        let other = Secret::from_text("hunter3").unwrap();
        let (s, c, n) = ([1u8; 16], [2u8; 32], [3u8; 32]);
        let t = transcript("alice", &s, &c, &n);
        let p = t.client_proof(&secret);
        assert!(t.verify_client(&secret, &p));
        assert!(!t.verify_client(&other, &p), "wrong secret");
        assert!(
            !t.verify_server(&secret, &p),
            "a client proof is no server proof"
        );
        let n2 = [4u8; 32];
        assert!(
            !transcript("alice", &s, &c, &n2).verify_client(&secret, &p),
            "another server nonce (replay)"
        );
        assert!(
            !transcript("bob", &s, &c, &n).verify_client(&secret, &p),
            "another tenant"
        );
        assert!(Secret::from_text(" \n").is_none());
        assert_eq!(format!("{secret:?}"), "Secret(<redacted>)");
    }
}
