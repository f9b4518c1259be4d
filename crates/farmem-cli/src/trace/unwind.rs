//! DWARF call-frame unwinding of sampled user stacks (x86-64).
//!
//! A sample holds the registers at the fault and a copy of the top of the thread's stack.
//! The programs we trace are mostly built without frame pointers, so walking `rbp` chains
//! gives nonsense; instead, for each frame we look up the call frame information (CFI) of
//! the code address, which says how to compute the frame's canonical frame address (CFA,
//! the caller's stack pointer) and where the caller's registers, among them the return
//! address, were saved. Every function a compiler emits for Linux has CFI in `.eh_frame`
//! (C++ exceptions and `backtrace()` need it), also in stripped binaries; code built with
//! `-fno-asynchronous-unwind-tables -g` has it only in `.debug_frame`, possibly in the
//! separate debug file, which we read when `.eh_frame` has no entry.
//!
//! All lookups happen in the module's ELF address space (see `modules`); register values,
//! the CFA and stack reads are runtime values. Only what the sample copied can be read: a
//! frame whose saved registers lie beyond the copied stack ends the walk.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, CommonInformationEntry, DebugFrame, EhFrame, EhFrameHdr,
    EndianRcSlice, EvaluationResult, Expression, FrameDescriptionEntry, Location, ParsedEhFrameHdr,
    Register, RegisterRule, RunTimeEndian, UnwindContext, UnwindOffset, UnwindSection,
    UnwindTableRow, Value,
};
use object::{Object, ObjectSection};

use super::modules::{self, ElfLayout, ModuleMap};

/// User registers of a sample: the ones CFI needs on x86-64 (the callee-saved ones, the
/// stack pointer and the instruction pointer).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Regs {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    pub bx: u64,
    pub r12: u64,
    pub r13: u64,
    pub r14: u64,
    pub r15: u64,
}

type R = EndianRcSlice<RunTimeEndian>;

/// DWARF register numbers of x86-64 (System V psABI, figure 3.36): 0 rax, 1 rdx, 2 rcx,
/// 3 rbx, 4 rsi, 5 rdi, 6 rbp, 7 rsp, 8-15 r8-r15, 16 the return address (rip).
const NREGS: usize = 17;
const RBX: usize = 3;
const RBP: usize = 6;
const RSP: usize = 7;
const RA: usize = 16;
/// Preserved across calls by the ABI: without a rule, the caller's value is the callee's.
const CALLEE_SAVED: [usize; 6] = [RBX, RBP, 12, 13, 14, 15];

/// Register values of one frame; `None` where unknown (caller-saved ones after a call).
type RegFile = [Option<u64>; NREGS];

/// A DWARF expression runs at most this many operations: bad CFI must not hang us.
const MAX_EXPRESSION_STEPS: u32 = 1000;

/// Unwinds sampled stacks, caching the parsed CFI of each module file.
pub struct Unwinder {
    /// `None` for a module whose file could not be read (warned about once).
    modules: HashMap<PathBuf, Option<ModuleCfi>>,
    ctx: Box<UnwindContext<usize>>,
    debug_root: PathBuf,
    /// Unwind rows already computed, by (module start, lookup address). Samples of one
    /// program keep hitting the same few hundred code addresses, and finding the FDE and
    /// running its CFA program is most of a step: with the cache the reader keeps up with
    /// tens of thousands of samples a second.
    rows: HashMap<(u64, u64), CachedRow>,
}

/// A computed unwind row, whether its FDE is a signal trampoline, and which section it came
/// from (expressions in it refer to that section).
struct CachedRow {
    row: UnwindTableRow<usize>,
    signal: bool,
    from_eh_frame: bool,
}

/// Rows kept at most (a cache of all of them is cleared and refilled).
const MAX_CACHED_ROWS: usize = 1 << 18;

impl Default for Unwinder {
    fn default() -> Self {
        Self::new()
    }
}

