//! Losing the memory server. The client programs run as separate processes (the right
//! outcome is that they stop): a server killed for good makes the program stop with an error
//! naming it; a server restarted within the reconnect window has lost the pages, and the
//! program errors rather than reading zeros.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use farmem_runtime::{FM_WRITE, PAGE_SIZE};
use support::*;

#[test]
fn program_stops_with_an_error_naming_the_server_when_it_is_gone() {
    let mut server = Server::shared("loss-secret");
    let addr = server.addr.clone();
    let child = Command::new(farmem_bin())
        .args(["demo", "--size", "1G", "--local-mem", "64M", "--backend"])
        .arg(format!("tcp://demo@{addr}"))
        .env("FARMEM_TOKEN", "loss-secret")
        .env("FARMEM_RECONNECT_S", "2")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Kill the server once the program has stored pages there (progress, not time).
    wait_for("pages stored on the server", || {
        server.metric("farmem_server_pages_total{op=\"write\"}") >= 5000.0
    });
    server.kill();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "the program must stop: {stdout}");
    assert!(
        stderr.contains(&format!("far-memory server {addr} unreachable for 2 s")),
        "the error names the server: {stderr}"
    );
    assert!(!stdout.contains("OK:"), "{stdout}");
}

/// The client side of the restart test, run as a child process of the test (see below):
/// write pages that reclaim sends to the server, report, wait for the go, read them back.
#[test]
#[ignore = "child process of restarted_server_lost_the_pages_and_the_program_errors"]
fn child_writes_then_verifies() {
    let Ok(addr) = std::env::var("FARMEM_TEST_SERVER") else {
        return;
    };
    let spec = farmem_runtime::TcpSpec {
        addr,
        tenant: "restart".into(),
        token: farmem_proto::auth::Secret::from_text("restart-secret"),
        reconnect_window: std::time::Duration::from_secs(20),
    };
    let rt = farmem_runtime::Runtime::new(farmem_runtime::Config {
        local_mem: 1 << 20,
        backend: farmem_runtime::BackendSpec::Tcp(spec),
        ..farmem_runtime::Config::default()
    })
    .unwrap();
    let pages = 2048;
    let r = rt.create_region(pages * PAGE_SIZE).unwrap();
    let value = |p: usize| (p as u64 + 1) * 0x9E37_79B9;
    for p in 0..pages {
        let q = r.as_mut_ptr().wrapping_add(p * PAGE_SIZE);
        farmem_runtime::hint_ex(q, 8, FM_WRITE, 0, 0);
        // SAFETY: inside the region.
        unsafe { (q as *mut u64).write(value(p)) };
    }
    assert!(rt.stats().pages_written_back > 1000, "{}", rt.stats());
    println!("WRITTEN");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    for p in 0..pages {
        // SAFETY: inside the region.
        let v = unsafe { (r.as_ptr().add(p * PAGE_SIZE) as *const u64).read() };
        if v != value(p) {
            println!("MISMATCH at page {p}: {v:#x}");
            std::process::exit(3);
        }
    }
    println!("VERIFIED");
}

#[test]
fn restarted_server_lost_the_pages_and_the_program_errors() {
    let mut server = Server::shared("restart-secret");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_writes_then_verifies",
            "--ignored",
            "--nocapture",
        ])
        .env("FARMEM_TEST_SERVER", &server.addr)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "child ended: {seen}"
        );
        seen.push_str(&line);
        if line.contains("WRITTEN") {
            break;
        }
    }
    // Restart the server on the same port: the new process holds nothing.
    server.restart();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the program must stop: {rest}\n{stderr}"
    );
    assert!(
        !rest.contains("VERIFIED") && !rest.contains("MISMATCH"),
        "no page may be read back after the loss: {rest}"
    );
    assert!(
        stderr.contains(&format!(
            "far-memory server {} lost this program's pages",
            server.addr
        )),
        "the error says the server lost the pages: {stderr}"
    );
}
