//! `farmem trace`: find the code lines that cause most far-memory faults.
//!
//! The program runs as under `farmem run`, with two recorders side by side:
//! * the runtime logs every unhinted fault it receives (`farmem_runtime::fault_log`: thread, page,
//!   zero fill or fetch, read or write), exactly;
//! * a `perf_event_open` sampler (`record`) takes one page fault in `--sample-rate` with the
//!   faulting thread's registers and the top of its stack, which are unwound with the DWARF
//!   call frame information (`unwind`) while the program runs.
//!
//! Samples are joined to the runtime's records by thread, page and time: a sample with no
//! record was a fault on ordinary memory and is left out. The joined faults are symbolized
//! (`symbolize`) and reported (`report`): top sites, the number of sites that cover 95% of
//! faults, at the innermost frame and at the first frame of the program's own code, flame
//! graphs, folded stacks, JSON, and a suggested hint per site. Hinted accesses do not fault,
//! so on a program with hints the report shows what is left to hint.

mod copier;
mod flame;
#[allow(dead_code)]
pub mod modules;
mod record;
mod report;
#[allow(dead_code)]
pub mod symbolize;
#[allow(dead_code)]
pub mod unwind;

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use farmem_runtime::fault_log::{FaultKind, FaultRecord};

use crate::run;
use copier::Copier;
use modules::{Module, ModuleMap};
use record::{Event, Recorder};
use unwind::Unwinder;

#[derive(clap::Parser, Debug)]
#[command(
    after_help = "Examples:\n  farmem trace --local-mem 10% --measure-peak -- sqlite3 db.sqlite < queries.sql\n  \
                  farmem trace --sample-rate 10 --out trace-py -- python3 script.py\n\n\
                  Writes to --out: report.txt (also printed), trace.json, fetch.svg and \
                  zero-fill.svg (flame graphs of the fault stacks), fetch.folded and \
                  zero-fill.folded (the stacks as text, for other flame graph tools). Build the \
                  program with -g (or install its -dbgsym package) for file:line; without debug \
                  information sites are module+offset. Needs perf events: root, or \
                  kernel.perf_event_paranoid <= 1."
)]
pub struct Args {
    #[command(flatten)]
    opts: run::Options,
    /// Directory for the report files (created if missing).
    #[arg(long, value_name = "DIR", default_value = "farmem-trace")]
    out: PathBuf,
    /// Sample one page fault in N (1: every fault). Higher rates cost the program less; the
    /// shares stay right, the patterns get coarser.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    sample_rate: u64,
    /// Bytes of the faulting thread's stack copied per sample, for unwinding (deep stacks
    /// need more).
    #[arg(long, value_name = "BYTES", default_value_t = 8192, value_parser = clap::value_parser!(u32).range(512..=65528))]
    stack_bytes: u32,
    /// Fault sites listed in the report.
    #[arg(long, value_name = "N", default_value_t = 15)]
    top: usize,
    /// The program and its arguments.
    // No `allow_hyphen_values`: an unknown option before the program is reported as one
    // (it used to become the program). Once the program's name is seen (or after `--`),
    // `trailing_var_arg` takes everything that follows as its arguments, options included.
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    cmd: Vec<OsString>,
}

/// Ring buffer per CPU, in pages: 256 MiB shared by the CPUs, between 16 and 64 MiB each
/// (two to eight thousand samples of 8 KiB of stack; a program taking zero-fill faults
/// fills 16 MiB in about ten milliseconds). The kernel pins these pages while tracing.
fn ring_pages() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pages = ((256usize << 20) / cpus).clamp(16 << 20, 64 << 20) / 4096;
    1 << (usize::BITS - 1 - pages.leading_zeros()) // a power of two, rounded down
}

/// A sample after unwinding: where the fault happened and by which path.
struct Sampled {
    pid: u32,
    tid: u32,
    time_ns: u64,
    page: u64,
    pcs: Vec<u64>,
}

/// A far-memory fault with its stack, ready to report.
pub struct TracedFault {
    pub pid: u32,
    pub tid: u32,
    pub time_ns: u64,
    pub page: u64,
    pub kind: FaultKind,
    pub write: bool,
    pub pcs: Vec<u64>,
}

