//! The metrics endpoint (`--metrics ADDR`): `GET /metrics` over HTTP/1.0 on its own thread.
//!
//! Connections are served side by side (non-blocking, one poll loop), each within a
//! deadline, and only so many at once (the oldest goes first): idle connections held open
//! cannot make a scrape wait (10 of them used to delay one by 20 s, each served in turn with
//! a 2 s read timeout).

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

use crate::metrics::Metrics;

const LISTENER: Token = Token(0);
/// A connection must have sent its request and taken the reply by then.
const DEADLINE: Duration = Duration::from_secs(5);
/// Connections served at once; a newer one drops the oldest.
const MAX_CONNS: usize = 64;
/// Longest request head read.
const MAX_REQUEST: usize = 8192;

struct HttpConn {
    sock: TcpStream,
    deadline: Instant,
    request: Vec<u8>,
    /// The reply, and how much of it was sent.
    reply: Option<(Vec<u8>, usize)>,
}

/// What a connection needs next.
enum Step {
    Wait,
    Done,
}

impl HttpConn {
    /// Read what arrived; once the request is whole (or the client stopped sending), build
    /// the reply; send what the socket takes.
    fn advance(&mut self, m: &Metrics) -> io::Result<Step> {
        if self.reply.is_none() {
            let mut buf = [0u8; 1024];
            let mut ended = false;
            loop {
                match self.sock.read(&mut buf) {
                    Ok(0) => {
                        ended = true;
                        break;
                    }
                    Ok(n) => {
                        self.request.extend_from_slice(&buf[..n]);
                        if self.request.len() >= MAX_REQUEST {
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            let whole = self.request.windows(4).any(|w| w == b"\r\n\r\n");
            if !(whole || ended || self.request.len() >= MAX_REQUEST) {
                return Ok(Step::Wait);
            }
            self.reply = Some((reply_to(&self.request, m), 0));
        }
        let (reply, sent) = self.reply.as_mut().expect("built above");
        while *sent < reply.len() {
            match self.sock.write(&reply[*sent..]) {
                Ok(0) => return Ok(Step::Done),
                Ok(n) => *sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Step::Wait),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Step::Done)
    }
}

/// The HTTP reply to a request head.
fn reply_to(request: &[u8], m: &Metrics) -> Vec<u8> {
    let text = String::from_utf8_lossy(request);
    let line = text.lines().next().unwrap_or("");
    let (status, body) = if line.starts_with("GET /metrics ") || line == "GET /metrics" {
        ("200 OK", m.render())
    } else {
        ("404 Not Found", "metrics are at /metrics\n".to_string())
    };
    format!(
        "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Take the connections waiting, making room by dropping the oldest.
fn accept(
    listener: &mut TcpListener,
    poll: &Poll,
    conns: &mut BTreeMap<usize, HttpConn>,
    next: &mut usize,
) {
    loop {
        let mut sock = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // WouldBlock, or out of descriptors: the next turn tries again.
            Err(_) => return,
        };
        if conns.len() >= MAX_CONNS {
            conns.pop_first();
        }
        let t = *next;
        *next += 1;
        let registered =
            poll.registry()
                .register(&mut sock, Token(t), Interest::READABLE | Interest::WRITABLE);
        if registered.is_ok() {
            let c = HttpConn {
                sock,
                deadline: Instant::now() + DEADLINE,
                request: Vec::new(),
                reply: None,
            };
            conns.insert(t, c);
        }
    }
}

/// Serve `GET /metrics` on `listener` until the process ends.
pub(crate) fn serve_http(listener: std::net::TcpListener, m: Arc<Metrics>) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    let mut listener = TcpListener::from_std(listener);
    let mut poll = Poll::new()?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    let mut events = Events::with_capacity(128);
    // By token; tokens grow with time, so the first is the oldest.
    let mut conns: BTreeMap<usize, HttpConn> = BTreeMap::new();
    let mut next = 1usize;
    loop {
        if let Err(e) = poll.poll(&mut events, Some(Duration::from_millis(250))) {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        for ev in events.iter() {
            if ev.token() == LISTENER {
                continue;
            }
            let t = ev.token().0;
            let Some(c) = conns.get_mut(&t) else { continue };
            if !matches!(c.advance(&m), Ok(Step::Wait)) {
                conns.remove(&t);
            }
        }
        // Every turn, not only on the listener's event: an accept that failed for want of
        // descriptors is not signalled again.
        accept(&mut listener, &poll, &mut conns, &mut next);
        let now = Instant::now();
        conns.retain(|_, c| c.deadline > now);
    }
}
