//! Idle connections held open by anyone who can reach the port do not lock programs out or
//! slow them down: connections that have not authenticated have their own pool, in which a
//! newcomer displaces the oldest handshake of the busiest address, and the refusals are
//! logged a few lines at a time. (Before: 1,030 idle connections made every client fail
//! with too_busy, and each refusal logged a line.)
//!
//! Alone in its test binary: it compares timings.

mod support;

use std::net::{Ipv4Addr, TcpStream};
use std::time::{Duration, Instant};

use farmem_runtime::backend::tcp::TcpBackend;
use farmem_runtime::backend::{Backend, IoClass, PageBuf, PageKey};
use farmem_runtime::PAGE_SIZE;
use support::raw::{connect_from, raise_fd_limit};
use support::*;

const SECRET: &str = "lockout-secret";
const IDLE: usize = 2000;
const PAGES: u64 = 1024;
const BATCH: u64 = 64;

/// A program's small workload from connecting on: write `PAGES` pages and read them back,
/// checked. Returns how long it took.
fn workload(server: &Server, round: u8) -> Duration {
    let t = Instant::now();
    let b = TcpBackend::connect(server.spec("worker", SECRET)).expect("the client gets in");
    for first in (0..PAGES).step_by(BATCH as usize) {
        let keys: Vec<PageKey> = (first..first + BATCH)
            .map(|page| PageKey { region: 1, page })
            .collect();
        let mut buf = PageBuf::new(keys.len());
        buf.set_len(keys.len());
        for (i, x) in buf.bytes_mut().iter_mut().enumerate() {
            *x = (first as usize * PAGE_SIZE + i) as u8 ^ round;
        }
        b.submit_write(IoClass::WriteBack, keys, buf)
            .wait(b.longest_wait())
            .expect("write");
    }
    for first in (0..PAGES).step_by(BATCH as usize) {
        let keys: Vec<PageKey> = (first..first + BATCH)
            .map(|page| PageKey { region: 1, page })
            .collect();
        let got = b
            .submit_read(IoClass::Demand, keys, PageBuf::new(BATCH as usize))
            .wait(b.longest_wait())
            .expect("read");
        for (i, x) in got.buf.bytes().iter().enumerate() {
            assert_eq!(*x, (first as usize * PAGE_SIZE + i) as u8 ^ round);
        }
    }
    drop(b);
    t.elapsed()
}

#[test]
fn idle_unauthenticated_connections_neither_lock_out_nor_slow_a_client() {
    assert!(
        raise_fd_limit() as usize > IDLE + 200,
        "too few descriptors"
    );
    // Two servers alike, one of them under attack; the runs alternate between them so that
    // whatever else the machine does weighs on both alike. Handshakes may take a minute
    // here: the idle connections stay in the pool for the whole measurement.
    let args = ["--metrics", "127.0.0.1:0", "--handshake-timeout", "60"];
    let quiet = Server::start(&format!("{SECRET}\n"), &args);
    let attacked = Server::start(&format!("{SECRET}\n"), &args);
    for r in 0..2 {
        workload(&quiet, r);
        workload(&attacked, r);
    }
    // Half of them from the client's own address, half from twenty others.
    let lines_before = attacked.log().lines().count();
    let mut idle: Vec<TcpStream> = Vec::with_capacity(IDLE);
    for i in 0..IDLE {
        let from = if i % 2 == 0 {
            Ipv4Addr::new(127, 0, 0, 1)
        } else {
            Ipv4Addr::new(127, 0, 0, 2 + (i % 20) as u8)
        };
        idle.push(connect_from(from, &attacked.addr).expect("connecting"));
    }
    wait_for("the server to take in the idle connections", || {
        attacked.metric("farmem_server_connections_total") >= IDLE as f64
    });
    let pool = attacked.metric("farmem_server_unauthenticated_connections");
    assert!(
        (200.0..=256.0).contains(&pool),
        "the handshake pool is full and bounded: {pool} unauthenticated connections"
    );
    let runs = Alternated::run(&quiet, &attacked, 15, workload);
    let ((mq, ma), ratio) = (runs.medians(), runs.ratio());
    eprintln!(
        "workload median {mq:?} without idle connections, {ma:?} with {IDLE} (ratio \
         {ratio:.2}); runs {:?} / {:?}",
        runs.a, runs.b
    );
    assert!(ratio <= 1.2, "slowed down {ratio:.2}x by idle connections");
    let refused = attacked.metric_all("farmem_server_refused_connections_total");
    assert!(
        refused >= (IDLE - 256) as f64,
        "idle connections were dropped to make room: {refused}"
    );
    assert!(attacked.metric("farmem_server_errors_total{code=\"too_busy\"}") > 0.0);
    drop(idle);
    // The refusals beyond the first few are summed up in a line once the interval (10 s)
    // is over.
    wait_for("the summary of the refusals in the log", || {
        attacked.log().contains("in the last 10 s")
    });
    let log = attacked.log();
    let added = log.lines().count() - lines_before;
    assert!(
        added <= 30,
        "{added} log lines for {IDLE} refused connections:\n{log}"
    );
}
