//! Slots of a far file that forked children still read.
//!
//! A child made by `fork()` keeps its far pages far: it reads them from its parent's file,
//! at the slots they had at the fork (see `fork.rs` and [`super::file`]). So the parent must
//! not reuse, or punch out, a slot that was in use at a fork while that child lives. Each
//! fork takes a snapshot of the slots in use and a pipe whose write end only the child
//! holds (close-on-exec: an exec, or the child's end, closes it, and so do its own
//! children's ends); a freed slot in a live snapshot is set aside, and freed for real once
//! the pipe reads end-of-file.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

/// The slots in use at one fork, until its child (and its child's children) are gone.
struct Pin {
    /// The read end of the child's pipe (None: a pipe could not be made, pinned for good).
    alive: Option<OwnedFd>,
    /// A bit per slot in use at the fork (slot `s` is bit `s % 64` of word `s / 64`).
    used: Vec<u64>,
    /// Slots freed since, waiting for the child to be gone.
    deferred: Vec<u32>,
}

impl Pin {
    fn holds(&self, slot: u32) -> bool {
        self.used
            .get(slot as usize / 64)
            .is_some_and(|bits| bits & (1 << (slot % 64)) != 0)
    }

    /// Whether the child (and everyone who inherited its end) is gone.
    fn ended(&self) -> bool {
        let Some(fd) = &self.alive else { return false };
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n > 0 && p.revents & (libc::POLLHUP | libc::POLLERR) != 0
    }
}

/// The fork under way: its pipe (read end, write end), if one could be made, and the
/// slots in use.
struct Forking {
    pipe: Option<(OwnedFd, OwnedFd)>,
    used: Vec<u64>,
}

#[derive(Default)]
struct Inner {
    live: Vec<Pin>,
    forking: Option<Forking>,
}

#[derive(Default)]
pub(crate) struct Pins {
    /// Whether any pin is live (the common case, none, costs one load per free).
    any: AtomicBool,
    inner: Mutex<Inner>,
}

impl Pins {
    /// A fork is about to happen with these slots in use (a bit per slot, as [`Pin`]).
    pub(crate) fn prepare(&self, used: Vec<u64>) {
        let mut fds = [0i32; 2];
        // SAFETY: pipe2 fills the two-int array it is given.
        let pipe = if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == 0 {
            // SAFETY: fresh descriptors from the kernel, owned here. The write end is the
            // child's, out of its way (a child that closes every descriptor it did not open
            // would otherwise end the pin while it still reads the slots).
            Some(unsafe {
                (
                    OwnedFd::from_raw_fd(fds[0]),
                    farmem_sys::fds::keep(OwnedFd::from_raw_fd(fds[1])),
                )
            })
        } else {
            tracing::warn!(
                "no pipe to follow a forked child ({}): the far file keeps its slots for the \
                 rest of the run",
                std::io::Error::last_os_error()
            );
            None
        };
        self.inner.lock().forking = Some(Forking { pipe, used });
    }

    /// In the parent after the fork: the child's slots stay until its pipe closes.
    pub(crate) fn parent(&self) {
        let mut g = self.inner.lock();
        if let Some(Forking { pipe, used }) = g.forking.take() {
            // Closing our write end leaves the child's as the only one.
            let alive = pipe.map(|(r, w)| {
                farmem_sys::fds::close_kept(std::os::fd::IntoRawFd::into_raw_fd(w));
                r
            });
            g.live.push(Pin {
                alive,
                used,
                deferred: Vec::new(),
            });
            self.any.store(true, Ordering::Release);
        }
    }

    /// In the child: hold the write end until exit or exec; the parent's other pins are
    /// not ours.
    pub(crate) fn child(&self) {
        let mut g = self.inner.lock();
        if let Some(Forking {
            pipe: Some((_r, w)),
            ..
        }) = g.forking.take()
        {
            std::mem::forget(w);
        }
        g.live.clear();
        self.any.store(false, Ordering::Release);
    }

    /// Of `slots` being freed, those free now; the others wait for their children. Slots
    /// set aside earlier whose children are gone are added.
    pub(crate) fn release(&self, slots: Vec<u32>) -> Vec<u32> {
        if !self.any.load(Ordering::Acquire) {
            return slots;
        }
        let mut g = self.inner.lock();
        let mut candidates = slots;
        let mut i = 0;
        while i < g.live.len() {
            if g.live[i].ended() {
                let pin = g.live.swap_remove(i);
                candidates.extend(pin.deferred);
            } else {
                i += 1;
            }
        }
        let mut free = Vec::with_capacity(candidates.len());
        'slots: for s in candidates {
            for pin in g.live.iter_mut() {
                if pin.holds(s) {
                    pin.deferred.push(s);
                    continue 'slots;
                }
            }
            free.push(s);
        }
        self.any.store(!g.live.is_empty(), Ordering::Release);
        free
    }

    /// Slots set aside now.
    #[cfg(test)]
    pub(crate) fn deferred(&self) -> usize {
        self.inner
            .lock()
            .live
            .iter()
            .map(|p| p.deferred.len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot in use at a fork waits for the child's end; a slot taken after it does not.
    #[test]
    fn slots_in_use_at_a_fork_wait_for_the_child() {
        let pins = Pins::default();
        pins.prepare(vec![0b11]); // slots 0 and 1 in use
        let child_end = {
            let g = pins.inner.lock();
            let (_r, w) = g.forking.as_ref().unwrap().pipe.as_ref().unwrap();
            w.try_clone().unwrap()
        };
        pins.parent();
        assert_eq!(
            pins.release(vec![1, 5]),
            vec![5],
            "slot 5 was free at the fork"
        );
        assert_eq!(pins.deferred(), 1);
        assert_eq!(pins.release(vec![]), Vec::<u32>::new(), "the child lives");
        drop(child_end);
        assert_eq!(pins.release(vec![0]), vec![0, 1], "the child is gone");
        assert_eq!(pins.deferred(), 0);
        assert_eq!(pins.release(vec![7]), vec![7]);
    }
}
