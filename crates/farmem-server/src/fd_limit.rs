//! The server's limit on open descriptors: each connection takes one, and the usual soft
//! limit (1024) is below what `--max-conns` and the handshake pool allow together, so the
//! soft limit is raised to the hard one at start.

use std::io;

/// Raise the soft `RLIMIT_NOFILE` to the hard limit; returns the limit now in force.
pub(crate) fn raise_to_hard() -> io::Result<u64> {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `l` is a valid rlimit for the kernel to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if l.rlim_cur < l.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: l.rlim_max,
            rlim_max: l.rlim_max,
        };
        // SAFETY: a valid rlimit, read from the kernel, with the soft limit at the hard one.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
        l = raised;
    }
    Ok(l.rlim_cur)
}
