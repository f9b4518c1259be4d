//! The runtime library's modules depend on each other in one direction only, and the library
//! stands alone: no import cycle between its source files, nothing of the transparent mode
//! (`libfarmem`) in it, and a Rust program that uses it keeps glibc's `malloc`.
//!
//! The module graph is read from the sources: a file depends on every file whose module
//! (or an item of it) it names through `crate::`, `super::` or `self::` paths, in `use`
//! declarations and in code. `mod x;` declarations are not dependencies; test code
//! (`#[cfg(test)]` items) is left out, as are comments and string literals. A re-export
//! (`pub use x::Y` in `a/mod.rs`) makes `a/mod.rs` depend on `x`, so a child that imports
//! through its parent's re-exports shows up as a cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The index just past the literal that starts with the quote at `start` (escapes skipped).
fn past_quoted(b: &[u8], start: usize) -> usize {
    let quote = b[start];
    let mut i = start + 1;
    while i < b.len() && b[i] != quote {
        i += if b[i] == b'\\' { 2 } else { 1 };
    }
    i + 1
}

/// Source text with comments, string and char literals blanked out.
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'r' && (b[i..].starts_with(b"r\"") || b[i..].starts_with(b"r#")) {
            // Raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while j < b.len() && b[j] == b'#' {
                hashes += 1;
                j += 1;
            }
            if j < b.len() && b[j] == b'"' {
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                j += 1;
                while j < b.len() && !b[j..].starts_with(&close) {
                    j += 1;
                }
                i = (j + close.len()).min(b.len());
                out.push_str("\"\"");
            } else {
                out.push('r');
                i += 1;
            }
            continue;
        } else if b[i] == b'"' {
            i = past_quoted(b, i);
            out.push_str("\"\"");
            continue;
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('x' or '\n'), not a lifetime.
            i = past_quoted(b, i);
            out.push_str("' '");
            continue;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// The text with every `#[cfg(test)]` item removed (up to its matching brace, or `;`).
fn without_test_items(src: &str) -> String {
    let mut out = String::new();
    let mut rest = src;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        let end = match (item.find('{'), item.find(';')) {
            (Some(brace), semi) if semi.is_none_or(|s| brace < s) => {
                let mut depth = 0;
                let mut end = item.len();
                for (k, c) in item[brace..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = brace + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (_, Some(semi)) => semi + 1,
            _ => item.len(),
        };
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// Expand a `use` tree (`a::{b, c::{d, e}}`) into full paths.
fn expand_use(tree: &str, prefix: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim_end_matches("::").trim();
        let inner = &tree[open + 1..tree.rfind('}').expect("closing brace")];
        let base = join(prefix, head);
        let mut depth = 0;
        let mut start = 0;
        for (k, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand_use(&inner[start..k], &base, out);
                    start = k + 1;
                }
                _ => {}
            }
        }
        expand_use(&inner[start..], &base, out);
    } else if !tree.is_empty() {
        let path = tree.split(" as ").next().unwrap().trim();
        out.push(join(prefix, path));
    }
}

fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ => format!("{a}::{b}"),
    }
}

/// Every path a file names: `use` trees expanded, plus `crate::`/`super::`/`self::` paths
/// and paths through its child modules (`child::item`) in code.
fn referenced_paths(code: &str, children: &[&str]) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = code;
    // `use` declarations (possibly `pub use`, `pub(crate) use`), up to their `;`.
    while let Some(at) = find_word(rest, "use") {
        let after = &rest[at + 3..];
        let end = after.find(';').unwrap_or(after.len());
        expand_use(&after[..end], "", &mut paths);
        rest = &after[end..];
    }
    // Paths in code.
    let bytes = code.as_bytes();
    let child_starts: Vec<String> = children.iter().map(|c| format!("{c}::")).collect();
    let starts = ["crate::", "super::", "self::"]
        .into_iter()
        .map(str::to_string)
        .chain(child_starts);
    for start in starts {
        let start = start.as_str();
        let mut from = 0;
        while let Some(k) = code[from..].find(start) {
            let at = from + k;
            from = at + start.len();
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
                continue;
            }
            let mut end = at;
            while end < bytes.len()
                && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_' || bytes[end] == b':')
            {
                end += 1;
            }
            let path = code[at..end].trim_end_matches(':');
            if path.len() + 2 > start.len() {
                // Not a bare `crate::{` (a use tree, expanded above).
                paths.push(path.to_string());
            }
        }
    }
    paths
}

