//! Symbolization of code addresses: function, source file and line, inlined frames included.
//!
//! Each module file is loaded once: its layout (to turn runtime addresses into ELF
//! addresses, see `modules`), its symbol tables, and its DWARF, from the file itself or
//! from its separate debug file (build-id under `/usr/lib/debug/.build-id/`, or
//! `.gnu_debuglink`), with the `dwz` supplementary file if the debug file names one.
//! `addr2line` answers from the DWARF, with one frame per inlined call. Without DWARF,
//! the symbol tables (`.symtab`, else `.dynsym`) still name the function; without even a
//! readable file, a frame is its module name and offset.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use gimli::{EndianRcSlice, RunTimeEndian, SectionId};
use object::{Object, ObjectSection, ObjectSymbol, SectionKind, SymbolKind};

use super::modules::{self, ElfLayout, Module, ModuleMap};

/// One frame of a symbolized address.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    /// The function, demangled (Rust and C++).
    pub function: Option<String>,
    /// The source file, as the compiler named it (usually absolute).
    pub file: Option<String>,
    pub line: Option<u32>,
    /// Whether this function was inlined into the next frame of the same address.
    pub inlined: bool,
    /// The file name of the module (`libc.so.6`), "?" for an address in no module.
    pub module: String,
    /// The address looked up, in the module's ELF address space (for a return address,
    /// the byte before it, inside the call instruction).
    pub offset: u64,
}

type R = EndianRcSlice<RunTimeEndian>;

/// Symbolizes code addresses, caching what it loads per module file.
pub struct Symbolizer {
    modules: HashMap<PathBuf, SymModule>,
    debug_root: PathBuf,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    pub fn new() -> Symbolizer {
        Symbolizer::with_debug_root(PathBuf::from(modules::DEFAULT_DEBUG_ROOT))
    }

    /// A symbolizer that looks for separate debug files under `root` instead of
    /// `/usr/lib/debug`.
    pub fn with_debug_root(root: PathBuf) -> Symbolizer {
        Symbolizer {
            modules: HashMap::new(),
            debug_root: root,
        }
    }

    /// Frames for one code address, innermost inlined frame first, the containing (physical)
    /// function last. `is_return_address` is true for every address of a stack but the
    /// first: then `addr - 1` is looked up, so that the line is that of the call (and `addr`
    /// itself if nothing at all is known of `addr - 1`).
    pub fn symbolize(&mut self, map: &ModuleMap, addr: u64, is_return_address: bool) -> Vec<Frame> {
        let Some(module) = map.find(addr) else {
            return vec![Frame {
                function: None,
                file: None,
                line: None,
                inlined: false,
                module: "?".into(),
                offset: addr,
            }];
        };
        if !self.modules.contains_key(&module.path) {
            let sm = SymModule::load(&module.path, &self.debug_root);
            self.modules.insert(module.path.clone(), sm);
        }
        let sm = self.modules.get(&module.path);
        if is_return_address && addr > module.start {
            let frames = symbolize_in(sm, module, addr - 1);
            // The pc of a frame interrupted by a signal is exact, not a return address, and
            // may be the first byte of a function (a signal trampoline is entered by `ret`):
            // the byte before it may belong to nothing.
            let known = |f: &Frame| f.function.is_some() || f.file.is_some();
            if frames.iter().any(known) {
                return frames;
            }
            let exact = symbolize_in(sm, module, addr);
            if exact.iter().any(known) {
                return exact;
            }
            return frames;
        }
        symbolize_in(sm, module, addr)
    }
}

/// Frames for runtime address `probe` in `module` (`sm`: what was loaded of it).
fn symbolize_in(sm: Option<&SymModule>, module: &Module, probe: u64) -> Vec<Frame> {
    let layout = sm.and_then(|sm| sm.layout.as_ref());
    let name = module.name();
    let offset = module.elf_address(probe, layout).unwrap_or(probe);
    let frame = |function: Option<String>, file, line, inlined| Frame {
        function,
        file,
        line,
        inlined,
        module: name.clone(),
        offset,
    };

    let mut frames: Vec<Frame> = Vec::new();
    let empty = SymbolTable::default();
    let symbols = sm.map_or(&empty, |sm| &sm.symbols);
    if let Some(ctx) = sm.and_then(|sm| sm.dwarf.as_ref()) {
        // Split DWARF (.dwo) is not loaded: Debian does not ship it.
        if let Ok(mut iter) = ctx.find_frames(offset).skip_all_loads() {
            while let Ok(Some(f)) = iter.next() {
                let function = f
                    .function
                    .as_ref()
                    .and_then(|n| n.demangle().ok())
                    .map(Cow::into_owned);
                let (file, line) = match f.location {
                    Some(loc) => (loc.file.map(str::to_owned), loc.line),
                    None => (None, None),
                };
                frames.push(frame(function, file, line, true));
            }
        }
    }
    match frames.last_mut() {
        Some(last) => {
            last.inlined = false;
            if last.function.is_none() {
                last.function = symbols.lookup(offset).map(demangle);
            }
        }
        None => frames.push(frame(
            symbols.lookup(offset).map(demangle),
            None,
            None,
            false,
        )),
    }
    frames
}

