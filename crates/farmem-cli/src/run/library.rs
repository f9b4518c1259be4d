//! Which `libfarmem.so` to preload, and whether a file given as one is one. Preloading any
//! other file makes the dynamic loader print a warning (or nothing) and run the program
//! without farmem, so a wrong `--lib` used to pass unnoticed.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use object::{Object, ObjectKind, ObjectSymbol, ReadCache};

/// The symbol every build of libfarmem defines (the inline hint's guard): a library that
/// exports it is the farmem library.
const MARKER: &str = "fm_guard";

/// Check that `path` is an ELF shared object that defines `fm_guard`; the error says what
/// it is instead.
pub fn check_farmem_library(path: &Path) -> Result<()> {
    let f = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    // Read only the parts the checks need (the library carries megabytes of debug data).
    let cache = ReadCache::new(f);
    let Ok(obj) = object::File::parse(&cache) else {
        bail!(
            "{} is not a farmem library: not an ELF file (pass --lib the libfarmem.so built \
             with the farmem binary)",
            path.display()
        );
    };
    if obj.kind() != ObjectKind::Dynamic {
        bail!(
            "{} is not a farmem library: an ELF file, but not a shared object",
            path.display()
        );
    }
    let defined = obj
        .dynamic_symbols()
        .any(|s| s.name() == Ok(MARKER) && s.is_definition());
    if !defined {
        bail!(
            "{} is not a farmem library: a shared object that does not define {MARKER} \
             (pass --lib the libfarmem.so built with the farmem binary)",
            path.display()
        );
    }
    Ok(())
}

/// Find libfarmem.so: `explicit` (--lib or FARMEM_LIB), else next to this binary or in its
/// deps/ (a cargo build), or in ../lib (an install). Whichever it is must be the farmem
/// library.
pub fn find_lib(explicit: Option<&Path>) -> Result<PathBuf> {
    let lib = locate(explicit)?;
    check_farmem_library(&lib)?;
    Ok(lib)
}

fn locate(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        if p.is_file() {
            return Ok(p.canonicalize()?);
        }
        bail!("{}: no such library", p.display());
    }
    let exe = std::env::current_exe().context("locating the farmem binary")?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    // A cargo build puts the library next to the binary; `cargo test` leaves it in deps/
    // only (and may have rebuilt it there after an older `cargo build`): take the newest.
    let newest = [dir.join("libfarmem.so"), dir.join("deps/libfarmem.so")]
        .into_iter()
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .max_by_key(|(t, _)| *t);
    if let Some((_, p)) = newest {
        return Ok(p.canonicalize()?);
    }
    let installed = dir.join("../lib/libfarmem.so");
    if installed.is_file() {
        return Ok(installed.canonicalize()?);
    }
    bail!(
        "libfarmem.so not found next to {} (build it with `cargo build --release`, or pass \
         --lib PATH / set FARMEM_LIB)",
        exe.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_shared_object_defining_the_marker_passes() {
        let e = check_farmem_library(Path::new("/etc/passwd")).unwrap_err();
        assert!(e.to_string().contains("not an ELF file"), "{e}");
        // The test binary is ELF but an executable; libc is a shared object without it.
        let exe = std::env::current_exe().unwrap();
        let e = check_farmem_library(&exe).unwrap_err().to_string();
        assert!(e.contains("not a farmem library"), "{e}");
        if let Some(libc) = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6"]
            .iter()
            .map(Path::new)
            .find(|p| p.exists())
        {
            let e = check_farmem_library(libc).unwrap_err().to_string();
            assert!(e.contains("does not define fm_guard"), "{e}");
        }
    }
}