impl Unwinder {
    pub fn new() -> Unwinder {
        Unwinder::with_debug_root(PathBuf::from(modules::DEFAULT_DEBUG_ROOT))
    }

    /// An unwinder that looks for separate debug files (for `.debug_frame`) under `root`
    /// instead of `/usr/lib/debug`.
    pub fn with_debug_root(root: PathBuf) -> Unwinder {
        Unwinder {
            modules: HashMap::new(),
            ctx: Box::new(UnwindContext::new()),
            debug_root: root,
            rows: HashMap::new(),
        }
    }

    /// Code addresses of the call stack, innermost first: `regs.ip`, then the return address
    /// of each caller. `stack` holds the bytes of the thread's stack starting at address
    /// `regs.sp`. Stops at `max_frames`, after an address outside every module, when the CFI
    /// has no entry, when a read falls outside `stack`, or when the CFA does not increase.
    pub fn unwind(
        &mut self,
        map: &ModuleMap,
        regs: &Regs,
        stack: &[u8],
        max_frames: usize,
    ) -> Vec<u64> {
        let mem = Stack {
            base: regs.sp,
            bytes: stack,
        };
        let mut file: RegFile = [None; NREGS];
        file[RBX] = Some(regs.bx);
        file[RBP] = Some(regs.bp);
        file[RSP] = Some(regs.sp);
        file[12] = Some(regs.r12);
        file[13] = Some(regs.r13);
        file[14] = Some(regs.r14);
        file[15] = Some(regs.r15);
        file[RA] = Some(regs.ip);

        let mut out = Vec::new();
        if max_frames == 0 {
            return out;
        }
        out.push(regs.ip);
        // The first address is where the thread stood; later ones are return addresses,
        // which may lie past the end of the calling function (a call to a noreturn function
        // is often its last instruction), so their CFI is looked up one byte earlier, unless
        // the frame they return from was a signal frame (the kernel's saved pc is exact).
        let mut exact_pc = true;
        while out.len() < max_frames {
            let Some((next, signal)) = self.step(map, &file, &mem, exact_pc) else {
                break;
            };
            let Some(ra) = next[RA].filter(|&ra| ra != 0) else {
                break;
            };
            out.push(ra);
            file = next;
            exact_pc = signal;
        }
        out
    }

    /// Computes the caller's registers from the frame in `file`, and whether this frame was
    /// a signal trampoline.
    fn step(
        &mut self,
        map: &ModuleMap,
        file: &RegFile,
        mem: &Stack,
        exact_pc: bool,
    ) -> Option<(RegFile, bool)> {
        let pc = file[RA]?;
        let module = map.find(pc)?;
        let lookup_pc = if exact_pc || pc == module.start {
            pc
        } else {
            pc - 1
        };
        let Unwinder {
            modules,
            ctx,
            debug_root,
            rows,
        } = self;
        // Looked up by reference first: no allocation per frame once the module is cached.
        if !modules.contains_key(&module.path) {
            modules.insert(module.path.clone(), ModuleCfi::load(&module.path));
        }
        let cfi = modules.get_mut(&module.path)?.as_mut()?;
        let key = (module.start, lookup_pc);
        if !rows.contains_key(&key) {
            if rows.len() >= MAX_CACHED_ROWS {
                rows.clear();
            }
            let addr = module.elf_address(lookup_pc, Some(&cfi.layout))?;
            let ctx = &mut **ctx;
            let eh_fde = cfi
                .eh_frame
                .as_ref()
                .and_then(|eh| eh.fde(addr).map(|fde| (eh, fde)));
            let (row, signal, from_eh_frame) = match eh_fde {
                Some((eh, fde)) => {
                    let (row, signal) = eh.cfi.row(&fde, addr, ctx)?;
                    (row, signal, true)
                }
                None => {
                    let df = cfi.debug_frame(&module.path, debug_root)?;
                    let fde = df.fde_from_index(addr)?;
                    let (row, signal) = df.row(&fde, addr, ctx)?;
                    (row, signal, false)
                }
            };
            rows.insert(
                key,
                CachedRow {
                    row,
                    signal,
                    from_eh_frame,
                },
            );
        }
        let c = rows.get(&key)?;
        let next = if c.from_eh_frame {
            apply_row(&cfi.eh_frame.as_ref()?.cfi.section, &c.row, file, mem)
        } else {
            apply_row(
                &cfi.debug_frame(&module.path, debug_root)?.section,
                &c.row,
                file,
                mem,
            )
        };
        next.map(|f| (f, c.signal))
    }
}

