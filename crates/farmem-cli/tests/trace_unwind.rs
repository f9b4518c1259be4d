//! `farmem trace`'s unwinder and symbolizer on a real sample: tests/programs/unwind_probe.c,
//! built like Debian builds packages (optimized, no frame pointers), records its registers,
//! the top of its stack and its /proc/self/maps from inside a chain of calls main → outer →
//! middle → inner, as a perf sample would. We unwind that with the DWARF CFI and symbolize
//! it, and expect inner, middle, outer, main with the source lines of the calls.
//!
//! Variants: with only the symbol table (no -g), stripped, with the debug info in a separate
//! file found by build-id or by .gnu_debuglink, with a dwz supplementary file, with CFI only
//! in .debug_frame, through libc (qsort calling back into the program) and through a signal
//! frame. Needs `cc` (and `objcopy`/`strip` for the separate-debug-file variants, `dwz` for
//! its own); a test whose tool is missing says so and passes. `--nocapture` shows the
//! symbolized stacks.

use farmem_cli::trace::{modules, symbolize, unwind};

use std::path::{Path, PathBuf};
use std::process::Command;

use modules::ModuleMap;
use object::Object;
use symbolize::{Frame, Symbolizer};
use unwind::{Regs, Unwinder};

mod run_support;
use run_support::Scratch;

const MAX_FRAMES: usize = 64;

fn source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/unwind_probe.c")
}

