//! Malformed input gets a clear error naming the problem, before anything runs: secrets with
//! `#` in token files (they work), sizes beyond 64 bits or beyond the machine, a file that is
//! not the farmem library, zero limits for the server, unknown options of `farmem run`
//! (while the program's own options keep passing through).

mod support;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::*;

fn farmem() -> Command {
    Command::new(farmem_bin())
}

/// Run a command that should end at once; kill it (and fail) if it does not.
fn bounded(cmd: &mut Command) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting farmem");
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("{cmd:?} did not end");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stderr ---\n{}\n--- stdout ---\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    )
}

/// Fails, says all of `words`, and did not run the program (it would create `marker`).
fn refused(args: &[&str], words: &[&str]) {
    let marker = temp_path("marker");
    let touch = format!("touch {}", marker.display());
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["sh", "-c", &touch]);
    let o = bounded(farmem().args(&all));
    assert!(!o.status.success(), "{all:?}: {}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    for w in words {
        assert!(
            err.contains(w),
            "{all:?}: the message should say {w:?}: {err}"
        );
    }
    assert!(!err.contains("panicked"), "{all:?}: {err}");
    assert!(!marker.exists(), "{all:?}: the program ran anyway");
}

#[test]
fn run_refuses_what_it_cannot_do() {
    refused(
        &["run", "--local-mem", "99999999999T", "--"],
        &["--local-mem", "too large"],
    );
    refused(
        &["run", "--local-mem", "100T", "--"],
        &["--local-mem 100T", "more than this machine's memory"],
    );
    refused(
        &["run", "--local-mem", "16M", "--lib", "/etc/passwd", "--"],
        &["/etc/passwd", "not a farmem library", "not an ELF file"],
    );
    refused(
        &["run", "--local-mem", "16M", "--lib", "/bin/sh", "--"],
        &["not a farmem library", "does not define fm_guard"],
    );
    // Unknown options are options, whether the program follows `--` or not.
    refused(
        &["run", "--frobnicate", "--"],
        &["unexpected argument '--frobnicate'"],
    );
    refused(
        &["run", "--frobnicate"],
        &["unexpected argument '--frobnicate'"],
    );
    refused(
        &["trace", "--frobnicate", "--"],
        &["unexpected argument '--frobnicate'"],
    );
}

#[test]
fn the_programs_own_options_pass_through() {
    let input = temp_path("numbers");
    std::fs::write(&input, "10\n9\n100\n-1\n").unwrap();
    let input = input.to_str().unwrap();
    for args in [
        &["run", "--local-mem", "50M", "--", "sort", "-n", input][..],
        &["run", "--local-mem", "50M", "sort", "-n", input][..],
    ] {
        let o = bounded(farmem().args(args));
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            "-1\n9\n10\n100\n",
            "{args:?}"
        );
    }
    // Options that farmem run has too belong to the program once it is named.
    let o = bounded(farmem().args([
        "run",
        "--local-mem",
        "16M",
        "sh",
        "-c",
        "echo \"$@\"",
        "sh",
        "--local-mem",
        "-x",
        "--frobnicate",
    ]));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "--local-mem -x --frobnicate\n"
    );
    let _ = std::fs::remove_file(input);
}

#[test]
fn server_limits_of_zero_are_refused() {
    let tokens = temp_path("tokens");
    std::fs::write(&tokens, "s3cret\n").unwrap();
    for (opt, value) in [
        ("--max-conns", "0"),
        ("--session-timeout", "0"),
        ("--max-unauth-conns", "0"),
        ("--max-unauth-per-addr", "0"),
        ("--handshake-timeout", "0"),
        ("--frame-timeout", "0"),
        ("--default-weight", "0"),
        ("--default-quota", "0"),
        ("--capacity", "0"),
        ("--capacity", "99999999999T"),
    ] {
        let o = bounded(
            farmem()
                .args(["server", "--listen", "127.0.0.1:0", "--token-file"])
                .arg(&tokens)
                .args([opt, value]),
        );
        assert!(!o.status.success(), "{opt} {value}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(opt),
            "{opt} {value}: the message should name it: {err}"
        );
    }
    let _ = std::fs::remove_file(tokens);
}

#[test]
fn secrets_may_contain_hash_signs() {
    // The server and `farmem run`'s client both read this file.
    let server = Server::start(
        "# a comment line, then a shared secret with # in it\n  pa#ssword#1\n\
         \t# an indented comment\nalice #a#2 quota=1G\n",
        &["--metrics", "127.0.0.1:0"],
    );
    for tenant in ["alice", "bob"] {
        let o = bounded(
            farmem()
                .args([
                    "run",
                    "--local-mem",
                    "16M",
                    "--backend",
                    &format!("tcp://{tenant}@{}", server.addr),
                    "--",
                    "/usr/bin/true",
                ])
                .env("FARMEM_TOKEN_FILE", &server.token_file)
                .env_remove("FARMEM_TOKEN"),
        );
        assert!(o.status.success(), "{tenant}: {}", text(&o));
    }
    assert_eq!(server.metric("farmem_server_auth_failures_total"), 0.0);
    assert!(server.metric("farmem_server_connections_total") >= 2.0);
    // The server's help says what # does, and that a shared secret does not isolate
    // tenants.
    let help = bounded(farmem().args(["server", "--help"]));
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("secrets may contain #"), "{help}");
    assert!(help.contains("tenants are NOT isolated"), "{help}");
}
