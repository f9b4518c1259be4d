//! Each tenant may buffer its share of the server's memory for requests in flight, and only
//! a tenant over its share stops being read: half-sent writes stalled under several tenant
//! names cannot slow another tenant (they used to fill the server's whole limit and slow
//! everyone 27x until the frame timeout, here 10 minutes).
//!
//! Alone in its test binary: it compares timings.

mod support;

use std::time::{Duration, Instant};

use farmem_proto::{self as p, Header, IoClass, Kind};
use farmem_runtime::backend::tcp::TcpBackend;
use farmem_runtime::backend::{Backend, PageBuf, PageKey};
use farmem_runtime::PAGE_SIZE;
use support::raw::{raise_fd_limit, Raw};
use support::*;

const SECRET: &str = "share-secret";
const HOGS: usize = 6;

/// A connection of `tenant` that announces a write of `len` bytes and sends a little of it.
fn stall(addr: &str, tenant: &str, len: usize) -> Raw {
    let mut r = Raw::authenticated(addr, tenant, SECRET);
    let mut head = Vec::new();
    Header::new(Kind::Write, IoClass::WriteBack, 1, len).encode(&mut head);
    r.send(&head);
    r.send(&vec![7u8; len.min(100 << 10) / 2]);
    r
}

/// Body length of a write of `pages` pages.
fn write_len(pages: usize) -> usize {
    4 + pages * (16 + PAGE_SIZE)
}

/// Connect, write 1024 pages and read them back, checked.
fn workload(server: &Server, round: u8) -> Duration {
    let t = Instant::now();
    let b = TcpBackend::connect(server.spec("worker", SECRET)).expect("the client gets in");
    let batches = |f: &mut dyn FnMut(Vec<PageKey>, usize)| {
        for first in (0..1024).step_by(64) {
            f(
                (first..first + 64)
                    .map(|page| PageKey { region: 1, page })
                    .collect(),
                first as usize,
            );
        }
    };
    batches(&mut |keys, first| {
        let mut buf = PageBuf::new(keys.len());
        buf.set_len(keys.len());
        for (i, x) in buf.bytes_mut().iter_mut().enumerate() {
            *x = (first * PAGE_SIZE + i) as u8 ^ round;
        }
        b.submit_write(IoClass::WriteBack, keys, buf)
            .wait(b.longest_wait())
            .expect("write");
    });
    batches(&mut |keys, first| {
        let got = b
            .submit_read(IoClass::Demand, keys, PageBuf::new(64))
            .wait(b.longest_wait())
            .expect("read");
        for (i, x) in got.buf.bytes().iter().enumerate() {
            assert_eq!(*x, (first * PAGE_SIZE + i) as u8 ^ round);
        }
    });
    t.elapsed()
}

#[test]
fn stalled_frames_of_other_tenants_do_not_slow_a_tenant() {
    raise_fd_limit();
    // The frame timeout cannot be what rescues the worker here.
    let args = ["--metrics", "127.0.0.1:0", "--frame-timeout", "600"];
    let quiet = Server::start(&format!("{SECRET}\n"), &args);
    let mut hogged = Server::start(&format!("{SECRET}\n"), &args);
    // Each hog tenant announces writes on many connections and sends a little of each: the
    // largest ones first, together more than the server's whole buffer limit (512 MiB),
    // then smaller ones, to fill what is left to within a page.
    let mut stalled = Vec::new();
    let mut wanted = 0;
    for (count, pages) in [(24, p::MAX_BATCH_PAGES), (4, 64), (16, 1)] {
        for h in 0..HOGS {
            for _ in 0..count {
                stalled.push(stall(&hogged.addr, &format!("hog-{h}"), write_len(pages)));
                wanted += write_len(pages);
            }
        }
    }
    let wanted = wanted as f64;
    assert!(wanted > (512u64 << 20) as f64);
    wait_for("the hogs' frames to be held", || {
        hogged.metric("farmem_server_held_bytes") >= 0.9 * (512u64 << 20) as f64
    });
    let held = hogged.metric("farmem_server_held_bytes");
    eprintln!(
        "{} stalled frames announce {wanted} bytes; {held} are held",
        stalled.len()
    );
    assert!(
        held < wanted,
        "each hog is held to its share: {held} bytes held"
    );
    let runs = Alternated::run(&quiet, &hogged, 7, workload);
    let ((mq, ma), ratio) = (runs.medians(), runs.ratio());
    eprintln!(
        "workload median {mq:?} alone, {ma:?} beside {} stalled frames of {HOGS} tenants \
         (ratio {ratio:.2}); runs {:?} / {:?}",
        stalled.len(),
        runs.a,
        runs.b
    );
    assert!(
        ratio <= 2.0,
        "slowed down {ratio:.2}x by other tenants' stalled frames"
    );
    assert!(hogged.alive());
    drop(stalled);
    wait_for("the stalled frames' memory to be given back", || {
        hogged.metric("farmem_server_held_bytes") == 0.0
    });
}