fn demangle(name: &str) -> String {
    addr2line::demangle_auto(Cow::Borrowed(name), None).into_owned()
}

/// What we know of one module file.
struct SymModule {
    /// `None` if the file could not be read: offsets are then file offsets.
    layout: Option<ElfLayout>,
    dwarf: Option<addr2line::Context<R>>,
    symbols: SymbolTable,
}

impl SymModule {
    /// Loads what there is; warns at most once per module, when the module itself or its
    /// debug information cannot be read (no debug information at all is normal, not a
    /// warning).
    fn load(path: &Path, root: &Path) -> SymModule {
        let mut sm = SymModule {
            layout: None,
            dwarf: None,
            symbols: SymbolTable::default(),
        };
        let cache = match modules::open_elf(path) {
            Ok(c) => c,
            Err(e) => {
                let why = format!("cannot read it ({e}): its frames show as module+offset");
                modules::warn_once(path, &why);
                return sm;
            }
        };
        let obj = match object::File::parse(&cache) {
            Ok(o) => o,
            Err(e) => {
                let why = format!("cannot parse it ({e}): its frames show as module+offset");
                modules::warn_once(path, &why);
                return sm;
            }
        };
        sm.layout = Some(ElfLayout::from_object(&obj));
        sm.symbols.add(&obj);
        let loaded = if has_dwarf(&obj) {
            Some(load_dwarf(path, &obj, root))
        } else {
            modules::find_debug_file(path, &obj, root).map(|debug| {
                let cache = modules::open_elf(&debug).map_err(|e| e.to_string())?;
                let dobj = object::File::parse(&cache).map_err(|e| e.to_string())?;
                // A Debian debug file has the full .symtab the stripped module lacks.
                sm.symbols.add(&dobj);
                load_dwarf(&debug, &dobj, root)
            })
        };
        sm.symbols.finish();
        match loaded {
            Some(Ok(ctx)) => sm.dwarf = Some(ctx),
            Some(Err(e)) => modules::warn_once(
                path,
                &format!("cannot load its debug information ({e}): function names only"),
            ),
            None => tracing::debug!("{} has no debug information", path.display()),
        }
        sm
    }
}

fn has_dwarf<'data, D: object::ReadRef<'data>>(obj: &object::File<'data, D>) -> bool {
    obj.section_by_name(".debug_info")
        .is_some_and(|s| s.size() > 0 && s.kind() != SectionKind::UninitializedData)
}

/// The DWARF of `obj` (at `path`), with the supplementary `dwz` file it names if any.
fn load_dwarf<'data, D: object::ReadRef<'data>>(
    path: &Path,
    obj: &object::File<'data, D>,
    root: &Path,
) -> Result<addr2line::Context<R>, String> {
    let mut dwarf = gimli::Dwarf::load(section_loader(obj)).map_err(|e| e.to_string())?;
    if let Some(sup) = modules::find_sup_file(path, obj, root) {
        let cache = modules::open_elf(&sup).map_err(|e| e.to_string())?;
        let sobj = object::File::parse(&cache).map_err(|e| e.to_string())?;
        dwarf
            .load_sup(section_loader(&sobj))
            .map_err(|e: gimli::Error| e.to_string())?;
    }
    addr2line::Context::from_dwarf(dwarf).map_err(|e| e.to_string())
}

/// Loads DWARF sections as owned, decompressed copies; a missing section is empty.
fn section_loader<'a, 'data, D: object::ReadRef<'data>>(
    obj: &'a object::File<'data, D>,
) -> impl FnMut(SectionId) -> Result<R, gimli::Error> + use<'a, 'data, D> {
    let endian = if obj.is_little_endian() {
        RunTimeEndian::Little
    } else {
        RunTimeEndian::Big
    };
    move |id| {
        let data = obj
            .section_by_name(id.name())
            .filter(|s| s.kind() != SectionKind::UninitializedData)
            .and_then(|s| s.uncompressed_data().ok())
            .unwrap_or(Cow::Borrowed(&[]));
        Ok(EndianRcSlice::new(Rc::from(&*data), endian))
    }
}

/// Function symbols by address, from `.symtab` and `.dynsym` of the module and its debug
/// file.
#[derive(Default)]
struct SymbolTable {
    /// (address, size, mangled name), by address.
    syms: Vec<(u64, u64, Box<str>)>,
}

impl SymbolTable {
    fn add<'data, D: object::ReadRef<'data>>(&mut self, obj: &object::File<'data, D>) {
        for s in obj.symbols().chain(obj.dynamic_symbols()) {
            if s.kind() != SymbolKind::Text || !s.is_definition() {
                continue;
            }
            if let Ok(name) = s.name() {
                if !name.is_empty() {
                    self.syms.push((s.address(), s.size(), name.into()));
                }
            }
        }
    }

