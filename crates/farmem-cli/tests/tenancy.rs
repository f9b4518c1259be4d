//! Tenancy and security of the memory server: separate namespaces per tenant and per
//! program, authentication by challenge-response, quotas and capacity that keep pages local
//! instead of dropping them, metrics, clean shutdown.

mod support;

use farmem_runtime::backend::tcp::TcpBackend;
use farmem_runtime::backend::{Backend, BackendError, IoClass, PageBuf, PageKey};
use farmem_runtime::{BackendSpec, Config, Runtime, PAGE_SIZE};
use support::*;

const TOKENS: &str = "# two tenants with their own secrets\n\
                      alice s-alice weight=2\n\
                      bob   s-bob   quota=1M\n";

fn keys(region: u32, pages: std::ops::Range<u64>) -> Vec<PageKey> {
    pages.map(|page| PageKey { region, page }).collect()
}

fn filled(n: usize, seed: u8) -> PageBuf {
    let mut b = PageBuf::new(n);
    b.set_len(n);
    for (i, x) in b.bytes_mut().iter_mut().enumerate() {
        *x = (i / PAGE_SIZE) as u8 ^ seed ^ (i as u8).wrapping_mul(7);
    }
    b
}

fn write(b: &TcpBackend, keys: Vec<PageKey>, seed: u8) {
    let n = keys.len();
    b.submit_write(IoClass::WriteBack, keys, filled(n, seed))
        .wait(b.longest_wait())
        .expect("write");
}

fn read(b: &TcpBackend, keys: Vec<PageKey>) -> Result<Vec<u8>, BackendError> {
    let n = keys.len();
    b.submit_read(IoClass::Demand, keys, PageBuf::new(n))
        .wait(b.longest_wait())
        .map(|d| d.buf.bytes().to_vec())
}

#[test]
fn tenants_and_programs_with_the_same_region_ids_cannot_see_each_other() {
    let server = Server::start(TOKENS, &["--metrics", "127.0.0.1:0"]);
    let alice = TcpBackend::connect(server.spec("alice", "s-alice")).unwrap();
    let bob = TcpBackend::connect(server.spec("bob", "s-bob")).unwrap();
    write(&alice, keys(1, 0..8), 0xA1);
    write(&bob, keys(1, 0..4), 0xB0);
    // Each reads its own pages under the same (region, page) names.
    assert_eq!(
        read(&alice, keys(1, 0..8)).unwrap(),
        filled(8, 0xA1).bytes()
    );
    assert_eq!(read(&bob, keys(1, 0..4)).unwrap(), filled(4, 0xB0).bytes());
    // A page only alice wrote does not exist for bob: an error, never her data or zeros.
    let e = read(&bob, keys(1, 5..6)).unwrap_err().to_string();
    assert!(e.contains("not stored"), "{e}");
    // Bob's writes did not touch alice's pages.
    assert_eq!(
        read(&alice, keys(1, 0..4)).unwrap(),
        filled(4, 0xA1).bytes()
    );
    // Another program of tenant alice has its own session: alice's first program's pages
    // are not its pages either.
    let alice2 = TcpBackend::connect(server.spec("alice", "s-alice")).unwrap();
    assert!(read(&alice2, keys(1, 0..1)).is_err());
    assert_eq!(
        server.metric("farmem_tenant_stored_pages{tenant=\"alice\"}"),
        8.0
    );
    assert_eq!(
        server.metric("farmem_tenant_stored_pages{tenant=\"bob\"}"),
        4.0
    );
    assert_eq!(alice.server_stats().unwrap().session_pages, 8);
}

#[test]
fn two_tenant_runtimes_keep_their_own_data_under_eviction() {
    let server = Server::start(TOKENS, &[]);
    let pages = 1024; // 4 MiB per region, 1 MiB local each
    let runtimes: Vec<(Runtime, u64)> = [("alice", "s-alice", 11), ("bob", "s-bob", 22)]
        .into_iter()
        .map(|(t, s, salt)| (server.runtime(t, s, 1 << 20), salt))
        .collect();
    // Bob's 1 MiB quota is too small for his evictions: his pages partly stay local.
    std::thread::scope(|s| {
        for (rt, salt) in &runtimes {
            s.spawn(move || {
                let r = rt.create_region(pages * PAGE_SIZE).unwrap();
                assert_eq!(r.id(), 1, "both tenants use region id 1");
                for round in 0..2u64 {
                    for p in 0..pages {
                        let v = (p as u64) << 16 ^ salt ^ round;
                        // SAFETY: inside the region.
                        unsafe { (r.as_mut_ptr().add(p * PAGE_SIZE) as *mut u64).write(v) };
                    }
                    for p in 0..pages {
                        // SAFETY: inside the region.
                        let got = unsafe { (r.as_ptr().add(p * PAGE_SIZE) as *const u64).read() };
                        assert_eq!(got, (p as u64) << 16 ^ salt ^ round, "page {p}");
                    }
                }
                assert!(rt.stats().pages_fetched > 0, "{}", rt.stats());
            });
        }
    });
}

