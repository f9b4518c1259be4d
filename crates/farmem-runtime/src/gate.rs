//! The fork gate: a fork waits until no thread is inside the runtime.
//!
//! A child made by `fork()` keeps its far pages far (see `fork.rs`): it runs the runtime on
//! the memory it inherited, page table, policy and far store included. That memory is only
//! usable if no lock in it was held at the moment of the fork, since the thread holding it
//! does not exist in the child. So every piece of runtime work passes this gate (a program
//! thread in a [`crate::scope::RuntimeScope`], a fault thread serving a batch, the control
//! thread's round), and a fork closes it: new work waits, and the fork waits until the work
//! inside is done.
//!
//! The gate is two words and a futex, not a lock with a queue of waiters: a queue would be
//! inherited by the child with entries for threads it does not have. Passes nest on one
//! thread (eviction inside a fetch inside a hint) without waiting.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use farmem_sys::mem;

/// Threads inside the gate now (a nested pass counts once).
static INSIDE: AtomicUsize = AtomicUsize::new(0);
/// 1 while a fork holds the gate closed (the futex word the others wait on).
static CLOSED: AtomicU64 = AtomicU64::new(0);
/// The thread that closed the gate (0 while open): its faults between the fork handlers are
/// served by the fault thread without entering (`fault.rs`).
static CLOSER: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// How deep the calling thread is inside the gate.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Permission to work inside the runtime, until dropped (on the thread that entered: the
/// depth it counts is that thread's).
pub(crate) struct Pass(PhantomData<*const ()>);

/// Wait until no fork holds the gate, and go in.
#[inline]
pub(crate) fn enter() -> Pass {
    let depth = DEPTH.with(|d| d.get());
    if depth == 0 {
        loop {
            INSIDE.fetch_add(1, Ordering::SeqCst);
            if CLOSED.load(Ordering::SeqCst) == 0 {
                break;
            }
            INSIDE.fetch_sub(1, Ordering::SeqCst);
            // Bounded sleep: a missed wake-up costs a millisecond, never a hang.
            mem::futex_wait(&CLOSED, 1, 1000);
        }
    }
    DEPTH.with(|d| d.set(depth + 1));
    Pass(PhantomData)
}

impl Drop for Pass {
    #[inline]
    fn drop(&mut self) {
        let depth = DEPTH.with(|d| {
            let v = d.get() - 1;
            d.set(v);
            v
        });
        if depth == 0 {
            INSIDE.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Go in if no fork holds the gate, without waiting.
pub(crate) fn try_enter() -> Option<Pass> {
    if DEPTH.with(|d| d.get()) == 0 {
        INSIDE.fetch_add(1, Ordering::SeqCst);
        if CLOSED.load(Ordering::SeqCst) != 0 {
            INSIDE.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
    }
    DEPTH.with(|d| d.set(d.get() + 1));
    Some(Pass(PhantomData))
}

/// The thread holding the gate closed for a fork, if one does.
pub(crate) fn closer() -> Option<u32> {
    match CLOSER.load(Ordering::SeqCst) {
        0 => None,
        tid => Some(tid),
    }
}

/// Close the gate: wait for another fork's to open, keep new work out, wait for the work
/// inside to finish. The calling thread is inside from now on (its own runtime work goes
/// on) until it calls [`open`] (a fork's parent and child handlers run on the thread that
/// ran its prepare handler).
pub(crate) fn close() {
    while CLOSED
        .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        mem::futex_wait(&CLOSED, 1, 1000);
    }
    CLOSER.store(farmem_sys::sched::gettid(), Ordering::SeqCst);
    // This thread's own pass, if it forked from inside the runtime.
    let mine = usize::from(DEPTH.with(|d| d.get()) > 0);
    let mut spins = 0u32;
    while INSIDE.load(Ordering::SeqCst) > mine {
        spins += 1;
        if spins < 100 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }
    // Passes of this thread from now on nest inside the closed gate.
    if mine == 0 {
        INSIDE.fetch_add(1, Ordering::SeqCst);
    }
    DEPTH.with(|d| d.set(d.get() + 1));
}

/// Whether a fork holds the gate closed, and how many threads are inside (for the
/// watchdog's report of a stall).
pub(crate) fn describe() -> (bool, usize) {
    (
        CLOSED.load(Ordering::Relaxed) != 0,
        INSIDE.load(Ordering::Relaxed),
    )
}

/// Open the gate this thread closed with [`close`].
pub(crate) fn open() {
    drop(Pass(PhantomData));
    CLOSER.store(0, Ordering::SeqCst);
    CLOSED.store(0, Ordering::SeqCst);
    mem::futex_wake_all(&CLOSED);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    /// While the gate is closed nobody gets in; work inside finishes first; nesting on one
    /// thread does not wait.
    #[test]
    fn a_closed_gate_keeps_work_out_and_waits_for_work_inside() {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let worker = std::thread::spawn(move || {
            let inside = enter();
            let nested = enter();
            drop(nested);
            tx.send(()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(50));
            d.store(true, Ordering::SeqCst);
            drop(inside);
        });
        rx.recv().unwrap();
        close();
        assert!(
            done.load(Ordering::SeqCst),
            "close waited for the pass inside"
        );
        let _nested = enter(); // the closer's own work goes on
        let got_in = Arc::new(AtomicBool::new(false));
        let g = got_in.clone();
        let waiter = std::thread::spawn(move || {
            let _p = enter();
            g.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !got_in.load(Ordering::SeqCst),
            "nobody enters a closed gate"
        );
        drop(_nested);
        open();
        waiter.join().unwrap();
        worker.join().unwrap();
        assert!(got_in.load(Ordering::SeqCst));
    }
}