/// Whether `tool` can be run; if not, the test that needs it is skipped with a message.
fn have(tool: &str) -> bool {
    let ok = Command::new(tool).arg("--version").output().is_ok();
    if !ok {
        eprintln!("skipped: `{tool}` is not installed");
    }
    ok
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn compile(dir: &Scratch, name: &str, flags: &[&str]) -> PathBuf {
    let exe = dir.path(name);
    run(Command::new("cc")
        .args(["-O2", "-fomit-frame-pointer", "-Wall"])
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(source()));
    exe
}

/// What the probe recorded.
struct Probe {
    regs: Regs,
    stack: Vec<u8>,
    maps: ModuleMap,
}

fn probe(exe: &Path, mode: &str, dir: &Scratch) -> Probe {
    let out = dir.path(&format!("{mode}.sample"));
    run(Command::new(exe).arg(&out).arg(mode));
    let data = std::fs::read(&out).unwrap();
    assert_eq!(&data[..8], b"UNWPROBE");
    let word = |i: usize| u64::from_le_bytes(data[8 + 8 * i..16 + 8 * i].try_into().unwrap());
    let regs = Regs {
        ip: word(0),
        sp: word(1),
        bp: word(2),
        bx: word(3),
        r12: word(4),
        r13: word(5),
        r14: word(6),
        r15: word(7),
    };
    let len = word(8) as usize;
    assert!(len >= 4096, "the probe copied {len} bytes of stack");
    let stack = data[80..80 + len].to_vec();
    let maps = String::from_utf8_lossy(&data[80 + len..]).into_owned();
    let maps = ModuleMap::from_proc_maps(&maps);
    assert!(
        maps.find(regs.ip).is_some(),
        "rip {:#x} is in no module",
        regs.ip
    );
    Probe { regs, stack, maps }
}

/// The number of the line of the probe's source that holds `marker`.
fn marker_line(marker: &str) -> u32 {
    let src = std::fs::read_to_string(source()).unwrap();
    let pat = format!("/* {marker} */");
    let i = src
        .lines()
        .position(|l| l.contains(&pat))
        .unwrap_or_else(|| panic!("no {pat} in the probe's source"));
    i as u32 + 1
}

/// The sample's call stack, each address symbolized (innermost inlined frame first).
fn stack_of(p: &Probe, unwinder: &mut Unwinder, sym: &mut Symbolizer) -> Vec<Vec<Frame>> {
    let pcs = unwinder.unwind(&p.maps, &p.regs, &p.stack, MAX_FRAMES);
    assert_eq!(pcs[0], p.regs.ip);
    let stack: Vec<Vec<Frame>> = pcs
        .iter()
        .enumerate()
        .map(|(i, &pc)| sym.symbolize(&p.maps, pc, i > 0))
        .collect();
    // Shown with --nocapture.
    for (pc, frames) in pcs.iter().zip(&stack) {
        for f in frames {
            let func = f.function.as_deref().unwrap_or("??");
            let file = f.file.as_deref().unwrap_or("?");
            let line = f.line.unwrap_or(0);
            let inl = if f.inlined { " (inlined)" } else { "" };
            eprintln!(
                "{pc:#014x} {func} {file}:{line} {}+{:#x}{inl}",
                f.module, f.offset
            );
        }
    }
    eprintln!();
    stack
}

/// The physical (containing) function of each address of the stack.
fn functions(stack: &[Vec<Frame>]) -> Vec<String> {
    stack
        .iter()
        .map(|f| {
            f.last()
                .unwrap()
                .function
                .clone()
                .unwrap_or_else(|| "??".into())
        })
        .collect()
}

/// Checks `frames` (the physical frames from `at`) are `names` in the probe's source, on the
/// lines with the markers.
fn expect_source_frames(stack: &[Vec<Frame>], at: usize, names: &[(&str, &str)]) {
    for (k, (name, marker)) in names.iter().enumerate() {
        let f = stack[at + k].last().unwrap();
        let ctx = format!("frame {} of {stack:#?}", at + k);
        assert_eq!(f.function.as_deref(), Some(*name), "{ctx}");
        assert!(
            f.file
                .as_deref()
                .is_some_and(|p| p.ends_with("unwind_probe.c")),
            "{ctx}"
        );
        assert_eq!(f.line, Some(marker_line(marker)), "{marker}: {ctx}");
    }
}

const DIRECT_CHAIN: [(&str, &str); 4] = [
    ("inner", "CAPTURE"),
    ("middle", "CALL_INLINED"),
    ("outer", "CALL_MIDDLE"),
    ("main", "CALL_OUTER"),
];

/// The return address into middle is in `call_inner`, inlined there: two frames.
fn expect_inlined_call(stack: &[Vec<Frame>]) {
    let frames = &stack[1];
    assert_eq!(frames.len(), 2, "{frames:#?}");
    assert_eq!(
        frames[0].function.as_deref(),
        Some("call_inner"),
        "{frames:#?}"
    );
    assert!(frames[0].inlined && !frames[1].inlined, "{frames:#?}");
    assert_eq!(
        frames[0].line,
        Some(marker_line("CALL_INNER")),
        "{frames:#?}"
    );
    assert!(
        frames[0]
            .file
            .as_deref()
            .is_some_and(|p| p.ends_with("unwind_probe.c")),
        "{frames:#?}"
    );
    assert_eq!(frames[0].offset, frames[1].offset);
}

/// Whether the stack goes on from `main` into libc (`__libc_start_call_main`) and ends
/// there by itself, well before the frame limit.
fn ends_in_libc_start(stack: &[Vec<Frame>], main_at: usize) {
    assert!(
        stack.len() > main_at + 1,
        "main's caller is missing: {stack:#?}"
    );
    let caller = stack[main_at + 1].last().unwrap();
    assert!(caller.module.starts_with("libc"), "{caller:#?}");
    assert!(
        stack.len() < MAX_FRAMES,
        "the walk did not stop: {stack:#?}"
    );
}

#[test]
fn unwinds_program_without_frame_pointers() {
    if !have("cc") {
        return;
    }
    let dir = Scratch::new("direct");
    let exe = compile(&dir, "probe", &["-g"]);
    let p = probe(&exe, "direct", &dir);
    let stack = stack_of(&p, &mut Unwinder::new(), &mut Symbolizer::new());
    expect_source_frames(&stack, 0, &DIRECT_CHAIN);
    expect_inlined_call(&stack);
    ends_in_libc_start(&stack, 3);
    let exe_name = exe.file_name().unwrap().to_str().unwrap();
    for f in stack[..4].iter().flatten() {
        assert_eq!(f.module, exe_name);
    }
}

#[test]
fn unwinds_through_libc_qsort() {
    if !have("cc") {
        return;
    }
    let dir = Scratch::new("qsort");
    let exe = compile(&dir, "probe", &["-g"]);
    let p = probe(&exe, "qsort", &dir);
    // With libc's debug info if this machine has it (libc6-dbg), and without, for sure.
    for mut sym in [
        Symbolizer::new(),
        Symbolizer::with_debug_root(dir.path("no-such-root")),
    ] {
        expect_qsort_stack(&stack_of(&p, &mut Unwinder::new(), &mut sym));
    }
}

fn expect_qsort_stack(stack: &[Vec<Frame>]) {
    let names = functions(stack);
    expect_source_frames(
        stack,
        0,
        &[("inner", "CAPTURE"), ("compare", "CALL_INNER_FROM_COMPARE")],
    );
    // qsort's internals, in libc: unwound with libc's .eh_frame (Debian's libc has no frame
    // pointers either), named from its debug info if installed, else from .dynsym.
    let back_in_program = 2 + stack[2..]
        .iter()
        .position(|f| !f.last().unwrap().module.starts_with("libc"))
        .unwrap_or_else(|| panic!("never came back from libc: {names:?}"));
    assert!(
        back_in_program > 2,
        "no libc frame between compare and middle: {names:?}"
    );
    assert!(
        names[2..back_in_program]
            .iter()
            .any(|n| n.contains("qsort")),
        "{names:?}"
    );
    expect_source_frames(
        stack,
        back_in_program,
        &[
            ("middle", "CALL_QSORT"),
            ("outer", "CALL_MIDDLE"),
            ("main", "CALL_OUTER"),
        ],
    );
    ends_in_libc_start(stack, back_in_program + 2);
}

/// Through a signal frame: the handler returns to libc's `__restore_rt`, whose CFI (a signal
/// frame, "S") takes the interrupted registers from the ucontext the kernel pushed, with
/// DWARF expressions; the interrupted pc is exact, not a return address.
#[test]
fn unwinds_through_signal_frame() {
    if !have("cc") {
        return;
    }
    let dir = Scratch::new("signal");
    let exe = compile(&dir, "probe", &["-g"]);
    let p = probe(&exe, "signal", &dir);
    for mut sym in [
        Symbolizer::new(),
        Symbolizer::with_debug_root(dir.path("no-such-root")),
    ] {
        expect_signal_stack(&stack_of(&p, &mut Unwinder::new(), &mut sym));
    }
}

fn expect_signal_stack(stack: &[Vec<Frame>]) {
    let names = functions(stack);
    expect_source_frames(
        stack,
        0,
        &[
            ("inner", "CAPTURE"),
            ("on_signal", "CALL_INNER_FROM_HANDLER"),
        ],
    );
    let trampoline = stack[2].last().unwrap();
    assert!(trampoline.module.starts_with("libc"), "{names:?}");
    // Named only where libc's symbol table is (libc6-dbg): it is not exported.
    if let Some(name) = &trampoline.function {
        assert_eq!(name, "__restore_rt");
    }
    let back_in_program = 2 + stack[2..]
        .iter()
        .position(|f| !f.last().unwrap().module.starts_with("libc"))
        .unwrap_or_else(|| panic!("never came back from libc: {names:?}"));
    expect_source_frames(
        stack,
        back_in_program,
        &[
            ("middle", "CALL_RAISE"),
            ("outer", "CALL_MIDDLE"),
            ("main", "CALL_OUTER"),
        ],
    );
    ends_in_libc_start(stack, back_in_program + 2);
}

#[test]
fn symbol_table_without_debug_info_and_stripped() {
    if !have("cc") {
        return;
    }
    let dir = Scratch::new("nodebug");
    let exe = compile(&dir, "probe", &[]);
    let p = probe(&exe, "direct", &dir);
    let stack = stack_of(&p, &mut Unwinder::new(), &mut Symbolizer::new());
    // .eh_frame is there without -g: the same stack, named from .symtab, without lines.
    assert_eq!(functions(&stack)[..4], ["inner", "middle", "outer", "main"]);
    for f in stack[..4].iter().flatten() {
        assert_eq!((&f.file, f.line), (&None, None), "{f:#?}");
    }
    ends_in_libc_start(&stack, 3);

    if !have("strip") {
        return;
    }
    run(Command::new("strip").arg("--strip-all").arg(&exe));
    let p = probe(&exe, "direct", &dir);
    let stack = stack_of(&p, &mut Unwinder::new(), &mut Symbolizer::new());
    assert!(stack.len() >= 5, "{stack:#?}");
    // No names left for the program's own static functions: module + offset.
    let f = &stack[1][0];
    assert_eq!(f.module, "probe");
    let m = p.maps.find(p.regs.ip).unwrap();
    assert!(f.offset < m.end - m.start + m.file_offset, "{f:#?}");
}

/// The file's build-id.
fn build_id(path: &Path) -> Vec<u8> {
    let data = std::fs::read(path).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    obj.build_id()
        .unwrap()
        .expect("cc links with --build-id")
        .to_vec()
}

/// Moves the debug info of `exe` into `debug`, leaving `exe` without even a symbol table.
fn split_debug_info(exe: &Path, debug: &Path) {
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(exe)
        .arg(debug));
    run(Command::new("strip").arg("--strip-all").arg(exe));
}

