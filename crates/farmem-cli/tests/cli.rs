//! The `farmem` binary end to end: the demo verifies its own data, the bench runs on a tiny
//! size with its checksums, and bad input gets a clear error.

use std::process::Command;

fn farmem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_farmem"))
}

#[test]
fn demo_verifies_data_larger_than_local_memory() {
    let out = farmem()
        .args(["demo", "--size", "64M", "--local-mem", "25%"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("OK: all 64 MiB read back correctly"),
        "{stdout}"
    );
    assert!(stdout.contains("pages_evicted"), "{stdout}");
}

#[test]
fn demo_on_lz4_backend() {
    let out = farmem()
        .args([
            "demo",
            "--size",
            "32M",
            "--local-mem",
            "8M",
            "--backend",
            "local+lz4://",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("backend local+lz4"));
}

#[test]
fn bench_runs_on_a_tiny_size_and_writes_json() {
    let json = std::env::temp_dir().join(format!("farmem-bench-{}.json", std::process::id()));
    let out = farmem()
        .args([
            "bench",
            "--size",
            "16M",
            "--local",
            "50",
            "--repeat",
            "1",
            "--no-hint-cost",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("hint-ra63"), "{stdout}");
    let j = std::fs::read_to_string(&json).unwrap();
    let _ = std::fs::remove_file(&json);
    assert_eq!(j.matches("\"pages_per_s\"").count(), 2 + 6, "{j}");
}

#[test]
fn bad_arguments_are_reported() {
    for args in [
        &["demo", "--local-mem", "0%"][..],
        &["demo", "--size", "lots"][..],
        &["demo", "--backend", "nfs://x"][..],
        &["bench", "--repeat", "0"][..],
    ] {
        let out = farmem().args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.trim().is_empty(), "{args:?}: no message");
    }
}
