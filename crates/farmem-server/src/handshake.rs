//! The handshake of a connection: the client's Hello (protocol version, tenant, session)
//! is answered with a challenge; its proof of the secret, checked by challenge-response, with
//! a Welcome that attaches the connection to its tenant and session. A failed step is answered
//! with an error and closes the connection.

use farmem_proto::auth::{Secret, Transcript};
use farmem_proto::{self as p, ErrorCode, Frame, Header, IoClass};
use farmem_sys::random::random_bytes;

use crate::closing::Close;
use crate::conn::State;
use crate::state::{Engine, LOG_TARGET};

impl Engine {
    /// Decode a frame whose kind the connection admitted for its state (see
    /// `Conn::admissible`); a malformed body closes the connection.
    fn decode<'a>(h: &Header, body: &'a [u8]) -> Result<Frame<'a>, Close> {
        p::decode(h, body).map_err(|e| Close::BadInput(e.to_string()))
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
            return Err(Close::Refused(msg));
        }
        let server_nonce = random_bytes::<32>();
        let mut out = Vec::new();
        p::encode_challenge(
            &mut out,
            &p::Challenge {
                version,
                nonce: server_nonce,
                instance: self.instance,
            },
        );
        let c = self.conns.get_mut(&id).expect("live connection");
        c.state = State::Auth {
            tenant: hello.tenant.to_string(),
            session: hello.session,
            resume: hello.resume,
            client_nonce: hello.nonce,
            server_nonce,
        };
        self.send(id, &[&out]);
        Ok(())
    }

    pub(crate) fn on_auth(&mut self, id: u64, h: &Header, body: &[u8]) -> Result<(), Close> {
        let Frame::Auth(auth) = Self::decode(h, body)? else {
            unreachable!("only an Auth is admitted after the Hello")
        };
        let c = self.conns.get(&id).expect("live connection");
        let State::Auth {
            tenant,
            session,
            resume,
            client_nonce,
            server_nonce,
        } = &c.state
        else {
            unreachable!("in the Auth state")
        };
        let (tenant, session, resume) = (tenant.clone(), *session, *resume);
        let (client_nonce, server_nonce) = (*client_nonce, *server_nonce);
        let peer = c.peer;
        let transcript = Transcript {
            tenant: &tenant,
            session: &session,
            client_nonce: &client_nonce,
            server_nonce: &server_nonce,
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
            self.send_error(
                id,
                0,
                IoClass::Demand,
                ErrorCode::AuthFailed,
                "authentication failed",
            );
            return Err(Close::Refused(format!(
                "authentication of tenant '{tenant}' from {peer} failed"
            )));
        }
        let attached = self
            .tenant_for(&tenant)
            .and_then(|t| self.attach(t, session, resume).map(|s| (t, s)));
        let (t, (sidx, resumed, pages)) = match attached {
            Ok(x) => x,
            Err((code, msg)) => {
                self.send_error(id, 0, IoClass::Demand, code, &msg);
                return Err(Close::Refused(msg));
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
        self.held.attribute(c);
        tracing::debug!(
            target: LOG_TARGET,
            "connection {id} from {peer}: tenant '{tenant}', session {sidx} ({})",
            if resumed { "resumed" } else { "new" }
        );
        self.send(id, &[&out]);
        Ok(())
    }
}
