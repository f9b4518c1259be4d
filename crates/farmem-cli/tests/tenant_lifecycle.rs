//! Tenants come and go: a tenant with no pages and no sessions is forgotten (its metrics
//! too), so any number of throwaway names cannot fill the tenant table (4,093 used to lock
//! every new tenant out until a restart); and a program that says Goodbye has its pages
//! freed as soon as its last connection closes, while one that just loses its connections
//! keeps them for the session timeout.

mod support;

use std::time::{Duration, Instant};

use farmem_proto::{self as p, ErrorCode, Frame, IoClass, Kind, PageKey, PAGE_SIZE};
use farmem_runtime::backend::tcp::TcpBackend;
use farmem_runtime::backend::{Backend, PageBuf};
use support::raw::{connect_from, Raw};
use support::*;

const SECRET: &str = "lifecycle-secret";

#[test]
fn throwaway_tenant_names_do_not_fill_the_tenant_table() {
    let server = Server::start(&format!("{SECRET}\n"), &["--metrics", "127.0.0.1:0"]);
    let t = Instant::now();
    for i in 0..10_000 {
        drop(Raw::authenticated(
            &server.addr,
            &format!("throwaway-{i}"),
            SECRET,
        ));
    }
    eprintln!("10,000 tenants made and left in {:?}", t.elapsed());
    wait_for("the tenants to be forgotten", || {
        server.metric("farmem_server_tenants") == 0.0
    });
    assert_eq!(server.metric("farmem_server_sessions"), 0.0);
    // Their series left the metrics with them.
    assert!(!server
        .metrics()
        .iter()
        .any(|(k, _)| k.contains("throwaway-")));
    // A new tenant gets in and works.
    let b = TcpBackend::connect(server.spec("newcomer", SECRET)).expect("a new tenant gets in");
    let key = vec![PageKey { region: 1, page: 0 }];
    let mut buf = PageBuf::new(1);
    buf.set_len(1);
    buf.bytes_mut().fill(0x42);
    b.submit_write(IoClass::WriteBack, key.clone(), buf)
        .wait(b.longest_wait())
        .unwrap();
    let got = b
        .submit_read(IoClass::Demand, key, PageBuf::new(1))
        .wait(b.longest_wait())
        .unwrap();
    assert!(got.buf.bytes().iter().all(|&x| x == 0x42));
    assert_eq!(server.metric("farmem_server_tenants"), 1.0);
    assert_eq!(
        server.metric("farmem_tenant_stored_pages{tenant=\"newcomer\"}"),
        1.0
    );
}

/// Write `n` pages on a raw connection.
fn write_pages(r: &mut Raw, id: u64, n: u64) {
    let keys: Vec<PageKey> = (0..n).map(|page| PageKey { region: 3, page }).collect();
    let data = vec![0x5Au8; n as usize * PAGE_SIZE];
    let mut w = Vec::new();
    p::encode_write_head(&mut w, id, IoClass::WriteBack, &keys, &data);
    w.extend_from_slice(&data);
    let (h, _) = r.call(&w, id).expect("the write's reply");
    assert_eq!(h.kind, Kind::WriteOk);
}

fn goodbye(r: &mut Raw, id: u64, free_at_close: bool) -> Kind {
    let mut g = Vec::new();
    p::encode_goodbye(&mut g, id, &p::Goodbye { free_at_close });
    r.call(&g, id).map_or(Kind::Error, |(h, _)| h.kind)
}

fn stored(server: &Server, tenant: &str) -> f64 {
    server.metric(&format!(
        "farmem_tenant_stored_pages{{tenant=\"{tenant}\"}}"
    ))
}

