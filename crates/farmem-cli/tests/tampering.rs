//! An attacker on the path between a program and its memory server: a proxy that alters
//! frames after the handshake (a page's bytes, a header's fields, a tag), in either
//! direction. Every alteration must be detected, nothing altered may ever be read, and the
//! error must say what happened. (Before the secure channel, a proxy that altered written
//! pages and recomputed their CRC32C went unnoticed: the program read altered data.)

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use farmem_proto::channel::TAG_LEN;
use farmem_proto::{self as p, Header, IoClass, Kind, PageKey, PAGE_SIZE};
use farmem_runtime::backend::tcp::TcpBackend;
use farmem_runtime::backend::{Backend, PageBuf};

mod support;
use support::*;

const SECRET: &str = "tamper-secret";

/// Which byte of which frames the proxy flips.
#[derive(Clone, Copy, Debug)]
enum Flip {
    /// In a page of a Write (client to server).
    WrittenPage,
    /// In a header field of a request (its id).
    RequestHeader,
    /// In a page of a ReadOk (server to client).
    ReadPage,
    /// In the tag of a reply.
    ReplyTag,
}

/// A proxy to `target` that flips one byte in up to `budget` frames chosen by `flip`
/// (frames after the handshake only); counts what it altered.
struct Proxy {
    addr: String,
    altered: Arc<AtomicUsize>,
}

fn proxy(target: String, flip: Flip, budget: usize) -> Proxy {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let altered = Arc::new(AtomicUsize::new(0));
    let a = altered.clone();
    std::thread::spawn(move || {
        for client in l.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(&target) else {
                return;
            };
            for (from, to, upstream) in [
                (
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    true,
                ),
                (server, client, false),
            ] {
                let a = a.clone();
                std::thread::spawn(move || relay(from, to, upstream, flip, budget, &a));
            }
        }
    });
    Proxy { addr, altered }
}

/// Copy frames from `from` to `to`, altering those `flip` picks while the budget lasts.
fn relay(
    mut from: TcpStream,
    mut to: TcpStream,
    upstream: bool,
    flip: Flip,
    budget: usize,
    altered: &AtomicUsize,
) {
    // The first two frames each way are the handshake's, in clear (Hello, Auth; Challenge,
    // Welcome); every later one is sealed: body, then tag.
    let mut frames = 0;
    loop {
        let mut hb = [0u8; p::HEADER_LEN];
        if from.read_exact(&mut hb).is_err() {
            break;
        }
        let Ok(h) = Header::decode(&hb) else { break };
        let sealed = frames >= 2;
        frames += 1;
        let mut rest = vec![0u8; h.len as usize + if sealed { TAG_LEN } else { 0 }];
        if from.read_exact(&mut rest).is_err() {
            break;
        }
        let at = match (flip, upstream, h.kind) {
            (Flip::WrittenPage, true, Kind::Write) => Some(Place::Body(rest.len() - TAG_LEN - 1)),
            (Flip::RequestHeader, true, k) if sealed && k.is_request() => Some(Place::Header(8)),
            (Flip::ReadPage, false, Kind::ReadOk) => Some(Place::Body(rest.len() - TAG_LEN - 7)),
            (Flip::ReplyTag, false, k) if sealed && k.is_response() => {
                Some(Place::Body(rest.len() - 1))
            }
            _ => None,
        };
        if let Some(place) = at.filter(|_| sealed) {
            if altered.fetch_add(1, Ordering::Relaxed) < budget {
                match place {
                    Place::Header(i) => hb[i] ^= 0x01,
                    Place::Body(i) => rest[i] ^= 0x20,
                }
            } else {
                altered.fetch_sub(1, Ordering::Relaxed);
            }
        }
        if to.write_all(&hb).is_err() || to.write_all(&rest).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

enum Place {
    Header(usize),
    Body(usize),
}

fn backend(addr: &str) -> TcpBackend {
    let spec = farmem_runtime::TcpSpec {
        addr: addr.into(),
        tenant: "tampered".into(),
        token: farmem_proto::auth::Secret::from_text(SECRET),
        reconnect_window: Duration::from_secs(10),
    };
    TcpBackend::connect(spec).expect("connecting through the proxy")
}

fn keys(n: u64) -> Vec<PageKey> {
    (0..n).map(|page| PageKey { region: 1, page }).collect()
}

fn pattern(n: usize, round: u8) -> PageBuf {
    let mut b = PageBuf::new(n);
    b.set_len(n);
    for (i, x) in b.bytes_mut().iter_mut().enumerate() {
        *x = (i / PAGE_SIZE) as u8 ^ (i as u8).wrapping_mul(7) ^ round;
    }
    b
}

/// Requests altered on their way to the server: each is refused there (the connection
/// closes), the client reconnects and sends it again, and the pages stored and read back
/// are exactly the program's.
#[test]
fn requests_altered_on_the_way_are_refused_and_sent_again() {
    for flip in [Flip::WrittenPage, Flip::RequestHeader] {
        let server = Server::start(&format!("{SECRET}\n"), &["--metrics", "127.0.0.1:0"]);
        let px = proxy(server.addr.clone(), flip, 5);
        let b = backend(&px.addr);
        for round in 0..8u8 {
            b.submit_write(IoClass::WriteBack, keys(16), pattern(16, round))
                .wait(b.longest_wait())
                .unwrap_or_else(|e| panic!("{flip:?}: a write failed: {e}"));
            let got = b
                .submit_read(IoClass::Demand, keys(16), PageBuf::new(16))
                .wait(b.longest_wait())
                .unwrap_or_else(|e| panic!("{flip:?}: a read failed: {e}"));
            assert_eq!(
                got.buf.bytes(),
                pattern(16, round).bytes(),
                "{flip:?}: round {round} read back altered data"
            );
        }
        assert_eq!(px.altered.load(Ordering::Relaxed), 5, "{flip:?}");
        let bad = server.metric("farmem_server_bad_input_total");
        assert!(bad >= 5.0, "{flip:?}: {bad} alterations detected of 5");
        assert!(
            server.log().contains("failed authentication"),
            "{flip:?}: the reason is logged:\n{}",
            server.log()
        );
    }
}

/// Replies altered on their way to the program: the first one is caught, nothing of it is
/// handed to the program, and the backend stops with an error that says why.
#[test]
fn replies_altered_on_the_way_are_caught_and_stop_the_backend() {
    for flip in [Flip::ReadPage, Flip::ReplyTag] {
        let server = Server::start(&format!("{SECRET}\n"), &[]);
        let px = proxy(server.addr.clone(), flip, 1);
        let b = backend(&px.addr);
        let write = b
            .submit_write(IoClass::WriteBack, keys(4), pattern(4, 9))
            .wait(b.longest_wait());
        let read = b
            .submit_read(IoClass::Demand, keys(4), PageBuf::new(4))
            .wait(b.longest_wait());
        let err = match (flip, write, read) {
            // A tag altered on the write's reply: caught there, the read fails too.
            (_, Err(e), _) => e.to_string(),
            (_, Ok(_), Err(e)) => e.to_string(),
            (_, Ok(_), Ok(_)) => panic!("{flip:?}: an altered reply was accepted"),
        };
        assert!(
            err.contains("failed authentication") || err.contains("altered"),
            "{flip:?}: the error says what happened: {err}"
        );
        assert_eq!(px.altered.load(Ordering::Relaxed), 1, "{flip:?}");
    }
}