pub fn run(a: Args) -> Result<()> {
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let work = run::tempdir()?;
    let prepared = run::prepare(&a.opts, &a.cmd, &work)?;
    // Both kept until the program has ended (the cgroup is removed on drop).
    let _trim = prepared.start_trim();
    let run::Prepared {
        mut cmd,
        local: prepared_local,
        cgroup: _cgroup,
        ..
    } = prepared;
    cmd.env("FARMEM_TRACE_DIR", &work);

    // The child tells its pid, then waits until the sampler is attached: the event must
    // exist before the program's first instruction (`enable_on_exec` starts it there).
    let (pid_r, pid_w) = pipe()?;
    let (go_r, go_w) = pipe()?;
    // SAFETY: the hook runs in the child between fork and exec and only makes
    // async-signal-safe calls (getpid, write, read, close) on descriptors it owns.
    unsafe {
        cmd.pre_exec(move || {
            libc::close(pid_r);
            libc::close(go_w);
            let pid = libc::getpid().to_le_bytes();
            libc::write(pid_w, pid.as_ptr().cast(), 4);
            libc::close(pid_w);
            let mut b = [1u8];
            let n = libc::read(go_r, b.as_mut_ptr().cast(), 1);
            libc::close(go_r);
            if n == 1 && b[0] == 0 {
                Ok(())
            } else {
                Err(std::io::Error::other(
                    "the fault sampler could not be attached",
                ))
            }
        });
    }
    let (period, stack_bytes) = (a.sample_rate, a.stack_bytes);
    // The copier is running before the program may start: its first milliseconds (loading,
    // the runtime's set-up, often a first burst of faults) would overflow the rings otherwise.
    let opener = std::thread::spawn(move || -> Result<Copier> {
        let mut pid_file = fd_file(pid_r);
        let mut go = fd_file(go_w);
        let mut b = [0u8; 4];
        pid_file
            .read_exact(&mut b)
            .context("the program did not start")?;
        let pid = i32::from_le_bytes(b);
        let r = Recorder::open(pid, period, stack_bytes, ring_pages()).map(Copier::start);
        let _ = go.write_all(&[r.is_err() as u8]);
        r.map_err(|e| {
            anyhow::anyhow!(
                "perf_event_open: {e} (run as root, or set kernel.perf_event_paranoid to 1 or less)"
            )
        })
    });
    let t0 = Instant::now();
    let spawned = cmd.spawn();
    // SAFETY: closing this process's copies of the child's ends.
    unsafe {
        libc::close(pid_w);
        libc::close(go_r);
    }
    let recorder = opener
        .join()
        .map_err(|_| anyhow::anyhow!("the sampler thread panicked"))?;
    match (spawned, recorder) {
        (Ok(child), Ok(copier)) => {
            eprintln!(
                "farmem trace: recording {:?} (pid {}), one fault in {}",
                a.cmd[0],
                child.id(),
                a.sample_rate
            );
            finish(a, child.id() as i32, copier, &work, t0, prepared_local)
        }
        // The child refuses to run without the sampler, so this is only for safety.
        (Ok(mut child), Err(e)) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(e)
        }
        (Err(_), Err(e)) => Err(e),
        (Err(e), Ok(_)) => bail!("cannot start {:?}: {e}", a.cmd[0]),
    }
}

