//! Bad input: garbage, truncated, oversized and out-of-order frames close the offending
//! connection and nothing else; the server stays up, bounded in memory, serving a
//! well-behaved client at the same time. Checksums are enforced on both ends.

mod support;

use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use farmem_proto::auth::Secret;
use farmem_proto::{self as p, ErrorCode, Frame, Header, Kind};
use farmem_runtime::backend::tcp::TcpBackend;
use farmem_runtime::backend::{Backend, IoClass, PageBuf, PageKey};
use farmem_runtime::PAGE_SIZE;
use farmem_sys::random::random_bytes;
use support::raw::Raw;
use support::*;

const SECRET: &str = "bad-input-secret";

fn read_req(id: u64) -> Vec<u8> {
    let mut out = Vec::new();
    p::encode_read(
        &mut out,
        id,
        IoClass::Demand,
        &[PageKey { region: 1, page: 0 }],
    );
    out
}

#[test]
fn bad_frames_close_only_their_connection_while_others_are_served() {
    // A long frame timeout: the stalled frames below must be survived by the per-tenant
    // budget, not by disconnecting them.
    let mut server = Server::start(
        &format!("{SECRET}\n"),
        &["--metrics", "127.0.0.1:0", "--frame-timeout", "600"],
    );
    let rss_before = server.rss_kib();
    let addr = server.addr.clone();
    let done = AtomicBool::new(false);
    let rounds = AtomicU64::new(0);
    std::thread::scope(|s| {
        // A well-behaved program, working through the attack: 8 MiB through 1 MiB local.
        let good = s.spawn(|| {
            let rt = server.runtime("good", SECRET, 1 << 20);
            let pages = 2048;
            let r = rt.create_region(pages * PAGE_SIZE).unwrap();
            while !done.load(Ordering::Relaxed) || rounds.load(Ordering::Relaxed) < 2 {
                let round = rounds.load(Ordering::Relaxed);
                for p in 0..pages {
                    let q = r.as_mut_ptr().wrapping_add(p * PAGE_SIZE) as *mut u64;
                    // SAFETY: inside the region.
                    unsafe { q.write(p as u64 ^ round) };
                }
                for p in 0..pages {
                    // SAFETY: inside the region.
                    let v = unsafe { (r.as_ptr().add(p * PAGE_SIZE) as *const u64).read() };
                    assert_eq!(v, p as u64 ^ round, "good client, page {p}");
                }
                rounds.fetch_add(1, Ordering::Relaxed);
            }
        });
        let _stop = StopFlag(&done);
        let mut closed = 0;
        let mut expect_closed = |mut r: Raw, what: &str| {
            assert!(r.closed_by_server(), "{what}: connection should be closed");
            closed += 1;
        };
        // Garbage of every size.
        for i in 0..20usize {
            let mut r = Raw::connect(&addr);
            let junk: Vec<u8> = (0..(1 + i * 300)).map(|_| random_bytes::<1>()[0]).collect();
            r.send(&junk);
            r.send(&[0xFF; p::HEADER_LEN]); // an invalid kind, in case the junk was short
            expect_closed(r, "garbage");
        }
        // A header announcing 4 GiB: refused from the header, nothing buffered.
        let mut r = Raw::connect(&addr);
        let mut h = Vec::new();
        Header::new(Kind::Write, IoClass::WriteBack, 1, 0).encode(&mut h);
        h[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        r.send(&h);
        expect_closed(r, "oversized");
        // A large frame before authenticating: refused on its header, nothing allocated.
        let mut r = Raw::connect(&addr);
        let mut h = Vec::new();
        Header::new(Kind::Write, IoClass::WriteBack, 1, Kind::Write.max_body()).encode(&mut h);
        r.send(&h);
        expect_closed(r, "a large frame before the handshake");
        // A request before the handshake, and a server's frame sent by a client.
        let mut r = Raw::connect(&addr);
        r.send(&read_req(1));
        expect_closed(r, "request before the handshake");
        let mut r = Raw::authenticated(&addr, "rogue", SECRET);
        let mut ok = Vec::new();
        p::encode_write_ok(
            &mut ok,
            9,
            IoClass::Demand,
            &p::WriteOk {
                new_pages: 0,
                session_pages: 0,
            },
        );
        r.send_frame(&ok);
        expect_closed(r, "a reply sent by a client");
        // The same request id twice while the first is in flight.
        let mut r = Raw::authenticated(&addr, "rogue", SECRET);
        r.send_frames(&[&read_req(5), &read_req(5)]);
        expect_closed(r, "a reused request id");
        // A wrong proof.
        let mut r = Raw::connect(&addr);
        let mut hello = Vec::new();
        p::encode_hello(
            &mut hello,
            &p::Hello {
                min_version: p::VERSION_MIN,
                max_version: p::VERSION_MAX,
                session: [1; 16],
                nonce: [2; 32],
                resume: false,
                tenant: "rogue",
                share: Some([9; 32]),
            },
        );
        r.send(&hello);
        assert!(r.frame().is_some(), "challenge");
        let mut auth = Vec::new();
        p::encode_auth(
            &mut auth,
            &p::Auth {
                proof: [0; 32],
                session_proof: None,
            },
        );
        r.send(&auth);
        let (h, body) = r.frame().expect("an error frame");
        assert!(
            matches!(p::decode(&h, &body), Ok(Frame::Error(e)) if e.code == ErrorCode::AuthFailed)
        );
        expect_closed(r, "a wrong proof");
        // Truncated frames: a large write that stops halfway, and half a header, then the
        // client goes away. Many of them at once.
        let mut stalled = Vec::new();
        for i in 0..30 {
            let mut r = Raw::authenticated(&addr, "rogue", SECRET);
            let mut h = Vec::new();
            Header::new(Kind::Write, IoClass::WriteBack, 1, Kind::Write.max_body()).encode(&mut h);
            r.send(&h);
            r.send(&vec![7u8; if i % 2 == 0 { 1 << 20 } else { 10 }]);
            stalled.push(r);
        }
        for _ in 0..30 {
            let mut r = Raw::connect(&addr);
            r.send(&[16, 0, 0]);
            stalled.push(r);
        }
        // One tenant stalls large frames on many connections: more than the whole server's
        // budget for requests in flight, had it no share per tenant. The other tenant's
        // program keeps going meanwhile.
        // Largest frames first, then smaller ones to fill what is left.
        let small = 4 + 64 * (p::WRITE_KEY_LEN + PAGE_SIZE);
        for i in 0..185 {
            let mut r = Raw::authenticated(&addr, "hog", SECRET);
            let len = if i < 125 {
                Kind::Write.max_body()
            } else {
                small
            };
            let mut h = Vec::new();
            Header::new(Kind::Write, IoClass::WriteBack, 1, len).encode(&mut h);
            r.send(&h);
            r.send(&vec![3u8; 100 << 10]);
            stalled.push(r);
        }
        let r0 = rounds.load(Ordering::Relaxed);
        wait_for(
            "the good program to progress while frames are stalled",
            || rounds.load(Ordering::Relaxed) >= r0 + 2,
        );
        drop(stalled);
        // The server refuses a page whose checksum does not match, keeping the connection.
        let mut r = Raw::authenticated(&addr, "checksums", SECRET);
        let key = [PageKey { region: 4, page: 2 }];
        let page = vec![0x5Au8; PAGE_SIZE];
        let mut w = Vec::new();
        p::encode_write_head(&mut w, 11, IoClass::WriteBack, &key, &page);
        w.extend(std::iter::repeat_n(0x5Bu8, PAGE_SIZE)); // not the checksummed contents
        r.send_frame(&w);
        let (h, body) = r.frame().expect("a reply");
        assert!(
            matches!(p::decode(&h, &body), Ok(Frame::Error(e)) if e.code == ErrorCode::Checksum),
            "{:?}",
            p::decode(&h, &body)
        );
        r.send_frame(&read_req(12));
        let mut rk = Vec::new();
        p::encode_read(&mut rk, 13, IoClass::Demand, &key);
        r.send_frame(&rk);
        let mut codes = Vec::new();
        for _ in 0..2 {
            let (h, body) = r.frame().expect("replies on the same connection");
            if let Ok(Frame::Error(e)) = p::decode(&h, &body) {
                codes.push(e.code);
            }
        }
        assert_eq!(
            codes,
            [ErrorCode::NotFound, ErrorCode::NotFound],
            "nothing was stored"
        );
        done.store(true, Ordering::Relaxed);
        assert_eq!(closed, 26, "20 garbage + 6 protocol violations");
        good.join().unwrap();
    });
    assert!(server.alive(), "the server survived: {}", server.log());
    let bad = server.metric("farmem_server_bad_input_total");
    assert!(bad >= 25.0, "bad connections counted: {bad}");
    // Every byte held for requests and replies was given back.
    wait_for("the memory held for requests to return to zero", || {
        server.metric("farmem_server_held_bytes") == 0.0
    });
    assert!(
        server.log().contains("sent bad input"),
        "reasons are logged"
    );
    // Nothing was kept of the attack: the store and the server's memory stay small.
    let rss = server.rss_kib();
    assert!(
        rss < rss_before + 200 * 1024,
        "server memory grew from {rss_before} to {rss} KiB"
    );
}

#[test]
fn a_client_stalled_mid_frame_is_disconnected_and_an_idle_one_is_not() {
    let server = Server::start(&format!("{SECRET}\n"), &["--frame-timeout", "1"]);
    let mut idle = Raw::authenticated(&server.addr, "idle", SECRET);
    let mut stalled = Raw::authenticated(&server.addr, "stalled", SECRET);
    let mut h = Vec::new();
    Header::new(Kind::Write, IoClass::WriteBack, 1, Kind::Write.max_body()).encode(&mut h);
    stalled.send(&h);
    stalled.send(&[1u8; 1000]);
    assert!(
        stalled.closed_by_server(),
        "the stalled client is disconnected"
    );
    // Between frames, silence is fine.
    std::thread::sleep(Duration::from_millis(2500));
    let mut stats = Vec::new();
    p::encode_empty(&mut stats, Kind::Stats, 1);
    idle.send_frame(&stats);
    let (h, _) = idle.frame().expect("the idle client is still served");
    assert_eq!(h.kind, Kind::StatsOk);
    wait_for("the stall in the log", || {
        server.log().contains("middle of a frame")
    });
}

struct StopFlag<'a>(&'a AtomicBool);

