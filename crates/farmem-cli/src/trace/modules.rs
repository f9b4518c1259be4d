//! Executable mappings of the traced process, and the ELF files behind them.
//!
//! A sampled code address is a *runtime* address: where the loader happened to map the
//! module in that process. Call frame information, DWARF and symbol tables speak of
//! addresses in the module's *ELF virtual address space* (the `p_vaddr` of its `PT_LOAD`
//! segments). This module keeps the mappings ([`ModuleMap`], from `/proc/PID/maps` or
//! `PERF_RECORD_MMAP2` events) and translates between the two with the file offset:
//! runtime address → file offset (through the mapping's `pgoff`) → ELF address (through
//! the `PT_LOAD` segment holding that file offset, [`ElfLayout`]). Going through the file
//! offset works alike for PIE executables, shared libraries and fixed-address executables,
//! and does not assume that `p_vaddr == p_offset` (lld and gold lay segments out otherwise).
//!
//! It also finds the separate debug file of a stripped module (Debian's `-dbgsym`
//! packages): by build-id under `/usr/lib/debug/.build-id/`, then by `.gnu_debuglink`,
//! and the `dwz` supplementary file named by `.gnu_debugaltlink`.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use object::read::ReadCache;
use object::{Object, ObjectSegment};

/// Where distributions install separate debug files.
pub const DEFAULT_DEBUG_ROOT: &str = "/usr/lib/debug";

/// One executable file-backed mapping of the traced process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    /// The mapped file, as the kernel names it.
    pub path: PathBuf,
    /// First runtime address of the mapping.
    pub start: u64,
    /// One past the last runtime address of the mapping.
    pub end: u64,
    /// File offset that `start` maps (the mapping's `pgoff`).
    pub file_offset: u64,
}

impl Module {
    /// The file name of the module (`libc.so.6`), as shown in frames.
    pub fn name(&self) -> String {
        self.path
            .file_name()
            .unwrap_or(self.path.as_os_str())
            .to_string_lossy()
            .into_owned()
    }

    /// The file offset that runtime address `addr` maps, if `addr` is in this mapping.
    pub fn file_position(&self, addr: u64) -> Option<u64> {
        if addr < self.start || addr >= self.end {
            return None;
        }
        (addr - self.start).checked_add(self.file_offset)
    }

    /// The ELF virtual address of runtime address `addr`. With the module's layout the
    /// translation is exact; without it (the file could not be read) the file offset is the
    /// best guess, which is right for the usual GNU ld layout of PIEs and shared libraries.
    pub fn elf_address(&self, addr: u64, layout: Option<&ElfLayout>) -> Option<u64> {
        let pos = self.file_position(addr)?;
        Some(
            layout
                .and_then(|l| l.file_offset_to_vaddr(pos))
                .unwrap_or(pos),
        )
    }
}

/// The executable mappings of one process, by address.
#[derive(Clone, Debug, Default)]
pub struct ModuleMap {
    by_start: BTreeMap<u64, Module>,
}

impl ModuleMap {
    /// Adds a mapping. A mapping replaces whatever it overlaps, as `mmap` does: earlier
    /// mappings of the same range go, and ones it overlaps partly keep only the parts
    /// outside it.
    pub fn insert(&mut self, m: Module) {
        if m.start >= m.end {
            return;
        }
        let overlapping: Vec<u64> = self
            .by_start
            .range(..m.end)
            .filter(|(_, old)| old.end > m.start)
            .map(|(&s, _)| s)
            .collect();
        for s in overlapping {
            let Some(old) = self.by_start.remove(&s) else {
                continue;
            };
            if old.start < m.start {
                let mut head = old.clone();
                head.end = m.start;
                self.by_start.insert(head.start, head);
            }
            if old.end > m.end {
                let mut tail = old;
                tail.file_offset = tail.file_offset.saturating_add(m.end - tail.start);
                tail.start = m.end;
                self.by_start.insert(tail.start, tail);
            }
        }
        self.by_start.insert(m.start, m);
    }

