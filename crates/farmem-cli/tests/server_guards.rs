//! What an attacker could do to a server without hanging it, tampering or locking clients
//! out: guess secrets (its address is slowed down), stop taking replies (disconnected
//! after the frame timeout), idle on the metrics port (scrapes are answered beside it), and
//! die with prefetches queued past their deadline (the server used to panic answering them).

mod support;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::time::{Duration, Instant};

use farmem_proto::{self as p, ErrorCode, Frame, IoClass, Kind, PageKey, PAGE_SIZE};
use support::raw::{connect_from, reset, Raw};
use support::*;

const SECRET: &str = "guards-secret";

fn error_code(f: &Result<Frame<'static>, String>) -> Option<ErrorCode> {
    match f {
        Ok(Frame::Error(e)) => Some(e.code),
        _ => None,
    }
}

#[test]
fn failed_authentications_slow_their_address_down() {
    let server = Server::start(&format!("{SECRET}\n"), &["--metrics", "127.0.0.1:0"]);
    let guesser = Ipv4Addr::new(127, 0, 0, 7);
    let lines_before = server.log().lines().count();
    let attempts = 200;
    let (mut examined, mut refused) = (0, 0);
    let mut last_examined = Instant::now();
    for i in 0..attempts {
        let mut r = Raw::wrap(connect_from(guesser, &server.addr).unwrap());
        let verdict = r.handshake("victim", &format!("guess-{i}"), p::VERSION_MAX);
        match error_code(&verdict) {
            Some(ErrorCode::AuthFailed) => {
                examined += 1;
                last_examined = Instant::now();
            }
            Some(ErrorCode::TooBusy) => refused += 1,
            _ => panic!("attempt {i}: {verdict:?}"),
        }
    }
    // The guesser's address is refused even with the right secret for now; another address
    // is not slowed down at all. "For now" is the back-off window (100 ms after the first
    // strike past the free ones): a loaded machine may take longer than that to get here,
    // and then the right secret is welcome again.
    let mut r = Raw::wrap(connect_from(guesser, &server.addr).unwrap());
    let v = r.handshake("victim", SECRET, p::VERSION_MAX);
    let right_secret_refused = error_code(&v).is_some();
    if right_secret_refused || last_examined.elapsed() < Duration::from_millis(100) {
        assert_eq!(error_code(&v), Some(ErrorCode::TooBusy), "{v:?}");
        assert!(format!("{v:?}").contains("failed authentications"), "{v:?}");
    }
    Raw::authenticated(&server.addr, "victim", SECRET);
    eprintln!("{attempts} guesses: {examined} examined, {refused} refused unexamined");
    assert!(
        examined <= 20,
        "{examined} of {attempts} guesses were examined"
    );
    assert_eq!(examined + refused, attempts);
    assert_eq!(
        server.metric("farmem_server_auth_failures_total"),
        examined as f64
    );
    assert_eq!(
        server.metric("farmem_server_refused_connections_total{reason=\"auth_backoff\"}"),
        (refused + usize::from(right_secret_refused)) as f64
    );
    // A few lines in full, the rest counted (summed up when the interval ends): bounded
    // however many guesses, even if an interval ends during the test.
    let added = server.log().lines().count() - lines_before;
    assert!(added <= 30, "{added} log lines:\n{}", server.log());
}

#[test]
fn a_client_that_stops_taking_replies_is_disconnected() {
    let server = Server::start(
        &format!("{SECRET}\n"),
        &["--metrics", "127.0.0.1:0", "--frame-timeout", "1"],
    );
    let mut r = Raw::authenticated(&server.addr, "sleepy", SECRET);
    let keys: Vec<PageKey> = (0..64).map(|page| PageKey { region: 1, page }).collect();
    let data = vec![0x11u8; 64 * PAGE_SIZE];
    let mut w = Vec::new();
    p::encode_write_head(&mut w, 1, IoClass::WriteBack, &keys, &data);
    w.extend_from_slice(&data);
    let (h, _) = r.call(&w, 1).expect("the write's reply");
    assert_eq!(h.kind, Kind::WriteOk);
    // 15 MiB of replies asked for, none taken: more than the sockets hold.
    let reads: Vec<Vec<u8>> = (2..62)
        .map(|id| {
            let mut read = Vec::new();
            p::encode_read(&mut read, id, IoClass::Demand, &keys);
            read
        })
        .collect();
    r.send_frames(&reads.iter().map(|r| &r[..]).collect::<Vec<_>>());
    wait_for("the server to give up on the client", || {
        server.log().contains("took none of its replies")
    });
    assert!(r.closed_by_server());
    wait_for("what the replies held to be given back", || {
        server.metric("farmem_server_held_bytes") == 0.0
    });
}