impl Drop for StopFlag<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A fake server that authenticates properly but corrupts every page it returns.
fn corrupting_server(secret: &'static str) -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            std::thread::spawn(move || serve_corrupting(s, secret));
        }
    });
    addr
}

fn serve_corrupting(s: TcpStream, secret: &str) {
    let mut r = Raw::wrap(s);
    let welcome = p::Welcome {
        proof: [0; 32],
        resumed: false,
        session_pages: 0,
        quota_pages: 1 << 20,
        capacity_pages: 1 << 20,
        max_batch: 256,
        window_pages: 4096,
    };
    if r.accept(secret, welcome).is_none() {
        return;
    }
    let mut out = Vec::new();
    while let Some((h, body)) = r.frame() {
        out.clear();
        match p::decode(&h, &body).unwrap() {
            Frame::Read(rq) => {
                let n = rq.len();
                let good = vec![1u8; PAGE_SIZE];
                let crcs = vec![p::page_crc(&good); n];
                p::encode_read_ok_head(&mut out, h.id, h.class, &crcs);
                for i in 0..n {
                    let mut page = good.clone();
                    page[i % PAGE_SIZE] ^= 0x40; // one flipped bit per page
                    out.extend(page);
                }
            }
            Frame::Close => p::encode_free_ok(
                &mut out,
                h.id,
                &p::FreeOk {
                    freed: 0,
                    session_pages: 0,
                },
            ),
            _ => p::encode_write_ok(
                &mut out,
                h.id,
                h.class,
                &p::WriteOk {
                    new_pages: 0,
                    session_pages: 0,
                },
            ),
        }
        r.send_frame(&out);
    }
}

#[test]
fn client_refuses_pages_whose_checksum_does_not_match() {
    let addr = corrupting_server("fake-secret");
    let spec = farmem_runtime::TcpSpec {
        addr,
        tenant: "victim".into(),
        token: Secret::from_text("fake-secret"),
        reconnect_window: Duration::from_secs(5),
    };
    let b = TcpBackend::connect(spec).unwrap();
    let keys: Vec<PageKey> = (0..3).map(|page| PageKey { region: 1, page }).collect();
    let e = b
        .submit_read(IoClass::Demand, keys, PageBuf::new(3))
        .wait(b.longest_wait())
        .err()
        .expect("a corrupted page must not be accepted")
        .to_string();
    assert!(e.contains("bad checksum"), "{e}");
    assert!(b
        .counters()
        .iter()
        .any(|&(n, v)| n == "tcp_checksum_errors" && v == 1));
}
