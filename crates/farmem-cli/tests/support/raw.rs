//! A client speaking the raw protocol, for tests that must send what the runtime never
//! would (garbage, stalls, Goodbye by hand), and sockets from chosen loopback addresses.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::FromRawFd;
use std::time::Duration;

use farmem_proto::auth::{Secret, SessionKey, Transcript};
use farmem_proto::channel::{self, EphemeralKey, Opener, Role, Sealer, TAG_LEN};
use farmem_proto::{self as p, Frame, Header, KeyShare};
use farmem_sys::random::random_bytes;

pub struct Raw {
    pub s: TcpStream,
    /// The protocol version the server chose (0 before the handshake).
    pub version: u16,
    /// The session it asks for (random; set it to join another connection's session).
    pub session: [u8; 16],
    /// The key of that session, to join it (`None`: create it).
    pub session_key: Option<SessionKey>,
    /// The secure channel, once authenticated: later frames are sealed and opened.
    channel: Option<(Sealer, Opener)>,
}

/// What a fake server learned from a client's handshake.
pub struct Accepted {
    pub tenant: String,
    pub session: [u8; 16],
}

impl Raw {
    pub fn connect(addr: &str) -> Raw {
        Raw::wrap(TcpStream::connect(addr).unwrap())
    }

    pub fn wrap(s: TcpStream) -> Raw {
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        Raw {
            s,
            version: 0,
            session: random_bytes::<16>(),
            session_key: None,
            channel: None,
        }
    }

    /// Bytes as they are, sealed or not (garbage, a header alone, half a frame).
    pub fn send(&mut self, b: &[u8]) {
        // The server may have closed already: that is what these tests provoke.
        let _ = self.s.write_all(b);
    }

    /// One whole frame (header and body), sealed once the channel is up.
    pub fn send_frame(&mut self, frame: &[u8]) {
        self.send_frames(&[frame]);
    }

    /// Whole frames, sealed once the channel is up, in one write (they arrive together).
    pub fn send_frames(&mut self, frames: &[&[u8]]) {
        let mut out = Vec::new();
        for frame in frames {
            let Some((sealer, _)) = self.channel.as_mut() else {
                out.extend_from_slice(frame);
                continue;
            };
            let header: [u8; p::HEADER_LEN] = frame[..p::HEADER_LEN].try_into().unwrap();
            let mut body = frame[p::HEADER_LEN..].to_vec();
            let tag = sealer.seal(&header, &mut body).unwrap();
            out.extend_from_slice(&header);
            out.extend(body);
            out.extend(tag);
        }
        self.send(&out);
    }

    /// The next frame, opened if sealed (`None`: closed, or a frame that fails to open).
    pub fn frame(&mut self) -> Option<(Header, Vec<u8>)> {
        let mut hb = [0u8; p::HEADER_LEN];
        self.s.read_exact(&mut hb).ok()?;
        let h = Header::decode(&hb).ok()?;
        let tag = if self.channel.is_some() { TAG_LEN } else { 0 };
        let mut body = vec![0u8; h.len as usize + tag];
        self.s.read_exact(&mut body).ok()?;
        if let Some((_, opener)) = self.channel.as_mut() {
            opener.open(&hb, &mut body).ok()?;
            body.truncate(h.len as usize);
        }
        Some((h, body))
    }

    /// The server closed this connection (EOF, possibly after an Error frame).
    pub fn closed_by_server(&mut self) -> bool {
        let mut b = [0u8; 4096];
        loop {
            match self.s.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }

    /// Connect and authenticate as `tenant`.
    pub fn authenticated(addr: &str, tenant: &str, secret: &str) -> Raw {
        Raw::authenticated_v(addr, tenant, secret, p::VERSION_MAX)
    }

    pub fn authenticated_v(addr: &str, tenant: &str, secret: &str, max_version: u16) -> Raw {
        let mut r = Raw::connect(addr);
        match r.handshake(tenant, secret, max_version) {
            Ok(Frame::Welcome(_)) => r,
            other => panic!("not welcomed: {other:?}"),
        }
    }

    /// Hello, challenge, proof for a new session: the server's last frame, decoded (Welcome,
    /// or an Error), or what went wrong.
    pub fn handshake(
        &mut self,
        tenant: &str,
        secret: &str,
        max_version: u16,
    ) -> Result<Frame<'static>, String> {
        self.handshake_with(tenant, secret, max_version, false)
    }

