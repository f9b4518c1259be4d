//! Signals and the machine lock: a baseline is torn down on Ctrl-C or SIGTERM, and
//! baselines of all processes are serialized.

use super::*;

/// Installs (once) a thread that, on SIGINT or SIGTERM, tears down every live baseline and
/// exits with 128 + the signal number (also once no baseline is live any more: the handler
/// stays for the life of the process). Signals the process ignores (e.g. SIGINT of a
/// background job) stay ignored.
pub(super) fn install_signal_handler() -> Result<()> {
    let r = HANDLER.get_or_init(|| {
        let sigs: Vec<libc::c_int> = [libc::SIGINT, libc::SIGTERM]
            .into_iter()
            .filter(|&s| !signal_ignored(s))
            .collect();
        if sigs.is_empty() {
            return Ok(());
        }
        let mut signals = signal_hook::iterator::Signals::new(&sigs).map_err(|e| e.to_string())?;
        thread::Builder::new()
            .name("farmem-swap-signals".into())
            .spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    EXITING.store(true, Ordering::SeqCst);
                    let n = cleanup_all();
                    let name = if sig == libc::SIGINT {
                        "SIGINT"
                    } else {
                        "SIGTERM"
                    };
                    let _ = writeln!(
                        io::stderr(),
                        "farmem: {name}: removed {n} Linux-swap baseline(s); exiting"
                    );
                    std::process::exit(128 + sig);
                }
            })
            .map_err(|e| e.to_string())?;
        // Only once the thread that acts on it runs: whoever sees the flag waits for it.
        for &sig in &sigs {
            signal_hook::flag::register(sig, &SIGNALED).map_err(|e| e.to_string())?;
        }
        Ok(())
    });
    r.clone()
        .map_err(|e| anyhow!("installing the SIGINT/SIGTERM cleanup handler failed: {e}"))
}

pub(super) fn signal_ignored(sig: libc::c_int) -> bool {
    // SAFETY: an all-zero sigaction is a valid out-parameter.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action only queries the current disposition into `old`.
    let r = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
    r == 0 && old.sa_sigaction == libc::SIG_IGN
}

/// Once the signal handler is tearing down, other threads must not go on (a thread returning
/// from `main` would end the process half-way through the teardown): they wait here for the
/// handler to exit the process.
pub(super) fn park_if_exiting() {
    while SIGNALED.load(Ordering::SeqCst) || EXITING.load(Ordering::SeqCst) {
        thread::park();
    }
}

/// Process groups to kill before the teardown (benchmark programs that run outside any
/// baseline cgroup, which teardown would not reach).
static GROUPS: Mutex<Vec<libc::pid_t>> = Mutex::new(Vec::new());

/// Installs the SIGINT / SIGTERM handler now (it is installed by the first baseline
/// otherwise), for a program that starts other processes before any baseline exists.
pub fn install_cleanup_handler() -> Result<()> {
    install_signal_handler()
}

/// Registers process group `pgid` to be killed (SIGKILL) when SIGINT / SIGTERM ends this
/// process; the returned guard unregisters it.
pub fn kill_group_on_signal(pgid: libc::pid_t) -> GroupGuard {
    lock(&GROUPS).push(pgid);
    GroupGuard(pgid)
}

pub struct GroupGuard(libc::pid_t);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        lock(&GROUPS).retain(|&g| g != self.0);
    }
}

/// Tears down every registered baseline (after killing the registered process groups);
/// returns how many baselines there were.
pub(super) fn cleanup_all() -> usize {
    for &g in lock(&GROUPS).iter() {
        // SAFETY: kill has no memory-safety preconditions; g is a process group this
        // process started and has not reaped the leader of.
        unsafe { libc::kill(-g, libc::SIGKILL) };
    }
    let all: Vec<Arc<Inner>> = lock(&REGISTRY).clone();
    for inner in &all {
        for e in lock(&inner.state).teardown() {
            tracing::warn!("Linux-swap baseline cleanup: {e:#}");
            let _ = writeln!(io::stderr(), "farmem: Linux-swap baseline cleanup: {e:#}");
        }
    }
    all.len()
}

pub(super) fn acquire_machine_lock() -> Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .open(LOCK_PATH)
        .with_context(|| format!("opening the lock file {LOCK_PATH}"))?;
    let fd = f.as_raw_fd();
    // SAFETY: fd is an open descriptor owned by `f` for the duration of the call.
    if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(f);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
        return Err(e).with_context(|| format!("locking {LOCK_PATH}"));
    }
    tracing::info!("waiting for {LOCK_PATH}: another Linux-swap baseline is live");
    loop {
        // SAFETY: as above.
        if unsafe { libc::flock(fd, libc::LOCK_EX) } == 0 {
            return Ok(f);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e).with_context(|| format!("locking {LOCK_PATH}"));
        }
    }
}