/// The copied top of the stack.
struct Stack<'a> {
    base: u64,
    bytes: &'a [u8],
}

impl Stack<'_> {
    /// Reads a little-endian value of `size` (at most 8) bytes at runtime address `addr`.
    fn read(&self, addr: u64, size: u8) -> Option<u64> {
        let size = usize::from(size);
        if size == 0 || size > 8 {
            return None;
        }
        let off = usize::try_from(addr.checked_sub(self.base)?).ok()?;
        let bytes = self.bytes.get(off..off.checked_add(size)?)?;
        let mut buf = [0u8; 8];
        buf[..size].copy_from_slice(bytes);
        Some(u64::from_le_bytes(buf))
    }
}

/// The caller's registers, from the unwind row of the current frame.
fn apply_row<S: UnwindSection<R>>(
    section: &S,
    row: &UnwindTableRow<usize>,
    file: &RegFile,
    mem: &Stack,
) -> Option<RegFile> {
    let cfa = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            reg(file, *register)?.checked_add_signed(*offset)?
        }
        CfaRule::Expression(e) => evaluate(e.get(section).ok()?, None, file, mem)?,
    };
    // The stack grows down: a caller's frame lies above its callee's. A CFA at or below the
    // current stack pointer means corrupt CFI or registers, and could loop forever.
    if cfa <= file[RSP]? {
        return None;
    }
    let mut next: RegFile = [None; NREGS];
    for (r, slot) in next.iter_mut().enumerate() {
        *slot = match row.register(Register(r as u16)) {
            None if r == RSP => Some(cfa),
            None if CALLEE_SAVED.contains(&r) => file[r],
            None => None,
            Some(rule) => match rule {
                RegisterRule::Undefined | RegisterRule::Architectural => None,
                RegisterRule::SameValue => file[r],
                RegisterRule::Offset(n) => mem.read(cfa.checked_add_signed(n)?, 8),
                RegisterRule::ValOffset(n) => cfa.checked_add_signed(n),
                RegisterRule::Register(other) => reg(file, other),
                RegisterRule::Expression(e) => {
                    let at = evaluate(e.get(section).ok()?, Some(cfa), file, mem);
                    at.and_then(|a| mem.read(a, 8))
                }
                RegisterRule::ValExpression(e) => {
                    evaluate(e.get(section).ok()?, Some(cfa), file, mem)
                }
                RegisterRule::Constant(v) => Some(v),
            },
        };
    }
    Some(next)
}

fn reg(file: &RegFile, r: Register) -> Option<u64> {
    file.get(usize::from(r.0)).copied().flatten()
}

/// Runs a CFI expression (`DW_CFA_def_cfa_expression`, `DW_CFA_expression`, …), feeding it
/// registers and stack memory; `initial` is the CFA that register rules start with.
/// Anything else it asks for (TLS, relocations) is not available to an unwinder.
fn evaluate(expr: Expression<R>, initial: Option<u64>, file: &RegFile, mem: &Stack) -> Option<u64> {
    let encoding = gimli::Encoding {
        format: gimli::Format::Dwarf32,
        version: 4,
        address_size: 8,
    };
    let mut eval = expr.evaluation(encoding);
    eval.set_max_iterations(MAX_EXPRESSION_STEPS);
    if let Some(v) = initial {
        eval.set_initial_value(v);
    }
    let mut state = eval.evaluate().ok()?;
    loop {
        state = match state {
            EvaluationResult::Complete => break,
            EvaluationResult::RequiresRegister { register, .. } => {
                let v = reg(file, register)?;
                eval.resume_with_register(Value::Generic(v)).ok()?
            }
            EvaluationResult::RequiresMemory { address, size, .. } => {
                let v = mem.read(address, size)?;
                eval.resume_with_memory(Value::Generic(v)).ok()?
            }
            _ => return None,
        };
    }
    match eval.result().as_slice() {
        [piece] => match piece.location {
            Location::Address { address } => Some(address),
            Location::Value { value } => value.to_u64(u64::MAX).ok(),
            _ => None,
        },
        _ => None,
    }
}

