//! Waiting for child processes with their resource usage (peak RSS, CPU time).

use std::io;

/// Wait for `pid` to end: its wait status and rusage.
pub fn wait_with_rusage(pid: i32) -> io::Result<(i32, libc::rusage)> {
    let mut status = 0;
    // SAFETY: rusage is plain old data; all-zero is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: waiting for our own child with valid out-pointers.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if r == pid {
            return Ok((status, ru));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// wait4 without blocking: the wait status and rusage once `pid` has ended.
pub fn try_wait_with_rusage(pid: i32) -> io::Result<Option<(i32, libc::rusage)>> {
    let mut status = 0;
    // SAFETY: rusage is plain old data; all-zero is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: polling our own child with valid out-pointers.
    let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
    match r {
        0 => Ok(None),
        r if r == pid => Ok(Some((status, ru))),
        _ => {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                Ok(None)
            } else {
                Err(e)
            }
        }
    }
}

/// Stop the process with a message naming the cause. Used where continuing would mean
/// handing the program wrong data (a page that cannot be fetched): never zeros instead.
pub fn fatal(msg: &str) -> ! {
    eprintln!("farmem: fatal: {msg}");
    std::process::abort()
}
