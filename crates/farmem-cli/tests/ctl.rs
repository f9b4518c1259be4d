//! `farmem ctl`: a running program's budget changes from outside, its resident set follows at
//! once, its data stays right, and what cannot be done is refused with the reason.

use std::process::{Command, Stdio};

mod run_support;

use run_support::{compile, farmem_bin, start_until_filled, Scratch};

fn ctl(args: &[&str]) -> std::process::Output {
    Command::new(farmem_bin())
        .arg("ctl")
        .args(args)
        .output()
        .unwrap()
}

fn stats(pid: &str) -> serde_json::Value {
    let o = ctl(&[pid, "--stats"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn a_running_program_is_shrunk_and_grown_from_outside_and_keeps_its_data() {
    let scratch = Scratch::new("ctl");
    let hold = compile("hold", &scratch);
    let (run, pid) = start_until_filled(
        Command::new(farmem_bin())
            .args([
                "run",
                "--local-mem",
                "64M",
                "--backend",
                "local+lz4://",
                "--",
            ])
            .arg(&hold)
            .arg("48")
            .stderr(Stdio::piped()),
    );
    let pid = pid.to_string();
    let s = stats(&pid);
    assert_eq!(s["budget_bytes"], 64u64 << 20);
    assert!(
        s["resident_pages"].as_u64().unwrap() > 8192,
        "48 MiB local: {s}"
    );

    let o = ctl(&[&pid, "--local-mem", "8M"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = stats(&pid);
    assert_eq!(s["budget_bytes"], 8u64 << 20);
    assert!(
        s["resident_pages"].as_u64().unwrap() <= 2048,
        "within the new budget as soon as ctl returns: {s}"
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    let s = stats(&pid);
    assert!(s["resident_pages"].as_u64().unwrap() <= 2048, "{s}");
    assert!(
        s["unhinted_faults"].as_u64().unwrap() > 0,
        "it keeps checking: {s}"
    );

    let o = ctl(&[&pid, "--local-mem", "64M"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::thread::sleep(std::time::Duration::from_millis(500));
    let s = stats(&pid);
    assert!(
        s["resident_pages"].as_u64().unwrap() > 4096,
        "its data comes back and stays: {s}"
    );

    // Refused, with the reason: a budget below the minimum, a size that is not one.
    let o = ctl(&[&pid, "--local-mem", "4K"]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("too small"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!ctl(&[&pid, "--local-mem", "lots"]).status.success());

    // SAFETY: plain kill(2) of the program we started.
    unsafe { libc::kill(pid.parse().unwrap(), libc::SIGTERM) };
    let out = run.wait_with_output().unwrap();
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("BAD"),
        "the program found its data wrong"
    );
}

#[test]
fn a_process_not_under_farmem_is_named_in_the_error() {
    let me = std::process::id().to_string();
    let o = ctl(&[&me, "--stats"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no farmem control socket"), "{err}");
}
