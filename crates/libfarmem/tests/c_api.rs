//! The C interface: a C program built against include/farmem.h and libfarmem.so uses regions,
//! hints and statistics; a second C program built with the same header but without the
//! library runs its hints as no-ops. Skipped (passing) only when no C compiler is installed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const WITH_LIB: &str = r#"
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "farmem.h"

#define PAGE 4096
#define FAIL(...) do { printf("FAIL: "); printf(__VA_ARGS__); printf("\n"); return 1; } while (0)

static uint64_t pat(size_t page, size_t word) {
    uint64_t x = (uint64_t)page * 0x9E3779B97F4A7C15ull ^ (uint64_t)word * 0xBF58476D1CE4E5B9ull;
    return (x ^ (x >> 29)) | 1;
}

int main(void) {
    if (fm_stats_size() != sizeof(struct fm_stats))
        FAIL("struct fm_stats is %zu bytes, library says %zu", sizeof(struct fm_stats), fm_stats_size());
    if (fm_init() != 0) FAIL("fm_init: %s", fm_last_error());

    if (fm_region_create(0) != NULL) FAIL("a zero-size region was created");
    if (strlen(fm_last_error()) == 0) FAIL("no error message for a zero-size region");

    size_t size = 64u << 20, pages = size / PAGE;
    uint64_t *r = fm_region_create(size);
    if (!r) FAIL("fm_region_create: %s", fm_last_error());

    /* Write: a pattern in three words of every page, each page write-hinted. */
    for (size_t p = 0; p < pages; p++) {
        uint64_t *pg = r + p * (PAGE / 8);
        fm_hint_write(pg);
        pg[0] = pat(p, 0);
        pg[17] = pat(p, 17);
        pg[511] = pat(p, 511);
    }
    /* Read back with fm_hint, backwards (no read-ahead help). */
    for (size_t i = pages; i-- > 0;) {
        uint64_t *pg = r + i * (PAGE / 8);
        fm_hint(pg);
        if (pg[0] != pat(i, 0) || pg[17] != pat(i, 17) || pg[511] != pat(i, 511))
            FAIL("page %zu wrong after fm_hint read", i);
        if (pg[1] != 0 || pg[510] != 0) FAIL("page %zu: unwritten words not zero", i);
    }
    /* Read back with sequential extended hints and read-ahead. */
    for (size_t p = 0; p < pages; p++) {
        uint64_t *pg = r + p * (PAGE / 8);
        fm_hint_ex(pg, 4096, FM_SEQ, 63, 0);
        if (pg[0] != pat(p, 0) || pg[17] != pat(p, 17) || pg[511] != pat(p, 511))
            FAIL("page %zu wrong after fm_hint_ex read", p);
    }
    /* Hints on memory outside every region do nothing. */
    char *heap = malloc(3 * PAGE);
    memset(heap, 7, 3 * PAGE);
    fm_hint(heap); fm_hint_write(heap); fm_hint_ex(heap + 100, 2 * PAGE, FM_WRITE, 8, 3);
    for (int i = 0; i < 3 * PAGE; i++) if (heap[i] != 7) FAIL("heap byte %d changed", i);
    free(heap);

    struct fm_stats s;
    if (fm_stats(&s) != 0) FAIL("fm_stats: %s", fm_last_error());
    if (fm_stats(NULL) != -1) FAIL("fm_stats(NULL) succeeded");
    if (s.budget_bytes != (8u << 20)) FAIL("budget %llu, FARMEM_LOCAL_MEM=8M", (unsigned long long)s.budget_bytes);
    if (s.pages_evicted == 0) FAIL("nothing was evicted");
    if (s.pages_written_back == 0 || s.pages_fetched == 0) FAIL("no write-back or no fetch");
    /* Field order: these pairs only match if the layout agrees with the library's. */
    if (s.bytes_read != s.pages_fetched * PAGE) FAIL("bytes_read %llu != pages_fetched * 4096", (unsigned long long)s.bytes_read);
    if (s.bytes_written != s.pages_written_back * PAGE) FAIL("bytes_written != pages_written_back * 4096");
    if (s.hint_calls != s.hint_hits + s.hint_misses) FAIL("hint_calls != hits + misses");
    if (s.peak_resident_pages > s.budget_bytes / PAGE) FAIL("peak resident above the budget");
    /* Read ahead by the hint itself (free budget permitting) or by the pipeline of windows
     * that a stream of FM_SEQ hints keeps in flight: once the pipeline leads, the hints find
     * their pages on the way, so on a loaded machine the first path may count nothing. */
    if (s.readahead_pages + s.prefetch_pages == 0) FAIL("fm_hint_ex read-ahead did nothing");
    printf("stats: evicted=%llu written_back=%llu fetched=%llu hint_calls=%llu readahead=%llu\n",
           (unsigned long long)s.pages_evicted, (unsigned long long)s.pages_written_back,
           (unsigned long long)s.pages_fetched, (unsigned long long)s.hint_calls,
           (unsigned long long)s.readahead_pages);
    fm_stats_print();
    /* Resizing: down to 2 MiB evicts at once, below the minimum is refused. */
    if (fm_set_local_mem(2u << 20) != 0) FAIL("fm_set_local_mem(2M): %s", fm_last_error());
    if (fm_stats(&s) != 0) FAIL("fm_stats: %s", fm_last_error());
    if (s.budget_bytes != (2u << 20) || s.resident_pages > (2u << 20) / PAGE)
        FAIL("after shrinking to 2 MiB: budget %llu, %llu pages resident",
             (unsigned long long)s.budget_bytes, (unsigned long long)s.resident_pages);
    if (fm_set_local_mem(4096) != -1) FAIL("a one-page budget was accepted");

    if (fm_region_destroy(r) != 0) FAIL("fm_region_destroy: %s", fm_last_error());
    if (fm_region_destroy(r) != -1) FAIL("destroying a region twice succeeded");
    if (strlen(fm_last_error()) == 0) FAIL("no error message for a double destroy");
    if (fm_region_destroy(NULL) != -1) FAIL("destroying NULL succeeded");
    fm_hint(r); fm_hint_write(r); fm_hint_ex(r, size, FM_WRITE, 100, 7); /* dropped region */
    printf("farmem C API OK\n");
    return 0;
}
"#;