    /// The mapping holding runtime address `addr`.
    pub fn find(&self, addr: u64) -> Option<&Module> {
        let (_, m) = self.by_start.range(..=addr).next_back()?;
        (addr < m.end).then_some(m)
    }

    /// All mappings, by address.
    pub fn iter(&self) -> impl Iterator<Item = &Module> {
        self.by_start.values()
    }

    pub fn len(&self) -> usize {
        self.by_start.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }

    /// Parses `/proc/PID/maps`, keeping the executable file-backed mappings (`r-xp` or
    /// `--xp` with a path starting with '/'). Lines it cannot parse are skipped: the text may
    /// come from a process that changed while it was read.
    pub fn from_proc_maps(text: &str) -> ModuleMap {
        let mut map = ModuleMap::default();
        for line in text.lines() {
            if let Some(m) = parse_maps_line(line) {
                map.insert(m);
            }
        }
        map
    }
}

/// One line of `/proc/PID/maps`: `start-end perms offset dev inode   path`. The path is the
/// rest of the line and may hold spaces; a deleted file shows as `path (deleted)`, which we
/// keep as is, so that it is not confused with a new file of the same name.
fn parse_maps_line(line: &str) -> Option<Module> {
    let mut rest = line;
    let mut field = || {
        let t = rest.trim_start();
        let n = t.find(char::is_whitespace).unwrap_or(t.len());
        let (f, r) = t.split_at(n);
        rest = r;
        (!f.is_empty()).then_some(f)
    };
    let range = field()?;
    let perms = field()?;
    let offset = field()?;
    let _dev = field()?;
    let _inode = field()?;
    let path = rest.trim_start();
    if !path.starts_with('/') || perms.as_bytes().get(2) != Some(&b'x') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    let file_offset = u64::from_str_radix(offset, 16).ok()?;
    (start < end).then(|| Module {
        path: PathBuf::from(path),
        start,
        end,
        file_offset,
    })
}

/// One `PT_LOAD` segment: file bytes `[file_offset, file_offset + file_size)` are loaded
/// at ELF address `vaddr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    pub file_offset: u64,
    pub file_size: u64,
    pub vaddr: u64,
}

/// The `PT_LOAD` segments of a module, to turn file offsets into ELF addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ElfLayout {
    pub segments: Vec<LoadSegment>,
}

impl ElfLayout {
    /// Reads the segments of a parsed ELF file (`object` lists only `PT_LOAD` ones).
    pub fn from_object<'data, R: object::ReadRef<'data>>(
        obj: &object::File<'data, R>,
    ) -> ElfLayout {
        let segments = obj
            .segments()
            .map(|s| {
                let (file_offset, file_size) = s.file_range();
                LoadSegment {
                    file_offset,
                    file_size,
                    vaddr: s.address(),
                }
            })
            .collect();
        ElfLayout { segments }
    }

    /// The ELF address that file offset `pos` is loaded at, if a segment holds it.
    pub fn file_offset_to_vaddr(&self, pos: u64) -> Option<u64> {
        self.segments.iter().find_map(|s| {
            let delta = pos.checked_sub(s.file_offset)?;
            (delta < s.file_size).then(|| s.vaddr.wrapping_add(delta))
        })
    }
}

/// Warns about a module once per process: the unwinder and the symbolizer both meet a module
/// that cannot be read, and a trace has many samples in it; one line says it all.
pub fn warn_once(path: &Path, message: &str) {
    static WARNED: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    let warned = WARNED.get_or_init(|| Mutex::new(HashSet::new()));
    let first = warned
        .lock()
        .map(|mut w| w.insert(path.to_path_buf()))
        .unwrap_or(false);
    if first {
        tracing::warn!("{}: {message}", path.display());
    }
}

/// Opens an ELF file for parsing without reading it whole: `object` reads the headers and
/// the sections asked for, on demand (debug files can be hundreds of MiB).
pub fn open_elf(path: &Path) -> std::io::Result<ReadCache<File>> {
    Ok(ReadCache::new(File::open(path)?))
}