#[test]
fn separate_debug_file_by_build_id() {
    if !have("cc") || !have("objcopy") || !have("strip") {
        return;
    }
    let dir = Scratch::new("buildid");
    let exe = compile(&dir, "probe", &["-g"]);
    let id = build_id(&exe);
    let root = dir.path("debug-root");
    let debug = modules::build_id_path(&root, &id).unwrap();
    std::fs::create_dir_all(debug.parent().unwrap()).unwrap();
    split_debug_info(&exe, &debug);

    let p = probe(&exe, "direct", &dir);
    let mut sym = Symbolizer::with_debug_root(root.clone());
    let stack = stack_of(&p, &mut Unwinder::new(), &mut sym);
    expect_source_frames(&stack, 0, &DIRECT_CHAIN);
    expect_inlined_call(&stack);

    // Not under the default root: module + offset only, and no panic.
    let stack = stack_of(&p, &mut Unwinder::new(), &mut Symbolizer::new());
    assert!(stack[0][0].file.is_none());
    assert_eq!(stack[0][0].module, "probe");
}

#[test]
fn separate_debug_file_by_debuglink() {
    if !have("cc") || !have("objcopy") || !have("strip") {
        return;
    }
    let dir = Scratch::new("debuglink");
    // Without a build-id, the debuglink is the only way to the debug file.
    let exe = compile(&dir, "probe", &["-g", "-Wl,--build-id=none"]);
    let debug = dir.path("probe.dbg");
    split_debug_info(&exe, &debug);
    run(Command::new("objcopy")
        .arg(format!("--add-gnu-debuglink={}", debug.display()))
        .arg(&exe));

    let p = probe(&exe, "direct", &dir);
    let mut sym = Symbolizer::with_debug_root(dir.path("no-such-root"));
    let stack = stack_of(&p, &mut Unwinder::new(), &mut sym);
    expect_source_frames(&stack, 0, &DIRECT_CHAIN);
    expect_inlined_call(&stack);
}

