//! Challenge-response authentication: each side proves it knows the shared secret with an
//! HMAC-SHA256 over both sides' fresh nonces, the tenant and the session. The secret never
//! crosses the wire, a recorded exchange cannot be replayed (the other side's nonce is new
//! each time), and the two proofs use different labels so one cannot be reflected as the
//! other.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::layout::{Nonce, Proof, SessionId};

type HmacSha256 = Hmac<Sha256>;

const CLIENT_LABEL: &[u8] = b"farmem v1 client proof";
const SERVER_LABEL: &[u8] = b"farmem v1 server proof";

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
        let mut m = HmacSha256::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        m.update(label);
        m
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// What both proofs cover.
pub struct Transcript<'a> {
    pub tenant: &'a str,
    pub session: &'a SessionId,
    pub client_nonce: &'a Nonce,
    pub server_nonce: &'a Nonce,
}

impl Transcript<'_> {
    fn feed(&self, m: &mut HmacSha256) {
        m.update(&[self.tenant.len() as u8]);
        m.update(self.tenant.as_bytes());
        m.update(self.session);
        m.update(self.client_nonce);
        m.update(self.server_nonce);
    }

    fn proof(&self, secret: &Secret, label: &[u8]) -> Proof {
        let mut m = secret.mac(label);
        self.feed(&mut m);
        m.finalize().into_bytes().into()
    }

    fn verify(&self, secret: &Secret, label: &[u8], proof: &Proof) -> bool {
        let mut m = secret.mac(label);
        self.feed(&mut m);
        // Constant time: how much of a guessed proof is right must not show in the timing.
        m.verify_slice(proof).is_ok()
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

    fn transcript<'a>(t: &'a str, s: &'a SessionId, c: &'a Nonce, n: &'a Nonce) -> Transcript<'a> {
        Transcript {
            tenant: t,
            session: s,
            client_nonce: c,
            server_nonce: n,
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