/// `ROOT/.build-id/ab/cdef….debug` for build-id `abcdef…`.
pub fn build_id_path(root: &Path, build_id: &[u8]) -> Option<PathBuf> {
    let (first, rest) = build_id.split_first()?;
    if rest.is_empty() {
        return None;
    }
    let hex: String = rest.iter().map(|b| format!("{b:02x}")).collect();
    Some(
        root.join(".build-id")
            .join(format!("{first:02x}"))
            .join(format!("{hex}.debug")),
    )
}

/// Where GDB looks for the file named by `.gnu_debuglink`: beside the module, in `.debug/`
/// beside it, and under the debug root at the module's directory.
pub fn debuglink_candidates(module: &Path, link: &Path, root: &Path) -> Vec<PathBuf> {
    let dir = module.parent().unwrap_or(Path::new("/"));
    vec![
        dir.join(link),
        dir.join(".debug").join(link),
        root.join(dir.strip_prefix("/").unwrap_or(dir)).join(link),
    ]
}

/// The separate debug file of the module at `path` (parsed as `obj`), if one exists and,
/// when both have a build-id, has the same one (a debug file of another build would give
/// wrong lines). Whether the module carries its own debug info is for the caller to check.
pub fn find_debug_file<'data, R: object::ReadRef<'data>>(
    path: &Path,
    obj: &object::File<'data, R>,
    root: &Path,
) -> Option<PathBuf> {
    let build_id = obj.build_id().ok().flatten();
    let mut candidates = Vec::new();
    if let Some(id) = build_id {
        candidates.extend(build_id_path(root, id));
    }
    // The CRC of the debuglink is not checked: the build-id check below covers files that
    // have one, and Debian's debug files all do.
    if let Ok(Some((link, _crc))) = obj.gnu_debuglink() {
        if let Ok(link) = std::str::from_utf8(link) {
            candidates.extend(debuglink_candidates(path, Path::new(link), root));
        }
    }
    candidates
        .into_iter()
        .find(|c| c.as_path() != path && debug_file_matches(c, build_id))
}

/// The `dwz` supplementary file named by the `.gnu_debugaltlink` of debug file `debug_path`
/// (relative names are relative to the debug file's directory), else found by its build-id.
pub fn find_sup_file<'data, R: object::ReadRef<'data>>(
    debug_path: &Path,
    obj: &object::File<'data, R>,
    root: &Path,
) -> Option<PathBuf> {
    let (name, build_id) = obj.gnu_debugaltlink().ok().flatten()?;
    let mut candidates = Vec::new();
    if let Ok(name) = std::str::from_utf8(name) {
        let dir = debug_path.parent().unwrap_or(Path::new("/"));
        candidates.push(dir.join(name));
    }
    candidates.extend(build_id_path(root, build_id));
    let id = (!build_id.is_empty()).then_some(build_id);
    candidates.into_iter().find(|c| debug_file_matches(c, id))
}

