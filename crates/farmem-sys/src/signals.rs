//! Deferring asynchronous signals on the calling thread.

/// While alive, every asynchronous signal to this thread waits (synchronous faults are still
/// delivered); the previous mask comes back on drop.
pub struct BlockAll {
    old: libc::sigset_t,
}

impl BlockAll {
    pub fn enter() -> BlockAll {
        // SAFETY: sigfillset initializes the set; pthread_sigmask changes only this thread's
        // mask and saves the previous one for `drop`.
        let old = unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            old
        };
        BlockAll { old }
    }
}

impl Drop for BlockAll {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved by `enter` on this same thread (the guard is not
        // Send: it holds a sigset_t only, but is created and dropped in one scope).
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}
