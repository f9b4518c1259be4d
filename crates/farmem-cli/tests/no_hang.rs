//! The runtime's own threads never wait on far memory, and a stall is an error, not a hang.
//!
//! Under CPU load a TCP receiver thread could start after the program was already running
//! with a tiny budget; its first allocation (Rust's thread start registering thread-local
//! destructors, a `calloc` in glibc) went to the far heap and faulted, while the fault
//! thread waited for a write-back that only that receiver could deliver: a hang, about one
//! run in five on this machine with two busy loops. Here: many short runs over TCP with a
//! 1 MiB budget beside two busy loops, each under a deadline, with the watchdog set to stop
//! the program (and say why) if a fault waits over 10 s.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod run_support;
mod support;

use run_support::{compile, Mode, Prog, Running, Scratch};
use support::Server;

/// Runs in all, and how many run at once (more contention, less wall time).
const RUNS: usize = 200;
const AT_ONCE: usize = 4;
/// A run that has not ended by then hangs.
const DEADLINE: Duration = Duration::from_secs(90);

#[test]
fn short_runs_over_tcp_under_load_never_hang() {
    let scratch = Scratch::new("no-hang");
    let exe = compile("fill", &scratch);
    let secret = "no-hang-secret";
    let server = Server::shared(secret);
    let token = scratch.path("token");
    std::fs::write(&token, format!("{secret}\n")).unwrap();
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let prog = Prog::new(&exe)
        .arg("8")
        .env("FARMEM_BACKEND", &format!("tcp://{}", server.addr))
        .env("FARMEM_TOKEN_FILE", token.to_str().unwrap())
        .env("FARMEM_WATCHDOG_S", "10")
        .env("FARMEM_WATCHDOG_ABORT", "1");

    // Two busy loops: the runtime's threads start late, as on a loaded machine.
    let stop = Arc::new(AtomicBool::new(false));
    let busy: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let _stop = farmem_runtime::testing::StopOnDrop(&stop);

    let t = Instant::now();
    let mode = Mode::absolute("1M");
    let mut evicted = 0u64;
    for round in 0..RUNS / AT_ONCE {
        let running: Vec<Running> = (0..AT_ONCE)
            .map(|i| {
                Running::spawn(
                    &format!("fill #{}", round * AT_ONCE + i),
                    &prog,
                    &mode,
                    &scratch,
                )
            })
            .collect();
        for r in running {
            let f = r.finish(DEADLINE);
            f.assert_ok();
            evicted += f.stat("pages_evicted").unwrap_or(0);
        }
    }
    stop.store(true, Ordering::Relaxed);
    for b in busy {
        b.join().unwrap();
    }
    eprintln!(
        "{RUNS} runs of 8 MiB at 1 MiB local over TCP beside two busy loops: none hung, {:.1} s, \
         {evicted} pages evicted in all",
        t.elapsed().as_secs_f64()
    );
    assert!(
        evicted > RUNS as u64 * 1000,
        "the runs did not use far memory"
    );
}
