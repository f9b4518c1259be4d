//! Starting other processes: a child inherits the CPU affinity of the thread that starts it,
//! and the runtime may have pinned that thread beside its fault thread
//! (`farmem_runtime::placement`). Before `posix_spawn`, `posix_spawnp`, `vfork`, `system` and
//! `popen` the thread gets its own affinity back (`Runtime::before_spawn`), as it does
//! before `fork` and the `exec` family (the runtime's fork handler, `exits.rs`) and
//! `pthread_create` (`threads.rs`). glibc's internal calls (`system` spawning through its
//! own `posix_spawn`) do not come through here, which is right: the public entry did.

use std::ffi::{c_char, c_int};
use std::sync::atomic::AtomicUsize;

use farmem_runtime::Runtime;

/// Give the calling thread its own affinity back before it starts a process or a thread.
pub(super) fn before_spawn(thread: bool) {
    let _ = std::panic::catch_unwind(|| {
        if let Some(rt) = Runtime::global_if_started() {
            rt.before_spawn(thread);
        }
    });
}

type SpawnFn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    *const *mut c_char,
    *const *mut c_char,
) -> c_int;
type SystemFn = unsafe extern "C" fn(*const c_char) -> c_int;
type PopenFn = unsafe extern "C" fn(*const c_char, *const c_char) -> *mut libc::FILE;

static REAL_SPAWN: AtomicUsize = AtomicUsize::new(0);
static REAL_SPAWNP: AtomicUsize = AtomicUsize::new(0);
static REAL_SYSTEM: AtomicUsize = AtomicUsize::new(0);
static REAL_POPEN: AtomicUsize = AtomicUsize::new(0);
static REAL_VFORK: AtomicUsize = AtomicUsize::new(0);

macro_rules! spawn_wrapper {
    ($name:ident, $slot:ident) => {
        #[doc = concat!("# Safety\nAs C `", stringify!($name), "`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            pid: *mut libc::pid_t,
            path: *const c_char,
            actions: *const libc::posix_spawn_file_actions_t,
            attr: *const libc::posix_spawnattr_t,
            argv: *const *mut c_char,
            envp: *const *mut c_char,
        ) -> c_int {
            let name = concat!(stringify!($name), "\0");
            let name = std::ffi::CStr::from_bytes_with_nul(name.as_bytes()).expect("a C name");
            let f = super::next_symbol(&$slot, name);
            if f == 0 {
                return libc::ENOSYS;
            }
            before_spawn(false);
            // SAFETY: glibc's function of this name, which has exactly this signature, with
            // the caller's arguments.
            unsafe {
                std::mem::transmute::<usize, SpawnFn>(f)(pid, path, actions, attr, argv, envp)
            }
        }
    };
}

spawn_wrapper!(posix_spawn, REAL_SPAWN);
spawn_wrapper!(posix_spawnp, REAL_SPAWNP);

/// # Safety
/// As C `system`.
#[no_mangle]
pub unsafe extern "C" fn system(command: *const c_char) -> c_int {
    let f = super::next_symbol(&REAL_SYSTEM, c"system");
    if f == 0 {
        super::set_errno(libc::ENOSYS);
        return -1;
    }
    before_spawn(false);
    // SAFETY: glibc's `system`, with the caller's argument.
    unsafe { std::mem::transmute::<usize, SystemFn>(f)(command) }
}

/// # Safety
/// As C `popen`.
#[no_mangle]
pub unsafe extern "C" fn popen(command: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    let f = super::next_symbol(&REAL_POPEN, c"popen");
    if f == 0 {
        super::set_errno(libc::ENOSYS);
        return std::ptr::null_mut();
    }
    before_spawn(false);
    // SAFETY: glibc's `popen`, with the caller's arguments.
    unsafe { std::mem::transmute::<usize, PopenFn>(f)(command, mode) }
}

/// Called by the `vfork` trampoline below: the affinity given back, glibc's `vfork` found.
/// Returns its address (0: none).
extern "C" fn farmem_vfork_prepare() -> usize {
    before_spawn(false);
    super::next_symbol(&REAL_VFORK, c"vfork")
}

/// Returned by the trampoline when glibc's `vfork` cannot be found.
extern "C" fn farmem_vfork_missing() -> c_int {
    super::set_errno(libc::ENOSYS);
    -1
}

/// `vfork` cannot be wrapped by a function that calls it and returns: the child runs on the
/// parent's stack until it execs, and would return through (and overwrite) the wrapper's
/// frame. So this `vfork` prepares, then jumps to glibc's with the caller's own frame, as if
/// the caller had called it directly.
///
/// # Safety
/// As C `vfork`.
#[cfg(target_arch = "x86_64")]
#[no_mangle]
#[unsafe(naked)]
pub unsafe extern "C" fn vfork() -> c_int {
    std::arch::naked_asm!(
        // At entry the stack holds the return address (rsp = 8 mod 16): align it for the
        // call, which needs no other state (vfork has no arguments).
        "sub rsp, 8",
        "call {prepare}",
        "add rsp, 8",
        "test rax, rax",
        "jz 2f",
        "jmp rax",
        "2:",
        "jmp {missing}",
        prepare = sym farmem_vfork_prepare,
        missing = sym farmem_vfork_missing,
    )
}