fn find_word(s: &str, w: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut from = 0;
    while let Some(k) = s[from..].find(w) {
        let at = from + k;
        let before_ok = at == 0 || !(b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_');
        let after = at + w.len();
        let after_ok = after < b.len() && b[after].is_ascii_whitespace();
        if before_ok && after_ok {
            return Some(at);
        }
        from = after;
    }
    None
}

/// The module path of a source file (`crate`, `crate::a`, `crate::a::b`).
fn module_of(src_dir: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src_dir).unwrap().with_extension("");
    let mut segs: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(segs.last().map(String::as_str), Some("mod" | "lib")) {
        segs.pop();
    }
    std::iter::once("crate".to_string())
        .chain(segs)
        .collect::<Vec<_>>()
        .join("::")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The library's file-level dependency graph: module path -> module paths it depends on.
fn module_graph(src_dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src_dir, &mut files);
    let modules: BTreeMap<String, PathBuf> = files
        .iter()
        .map(|f| (module_of(src_dir, f), f.clone()))
        .collect();
    let mut graph = BTreeMap::new();
    for (module, file) in &modules {
        let code = without_test_items(&strip(&std::fs::read_to_string(file).unwrap()));
        let prefix = format!("{module}::");
        let children: Vec<&str> = modules
            .keys()
            .filter_map(|m| m.strip_prefix(&prefix))
            .filter(|rest| !rest.contains("::"))
            .collect();
        let mut deps = BTreeSet::new();
        for path in referenced_paths(&code, &children) {
            // Make it absolute.
            let mut segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
            let mut base: Vec<&str> = module.split("::").collect();
            match segs.first() {
                Some(&"crate") => {
                    base = vec!["crate"];
                    segs.remove(0);
                }
                Some(&"self") => {
                    segs.remove(0);
                }
                Some(&"super") => {
                    while segs.first() == Some(&"super") {
                        segs.remove(0);
                        base.pop();
                    }
                }
                // A path through a child module, relative to this one.
                Some(first) if children.contains(first) => {}
                _ => continue, // an external crate, or a path relative to a `use`d name
            }
            let full: Vec<&str> = base.into_iter().chain(segs).collect();
            // The longest prefix that is a module file.
            let target = (1..=full.len())
                .rev()
                .map(|n| full[..n].join("::"))
                .find(|p| modules.contains_key(p));
            if let Some(t) = target {
                if &t != module {
                    deps.insert(t);
                }
            }
        }
        graph.insert(module.clone(), deps);
    }
    graph
}

/// Strongly connected components with more than one module (Tarjan).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g: graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn the_runtime_library_has_no_import_cycle() {
    let graph = module_graph(&src_dir());
    assert!(graph.len() > 20, "the sources were not found: {graph:?}");
    // The graph, for `--nocapture`.
    for (m, deps) in &graph {
        let short: Vec<&str> = deps
            .iter()
            .map(|d| d.trim_start_matches("crate::"))
            .collect();
        println!("{m} -> {}", short.join(", "));
    }
    let found = cycles(&graph);
    let explain: Vec<String> = found
        .iter()
        .map(|c| {
            let edges: Vec<String> = c
                .iter()
                .flat_map(|m| {
                    graph[m]
                        .iter()
                        .filter(|d| c.contains(d))
                        .map(move |d| format!("  {m} -> {d}"))
                })
                .collect();
            format!("{}\n{}", c.join(", "), edges.join("\n"))
        })
        .collect();
    assert!(
        found.is_empty(),
        "import cycles among the runtime's modules:\n{}",
        explain.join("\n\n")
    );
}