/// Debian runs `dwz` on debug files: what several share moves to a supplementary file named
/// by `.gnu_debugaltlink`, which names and types then refer to. Needs `dwz`.
#[test]
fn dwz_supplementary_file() {
    if !have("cc") || !have("objcopy") || !have("strip") || !have("dwz") {
        return;
    }
    let dir = Scratch::new("dwz");
    let exe = compile(&dir, "probe", &["-g"]);
    let other = compile(&dir, "probe-o1", &["-g", "-O1"]);
    run(Command::new("dwz")
        .current_dir(dir.dir())
        .args(["-m", "common.debug", "-M", "common.debug"])
        .arg(&exe)
        .arg(&other));
    let root = dir.path("debug-root");
    let debug = modules::build_id_path(&root, &build_id(&exe)).unwrap();
    std::fs::create_dir_all(debug.parent().unwrap()).unwrap();
    split_debug_info(&exe, &debug);
    let p = probe(&exe, "direct", &dir);

    // Not found (it is not beside the debug file, nor under its build-id): the name of the
    // inlined call_inner, which only DWARF has, is in the supplementary file.
    let mut sym = Symbolizer::with_debug_root(root.clone());
    let stack = stack_of(&p, &mut Unwinder::new(), &mut sym);
    assert!(
        stack[1]
            .iter()
            .all(|f| f.function.as_deref() != Some("call_inner")),
        "{stack:#?}"
    );

    // Found by its build-id, as Debian links it too.
    let common = dir.path("common.debug");
    let sup = modules::build_id_path(&root, &build_id(&common)).unwrap();
    std::fs::create_dir_all(sup.parent().unwrap()).unwrap();
    std::fs::rename(&common, &sup).unwrap();
    let mut sym = Symbolizer::with_debug_root(root);
    let stack = stack_of(&p, &mut Unwinder::new(), &mut sym);
    expect_source_frames(&stack, 0, &DIRECT_CHAIN);
    expect_inlined_call(&stack);
}

