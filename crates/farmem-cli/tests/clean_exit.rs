//! A program that ends frees its far pages at once: at exit, at `_exit`, or when it execs
//! another program (`execv` here; the new image has pages of its own, freed when it ends). Only a lost connection (a crash, a kill) keeps them for the session
//! timeout, in case the program comes back. (A program that exited normally used to leave
//! its pages on the server for 120 s, and a second program got no far memory meanwhile.)

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod run_support;
mod support;

use run_support::{compile, farmem_bin, Scratch};
use support::Server;

const SECRET: &str = "exit-secret";

/// Pages the server holds for all its tenants.
fn stored(server: &Server) -> f64 {
    server.metric("farmem_server_stored_pages")
}

fn farmem_run(server: &Server, token: &std::path::Path, prog: &[&str]) -> Command {
    let mut c = Command::new(farmem_bin());
    c.args(["run", "--local-mem", "1M", "--backend"])
        .arg(format!("tcp://exiting@{}", server.addr))
        .arg("--")
        .args(prog)
        .env("FARMEM_TOKEN_FILE", token);
    c
}

#[test]
fn exit_underscore_exit_and_exec_free_the_pages_at_once_and_a_kill_does_not() {
    let scratch = Scratch::new("clean-exit");
    let fill = compile("fill", &scratch);
    let fill = fill.to_str().unwrap();
    let server = Server::start(
        &format!("{SECRET}\n"),
        &["--metrics", "127.0.0.1:0", "--session-timeout", "120"],
    );
    let token = scratch.path("token");
    std::fs::write(&token, format!("{SECRET}\n")).unwrap();
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();

    for end in ["exit", "_exit", "exec"] {
        let out = farmem_run(&server, &token, &[fill, "16", end])
            .output()
            .expect("farmem run");
        assert!(
            out.status.success(),
            "{end}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ended = Instant::now();
        while stored(&server) != 0.0 {
            assert!(
                ended.elapsed() < Duration::from_secs(1),
                "{end}: the server still holds {} pages 1 s after the program ended",
                stored(&server)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!("{end}: pages freed {:?} after the end", ended.elapsed());
    }

    // Killed: the connection is lost, not closed by a program that ended; the pages stay
    // for it to come back.
    let mut child = farmem_run(&server, &token, &[fill, "16", "wait"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("farmem run");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "filled");
    // The runtime may still finish an eviction after the program's last write (its budget
    // follows the tree's cgroup): take the count once it has held still for 300 ms.
    let mut held = stored(&server);
    let mut still = Instant::now();
    let waited = Instant::now();
    while still.elapsed() < Duration::from_millis(300) && waited.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(20));
        let now = stored(&server);
        if now != held {
            held = now;
            still = Instant::now();
        }
    }
    assert!(held > 0.0, "the program's pages went far");
    // SIGKILL to the program (farmem run's child), then farmem run ends too.
    let pgrep = Command::new("pgrep")
        .args(["-P", &child.id().to_string()])
        .output()
        .unwrap();
    let pid: i32 = String::from_utf8_lossy(&pgrep.stdout)
        .trim()
        .parse()
        .expect("the program's pid");
    // SAFETY: a signal to the program we started (farmem run's only child).
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = child.wait();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(stored(&server), held, "a killed program's pages are kept");
}
