//! The C ABI of `libfarmem.so` (declared in `include/farmem.h`). Every entry point catches
//! panics: none may unwind into C.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use parking_lot::Mutex;

use farmem_runtime::Region;
use farmem_runtime::Runtime;
use farmem_runtime::StatsSnapshot;

static REGIONS: Mutex<Option<HashMap<usize, Region>>> = Mutex::new(None);

thread_local!(static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default()));

fn set_error(msg: String) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Run `f`, turning errors and panics into `on_err` plus a message for `fm_last_error`.
fn guarded<T>(on_err: T, f: impl FnOnce() -> Result<T, String>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(msg)) => {
            set_error(msg);
            on_err
        }
        Err(_) => {
            set_error("internal error (panic) in farmem".into());
            on_err
        }
    }
}

/// Start the process-wide runtime from `FARMEM_*` variables. 0 on success, -1 on error.
#[no_mangle]
pub extern "C" fn fm_init() -> c_int {
    guarded(-1, || {
        Runtime::global().map(|_| 0).map_err(|e| e.to_string())
    })
}

/// Create a far-memory region of `size` bytes; NULL on error (see `fm_last_error`).
#[no_mangle]
pub extern "C" fn fm_region_create(size: usize) -> *mut c_void {
    guarded(std::ptr::null_mut(), || {
        let rt = Runtime::global().map_err(|e| e.to_string())?;
        let r = rt.create_region(size).map_err(|e| e.to_string())?;
        let p = r.as_mut_ptr();
        REGIONS
            .lock()
            .get_or_insert_with(HashMap::new)
            .insert(p as usize, r);
        Ok(p.cast())
    })
}

/// Destroy a region made by `fm_region_create`. 0 on success, -1 if `base` is not one.
#[no_mangle]
pub extern "C" fn fm_region_destroy(base: *mut c_void) -> c_int {
    guarded(-1, || {
        let r = REGIONS
            .lock()
            .as_mut()
            .and_then(|m| m.remove(&(base as usize)))
            .ok_or_else(|| format!("{base:p} is not the base of a far-memory region"))?;
        drop(r);
        Ok(0)
    })
}

/// Change the process-wide runtime's local budget to `bytes`: shrinking evicts at once and
/// returns once the resident set fits (within 10 s), growing stops evicting. 0, or -1 with a
/// message (a budget below the minimum, or pages in flight that kept it from shrinking).
#[no_mangle]
pub extern "C" fn fm_set_local_mem(bytes: usize) -> c_int {
    guarded(-1, || {
        Runtime::global()
            .map_err(|e| e.to_string())?
            .set_local_mem(bytes as u64, std::time::Duration::from_secs(10))
            .map_err(|e| e.to_string())?;
        Ok(0)
    })
}

/// Out-of-line part of the hints in `farmem.h`.
#[no_mangle]
pub extern "C" fn fm_hint_slow(
    addr: *const c_void,
    len: usize,
    flags: u32,
    readahead: c_int,
    ev_prio: c_int,
) {
    guarded((), || {
        farmem_runtime::hint_slow(
            addr as usize,
            len,
            flags,
            readahead,
            ev_prio.clamp(0, 255) as u8,
        );
        Ok(())
    })
}

/// Copy the global runtime's statistics into `out`. 0 on success, -1 on error.
#[no_mangle]
pub extern "C" fn fm_stats(out: *mut StatsSnapshot) -> c_int {
    guarded(-1, || {
        if out.is_null() {
            return Err("fm_stats: NULL output".into());
        }
        let s = Runtime::global().map_err(|e| e.to_string())?.stats();
        // SAFETY: `out` is non-null and, per the header, points to a `struct fm_stats`,
        // which has StatsSnapshot's layout.
        unsafe { out.write(s) };
        Ok(0)
    })
}

/// Print the global runtime's statistics to stderr.
#[no_mangle]
pub extern "C" fn fm_stats_print() {
    guarded((), || {
        let s = Runtime::global().map_err(|e| e.to_string())?.stats();
        eprintln!("{s}");
        Ok(())
    })
}

/// Size of `struct fm_stats` this library was built with (the header checks it).
#[no_mangle]
pub extern "C" fn fm_stats_size() -> usize {
    std::mem::size_of::<StatsSnapshot>()
}

/// The calling thread's last error message (empty if none). Valid until the next call.
#[no_mangle]
pub extern "C" fn fm_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}
