//! The program's end, as far memory sees it: at exit, `_exit` or an exec, the far tier may
//! free this program's pages as soon as its connections close, instead of keeping them for
//! `--session-timeout` in case the program comes back (a program that ended normally never
//! does, and its pages would keep others out of a small server meanwhile).
//!
//! Nothing is freed before the program is really gone: the connections close only when the
//! process dies (or the exec replaces it), after every destructor that might still touch far
//! memory. An exec that fails takes the request back. A child made by `fork` or `vfork`
//! shares its parent's connections and asks nothing (`Runtime::release_at_exit`).
//!
//! `exit` runs the handler registered at start (`report.rs` calls [`release`]); `_exit`,
//! `_Exit` and the `exec` family are wrapped here. glibc's internal calls to them (the end of
//! `exit` itself, `posix_spawn`'s child) do not come through these wrappers, which is right:
//! `exit` already asked, and a spawned child must not speak for its parent.

use std::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicUsize, Ordering};

use farmem_runtime::Runtime;

/// Ask far memory to free this program's pages once its connections close (or not).
pub(super) fn release(release: bool) {
    let _ = std::panic::catch_unwind(|| {
        if let Some(rt) = Runtime::global_if_started() {
            rt.release_at_exit(release);
        }
    });
}

/// How long `_exit` waits for the control thread to write the process's report (it is
/// written within a round of that thread, microseconds, unless it is busy evicting).
const REPORT_WAIT_US: u64 = 100_000;

/// The report of a process that ends without its exit handlers (`report.rs`), where one is
/// wanted: written by the control thread, since `_exit` may run in a signal handler.
fn report() {
    if !super::report::wanted() || super::STATE.load(Ordering::Acquire) != super::READY {
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        if let Some(rt) = super::runtime() {
            rt.report_at_exit(REPORT_WAIT_US);
        }
    });
}

type ExitFn = unsafe extern "C" fn(c_int) -> !;
type ExecveFn =
    unsafe extern "C" fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
type ExecvFn = unsafe extern "C" fn(*const c_char, *const *const c_char) -> c_int;

static REAL_EXIT: AtomicUsize = AtomicUsize::new(0);
static REAL_EXIT2: AtomicUsize = AtomicUsize::new(0);

/// End the process the way `_exit` does when glibc's cannot be found.
fn exit_group(status: c_int) -> ! {
    // SAFETY: exit_group ends the process; it does not return.
    unsafe { libc::syscall(libc::SYS_exit_group, status) };
    unreachable!("exit_group returned")
}

/// # Safety
/// As C `_exit`.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    report();
    release(true);
    let f = super::next_symbol(&REAL_EXIT, c"_exit");
    if f == 0 {
        exit_group(status);
    }
    // SAFETY: `f` is glibc's `_exit`, which has exactly this signature.
    unsafe { std::mem::transmute::<usize, ExitFn>(f)(status) }
}

/// # Safety
/// As C `_Exit`.
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    report();
    release(true);
    let f = super::next_symbol(&REAL_EXIT2, c"_Exit");
    if f == 0 {
        exit_group(status);
    }
    // SAFETY: `f` is glibc's `_Exit`, which has exactly this signature.
    unsafe { std::mem::transmute::<usize, ExitFn>(f)(status) }
}

/// Run an exec through glibc's `name` (looked up once into `slot`), with the release asked
/// for before and taken back if it fails.
fn exec(slot: &AtomicUsize, name: &std::ffi::CStr, call: impl FnOnce(usize) -> c_int) -> c_int {
    let f = super::next_symbol(slot, name);
    if f == 0 {
        super::set_errno(libc::ENOSYS);
        return -1;
    }
    release(true);
    let rc = call(f);
    // Only a failed exec returns: the program goes on, its pages must stay.
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    release(false);
    super::set_errno(errno);
    rc
}

/// A wrapper of an `exec` function of glibc with this signature: the release asked for
/// before, taken back if the exec fails.
macro_rules! exec_wrapper {
    ($name:ident, $slot:ident, $ty:ty, ($($arg:ident: $t:ty),*)) => {
        static $slot: AtomicUsize = AtomicUsize::new(0);

        #[doc = concat!("# Safety\nAs C `", stringify!($name), "`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $t),*) -> c_int {
            let name = concat!(stringify!($name), "\0");
            let name = std::ffi::CStr::from_bytes_with_nul(name.as_bytes()).expect("a C name");
            // SAFETY: glibc's function of this name, with the caller's arguments.
            exec(&$slot, name, |f| unsafe {
                std::mem::transmute::<usize, $ty>(f)($($arg),*)
            })
        }
    };
}

exec_wrapper!(execve, REAL_EXECVE, ExecveFn, (path: *const c_char, argv: *const *const c_char, envp: *const *const c_char));
exec_wrapper!(execvpe, REAL_EXECVPE, ExecveFn, (file: *const c_char, argv: *const *const c_char, envp: *const *const c_char));
exec_wrapper!(execv, REAL_EXECV, ExecvFn, (path: *const c_char, argv: *const *const c_char));
exec_wrapper!(execvp, REAL_EXECVP, ExecvFn, (file: *const c_char, argv: *const *const c_char));