#[test]
fn wrong_or_missing_token_is_rejected() {
    let server = Server::start(TOKENS, &["--metrics", "127.0.0.1:0"]);
    let try_rt = |tenant: &str, secret: &str| {
        Runtime::new(Config {
            local_mem: 1 << 20,
            backend: BackendSpec::Tcp(server.spec(tenant, secret)),
            ..Config::default()
        })
        .map(|_| ())
        .unwrap_err()
        .to_string()
    };
    for (tenant, secret) in [("alice", "s-bob"), ("alice", "wrong"), ("carol", "s-alice")] {
        let e = try_rt(tenant, secret);
        assert!(
            e.contains(&format!("rejected tenant '{tenant}'"))
                && e.contains("authentication failed"),
            "{tenant}/{secret}: {e}"
        );
    }
    assert_eq!(
        server.metric("farmem_server_errors_total{code=\"auth_failed\"}"),
        3.0
    );
    // The refusal reaches the client before the server logs it.
    wait_for("the refusal in the server log", || {
        server.log().contains("authentication of tenant 'carol'")
    });
    // No token at all: the error says where to put it.
    let mut spec = server.spec("alice", "x");
    spec.token = None;
    std::env::remove_var("FARMEM_TOKEN");
    std::env::remove_var("FARMEM_TOKEN_FILE");
    let e = TcpBackend::connect(spec).err().unwrap().to_string();
    assert!(e.contains("FARMEM_TOKEN"), "{e}");
    // A server that is not there: the error names it.
    let mut spec = server.spec("alice", "s-alice");
    spec.addr = "127.0.0.1:1".into();
    let e = TcpBackend::connect(spec).err().unwrap().to_string();
    assert!(
        e.contains("cannot reach far-memory server 127.0.0.1:1"),
        "{e}"
    );
}

/// Write more than the far tier takes; every page must read back right, the refused ones
/// having stayed local (beyond the budget) rather than being dropped.
fn overflow_keeps_pages_local(server: &Server, tenant: &str, secret: &str, full_code: &str) {
    let budget = 2 << 20; // 512 pages
    let rt = server.runtime(tenant, secret, budget);
    let pages = 1536; // 6 MiB: the far tier takes 1 MiB of it
    let r = rt.create_region(pages * PAGE_SIZE).unwrap();
    let value = |p: usize, w: usize| ((p as u64) << 20 | w as u64) ^ 0x5EED_0000_0000_0001;
    for p in 0..pages {
        for w in (0..PAGE_SIZE / 8).step_by(61) {
            // SAFETY: inside the region.
            unsafe { (r.as_mut_ptr().add(p * PAGE_SIZE + w * 8) as *mut u64).write(value(p, w)) };
        }
    }
    for pass in 0..2 {
        for p in 0..pages {
            for w in (0..PAGE_SIZE / 8).step_by(61) {
                // SAFETY: inside the region.
                let got = unsafe { (r.as_ptr().add(p * PAGE_SIZE + w * 8) as *const u64).read() };
                assert_eq!(got, value(p, w), "pass {pass}, page {p}, word {w}");
            }
        }
    }
    let s = rt.stats();
    assert!(s.backend_full > 0, "the far tier refused pages: {s}");
    assert!(
        s.over_budget_pages > 0,
        "pages stayed local beyond the budget: {s}"
    );
    assert!(s.peak_resident_pages * PAGE_SIZE as u64 > budget, "{s}");
    assert!(
        s.pages_fetched > 0,
        "pages the far tier took came back: {s}"
    );
    assert!(
        server.metric(&format!(
            "farmem_server_errors_total{{code=\"{full_code}\"}}"
        )) > 0.0
    );
    assert!(server.metric("farmem_server_stored_pages") <= 256.0);
}

#[test]
fn quota_exceeded_keeps_pages_local_and_correct() {
    let server = Server::start(TOKENS, &["--metrics", "127.0.0.1:0"]);
    overflow_keeps_pages_local(&server, "bob", "s-bob", "quota_exceeded");
}

#[test]
fn capacity_exceeded_keeps_pages_local_and_correct() {
    let server = Server::start(
        "shared\n",
        &["--metrics", "127.0.0.1:0", "--capacity", "1M"],
    );
    overflow_keeps_pages_local(&server, "t", "shared", "capacity_exceeded");
}

#[test]
fn stats_for_people_help_and_clean_shutdown() {
    let mut server = Server::start(TOKENS, &["--metrics", "127.0.0.1:0"]);
    let alice = TcpBackend::connect(server.spec("alice", "s-alice")).unwrap();
    write(&alice, keys(3, 0..16), 1);
    let out = std::process::Command::new(farmem_bin())
        .args(["server", "--stats", server.metrics.as_deref().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("alice") && text.contains("stored"), "{text}");
    assert!(
        text.contains("0.1 MiB"),
        "16 pages stored for alice: {text}"
    );
    let help = std::process::Command::new(farmem_bin())
        .args(["server", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for opt in [
        "--listen",
        "--capacity",
        "--token-file",
        "--metrics",
        "--stats",
        "weight=",
    ] {
        assert!(help.contains(opt), "--help explains {opt}: {help}");
    }
    drop(alice);
    let st = server.signal_and_wait(libc::SIGTERM);
    assert!(st.success(), "SIGTERM: clean exit, got {st}");
    assert!(server.log().contains("stopped"), "{}", server.log());
    // A server without any secret refuses to start, saying how to make one.
    let out = std::process::Command::new(farmem_bin())
        .args(["server", "--listen", "127.0.0.1:0"])
        .env_remove("FARMEM_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--token-file") && err.contains("FARMEM_TOKEN"),
        "{err}"
    );
}
