//! The handshake of a connection: the client's Hello (protocol version, tenant, session)
//! is answered with a challenge; its proof of the secret, checked by challenge-response, with
//! a Welcome that attaches the connection to its tenant and session. A failed step is answered
//! with an error and closes the connection; a wrong proof also counts a strike against the
//! client's address (`backoff`), and a proof from an address in its back-off is refused
//! without being examined.
//!
//! The Hello and the Challenge carry the two sides' key shares; once the proof is checked,
//! both derive the secure channel's keys (`farmem_proto::channel`) and every frame after the
//! Welcome is sealed. A connection that names an existing session must prove the session's
//! key, which only the connection that created it derived: its id alone, seen on the wire or
//! guessed, is not enough.

use std::sync::atomic::Ordering;
use std::time::Instant;

use farmem_proto::auth::{Secret, Transcript};
use farmem_proto::channel::{self, EphemeralKey, Role};
use farmem_proto::{self as p, ErrorCode, Frame, Header, IoClass};
use farmem_sys::random::random_bytes;

use crate::closing::Close;
use crate::conn::State;
use crate::metrics::Refusal;
use crate::state::{Engine, LOG_TARGET};

impl Engine {
    /// Decode a frame whose kind the connection admitted for its state (see
    /// `Conn::admissible`); a malformed body closes the connection.
    fn decode<'a>(h: &Header, body: &'a [u8]) -> Result<Frame<'a>, Close> {
        p::decode(h, body).map_err(|e| Close::BadInput("malformed frame", e.to_string()))
    }

    pub(crate) fn on_hello(&mut self, id: u64, h: &Header, body: &[u8]) -> Result<(), Close> {
        let Frame::Hello(hello) = Self::decode(h, body)? else {
            unreachable!("only a Hello is admitted before the handshake")
        };
        let version = hello.max_version.min(p::VERSION_MAX);
        if version < hello.min_version.max(p::VERSION_MIN) {
            let msg = format!(
                "no common protocol version: client speaks {}..={}, server {}..={}",
                hello.min_version,
                hello.max_version,
                p::VERSION_MIN,
                p::VERSION_MAX
            );
            self.send_error(id, 0, IoClass::Demand, ErrorCode::Version, &msg);
            return Err(Close::Declined(msg));
        }
        let Some(client_share) = hello.share else {
            let msg = "no key share in the hello: a secure channel is required".to_string();
            self.send_error(id, 0, IoClass::Demand, ErrorCode::Version, &msg);
            return Err(Close::Declined(msg));
        };
        let server_nonce = random_bytes::<32>();
        let key = EphemeralKey::from_random(random_bytes::<32>());
        let mut out = Vec::new();
        p::encode_challenge(
            &mut out,
            &p::Challenge {
                version,
                nonce: server_nonce,
                instance: self.instance,
                share: Some(key.share()),
            },
        );
        let c = self.conns.get_mut(&id).expect("live connection");
        c.version = version;
        c.state = State::Auth {
            tenant: hello.tenant.to_string(),
            session: hello.session,
            resume: hello.resume,
            client_nonce: hello.nonce,
            server_nonce,
            client_share,
            key: Box::new(key),
        };
        self.send(id, &[&out]);
        Ok(())
    }

    pub(crate) fn on_auth(&mut self, id: u64, h: &Header, body: &[u8]) -> Result<(), Close> {
        let Frame::Auth(auth) = Self::decode(h, body)? else {
            unreachable!("only an Auth is admitted after the Hello")
        };
        let c = self.conns.get_mut(&id).expect("live connection");
        // Taken out: the exchange's key is used once, and the state is Ready or the
        // connection closed when this returns.
        let State::Auth {
            tenant,
            session,
            resume,
            client_nonce,
            server_nonce,
            client_share,
            key,
        } = std::mem::replace(&mut c.state, State::Hello)
        else {
            unreachable!("in the Auth state")
        };
        let (peer, source) = (c.peer, c.source);
        let server_share = key.share();
        let now = Instant::now();
        if let Some(left) = self.admission.backoff.refusing(source, now) {
            self.metrics.refused(Refusal::AuthBackoff);
            let msg = format!(
                "too many failed authentications from {source} lately: try again in {:.1} s",
                left.as_secs_f64()
            );
            self.send_error(id, 0, IoClass::Demand, ErrorCode::TooBusy, &msg);
            return Err(Close::AuthFailed {
                examined: false,
                detail: format!("proof for tenant '{tenant}' not examined: {msg}"),
            });
        }
        let transcript = Transcript {
            tenant: &tenant,
            session: &session,
            client_nonce: &client_nonce,
            server_nonce: &server_nonce,
            client_share: &client_share,
            server_share: &server_share,
        };
        // An unknown tenant is checked against a random secret, so that the reply and its
        // timing do not tell which tenant names exist.
        let unknown = Secret::from_text(&format!("{:x}", u128::from_le_bytes(random_bytes())))
            .expect("non-empty");
        let secret = self
            .cfg
            .tokens
            .secret_for(&tenant)
            .unwrap_or(&unknown)
            .clone();
        if !transcript.verify_client(&secret, &auth.proof) {
            self.metrics.auth_failures.fetch_add(1, Ordering::Relaxed);
            let window = self.admission.backoff.failed(source, now);
            self.send_error(
                id,
                0,
                IoClass::Demand,
                ErrorCode::AuthFailed,
                "authentication failed",
            );
            let mut detail = format!("authentication of tenant '{tenant}' from {peer} failed");
            if !window.is_zero() {
                detail += &format!(
                    " (again: {source} is refused for {:.1} s)",
                    window.as_secs_f64()
                );
            }
            return Err(Close::AuthFailed {
                examined: true,
                detail,
            });
        }
        if self.authed >= self.cfg.max_conns {
            let msg = format!(
                "the server has too many connections ({} authenticated, --max-conns)",
                self.authed
            );
            self.send_error(id, 0, IoClass::Demand, ErrorCode::TooBusy, &msg);
            return Err(Close::Refused(Refusal::MaxConns, msg));
        }
        let keys = match channel::derive(Role::Server, *key, &client_share, &secret, &transcript) {
            Ok(k) => k,
            Err(e) => {
                let msg = format!("key exchange: {e}");
                self.send_error(id, 0, IoClass::Demand, ErrorCode::AuthFailed, &msg);
                return Err(Close::AuthFailed {
                    examined: true,
                    detail: format!("tenant '{tenant}' from {peer}: {msg}"),
                });
            }
        };
        let t = match self.tenant_for(&tenant) {
            Ok(t) => t,
            Err((code, msg)) => {
                self.send_error(id, 0, IoClass::Demand, code, &msg);
                return Err(Close::Declined(msg));
            }
        };
        // Joining an existing session takes its key, not just its id.
        if let Some(owner_key) = self.session_key(t, &session) {
            let proven = auth
                .session_proof
                .is_some_and(|p| transcript.verify_session(owner_key, &p));
            if !proven {
                self.forget_if_unused(t);
                self.metrics.auth_failures.fetch_add(1, Ordering::Relaxed);
                self.admission.backoff.failed(source, now);
                let msg = "this connection does not hold the session's key";
                self.send_error(id, 0, IoClass::Demand, ErrorCode::AuthFailed, msg);
                return Err(Close::AuthFailed {
                    examined: true,
                    detail: format!("tenant '{tenant}' from {peer}: {msg}"),
                });
            }
        }
        let (sidx, resumed, pages) = match self.attach(t, session, resume, &keys.new_session_key) {
            Ok(x) => x,
            Err((code, msg)) => {
                // A tenant made for this connection alone is forgotten again.
                self.forget_if_unused(t);
                self.send_error(id, 0, IoClass::Demand, code, &msg);
                return Err(Close::Declined(msg));
            }
        };
        let mut out = Vec::new();
        p::encode_welcome(
            &mut out,
            &p::Welcome {
                proof: transcript.server_proof(&secret),
                resumed,
                session_pages: pages,
                quota_pages: self.tenants[t].quota_pages,
                capacity_pages: self.store.capacity() as u64,
                max_batch: p::MAX_BATCH_PAGES as u32,
                window_pages: self.cfg.window_pages,
            },
        );
        let c = self.conns.get_mut(&id).expect("live connection");
        c.state = State::Ready {
            tenant: t,
            session: sidx,
        };
        c.deadline = None;
        c.grow_read_buffer();
        self.held.attribute(c);
        self.admission.leave(source, id);
        self.metrics
            .unauth_connections
            .fetch_sub(1, Ordering::Relaxed);
        self.authed += 1;
        self.tenant_connected(t);
        tracing::debug!(
            target: LOG_TARGET,
            "connection {id} from {peer}: tenant '{tenant}', session {sidx} ({})",
            if resumed { "resumed" } else { "new" }
        );
        self.send(id, &[&out]);
        // The Welcome went in clear; everything after it is sealed.
        if let Some(c) = self.conns.get_mut(&id) {
            c.secure(keys);
        }
        Ok(())
    }
}