/// The parsed CFI of one module file.
struct ModuleCfi {
    layout: ElfLayout,
    eh_frame: Option<EhFrameCfi>,
    /// Loaded on first need: most lookups are answered by `.eh_frame`, and `.debug_frame`
    /// may be in a large separate debug file.
    debug_frame: Option<Option<Cfi<DebugFrame<R>>>>,
}

impl ModuleCfi {
    /// Reads the module's layout and `.eh_frame`. `None` (with one warning) if the file
    /// cannot be read or is not ELF: its frames then end the walk.
    fn load(path: &Path) -> Option<ModuleCfi> {
        match Self::try_load(path) {
            Ok(cfi) => Some(cfi),
            Err(e) => {
                modules::warn_once(
                    path,
                    &format!(
                        "cannot read it ({e}): stacks end in it, its frames show as module+offset"
                    ),
                );
                None
            }
        }
    }

    fn try_load(path: &Path) -> Result<ModuleCfi, String> {
        let cache = modules::open_elf(path).map_err(|e| e.to_string())?;
        let obj = object::File::parse(&cache).map_err(|e| e.to_string())?;
        let endian = endian_of(&obj);
        let layout = ElfLayout::from_object(&obj);
        let eh_frame = load_eh_frame(&obj, endian);
        Ok(ModuleCfi {
            layout,
            eh_frame,
            debug_frame: None,
        })
    }

    /// The module's `.debug_frame`, from the module itself or its separate debug file.
    fn debug_frame(&mut self, path: &Path, debug_root: &Path) -> Option<&Cfi<DebugFrame<R>>> {
        self.debug_frame
            .get_or_insert_with(|| load_debug_frame(path, debug_root))
            .as_ref()
    }
}

/// `.eh_frame` with the bases its pointer encodings may be relative to, and the search
/// table of `.eh_frame_hdr` if there is a usable one (else an index is built).
fn load_eh_frame<'data, D: object::ReadRef<'data>>(
    obj: &object::File<'data, D>,
    endian: RunTimeEndian,
) -> Option<EhFrameCfi> {
    let s = obj.section_by_name(".eh_frame")?;
    let mut section = EhFrame::from(section_reader(&s, endian)?);
    section.set_address_size(8);
    let mut bases = BaseAddresses::default().set_eh_frame(s.address());
    if let Some(text) = obj.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    if let Some(got) = obj.section_by_name(".got") {
        bases = bases.set_got(got.address());
    }
    let hdr_section = obj.section_by_name(".eh_frame_hdr");
    if let Some(h) = &hdr_section {
        bases = bases.set_eh_frame_hdr(h.address());
    }
    let hdr = hdr_section
        .and_then(|h| section_reader(&h, endian))
        .and_then(|data| EhFrameHdr::from(data).parse(&bases, 8).ok())
        .filter(|h| h.table().is_some());
    let cfi = Cfi::new(section, bases, hdr.is_none());
    Some(EhFrameCfi { cfi, hdr })
}

