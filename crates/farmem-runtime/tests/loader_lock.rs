//! A program thread that faults on far memory while it holds the dynamic loader's lock (a
//! library constructor run by `dlopen`, or the loader's own `calloc` into a far heap, as
//! python3 does when it imports a C module) must be served. The fault thread once made its
//! first receive buffer there: a thread-local whose destructor glibc registers under that
//! same lock, so it waited for the faulting thread, which waited for it (python3 at 40 MiB
//! hung for good). Runtime threads now set up their thread-locals before serving anything.

use std::ffi::CString;
use std::sync::mpsc;
use std::time::Duration;

use farmem_runtime::testing::*;
use farmem_runtime::{hint_ex, FM_WRITE, PAGE_SIZE};

const PAGES: usize = 1024;

/// A shared library whose constructor sums the first word of `FARMEM_TEST_PAGES` pages from
/// `FARMEM_TEST_ADDR` into `farmem_test_sum`: it runs inside `dlopen`, under the loader's lock.
const LIB_C: &str = r#"
#include <stdint.h>
#include <stdlib.h>
uint64_t farmem_test_sum;
__attribute__((constructor)) static void touch_far_pages(void) {
    const char *a = getenv("FARMEM_TEST_ADDR"), *n = getenv("FARMEM_TEST_PAGES");
    if (!a || !n) return;
    const volatile uint64_t *p = (const volatile uint64_t *)(uintptr_t)strtoull(a, 0, 0);
    uint64_t pages = strtoull(n, 0, 0), s = 0;
    for (uint64_t i = 0; i < pages; i++) s += p[i * 512];
    farmem_test_sum = s;
}
"#;

fn value(p: usize) -> u64 {
    (p as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

#[test]
fn a_fault_under_the_loader_lock_is_served() {
    let dir = std::env::temp_dir().join(format!("farmem-loader-lock-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, lib) = (dir.join("touch.c"), dir.join("libtouch.so"));
    std::fs::write(&src, LIB_C).unwrap();
    let st = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("cc (build-essential) is needed");
    assert!(st.success(), "compiling the test library failed");

    // Written and evicted by this thread alone (write hints fetch on the calling thread, and
    // the pressure reads with hints): the fault thread has served nothing yet, so the
    // constructor's faults are its first fetches.
    let rt = runtime(256 * PAGE_SIZE as u64, 32, 8);
    let r = rt.create_region(PAGES * PAGE_SIZE).unwrap();
    for p in 0..PAGES {
        hint_ex(at(&r, p * PAGE_SIZE), PAGE_SIZE, FM_WRITE, 0, 0);
        wr_at(&r, p * PAGE_SIZE, value(p));
    }
    let mut pressure = Pressure::new(&rt, 2048);
    pressure.evict(&r, 0..PAGES);
    let before = rt.stats().unhinted_faults;

    std::env::set_var("FARMEM_TEST_ADDR", format!("{:#x}", at(&r, 0) as usize));
    std::env::set_var("FARMEM_TEST_PAGES", PAGES.to_string());
    let (tx, rx) = mpsc::channel();
    let path = CString::new(lib.to_str().unwrap()).unwrap();
    std::thread::spawn(move || {
        // SAFETY: a library of our own whose constructor only reads the region's pages.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen failed");
        // SAFETY: the symbol is a u64 the constructor wrote before dlopen returned.
        let sum = unsafe {
            let s = libc::dlsym(h, c"farmem_test_sum".as_ptr()) as *const u64;
            assert!(!s.is_null());
            *s
        };
        let _ = tx.send(sum);
    });
    // Generous: the fetches take milliseconds; the deadlock never ends. Abort rather than
    // panic: unwinding would drop the runtime, whose shutdown waits for the stuck thread.
    let Ok(sum) = rx.recv_timeout(Duration::from_secs(60)) else {
        eprintln!("dlopen never returned: a fault under the loader's lock was not served");
        std::process::abort();
    };
    let want = (0..PAGES).fold(0u64, |s, p| s.wrapping_add(value(p)));
    assert_eq!(sum, want);
    assert!(
        rt.stats().unhinted_faults > before,
        "the constructor's reads did not fault: the pages were not far"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