const WITHOUT_LIB: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "farmem.h"

int main(void) {
    size_t n = 1u << 20;
    unsigned char *m = malloc(n);
    if (!m) return 2;
    for (size_t i = 0; i < n; i++) {
        fm_hint(m + i);
        fm_hint_write(m + i);
        m[i] = (unsigned char)(i * 13);
    }
    for (size_t i = 0; i < n; i += 4096) {
        fm_hint_ex(m + i, 3 * 4096, FM_WRITE, 64, 0);
        fm_hint_ex(m + i + 4000, 200, FM_SEQ, -10, 255);
    }
    fm_hint(NULL); fm_hint_write(NULL); fm_hint_ex(NULL, (size_t)-1, 0, 0, 0);
    for (size_t i = 0; i < n; i++)
        if (m[i] != (unsigned char)(i * 13)) { printf("FAIL at %zu\n", i); return 1; }
    free(m);
    printf("no-op hints OK\n");
    return 0;
}
"#;

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn include_dir() -> PathBuf {
    manifest_dir().join("../../include")
}

fn have_cc() -> bool {
    Command::new("cc")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Directory holding a `libfarmem.so` built from this tree for the test's profile.
///
/// `cargo test` builds the cdylib into `target/<profile>/deps/` next to the test binary
/// (`cargo build` also copies it to `target/<profile>/`). If neither exists, build it.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps dir").to_path_buf();
    let profile_dir = deps.parent().expect("profile dir").to_path_buf();
    for d in [&deps, &profile_dir] {
        if d.join("libfarmem.so").is_file() {
            return d.clone();
        }
    }
    let profile = profile_dir
        .file_name()
        .and_then(|s| s.to_str())
        .unwrap_or("debug")
        .to_string();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("-p")
        .arg("libfarmem")
        .arg("--lib")
        .arg("--manifest-path")
        .arg(manifest_dir().join("../../Cargo.toml"))
        .env(
            "CARGO_TARGET_DIR",
            profile_dir.parent().expect("target dir"),
        );
    match profile.as_str() {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.arg("--profile").arg(other);
        }
    }
    let out = cmd.output().expect("running cargo build for libfarmem.so");
    assert!(
        out.status.success(),
        "building libfarmem.so failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        profile_dir.join("libfarmem.so").is_file(),
        "cargo build made no libfarmem.so"
    );
    profile_dir
}

fn work_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("farmem-c-api-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn compile(dir: &Path, src: &str, lib: Option<&Path>) -> PathBuf {
    let c = dir.join("prog.c");
    std::fs::write(&c, src).unwrap();
    let bin = dir.join("prog");
    let mut cmd = Command::new("cc");
    cmd.args(["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&bin)
        .arg(&c)
        .arg("-I")
        .arg(include_dir());
    if let Some(lib) = lib {
        cmd.arg("-L").arg(lib).arg("-lfarmem");
    }
    let out = cmd.output().expect("running cc");
    assert!(
        out.status.success(),
        "cc failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

fn show(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn c_program_uses_regions_hints_and_stats() {
    if !have_cc() {
        eprintln!("SKIPPED: no C compiler (`cc`) found");
        return;
    }
    let lib = lib_dir();
    let dir = work_dir("with-lib");
    let bin = compile(&dir, WITH_LIB, Some(&lib));
    let out = Command::new(&bin)
        .env("LD_LIBRARY_PATH", &lib)
        .env("FARMEM_LOCAL_MEM", "8M")
        .env_remove("FARMEM_BACKEND")
        .env_remove("FARMEM_EVICT_BATCH")
        .env_remove("FARMEM_STATS")
        .output()
        .expect("running the C program");
    let _ = std::fs::remove_dir_all(&dir);
    let text = show(&out);
    assert!(out.status.success(), "C program failed:\n{text}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("farmem C API OK"), "{text}");
    assert!(!stdout.contains("FAIL"), "{text}");
    // fm_stats_print writes the statistics to stderr.
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("pages_evicted"),
        "{text}"
    );
}

#[test]
fn c_program_without_the_library_runs_hints_as_no_ops() {
    if !have_cc() {
        eprintln!("SKIPPED: no C compiler (`cc`) found");
        return;
    }
    let dir = work_dir("without-lib");
    let bin = compile(&dir, WITHOUT_LIB, None);
    // Not linked: the weak fm_guard / fm_hint_slow references stay unresolved.
    let out = Command::new(&bin)
        .env_remove("LD_PRELOAD")
        .output()
        .expect("running");
    let _ = std::fs::remove_dir_all(&dir);
    let text = show(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("no-op hints OK"),
        "{text}"
    );
}