    /// Sorts by address, and at one address the smaller symbols last, so that a lookup,
    /// which walks down from the address, meets the most specific symbol first.
    fn finish(&mut self) {
        self.syms
            .sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
        self.syms.dedup();
    }

    /// The function symbol covering ELF address `addr`: the closest one at or below it that
    /// is large enough, or, for a symbol without a size (hand-written assembly), the closest
    /// one if nothing sized covers the address.
    fn lookup(&self, addr: u64) -> Option<&str> {
        let i = self.syms.partition_point(|s| s.0 <= addr);
        let below = self.syms[..i].iter().rev().take(16);
        let mut no_size = None;
        for (start, size, name) in below {
            if *size == 0 {
                no_size = no_size.or(Some(&**name));
            } else if addr - start < *size {
                return Some(name);
            }
        }
        let nearest = self.syms[..i].last()?;
        (nearest.1 == 0).then_some(no_size).flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn known_function_for_symbolize(x: u64) -> u64 {
        std::hint::black_box(x).wrapping_mul(0x9e37).rotate_left(11)
    }

    fn own_map() -> ModuleMap {
        ModuleMap::from_proc_maps(&std::fs::read_to_string("/proc/self/maps").unwrap())
    }

    #[test]
    fn symbolizes_own_function_with_file_and_line() {
        assert_ne!(known_function_for_symbolize(3), 0);
        let map = own_map();
        let addr = known_function_for_symbolize as *const () as u64;
        let mut s = Symbolizer::new();
        let frames = s.symbolize(&map, addr, false);
        let last = frames.last().unwrap();
        assert!(
            last.function
                .as_deref()
                .is_some_and(|f| f.ends_with("known_function_for_symbolize")),
            "{frames:#?}"
        );
        assert!(!last.inlined);
        // The release profile keeps line tables (debug = 1).
        assert!(
            last.file
                .as_deref()
                .is_some_and(|f| f.ends_with("symbolize.rs")),
            "{frames:#?}"
        );
        assert!(last.line.is_some_and(|l| l > 0));
        let exe = std::fs::canonicalize("/proc/self/exe").unwrap();
        assert_eq!(
            Some(last.module.as_str()),
            exe.file_name().and_then(|n| n.to_str())
        );
        // Cached: the same answer again.
        assert_eq!(s.symbolize(&map, addr, false), frames);
        assert_eq!(s.modules.len(), 1);
    }

    #[test]
    fn address_in_no_module() {
        let mut s = Symbolizer::new();
        let frames = s.symbolize(&ModuleMap::default(), 0x1234, true);
        assert_eq!(
            frames,
            vec![Frame {
                function: None,
                file: None,
                line: None,
                inlined: false,
                module: "?".into(),
                offset: 0x1234
            }]
        );
    }

    #[test]
    fn unreadable_module_gives_module_and_offset() {
        let mut map = ModuleMap::default();
        map.insert(Module {
            path: "/nonexistent/farmem-test/libgone.so (deleted)".into(),
            start: 0x7f00_0000_0000,
            end: 0x7f00_0001_0000,
            file_offset: 0x2000,
        });
        let mut s = Symbolizer::new();
        for _ in 0..3 {
            let f = s.symbolize(&map, 0x7f00_0000_0100, true);
            assert_eq!(f.len(), 1);
            assert_eq!(f[0].module, "libgone.so (deleted)");
            assert_eq!(f[0].offset, 0x20ff);
            assert_eq!(f[0].function, None);
        }
        assert_eq!(s.modules.len(), 1, "loaded (and warned) once");
    }

    #[test]
    fn symbol_table_lookup() {
        let mut t = SymbolTable {
            syms: vec![
                (0x1000, 0x100, "a".into()),
                (0x1100, 0, "asm_entry".into()),
                (0x1200, 0x10, "b".into()),
                (0x1200, 0x80, "b_alias_larger".into()),
            ],
        };
        t.finish();
        assert_eq!(t.lookup(0xfff), None);
        assert_eq!(t.lookup(0x1000), Some("a"));
        assert_eq!(t.lookup(0x10ff), Some("a"));
        assert_eq!(t.lookup(0x1150), Some("asm_entry"));
        assert_eq!(t.lookup(0x1205), Some("b"));
        assert_eq!(t.lookup(0x1250), Some("b_alias_larger"));
        assert_eq!(t.lookup(0x1280), None, "past every sized symbol");
    }

    #[test]
    fn demangles_rust_and_cpp() {
        assert_eq!(
            demangle("_ZN4core3fmt5write17h0123456789abcdefE"),
            "core::fmt::write"
        );
        assert_eq!(demangle("_Z3fooi"), "foo(int)");
        assert_eq!(demangle("memcpy"), "memcpy");
    }
}