/// Whether `candidate` is a readable ELF file whose build-id, if both have one, is `want`.
fn debug_file_matches(candidate: &Path, want: Option<&[u8]>) -> bool {
    if !candidate.is_file() {
        return false;
    }
    let Ok(cache) = open_elf(candidate) else {
        return false;
    };
    let Ok(obj) = object::File::parse(&cache) else {
        return false;
    };
    match (want, obj.build_id().ok().flatten()) {
        (Some(want), Some(have)) => want == have,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::{ObjectSymbol, SymbolKind};

    const MAPS: &str = "\
55d0c0a00000-55d0c0a02000 r--p 00000000 08:01 1234                       /usr/bin/prog
55d0c0a02000-55d0c0a07000 r-xp 00002000 08:01 1234                       /usr/bin/prog
55d0c0a07000-55d0c0a09000 r--p 00007000 08:01 1234                       /usr/bin/prog
55d0c0a0a000-55d0c0a0b000 rw-p 00009000 08:01 1234                       /usr/bin/prog
55d0c1000000-55d0c1021000 rw-p 00000000 00:00 0                          [heap]
7f1a2b000000-7f1a2b028000 r--p 00000000 08:01 99                         /usr/lib/x86_64-linux-gnu/libc.so.6
7f1a2b028000-7f1a2b1bd000 r-xp 00028000 08:01 99                         /usr/lib/x86_64-linux-gnu/libc.so.6
7f1a2b300000-7f1a2b400000 rwxp 00000000 00:00 0 
7f1a2b400000-7f1a2b401000 r-xp 00000000 00:00 0                          [anon:jit]
7f1a2b500000-7f1a2b501000 r-xp 00001000 08:01 77                         /tmp/my lib.so (deleted)
7ffd8a000000-7ffd8a021000 rw-p 00000000 00:00 0                          [stack]
7ffd8a1f0000-7ffd8a1f2000 r-xp 00000000 00:00 0                          [vdso]
garbage line
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";

    #[test]
    fn parses_proc_maps_keeping_executable_files() {
        let map = ModuleMap::from_proc_maps(MAPS);
        let mods: Vec<&Module> = map.iter().collect();
        assert_eq!(mods.len(), 3, "{mods:#?}");
        assert_eq!(
            *mods[0],
            Module {
                path: "/usr/bin/prog".into(),
                start: 0x55d0c0a02000,
                end: 0x55d0c0a07000,
                file_offset: 0x2000
            }
        );
        assert_eq!(
            mods[1].path,
            Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6")
        );
        assert_eq!(mods[1].file_offset, 0x28000);
        assert_eq!(mods[1].name(), "libc.so.6");
        assert_eq!(mods[2].path, Path::new("/tmp/my lib.so (deleted)"));
    }

    #[test]
    fn find_respects_boundaries() {
        let map = ModuleMap::from_proc_maps(MAPS);
        assert!(map.find(0x55d0c0a01fff).is_none());
        assert_eq!(map.find(0x55d0c0a02000).unwrap().file_offset, 0x2000);
        assert_eq!(map.find(0x55d0c0a06fff).unwrap().file_offset, 0x2000);
        assert!(map.find(0x55d0c0a07000).is_none());
        assert!(map.find(0).is_none());
        assert!(map.find(u64::MAX).is_none());
        assert!(
            map.find(0x7f1a2b400000).is_none(),
            "anonymous executable memory"
        );
        assert!(ModuleMap::default().find(0x1000).is_none());
    }

    #[test]
    fn later_mappings_replace_earlier_ones() {
        let m = |path: &str, start, end, file_offset| Module {
            path: path.into(),
            start,
            end,
            file_offset,
        };
        let mut map = ModuleMap::default();
        map.insert(m("/a", 0x1000, 0x5000, 0));
        map.insert(m("/b", 0x1000, 0x5000, 0x1000));
        assert_eq!(map.len(), 1);
        assert_eq!(map.find(0x1000).unwrap().path, Path::new("/b"));
        // A partial overlap leaves the old mapping's head and tail, offsets kept right.
        map.insert(m("/c", 0x2000, 0x3000, 0));
        assert_eq!(map.len(), 3);
        assert_eq!(*map.find(0x1fff).unwrap(), m("/b", 0x1000, 0x2000, 0x1000));
        assert_eq!(map.find(0x2fff).unwrap().path, Path::new("/c"));
        assert_eq!(*map.find(0x3000).unwrap(), m("/b", 0x3000, 0x5000, 0x3000));
        map.insert(m("/empty", 0x9000, 0x9000, 0));
        assert_eq!(map.len(), 3);
    }

    #[test]
    fn translates_pie_shared_and_fixed_layouts() {
        let seg = |file_offset, file_size, vaddr| LoadSegment {
            file_offset,
            file_size,
            vaddr,
        };
        // A GNU ld PIE or shared library: vaddr == offset.
        let pie = ElfLayout {
            segments: vec![seg(0, 0x1000, 0), seg(0x1000, 0x5000, 0x1000)],
        };
        let m = Module {
            path: "/p".into(),
            start: 0x5555_5555_5000,
            end: 0x5555_5555_a000,
            file_offset: 0x1000,
        };
        assert_eq!(m.elf_address(0x5555_5555_5123, Some(&pie)), Some(0x1123));
        // A fixed-address executable: vaddr 0x401000 at offset 0x1000.
        let fixed = ElfLayout {
            segments: vec![seg(0, 0x500, 0x400000), seg(0x1000, 0x2000, 0x401000)],
        };
        let m = Module {
            path: "/e".into(),
            start: 0x401000,
            end: 0x403000,
            file_offset: 0x1000,
        };
        assert_eq!(m.elf_address(0x401234, Some(&fixed)), Some(0x401234));
        // An lld-style layout where the code segment's vaddr is not its offset.
        let lld = ElfLayout {
            segments: vec![seg(0, 0x800, 0), seg(0x800, 0x3000, 0x1800)],
        };
        let m = Module {
            path: "/l".into(),
            start: 0x7f00_0000_1000,
            end: 0x7f00_0000_4000,
            file_offset: 0,
        };
        assert_eq!(m.elf_address(0x7f00_0000_1900, Some(&lld)), Some(0x1900));
        // Without a layout, the file offset; outside the mapping, nothing.
        assert_eq!(m.elf_address(0x7f00_0000_1900, None), Some(0x900));
        assert_eq!(m.elf_address(0x7f00_0000_4000, Some(&lld)), None);
    }

    #[test]
    fn build_id_and_debuglink_paths() {
        let root = Path::new("/usr/lib/debug");
        assert_eq!(
            build_id_path(root, &[0x93, 0xac, 0x61]).unwrap(),
            Path::new("/usr/lib/debug/.build-id/93/ac61.debug")
        );
        assert!(build_id_path(root, &[0x93]).is_none());
        let c = debuglink_candidates(Path::new("/usr/bin/prog"), Path::new("prog.debug"), root);
        assert_eq!(
            c,
            vec![
                PathBuf::from("/usr/bin/prog.debug"),
                PathBuf::from("/usr/bin/.debug/prog.debug"),
                PathBuf::from("/usr/lib/debug/usr/bin/prog.debug"),
            ]
        );
    }

    #[inline(never)]
    fn known_function_for_translation(x: u64) -> u64 {
        std::hint::black_box(x).wrapping_mul(31).rotate_left(7)
    }

    /// The address of a function of this very test binary, taken at run time, maps through
    /// our own /proc/self/maps and the binary's program headers to the ELF address that its
    /// symbol table gives that function.
    #[test]
    fn translates_own_function_through_proc_self_maps() {
        assert_eq!(known_function_for_translation(1), 31 << 7);
        let addr = known_function_for_translation as *const () as u64;
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let map = ModuleMap::from_proc_maps(&maps);
        let module = map.find(addr).expect("the test binary's code is mapped");
        let exe = std::fs::canonicalize("/proc/self/exe").unwrap();
        assert_eq!(std::fs::canonicalize(&module.path).unwrap(), exe);

        let cache = open_elf(&module.path).unwrap();
        let obj = object::File::parse(&cache).unwrap();
        let layout = ElfLayout::from_object(&obj);
        assert!(!layout.segments.is_empty());
        let elf_addr = module.elf_address(addr, Some(&layout)).unwrap();
        let sym = obj
            .symbols()
            .find(|s| {
                s.kind() == SymbolKind::Text
                    && s.address() <= elf_addr
                    && elf_addr < s.address() + s.size().max(1)
            })
            .expect("a symbol covers the translated address");
        let name = addr2line::demangle_auto(sym.name().unwrap().into(), None);
        assert!(
            name.contains("known_function_for_translation"),
            "translated {addr:#x} to {elf_addr:#x}, which is in {name}"
        );
    }
}