#[test]
fn the_checker_finds_a_cycle_and_resolves_paths() {
    let dir = std::env::temp_dir().join(format!("farmem-layering-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("a")).unwrap();
    let write = |p: &str, s: &str| std::fs::write(dir.join(p), s).unwrap();
    write("lib.rs", "mod a;\nmod b;\nmod c;\n");
    write(
        "a/mod.rs",
        "mod x;\npub use x::Thing;\n// crate::c would be a comment\n",
    );
    write("a/x.rs", "use crate::b::{self, f};\nfn g() { f(); }\n");
    write(
        "b.rs",
        "pub fn f() { let _ = \"crate::c::h\"; crate::a::Thing::new(); }\n\
         #[cfg(test)]\nmod tests { use crate::c::h; }\n",
    );
    write("c.rs", "pub fn h() {}\n");
    let graph = module_graph(&dir);
    assert_eq!(
        graph["crate::a"],
        BTreeSet::from(["crate::a::x".to_string()])
    );
    assert_eq!(
        graph["crate::a::x"],
        BTreeSet::from(["crate::b".to_string()])
    );
    assert_eq!(graph["crate::b"], BTreeSet::from(["crate::a".to_string()]));
    assert!(graph["crate::c"].is_empty());
    let found = cycles(&graph);
    assert_eq!(found, vec![vec!["crate::a", "crate::a::x", "crate::b"]]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn nothing_of_the_transparent_mode_is_in_the_runtime() {
    let mut files = Vec::new();
    rust_files(&src_dir(), &mut files);
    for f in files {
        let code = strip(&std::fs::read_to_string(&f).unwrap());
        for word in ["preload", "libfarmem", "global_allocator", "capi"] {
            assert!(
                !code.contains(word),
                "{} mentions `{word}` in code",
                f.display()
            );
        }
        // The only symbol the library exports by name is the inline hint's guard.
        for (i, _) in code.match_indices("#[no_mangle]") {
            let next = &code[i..(i + 200).min(code.len())];
            assert!(
                next.contains("fm_guard"),
                "{}: an unmangled symbol other than fm_guard: {next}",
                f.display()
            );
        }
    }
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    for dep in ["libfarmem", "mimalloc"] {
        assert!(!manifest.contains(dep), "the runtime depends on {dep}");
    }
}

/// The shared object that defines the code at `addr`.
fn object_of(addr: *const libc::c_void) -> String {
    // SAFETY: Dl_info is plain old data; dladdr fills it for any address.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid out-pointer.
    let ok = unsafe { libc::dladdr(addr, &mut info) };
    assert!(
        ok != 0 && !info.dli_fname.is_null(),
        "dladdr found no object"
    );
    // SAFETY: dladdr returned a NUL-terminated file name.
    unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned()
}

/// A Rust program that uses the runtime keeps glibc's allocator: the runtime interposes
/// nothing. (Before the runtime was a library of its own, every crate that linked it got the
/// transparent mode's `malloc`, defined in the program itself.)
#[test]
fn a_program_using_the_runtime_keeps_glibc_malloc() {
    use farmem_runtime::{Config, Runtime, PAGE_SIZE};
    // SAFETY: dlsym with a NUL-terminated name; RTLD_DEFAULT searches the global scope, where
    // the program's own definitions come first.
    let malloc = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) };
    assert!(!malloc.is_null());
    let owner = object_of(malloc);
    assert!(
        owner.contains("libc.so"),
        "malloc is defined by {owner}, not glibc"
    );
    let free = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"free".as_ptr()) };
    assert!(object_of(free).contains("libc.so"));

    // And the runtime works in such a program: a region larger than its budget keeps what is
    // written, while the program's own heap (a Vec) stays glibc's.
    let rt = Runtime::new(Config {
        local_mem: 1 << 20,
        ..Config::default()
    })
    .expect("a runtime (needs userfaultfd)");
    let pages = 1024;
    let r = rt.create_region(pages * PAGE_SIZE).unwrap();
    let heap: Vec<u64> = (0..pages as u64).collect();
    // SAFETY: glibc's malloc_usable_size on a block glibc allocated (Vec's buffer comes
    // from the global allocator, i.e. glibc's malloc here).
    let usable = unsafe { libc::malloc_usable_size(heap.as_ptr() as *mut libc::c_void) };
    assert!(usable >= pages * 8);
    for (p, v) in heap.iter().enumerate() {
        // SAFETY: inside the region.
        unsafe { (r.as_mut_ptr().add(p * PAGE_SIZE) as *mut u64).write_volatile(*v ^ 0xfa) };
    }
    for (p, v) in heap.iter().enumerate() {
        // SAFETY: inside the region.
        let got = unsafe { (r.as_ptr().add(p * PAGE_SIZE) as *const u64).read_volatile() };
        assert_eq!(got, *v ^ 0xfa, "page {p}");
    }
    assert!(rt.stats().pages_evicted > 0, "the region went far");
}