#[test]
fn debug_frame_when_eh_frame_has_no_entry() {
    if !have("cc") {
        return;
    }
    let dir = Scratch::new("debugframe");
    // The program's own functions get CFI only in .debug_frame.
    let flags = [
        "-g",
        "-fno-asynchronous-unwind-tables",
        "-fno-unwind-tables",
    ];
    let exe = compile(&dir, "probe", &flags);
    let p = probe(&exe, "direct", &dir);
    let stack = stack_of(&p, &mut Unwinder::new(), &mut Symbolizer::new());
    expect_source_frames(&stack, 0, &DIRECT_CHAIN);
    expect_inlined_call(&stack);
    ends_in_libc_start(&stack, 3);

    // Stripped, with .debug_frame only in the separate debug file.
    if !have("objcopy") || !have("strip") {
        return;
    }
    let root = dir.path("debug-root");
    let debug = modules::build_id_path(&root, &build_id(&exe)).unwrap();
    std::fs::create_dir_all(debug.parent().unwrap()).unwrap();
    split_debug_info(&exe, &debug);
    let p = probe(&exe, "direct", &dir);
    let mut sym = Symbolizer::with_debug_root(root.clone());
    let stack = stack_of(&p, &mut Unwinder::with_debug_root(root), &mut sym);
    expect_source_frames(&stack, 0, &DIRECT_CHAIN);
    expect_inlined_call(&stack);
    // Without the debug file there is no CFI for inner: the walk stops at once.
    let pcs = Unwinder::new().unwind(&p.maps, &p.regs, &p.stack, MAX_FRAMES);
    assert_eq!(pcs, vec![p.regs.ip]);
}

#[test]
fn truncated_stack_and_frame_limit() {
    if !have("cc") {
        return;
    }
    let dir = Scratch::new("limits");
    let exe = compile(&dir, "probe", &["-g"]);
    let p = probe(&exe, "direct", &dir);
    let mut u = Unwinder::new();
    let full = u.unwind(&p.maps, &p.regs, &p.stack, MAX_FRAMES);
    assert!(full.len() >= 5);
    for limit in 1..full.len() {
        assert_eq!(u.unwind(&p.maps, &p.regs, &p.stack, limit), full[..limit]);
    }
    // A copy too short to hold middle's saved registers ends the walk early, cleanly.
    for cut in [0, 8, 64, 512, 1024] {
        let pcs = u.unwind(&p.maps, &p.regs, &p.stack[..cut], MAX_FRAMES);
        assert!(
            pcs.len() < full.len() && pcs[..] == full[..pcs.len()],
            "cut {cut}"
        );
    }
}
