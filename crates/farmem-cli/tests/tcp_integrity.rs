//! The core integrity tests with their pages in a real `farmem server` process: churn (zero
//! mismatches, also while a proxy cuts every connection again and again: the client must
//! reconnect, resume its session and re-send exactly what was unanswered), and sequential
//! scans with read-ahead windows in flight over the network.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use farmem_runtime::testing::churn::{churn, BUDGET};
use farmem_runtime::testing::scans::overlapping_scans;
use farmem_runtime::{BackendSpec, Config, Runtime};
use support::*;

#[test]
fn integrity_under_churn_over_tcp() {
    let server = Server::shared("churn-secret");
    let rt = server.runtime("churn", "churn-secret", BUDGET as u64);
    assert!(rt.backend_name().starts_with("tcp://churn@127.0.0.1:"));
    churn(rt.clone());
    let report = rt.report();
    assert!(report.contains("tcp_pages_written"), "{report}");
    // The server saw the traffic, and the session is freed when the runtime goes.
    assert!(server.metric("farmem_server_pages_total{op=\"write\"}") > 0.0);
    assert!(server.metric("farmem_server_pages_total{op=\"read\"}") > 0.0);
    drop(rt);
    wait_for("the session's pages to be freed", || {
        server.metric("farmem_server_stored_pages") == 0.0
    });
    assert_eq!(
        server.metric("farmem_server_errors_total{code=\"checksum\"}"),
        0.0
    );
}

#[test]
fn integrity_while_connections_are_cut() {
    let server = Server::shared("cut-secret");
    let proxy = Proxy::start(&server.addr);
    let mut spec = server.spec("cuts", "cut-secret");
    spec.addr = proxy.addr.clone();
    let rt = Runtime::new(Config {
        local_mem: BUDGET as u64,
        backend: BackendSpec::Tcp(spec),
        ..Config::default()
    })
    .unwrap();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(150));
                proxy.cut();
            }
        });
        let _stop = farmem_runtime::testing::StopOnDrop(&done);
        churn(rt.clone());
    });
    let cuts = proxy.cuts.load(Ordering::Relaxed);
    let report = rt.report();
    let counter = |name: &str| {
        report
            .lines()
            .find(|l| l.trim_start().starts_with(name))
            .and_then(|l| l.split_whitespace().last()?.parse::<u64>().ok())
            .unwrap()
    };
    let (reconnects, resent) = (counter("tcp_reconnects"), counter("tcp_resent_requests"));
    eprintln!("{cuts} cuts, {reconnects} reconnections, {resent} requests re-sent");
    assert!(cuts >= 3, "the proxy cut connections during the run");
    assert!(reconnects >= 3, "the client reconnected: {report}");
    // With dozens of cuts in the middle of heavy traffic, some requests were in flight.
    assert!(resent > 0, "unanswered requests were re-sent: {report}");
}

#[test]
fn scans_with_readahead_in_flight_over_tcp() {
    let server = Server::shared("scan-secret");
    let rt = server.runtime(
        "scans",
        "scan-secret",
        farmem_runtime::testing::scans::BUDGET,
    );
    overlapping_scans(rt.clone());
    assert!(rt.stats().prefetch_batches > 200, "{}", rt.stats());
}
