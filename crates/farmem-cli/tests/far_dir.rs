//! The default backend's far file: in `--far-dir`, never visible there (no name), in use while
//! the program runs, gone when it is killed; a directory that cannot serve is an error before
//! the program starts, naming the directory and the cause.

use std::process::Command;

mod run_support;

use run_support::{compile, farmem_bin, start_until_filled, Scratch};

/// The targets of `pid`'s open descriptors.
fn open_files(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|p| p.to_string_lossy().into_owned())
        .collect()
}

#[test]
fn the_far_file_has_no_name_and_nothing_is_left_after_a_kill() {
    let scratch = Scratch::new("far-dir");
    let fill = compile("fill", &scratch);
    let far = scratch.path("far");
    std::fs::create_dir(&far).unwrap();
    // A 1 MiB compressed tier: most of the 32 MiB goes to the file.
    let (mut run, prog) = start_until_filled(
        Command::new(farmem_bin())
            .args(["run", "--local-mem", "2M", "--far-dir"])
            .arg(&far)
            .arg("--")
            .arg(&fill)
            .args(["32", "wait"])
            .env("FARMEM_COMPRESSED_MAX", "1M"),
    );
    let far_str = far.to_string_lossy().into_owned();
    let in_use: Vec<String> = open_files(prog)
        .into_iter()
        .filter(|f| f.starts_with(&far_str))
        .collect();
    assert_eq!(in_use.len(), 1, "one far file, open: {in_use:?}");
    assert!(in_use[0].ends_with("(deleted)"), "with no name: {in_use:?}");
    assert_eq!(
        std::fs::read_dir(&far).unwrap().count(),
        0,
        "nothing to see in the directory while it runs"
    );
    // SAFETY: plain kill(2) of the program we started.
    unsafe { libc::kill(prog as i32, libc::SIGKILL) };
    let status = run.wait().unwrap();
    assert!(!status.success(), "killed: {status:?}");
    assert_eq!(std::fs::read_dir(&far).unwrap().count(), 0, "nothing left");
}

fn refused(args: &[&str], want: &str) {
    let out = Command::new(farmem_bin())
        .arg("run")
        .args(args)
        .args(["--", "/bin/echo", "RAN"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} was accepted: {err}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("RAN"),
        "{args:?}: the program ran"
    );
    assert!(err.contains(want), "{args:?}: {err}");
}

#[test]
fn a_far_dir_that_cannot_serve_is_refused_before_the_program_starts() {
    let scratch = Scratch::new("bad-far-dir");
    let missing = scratch.path("missing");
    refused(
        &["--far-dir", missing.to_str().unwrap()],
        "No such file or directory",
    );
    let file = scratch.path("plain");
    std::fs::write(&file, b"x").unwrap();
    refused(&["--far-dir", file.to_str().unwrap()], "not a directory");
    if std::path::Path::new("/dev/shm").is_dir() {
        refused(&["--far-dir", "/dev/shm"], "tmpfs");
    }
    refused(
        &[
            "--backend",
            "local://",
            "--far-dir",
            scratch.dir().to_str().unwrap(),
        ],
        "--far-dir is for the tiered:// and file:// backends",
    );
    refused(&["--backend", "file://"], "needs a directory");
}