    /// The same, resuming `self.session`.
    pub fn handshake_resume(
        &mut self,
        tenant: &str,
        secret: &str,
        max_version: u16,
    ) -> Result<Frame<'static>, String> {
        self.handshake_with(tenant, secret, max_version, true)
    }

    fn handshake_with(
        &mut self,
        tenant: &str,
        secret: &str,
        max_version: u16,
        resume: bool,
    ) -> Result<Frame<'static>, String> {
        let (session, nonce) = (self.session, random_bytes::<32>());
        let mine = EphemeralKey::from_random(random_bytes::<32>());
        let client_share = mine.share();
        let mut out = Vec::new();
        p::encode_hello(
            &mut out,
            &p::Hello {
                min_version: max_version.min(p::VERSION_MIN),
                max_version,
                session,
                nonce,
                resume,
                tenant,
                share: Some(client_share),
            },
        );
        self.send(&out);
        let (h, body) = self.frame().ok_or("closed before the challenge")?;
        let c = match p::decode(&h, &body) {
            Ok(Frame::Challenge(c)) => c,
            Ok(f) => return Ok(owned(f)),
            Err(e) => return Err(e.to_string()),
        };
        self.version = c.version;
        let server_share = c.share.ok_or("no key share in the challenge")?;
        let t = Transcript {
            tenant,
            session: &session,
            client_nonce: &nonce,
            server_nonce: &c.nonce,
            client_share: &client_share,
            server_share: &server_share,
        };
        let secret = Secret::from_text(secret).unwrap();
        out.clear();
        p::encode_auth(
            &mut out,
            &p::Auth {
                proof: t.client_proof(&secret),
                session_proof: self.session_key.as_ref().map(|k| t.session_proof(k)),
            },
        );
        self.send(&out);
        let (h, body) = self.frame().ok_or("closed before the verdict")?;
        let verdict = p::decode(&h, &body).map(owned).map_err(|e| e.to_string())?;
        if let Frame::Welcome(w) = &verdict {
            let keys = channel::derive(Role::Client, mine, &server_share, &secret, &t)
                .map_err(|e| e.to_string())?;
            if !w.resumed {
                self.session_key = Some(keys.new_session_key);
            }
            self.channel = Some((keys.sealer, keys.opener));
        }
        Ok(verdict)
    }

    /// The server's side of a handshake, for fake servers: read the Hello, challenge it,
    /// take the proof (without checking it) and welcome it with `welcome` (its proof is
    /// filled in); frames are sealed from then on.
    pub fn accept(&mut self, secret: &str, mut welcome: p::Welcome) -> Option<Accepted> {
        let (h, body) = self.frame()?;
        let Ok(Frame::Hello(hello)) = p::decode(&h, &body) else {
            return None;
        };
        let client_share: KeyShare = hello.share?;
        let (tenant, session, client_nonce) =
            (hello.tenant.to_string(), hello.session, hello.nonce);
        let server_nonce = random_bytes::<32>();
        let mine = EphemeralKey::from_random(random_bytes::<32>());
        let server_share = mine.share();
        let mut out = Vec::new();
        p::encode_challenge(
            &mut out,
            &p::Challenge {
                version: p::VERSION_MAX,
                nonce: server_nonce,
                instance: 7,
                share: Some(server_share),
            },
        );
        self.send(&out);
        self.frame()?;
        let t = Transcript {
            tenant: &tenant,
            session: &session,
            client_nonce: &client_nonce,
            server_nonce: &server_nonce,
            client_share: &client_share,
            server_share: &server_share,
        };
        let secret = Secret::from_text(secret).unwrap();
        welcome.proof = t.server_proof(&secret);
        out.clear();
        p::encode_welcome(&mut out, &welcome);
        self.send(&out);
        let keys = channel::derive(Role::Server, mine, &client_share, &secret, &t).ok()?;
        self.channel = Some((keys.sealer, keys.opener));
        self.version = p::VERSION_MAX;
        Some(Accepted { tenant, session })
    }

    /// Send a request and wait for its reply (any frame with the same id).
    pub fn call(&mut self, req: &[u8], id: u64) -> Option<(Header, Vec<u8>)> {
        self.send_frame(req);
        loop {
            let (h, body) = self.frame()?;
            if h.id == id {
                return Some((h, body));
            }
        }
    }
}

/// A frame without borrows (the handshake's verdicts have none worth keeping).
fn owned(f: Frame<'_>) -> Frame<'static> {
    match f {
        Frame::Welcome(w) => Frame::Welcome(w),
        Frame::Challenge(c) => Frame::Challenge(c),
        Frame::Error(e) => Frame::Error(p::ErrorMsg {
            code: e.code,
            message: Box::leak(e.message.to_string().into_boxed_str()),
        }),
        _ => Frame::Stats,
    }
}

/// A TCP connection to `addr` from loopback address `from` (127.0.0.0/8: any of them works
/// without configuration), to appear to the server as another client machine.
pub fn connect_from(from: Ipv4Addr, addr: &str) -> std::io::Result<TcpStream> {
    let to: SocketAddr = addr.parse().expect("an IPv4 address");
    let SocketAddr::V4(to) = to else {
        panic!("an IPv4 address")
    };
    let sa = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a new socket; the addresses are valid sockaddr_in of the length given; the
    // descriptor is owned by the TcpStream made from it (or closed on failure).
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let stream = TcpStream::from_raw_fd(fd);
        let local = sa(from, 0);
        if libc::bind(fd, &local as *const _ as *const libc::sockaddr, len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let remote = sa(*to.ip(), to.port());
        if libc::connect(fd, &remote as *const _ as *const libc::sockaddr, len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stream)
    }
}

/// Let this test process open as many descriptors as the hard limit allows.
pub fn raise_fd_limit() -> u64 {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid rlimit structs for the kernel to read and fill.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut l), 0);
        l.rlim_cur = l.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &l), 0);
    }
    l.rlim_cur
}

/// Close with a reset (SO_LINGER 0): the peer's next write to it fails.
pub fn reset(s: TcpStream) {
    let lin = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setting a valid option on an open socket owned by `s`.
    unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&s),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &lin as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    drop(s);
}