fn load_debug_frame(path: &Path, debug_root: &Path) -> Option<Cfi<DebugFrame<R>>> {
    let from = |p: &Path| -> Option<Cfi<DebugFrame<R>>> {
        let cache = modules::open_elf(p).ok()?;
        let obj = object::File::parse(&cache).ok()?;
        let s = obj.section_by_name(".debug_frame")?;
        let mut section = DebugFrame::from(section_reader(&s, endian_of(&obj))?);
        section.set_address_size(8);
        Some(Cfi::new(section, BaseAddresses::default(), true))
    };
    if let Some(df) = from(path) {
        return Some(df);
    }
    let cache = modules::open_elf(path).ok()?;
    let obj = object::File::parse(&cache).ok()?;
    let debug = modules::find_debug_file(path, &obj, debug_root)?;
    from(&debug)
}

fn endian_of<'data, D: object::ReadRef<'data>>(obj: &object::File<'data, D>) -> RunTimeEndian {
    if obj.is_little_endian() {
        RunTimeEndian::Little
    } else {
        RunTimeEndian::Big
    }
}

/// An owned copy of a section's (decompressed) bytes; `None` if empty or unreadable.
fn section_reader<'data, S: ObjectSection<'data>>(s: &S, endian: RunTimeEndian) -> Option<R> {
    let data = s.uncompressed_data().ok()?;
    (!data.is_empty()).then(|| EndianRcSlice::new(Rc::from(&*data), endian))
}

/// `.eh_frame`, searched with the binary search table of `.eh_frame_hdr` when there is one.
struct EhFrameCfi {
    cfi: Cfi<EhFrame<R>>,
    hdr: Option<ParsedEhFrameHdr<R>>,
}

impl EhFrameCfi {
    fn fde(&self, addr: u64) -> Option<FrameDescriptionEntry<R>> {
        match self.hdr.as_ref().and_then(|h| h.table()) {
            Some(table) => table
                .fde_for_address(&self.cfi.section, &self.cfi.bases, addr, |s, b, o| {
                    s.cie_from_offset(b, o)
                })
                .ok(),
            None => self.cfi.fde_from_index(addr),
        }
    }
}

/// One CFI section, with an index of its FDEs when no search table comes with it
/// (`.debug_frame` never has one).
struct Cfi<S: UnwindSection<R>> {
    section: S,
    bases: BaseAddresses,
    /// FDEs as (first address, end address, section offset), by first address.
    index: Vec<(u64, u64, usize)>,
}

impl<S: UnwindSection<R>> Cfi<S>
where
    S::Offset: UnwindOffset<usize>,
{
    fn new(section: S, bases: BaseAddresses, with_index: bool) -> Cfi<S> {
        let index = if with_index {
            build_index(&section, &bases)
        } else {
            Vec::new()
        };
        Cfi {
            section,
            bases,
            index,
        }
    }

    fn fde_from_index(&self, addr: u64) -> Option<FrameDescriptionEntry<R>> {
        let i = self.index.partition_point(|e| e.0 <= addr);
        let &(_, end, offset) = self.index.get(i.checked_sub(1)?)?;
        if addr >= end {
            return None;
        }
        self.section
            .fde_from_offset(&self.bases, S::Offset::from(offset), |s, b, o| {
                s.cie_from_offset(b, o)
            })
            .ok()
    }

    /// The unwind row of `fde` for ELF address `addr`, and whether the FDE is a signal
    /// trampoline.
    fn row(
        &self,
        fde: &FrameDescriptionEntry<R>,
        addr: u64,
        ctx: &mut UnwindContext<usize>,
    ) -> Option<(UnwindTableRow<usize>, bool)> {
        let row = fde
            .unwind_info_for_address(&self.section, &self.bases, ctx, addr)
            .ok()?;
        Some((row.clone(), fde.is_signal_trampoline()))
    }
}