fn finish(
    a: Args,
    pid: i32,
    copier: Copier,
    work: &std::path::Path,
    t0: Instant,
    local: Option<u64>,
) -> Result<()> {
    // Executable mappings per process (a program may execute others; each has its own).
    let mut maps = Maps::default();
    let mut unwinder = Unwinder::new();
    let mut samples: Vec<Sampled> = Vec::new();
    let mut lost = 0u64;
    let mut take = |ev: Event<'_>, maps: &mut Maps| match ev {
        // Only files: [vdso] and anonymous code have nothing to read symbols from.
        Event::Mapping(m) if !m.path.starts_with('/') => {}
        Event::Mapping(m) => maps.by_pid.entry(m.pid).or_default().insert(Module {
            path: PathBuf::from(m.path),
            start: m.start,
            end: m.start + m.len,
            file_offset: m.file_offset,
        }),
        Event::Lost(n) => lost += n,
        Event::Sample(s) => {
            let Some(regs) = s.regs else { return };
            let mut pcs = unwinder.unwind(maps.of(s.pid), &regs, s.stack, 64);
            if pcs.len() < 2 && s.callchain.len() > pcs.len() {
                pcs = s.callchain.clone(); // no CFI here: the frame-pointer walk, if any
            }
            samples.push(Sampled {
                pid: s.pid,
                tid: s.tid,
                time_ns: s.time_ns,
                page: s.addr & !(farmem_runtime::PAGE_SIZE as u64 - 1),
                pcs,
            });
        }
    };
    // One thread copies the rings out as fast as the program fills them; this one parses
    // and unwinds, which is much slower (a few microseconds a sample) and may fall behind
    // for a while without the kernel dropping samples.
    let (status, rusage) = loop {
        copier.take_for(Duration::from_millis(5), |ev| take(ev, &mut maps));
        if let Some(ended) = run::try_wait_with_rusage(pid)? {
            break ended;
        }
    };
    copier.finish(|ev| take(ev, &mut maps));
    let wall = t0.elapsed();

    let records = read_fault_logs(work);
    let ended = run::Ended {
        pid,
        status,
        wall,
        rusage,
        local,
        trimmed: None,
    };
    let stats = run::write_stats(&a.opts, work, &ended);
    let _ = std::fs::remove_dir_all(work);
    let records = records?;
    stats?;
    let status = std::process::ExitStatus::from_raw(status);
    let sampled = samples.len();
    let faults = join(&records, samples);
    eprintln!(
        "farmem trace: {:?} ended ({status}) after {:.1} s: {} far-memory faults; {} faults \
         sampled, {} of them far-memory{}",
        a.cmd[0],
        wall.as_secs_f64(),
        records.len(),
        sampled,
        faults.len(),
        if lost > 0 {
            format!(
                "; {lost} samples lost (the program faulted faster than they were read; \
                 --sample-rate 10 keeps up)"
            )
        } else {
            String::new()
        }
    );
    let rep = report::Report::build(&faults, &records, &maps, a.sample_rate, lost, a.top);
    rep.write(&a.out)?;
    print!("{}", rep.text);
    if !status.success() {
        eprintln!(
            "farmem trace: the program did not exit cleanly ({status}); the report covers what ran"
        );
    }
    Ok(())
}

/// The runtime's fault logs of every process of the program.
fn read_fault_logs(dir: &std::path::Path) -> Result<Vec<FaultRecord>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e?;
        if e.file_name().to_string_lossy().starts_with("faults.") {
            out.extend(FaultRecord::decode_all(&std::fs::read(e.path())?));
        }
    }
    out.sort_by_key(|r| r.time_ns);
    Ok(out)
}

/// Pair each sample with the runtime's record of the same fault: same thread and page, the
/// nearest in time (the runtime reads the fault a few microseconds after the sample). A
/// sample without one (within a second) was a fault on ordinary memory.
fn join(records: &[FaultRecord], samples: Vec<Sampled>) -> Vec<TracedFault> {
    let mut by_key: HashMap<(u32, u64), Vec<&FaultRecord>> = HashMap::new();
    for r in records {
        by_key.entry((r.tid, r.addr)).or_default().push(r);
    }
    samples
        .into_iter()
        .filter_map(|s| {
            let cands = by_key.get(&(s.tid, s.page))?;
            let r = cands
                .iter()
                .min_by_key(|r| r.time_ns.abs_diff(s.time_ns))
                .filter(|r| r.time_ns.abs_diff(s.time_ns) < 1_000_000_000)?;
            Some(TracedFault {
                pid: s.pid,
                tid: s.tid,
                time_ns: s.time_ns,
                page: s.page,
                kind: r.kind,
                write: r.write,
                pcs: s.pcs,
            })
        })
        .collect()
}

/// The executable mappings of each process of the program.
#[derive(Default)]
pub struct Maps {
    by_pid: HashMap<u32, ModuleMap>,
    empty: ModuleMap,
}

impl Maps {
    /// The mappings of `pid`; a process forked without exec has no mapping events of its
    /// own, and shares its parent's code: the first process's mappings stand in.
    pub fn of(&self, pid: u32) -> &ModuleMap {
        self.by_pid
            .get(&pid)
            .or_else(|| self.by_pid.iter().min_by_key(|(p, _)| **p).map(|(_, m)| m))
            .unwrap_or(&self.empty)
    }
}

fn pipe() -> Result<(libc::c_int, libc::c_int)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("pipe");
    }
    Ok((fds[0], fds[1]))
}

fn fd_file(fd: libc::c_int) -> std::fs::File {
    use std::os::fd::FromRawFd;
    // SAFETY: `fd` is a pipe end this process owns and hands over here.
    unsafe { std::fs::File::from_raw_fd(fd) }
}