#[test]
fn the_metrics_endpoint_answers_beside_idle_connections() {
    let server = Server::start(&format!("{SECRET}\n"), &["--metrics", "127.0.0.1:0"]);
    let maddr = server.metrics.clone().unwrap();
    let idle: Vec<TcpStream> = (0..10)
        .map(|_| TcpStream::connect(&maddr).unwrap())
        .collect();
    // One that sent half a request, too.
    let mut half = TcpStream::connect(&maddr).unwrap();
    half.write_all(b"GET /metr").unwrap();
    let t = Instant::now();
    let up = server.metric("farmem_server_uptime_seconds");
    let took = t.elapsed();
    assert!(up >= 0.0);
    // Served in turn with a 2 s read timeout each, this took 20 s.
    assert!(
        took < Duration::from_secs(2),
        "a scrape took {took:?} beside 10 idle connections"
    );
    // Idle ones are closed after their deadline (5 s).
    let mut first = idle.into_iter().next().unwrap();
    first
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut b = [0u8; 16];
    assert!(matches!(first.read(&mut b), Ok(0) | Err(_)));
}

/// Prefetch reads wait behind the bandwidth cap until their deadline passes; their client
/// resets its connection meanwhile without the server noticing (it is not reading that
/// connection: its window is full). Answering the expired prefetches `Late` fails on the
/// first and closes the connection; the others used to find it gone and panic the server.
#[test]
fn expired_prefetches_of_a_connection_that_died_do_not_take_the_server_down() {
    let mut server = Server::start(
        &format!("{SECRET}\n"),
        &["--metrics", "127.0.0.1:0", "--max-bandwidth", "4K"],
    );
    // One page per second: two reads of 1024 pages leave the bucket owing 1024 s.
    let mut drain = Raw::authenticated_v(&server.addr, "t", SECRET, p::VERSION_MAX);
    let keys: Vec<PageKey> = (0..1024).map(|page| PageKey { region: 9, page }).collect();
    for id in 1..=2 {
        let mut rq = Vec::new();
        p::encode_read(&mut rq, id, IoClass::Demand, &keys);
        let (h, body) = drain.call(&rq, id).expect("a reply");
        assert!(
            matches!(p::decode(&h, &body), Ok(Frame::Error(e)) if e.code == ErrorCode::NotFound)
        );
    }
    // Prefetch reads useful for about a second: five fill the window, the sixth waits.
    let mut victim = Raw::authenticated_v(&server.addr, "t", SECRET, p::VERSION_MAX);
    assert!(victim.version >= p::VERSION_USEFUL_FOR);
    let reads: Vec<Vec<u8>> = (1..=6)
        .map(|id| {
            let mut out = Vec::new();
            p::encode_read_useful_for(&mut out, id, IoClass::Prefetch, &keys, u16::MAX);
            out
        })
        .collect();
    victim.send_frames(&reads.iter().map(|r| &r[..]).collect::<Vec<_>>());
    std::thread::sleep(Duration::from_millis(300));
    reset(victim.s);
    // Past the deadline (65535 x 16 us), the server answers them: it must survive that.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(server.alive(), "the server died:\n{}", server.log());
    let mut later = Raw::authenticated_v(&server.addr, "t", SECRET, p::VERSION_MAX);
    let mut stats = Vec::new();
    p::encode_empty(&mut stats, Kind::Stats, 77);
    let (h, _) = later.call(&stats, 77).expect("served after");
    assert_eq!(h.kind, Kind::StatsOk);
    wait_for("the dead connection's holdings to be given back", || {
        // Only what the drained connection's bucket debt leaves: nothing is held.
        server.metric("farmem_server_held_bytes") == 0.0
    });
}