/// Walks a CFI section once, listing its FDEs by address. CIEs are parsed once each.
/// Stops at the first entry it cannot parse (its length, hence what follows, is unknown).
fn build_index<S: UnwindSection<R>>(section: &S, bases: &BaseAddresses) -> Vec<(u64, u64, usize)>
where
    S::Offset: UnwindOffset<usize>,
{
    let mut cies: HashMap<usize, CommonInformationEntry<R>> = HashMap::new();
    let mut index = Vec::new();
    let mut entries = section.entries(bases);
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = partial.parse(|s, b, o| {
            let key: usize = UnwindOffset::into(o);
            if let Some(cie) = cies.get(&key) {
                return Ok(cie.clone());
            }
            let cie = s.cie_from_offset(b, o)?;
            cies.insert(key, cie.clone());
            Ok(cie)
        });
        if let Ok(fde) = fde {
            if fde.len() > 0 {
                index.push((fde.initial_address(), fde.end_address(), fde.offset()));
            }
        }
    }
    index.sort_unstable();
    index
}

#[cfg(test)]
mod tests {
    use super::modules::Module;
    use super::*;

    fn own_exe_module() -> (ModuleMap, Module) {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let map = ModuleMap::from_proc_maps(&maps);
        let here = own_exe_module as *const () as u64;
        let m = map.find(here).expect("own code mapped").clone();
        (map, m)
    }

    #[test]
    fn stack_reads_stay_inside_the_copy() {
        let bytes: Vec<u8> = (0u8..16).collect();
        let s = Stack {
            base: 0x1000,
            bytes: &bytes,
        };
        assert_eq!(s.read(0x1000, 8), Some(0x0706050403020100));
        assert_eq!(s.read(0x1008, 8), Some(0x0f0e0d0c0b0a0908));
        assert_eq!(s.read(0x1009, 8), None);
        assert_eq!(s.read(0x0fff, 8), None);
        assert_eq!(s.read(0x100e, 2), Some(0x0f0e));
        assert_eq!(s.read(0x1000, 9), None);
        assert_eq!(s.read(u64::MAX, 8), None);
    }

    fn expr(bytes: &[u8]) -> Expression<R> {
        Expression(EndianRcSlice::new(Rc::from(bytes), RunTimeEndian::Little))
    }

    /// The CFA expression of PLT entries (GNU ld): rsp + 8, plus 8 more once the entry has
    /// pushed its relocation index (rip & 15 >= 11).
    #[test]
    fn evaluates_plt_cfa_expression() {
        // breg7(rsp)+8; breg16(rip)+0; lit15; and; lit11; ge; lit3; shl; plus
        let plt = [
            0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22,
        ];
        let mem = Stack {
            base: 0x7000,
            bytes: &[],
        };
        let mut file: RegFile = [None; NREGS];
        file[RSP] = Some(0x7000);
        file[RA] = Some(0x1020 + 12);
        assert_eq!(evaluate(expr(&plt), None, &file, &mem), Some(0x7010));
        file[RA] = Some(0x1020 + 3);
        assert_eq!(evaluate(expr(&plt), None, &file, &mem), Some(0x7008));
        file[RSP] = None;
        assert_eq!(evaluate(expr(&plt), None, &file, &mem), None, "unknown rsp");
    }

    /// Signal frames load the interrupted registers from the ucontext on the stack.
    #[test]
    fn evaluates_memory_reads_and_stops_runaway_expressions() {
        let mut bytes = vec![0u8; 64];
        bytes[40..48].copy_from_slice(&0x1234_5678u64.to_le_bytes());
        let mem = Stack {
            base: 0x7000,
            bytes: &bytes,
        };
        let mut file: RegFile = [None; NREGS];
        file[RSP] = Some(0x7000);
        // breg7(rsp)+40; deref
        let deref = [0x77, 40, 0x06];
        assert_eq!(evaluate(expr(&deref), None, &file, &mem), Some(0x1234_5678));
        file[RSP] = Some(0x7000 + 30);
        assert_eq!(
            evaluate(expr(&deref), None, &file, &mem),
            None,
            "read past the copy"
        );
        // A register rule's expression starts with the CFA pushed: CFA + 8.
        let plus8 = [0x23, 0x08]; // plus_uconst 8
        assert_eq!(
            evaluate(expr(&plus8), Some(0x9000), &file, &mem),
            Some(0x9008)
        );
        // skip -3: jumps back to itself forever.
        let forever = [0x2f, 0xfd, 0xff];
        assert_eq!(evaluate(expr(&forever), None, &file, &mem), None);
        // Truncated and unknown operations.
        assert_eq!(evaluate(expr(&[0x77]), None, &file, &mem), None);
        assert_eq!(evaluate(expr(&[0xff]), None, &file, &mem), None);
        assert_eq!(evaluate(expr(&[]), None, &file, &mem), None);
    }

