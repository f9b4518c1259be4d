//! Opening one authenticated connection to a `farmem server`: connect, Hello, Challenge,
//! Auth, Welcome, with the server proving it knows the secret too.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use farmem_proto::auth::{Secret, SessionKey, Transcript};
use farmem_proto::channel::{self, ChannelKeys, EphemeralKey, Role};
use farmem_proto::{self as p, ErrorCode, Frame, Header, Hello, SessionId, Welcome};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a connection could not be opened.
#[derive(Debug)]
pub(crate) enum ConnectError {
    /// Network trouble: worth retrying.
    Io(String),
    /// The server refused us: retrying the same way will not help (except `SessionUnknown`,
    /// which the caller handles).
    Rejected(ErrorCode, String),
    /// The peer does not speak the protocol, or failed to prove it knows the secret.
    Protocol(String),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Io(m) | ConnectError::Protocol(m) => f.write_str(m),
            ConnectError::Rejected(code, m) => write!(f, "{m} ({})", code.name()),
        }
    }
}

fn io(what: &str, e: std::io::Error) -> ConnectError {
    ConnectError::Io(format!("{what}: {e}"))
}

/// Read one small frame (handshake or reply) into `body`.
pub(crate) fn read_frame(s: &mut TcpStream, body: &mut Vec<u8>) -> Result<Header, ConnectError> {
    let mut hb = [0u8; p::HEADER_LEN];
    s.read_exact(&mut hb).map_err(|e| io("reading", e))?;
    let h = Header::decode(&hb).map_err(|e| ConnectError::Protocol(e.to_string()))?;
    body.resize(h.len as usize, 0);
    s.read_exact(body).map_err(|e| io("reading", e))?;
    Ok(h)
}

fn expect_frame<'a>(h: &Header, body: &'a [u8]) -> Result<Frame<'a>, ConnectError> {
    match p::decode(h, body).map_err(|e| ConnectError::Protocol(e.to_string()))? {
        Frame::Error(e) => Err(ConnectError::Rejected(e.code, e.message.to_string())),
        f => Ok(f),
    }
}

pub(crate) struct Opened {
    pub stream: TcpStream,
    pub welcome: Welcome,
    /// The server process's random instance id.
    pub instance: u64,
    /// Protocol version the server chose.
    pub version: u16,
    /// The secure channel's keys for this connection.
    pub keys: ChannelKeys,
}

/// Connect to `addr` and authenticate as `tenant` for `session`: join it with a proof of
/// `session_key` if given (the session exists: this program made it), else create it
/// (`resume` then says whether the server must already know it).
pub(crate) fn open(
    addr: &str,
    tenant: &str,
    secret: &Secret,
    session: &SessionId,
    resume: bool,
    session_key: Option<&SessionKey>,
) -> Result<Opened, ConnectError> {
    let addrs: Vec<_> = addr
        .to_socket_addrs()
        .map_err(|e| io(&format!("resolving {addr}"), e))?
        .collect();
    let mut last = None;
    let mut stream = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, CONNECT_TIMEOUT) {
            Ok(s) => {
                // Out of the program's way (it may close every descriptor it did not open).
                stream = Some(farmem_sys::fds::keep(s));
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let mut s = match stream {
        Some(s) => s,
        None => {
            return Err(match last {
                Some(e) => io("connecting", e),
                None => ConnectError::Io(format!("{addr} resolves to no address")),
            })
        }
    };
    s.set_nodelay(true).map_err(|e| io("TCP_NODELAY", e))?;
    s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(|e| io("socket timeout", e))?;
    s.set_write_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(|e| io("socket timeout", e))?;

    let client_nonce = farmem_sys::random::random_bytes::<32>();
    let mine = EphemeralKey::from_random(farmem_sys::random::random_bytes::<32>());
    let client_share = mine.share();
    let mut out = Vec::new();
    p::encode_hello(
        &mut out,
        &Hello {
            min_version: p::VERSION_MIN,
            max_version: p::VERSION_MAX,
            session: *session,
            nonce: client_nonce,
            resume,
            tenant,
            share: Some(client_share),
        },
    );
    s.write_all(&out).map_err(|e| io("sending hello", e))?;
    let mut body = Vec::new();
    let h = read_frame(&mut s, &mut body)?;
    let Frame::Challenge(ch) = expect_frame(&h, &body)? else {
        return Err(ConnectError::Protocol(format!(
            "expected a challenge, got {:?}",
            h.kind
        )));
    };
    if !(p::VERSION_MIN..=p::VERSION_MAX).contains(&ch.version) {
        return Err(ConnectError::Protocol(format!(
            "server chose protocol version {}, this client speaks {}..={}",
            ch.version,
            p::VERSION_MIN,
            p::VERSION_MAX
        )));
    }
    let Some(server_share) = ch.share else {
        return Err(ConnectError::Protocol(
            "the server sent no key share: it cannot open a secure channel".into(),
        ));
    };
    let transcript = Transcript {
        tenant,
        session,
        client_nonce: &client_nonce,
        server_nonce: &ch.nonce,
        client_share: &client_share,
        server_share: &server_share,
    };
    out.clear();
    p::encode_auth(
        &mut out,
        &p::Auth {
            proof: transcript.client_proof(secret),
            session_proof: session_key.map(|k| transcript.session_proof(k)),
        },
    );
    s.write_all(&out).map_err(|e| io("sending proof", e))?;
    let h = read_frame(&mut s, &mut body)?;
    let Frame::Welcome(w) = expect_frame(&h, &body)? else {
        return Err(ConnectError::Protocol(format!(
            "expected a welcome, got {:?}",
            h.kind
        )));
    };
    if !transcript.verify_server(secret, &w.proof) {
        return Err(ConnectError::Protocol(
            "the server could not prove it knows the token: wrong server, or a different token"
                .into(),
        ));
    }
    if w.max_batch == 0 || w.window_pages == 0 {
        return Err(ConnectError::Protocol(
            "server announced a zero batch or window".into(),
        ));
    }
    let keys = channel::derive(Role::Client, mine, &server_share, secret, &transcript)
        .map_err(|e| ConnectError::Protocol(e.to_string()))?;
    Ok(Opened {
        stream: s,
        welcome: w,
        instance: ch.instance,
        version: ch.version,
        keys,
    })
}
