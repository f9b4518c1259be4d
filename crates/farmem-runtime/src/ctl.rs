//! The control socket: `farmem ctl PID` talks to a running program through it.
//!
//! An abstract Unix socket named `farmem-ctl-PID` (no file to leave behind; closed at exec,
//! when the new image opens its own). A child made by `fork()` that keeps its far memory
//! opens its own under its pid ([`restart_in_child`]), so each worker of a forking server
//! can be watched; in a process tree sharing one budget (`farmem run`'s default), a size
//! sent to any member is the tree's. Only the program's own user and root may use it
//! (`SO_PEERCRED`). One request per connection, one line each way:
//! `local-mem BYTES` → `ok` (the budget changed, and the resident set fits it) or
//! `error MESSAGE`; `stats` → the statistics as one JSON object.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

/// How long a shrink may take before the request answers with an error.
const SHRINK_DEADLINE: Duration = Duration::from_secs(10);

/// The socket name of process `pid`.
pub fn socket_name(pid: u32) -> String {
    format!("farmem-ctl-{pid}")
}

/// The descriptor of this process's listening socket (-1: none), for a forked child to
/// close: its serving thread did not come along.
static LISTENER: AtomicI32 = AtomicI32::new(-1);

/// Open this process's control socket and serve it on a runtime thread (`farmem-ctl`).
pub fn start(rt: &crate::Runtime) -> std::io::Result<()> {
    let listener = listen()?;
    let rt = rt.clone();
    crate::thread::spawn("farmem-ctl".into(), move || serve(listener, rt))?;
    Ok(())
}

/// This process's listening socket, under its name, out of the program's way.
fn listen() -> std::io::Result<UnixListener> {
    let _local = crate::scope::LocalScope::enter();
    let addr = SocketAddr::from_abstract_name(socket_name(std::process::id()))?;
    let listener = farmem_sys::fds::keep(UnixListener::bind_addr(&addr)?);
    LISTENER.store(listener.as_raw_fd(), Ordering::Release);
    Ok(listener)
}

/// In a child made by `fork()` that kept the runtime: let go of the parent's socket (kept
/// open here, it would keep the parent's name taken after the parent ends, and nothing
/// here serves it) and open this process's own. The socket is there at once (`farmem ctl`
/// may ask as soon as the child exists: its request waits in the socket's backlog); the
/// thread that serves it starts once the child has lived a few milliseconds
/// (`deferred.rs`: most forked children exec or end before).
pub fn restart_in_child(rt: &crate::Runtime) {
    let fd = LISTENER.swap(-1, Ordering::AcqRel);
    if fd >= 0 {
        // The inherited listening socket, which nothing in this process uses: its owner
        // (the serving thread) exists only in the parent.
        farmem_sys::fds::close_kept(fd);
    }
    let listener = match listen() {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("no control socket in the forked child: {e}");
            return;
        }
    };
    // Weak: the runtime's state would otherwise own the runtime until the work runs.
    let weak = rt.downgrade();
    crate::deferred::defer(
        rt.state(),
        Box::new(move |_| {
            let Some(rt) = weak.upgrade() else { return };
            if let Err(e) = crate::thread::spawn("farmem-ctl".into(), move || serve(listener, rt)) {
                tracing::warn!("no control socket in the forked child: {e}");
            }
        }),
    );
}

/// The uid of the peer of `s`.
fn peer_uid(s: &UnixStream) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt fills `cred` (of the size given) for a connected Unix socket.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred.uid)
}

/// Serve requests for ever (the thread ends with the process).
fn serve(listener: UnixListener, rt: crate::Runtime) {
    // A budget change evicts on this thread.
    crate::fetch::warm_thread_locals();
    // SAFETY: getuid has no preconditions.
    let me = unsafe { libc::getuid() };
    // Never blocked in `accept`: the kernel takes the new connection's descriptor number
    // when `accept` starts, and holds it while it waits. That number, the lowest free one
    // when the thread started (3 in a forked child), stayed taken for good, and the
    // program's `dup2` onto it failed with EBUSY (BEAM's forker child lost its socket to
    // its parent that way). So the thread waits in `poll`, which takes none, and accepts
    // only what has arrived.
    if let Err(e) = listener.set_nonblocking(true) {
        tracing::warn!("control socket not served: {e}");
        return;
    }
    loop {
        let mut p = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, -1) };
        if r < 0 || p.revents & libc::POLLNVAL != 0 {
            if r < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        let Ok((s, _)) = listener.accept() else {
            continue;
        };
        // Out of the program's way while it is answered (up to the read timeout).
        let mut s = farmem_sys::fds::keep(s);
        let _ = s.set_nonblocking(false);
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let reply = match peer_uid(&s) {
            Some(uid) if uid == me || uid == 0 => answer(&mut s, &rt),
            _ => "error permission denied: not the program's user\n".to_string(),
        };
        let _ = s.write_all(reply.as_bytes());
    }
}

fn answer(s: &mut UnixStream, rt: &crate::Runtime) -> String {
    let mut line = String::new();
    if BufReader::new(Read::by_ref(s).take(256))
        .read_line(&mut line)
        .is_err()
    {
        return "error unreadable request\n".into();
    }
    let mut words = line.split_whitespace();
    match (words.next(), words.next()) {
        (Some("stats"), None) => format!("{}\n", rt.stats().to_json()),
        (Some("local-mem"), Some(n)) => match n.parse::<u64>() {
            Ok(bytes) => match rt.set_local_mem(bytes, SHRINK_DEADLINE) {
                Ok(()) => "ok\n".into(),
                Err(e) => format!("error {e}\n"),
            },
            Err(_) => format!("error not a number of bytes: {n}\n"),
        },
        _ => format!("error unknown request: {}\n", line.trim()),
    }
}

/// Send one request to process `pid` and return its answer (without the newline).
pub fn request(pid: u32, req: &str) -> std::io::Result<String> {
    let addr = SocketAddr::from_abstract_name(socket_name(pid))?;
    let mut s = UnixStream::connect_addr(&addr)?;
    s.write_all(format!("{req}\n").as_bytes())?;
    let mut out = String::new();
    BufReader::new(s).read_line(&mut out)?;
    Ok(out.trim_end().to_string())
}