#[test]
fn goodbye_frees_a_session_when_its_last_connection_closes() {
    let server = Server::start(&format!("{SECRET}\n"), &["--metrics", "127.0.0.1:0"]);
    let addr = server.addr.clone();
    // Without Goodbye, a program's lost connection leaves its pages for it to come back.
    let mut kept = Raw::authenticated_v(&addr, "keeper", SECRET, p::VERSION_MAX);
    write_pages(&mut kept, 1, 8);
    // Goodbye then its cancellation: the same as no Goodbye.
    assert_eq!(goodbye(&mut kept, 2, true), Kind::GoodbyeOk);
    assert_eq!(goodbye(&mut kept, 3, false), Kind::GoodbyeOk);
    drop(kept);
    // With Goodbye: freed when the connection closes.
    let mut leaving = Raw::authenticated_v(&addr, "leaver", SECRET, p::VERSION_MAX);
    assert_eq!(leaving.version, p::VERSION_MAX);
    write_pages(&mut leaving, 1, 8);
    assert_eq!(stored(&server, "leaver"), 8.0);
    assert_eq!(goodbye(&mut leaving, 2, true), Kind::GoodbyeOk);
    assert_eq!(stored(&server, "leaver"), 8.0, "not before it closes");
    let closed = Instant::now();
    drop(leaving);
    wait_for("the leaver's pages to be freed", || {
        stored(&server, "leaver") == 0.0
    });
    let took = closed.elapsed();
    assert!(took < Duration::from_secs(1), "freed after {took:?}");
    assert_eq!(server.metric("farmem_server_stored_pages"), 8.0);
    // The keeper's pages stay (for the session timeout, 120 s).
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(stored(&server, "keeper"), 8.0);
    assert_eq!(server.metric("farmem_server_sessions"), 1.0);
}

#[test]
fn goodbye_waits_for_the_last_connection() {
    let server = Server::start(&format!("{SECRET}\n"), &["--metrics", "127.0.0.1:0"]);
    let addr = server.addr.clone();
    // Two connections of one session (a second one resumes it).
    let mut a = Raw::authenticated_v(&addr, "pair", SECRET, p::VERSION_MAX);
    write_pages(&mut a, 1, 4);
    let session = a.session;
    let mut b = Raw::connect(&addr);
    b.session = session;
    b.session_key = a.session_key.clone();
    let v = b.handshake_resume("pair", SECRET, p::VERSION_MAX);
    assert!(
        matches!(v, Ok(Frame::Welcome(w)) if w.resumed && w.session_pages == 4),
        "{v:?}"
    );
    assert_eq!(goodbye(&mut a, 2, true), Kind::GoodbyeOk);
    drop(a);
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(stored(&server, "pair"), 4.0, "one connection is still open");
    drop(b);
    wait_for("the pair's pages to be freed", || {
        stored(&server, "pair") == 0.0
    });
}

/// A session is joined with its key, not its id: a client that knows the shared secret and
/// a session id seen (or guessed) cannot join another program's session and read its pages.
#[test]
fn a_stolen_session_id_does_not_open_the_session() {
    let server = Server::start(&format!("{SECRET}\n"), &["--metrics", "127.0.0.1:0"]);
    let addr = server.addr.clone();
    let mut owner = Raw::authenticated(&addr, "victim", SECRET);
    write_pages(&mut owner, 1, 3);
    let other = Raw::authenticated(&addr, "victim", SECRET);
    let mut thief_address = 0u8;
    for (what, key) in [
        ("no key", None),
        ("another session's key", other.session_key.clone()),
    ] {
        for resume in [false, true] {
            // Each attempt from its own address, so that none is in the failures' back-off.
            thief_address += 1;
            let from = std::net::Ipv4Addr::new(127, 0, 9, thief_address);
            let mut t = Raw::wrap(connect_from(from, &addr).unwrap());
            t.session = owner.session;
            t.session_key = key.clone();
            let v = if resume {
                t.handshake_resume("victim", SECRET, p::VERSION_MAX)
            } else {
                t.handshake("victim", SECRET, p::VERSION_MAX)
            };
            assert!(
                matches!(&v, Ok(Frame::Error(e)) if e.code == ErrorCode::AuthFailed),
                "{what}, resume {resume}: {v:?}"
            );
        }
    }
    // The owner's own second connection gets in, and the pages are there.
    let mut second = Raw::connect(&addr);
    second.session = owner.session;
    second.session_key = owner.session_key.clone();
    let v = second.handshake_resume("victim", SECRET, p::VERSION_MAX);
    assert!(
        matches!(v, Ok(Frame::Welcome(w)) if w.resumed && w.session_pages == 3),
        "{v:?}"
    );
    assert_eq!(stored(&server, "victim"), 3.0);
}

/// Clients from before the secure channel (versions 1 to 3) are refused with the reason.
#[test]
fn clients_without_the_secure_channel_are_refused() {
    let server = Server::start(&format!("{SECRET}\n"), &[]);
    let mut old = Raw::connect(&server.addr);
    let v = old.handshake("old", SECRET, 3);
    assert!(
        matches!(&v, Ok(Frame::Error(e)) if e.code == ErrorCode::Version
            && e.message.contains("no common protocol version")),
        "{v:?}"
    );
    assert!(old.closed_by_server());
}