    /// The FDE index (used for `.debug_frame` and for `.eh_frame` without a header) finds
    /// the same FDE as `.eh_frame_hdr`'s search table, for every function of this binary.
    #[test]
    fn index_agrees_with_eh_frame_hdr() {
        let (_, m) = own_exe_module();
        let cfi = ModuleCfi::try_load(&m.path).unwrap();
        let eh = cfi.eh_frame.expect(".eh_frame");
        assert!(eh.hdr.is_some(), "Rust binaries have .eh_frame_hdr");
        let indexed = Cfi::new(eh.cfi.section.clone(), eh.cfi.bases.clone(), true);
        assert!(indexed.index.len() > 100, "{} FDEs", indexed.index.len());
        let mut ctx = UnwindContext::new();
        for &(start, end, offset) in indexed.index.iter().step_by(7) {
            for addr in [start, end - 1] {
                let by_hdr = eh.fde(addr).expect("the header table finds it");
                let by_index = indexed.fde_from_index(addr).expect("the index finds it");
                assert_eq!(by_hdr.offset(), offset, "at {addr:#x}");
                assert_eq!(by_index.offset(), offset, "at {addr:#x}");
            }
            let fde = indexed.fde_from_index(start).unwrap();
            assert!(indexed.row(&fde, start, &mut ctx).is_some());
        }
        assert!(indexed.fde_from_index(0).is_none());
    }

    #[test]
    fn garbage_never_panics_and_stays_bounded() {
        let (map, m) = own_exe_module();
        let mut u = Unwinder::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..300 {
            let sp = 0x7ffd_0000_0000 + (rnd() % 0x1000) * 8;
            let mut stack: Vec<u8> = (0..4096).map(|_| rnd() as u8).collect();
            // Plant plausible return addresses into the own module now and then.
            for _ in 0..(round % 20) {
                let at = (rnd() as usize % (stack.len() / 8)) * 8;
                let ra = m.start + rnd() % (m.end - m.start);
                stack[at..at + 8].copy_from_slice(&ra.to_le_bytes());
            }
            let regs = Regs {
                ip: m.start + rnd() % (m.end - m.start),
                sp,
                bp: rnd(),
                bx: rnd(),
                r12: sp + rnd() % 4096,
                r13: rnd(),
                r14: rnd(),
                r15: rnd(),
            };
            let frames = u.unwind(&map, &regs, &stack, 64);
            assert!(!frames.is_empty() && frames.len() <= 64);
            assert_eq!(frames[0], regs.ip);
        }
        assert!(u.unwind(&map, &Regs::default(), &[], 8) == vec![0]);
        assert!(u.unwind(&map, &Regs::default(), &[], 0).is_empty());
    }

    #[test]
    fn unreadable_module_ends_the_walk() {
        let mut map = ModuleMap::default();
        map.insert(Module {
            path: "/nonexistent/farmem-test/libgone.so (deleted)".into(),
            start: 0x10000,
            end: 0x20000,
            file_offset: 0,
        });
        let mut u = Unwinder::new();
        let regs = Regs {
            ip: 0x10010,
            sp: 0x7000,
            ..Regs::default()
        };
        for _ in 0..3 {
            assert_eq!(u.unwind(&map, &regs, &[0u8; 64], 16), vec![0x10010]);
        }
        assert_eq!(u.modules.len(), 1, "the failure is cached: one warning");
    }
}
