//! Sampling a program's page faults with `perf_event_open`.
//!
//! One software event (`PERF_COUNT_SW_PAGE_FAULTS`) is opened on the program's first thread
//! before it executes (`enable_on_exec`), inherited by every thread it creates, and sampled
//! every `period` faults. A sample carries the thread, the time (`CLOCK_MONOTONIC`, as the
//! runtime's fault log), the faulting address, the user registers the unwinder needs and a
//! copy of the top of the user stack; the kernel's frame-pointer call chain comes along as a
//! fallback. The ring buffer also reports every executable mapping (`PERF_RECORD_MMAP2`), so
//! addresses can be symbolized after the program is gone.

use std::io;
use std::sync::atomic::{fence, Ordering};

use super::unwind::Regs;

/// `struct perf_event_attr` (version 8 layout, 136 bytes).
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    reserved_2: u16,
    aux_sample_size: u32,
    reserved_3: u32,
    sig_data: u64,
    config3: u64,
}

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;
const PERF_COUNT_SW_PAGE_FAULTS: u64 = 2;

const SAMPLE_IP: u64 = 1 << 0;
const SAMPLE_TID: u64 = 1 << 1;
const SAMPLE_TIME: u64 = 1 << 2;
const SAMPLE_ADDR: u64 = 1 << 3;
const SAMPLE_CALLCHAIN: u64 = 1 << 5;
const SAMPLE_REGS_USER: u64 = 1 << 12;
const SAMPLE_STACK_USER: u64 = 1 << 13;

const FLAG_DISABLED: u64 = 1 << 0;
const FLAG_INHERIT: u64 = 1 << 1;
const FLAG_EXCLUDE_HV: u64 = 1 << 6;
const FLAG_MMAP: u64 = 1 << 8;
const FLAG_ENABLE_ON_EXEC: u64 = 1 << 12;
const FLAG_WATERMARK: u64 = 1 << 14;
const FLAG_EXCLUDE_CALLCHAIN_KERNEL: u64 = 1 << 21;
const FLAG_MMAP2: u64 = 1 << 23;
const FLAG_USE_CLOCKID: u64 = 1 << 25;

/// x86-64 perf register numbers, in the order the sample carries them (ascending).
const REG_BX: u32 = 1;
const REG_BP: u32 = 6;
const REG_SP: u32 = 7;
const REG_IP: u32 = 8;
const REG_R12: u32 = 20;
const REG_R13: u32 = 21;
const REG_R14: u32 = 22;
const REG_R15: u32 = 23;
const REGS: [u32; 8] = [
    REG_BX, REG_BP, REG_SP, REG_IP, REG_R12, REG_R13, REG_R14, REG_R15,
];

const RECORD_MMAP2: u32 = 10;
const RECORD_LOST: u32 = 2;
const RECORD_SAMPLE: u32 = 9;
/// `misc` flag of an MMAP2 record that carries a build id instead of device and inode.
const MISC_MMAP_BUILD_ID: u16 = 1 << 14;

/// Calls from frame-pointer chains beyond this are dropped by the kernel.
const MAX_CALLCHAIN: u16 = 127;

/// One sampled fault, borrowed from the ring buffer.
pub struct Sample<'a> {
    pub pid: u32,
    pub tid: u32,
    pub time_ns: u64,
    pub addr: u64,
    /// User registers (absent for a fault in a kernel thread).
    pub regs: Option<Regs>,
    /// The user stack from `regs.sp` up.
    pub stack: &'a [u8],
    /// The kernel's frame-pointer walk of the user stack (first entry: the user IP).
    pub callchain: Vec<u64>,
}

/// An executable mapping of the program.
#[derive(Clone, Debug)]
pub struct Mapping {
    pub pid: u32,
    pub start: u64,
    pub len: u64,
    pub file_offset: u64,
    pub path: String,
}

/// What the ring buffer delivers.
pub enum Event<'a> {
    Sample(Sample<'a>),
    Mapping(Mapping),
    /// The kernel dropped this many samples (the reader fell behind).
    Lost(u64),
}

/// One CPU's sampling event and its ring buffer. The kernel refuses to map the buffer of an
/// event that follows one task and its children on every CPU (all threads would write to one
/// ring), so there is one event per CPU, each inherited by every thread of the program.
struct Ring {
    fd: libc::c_int,
    base: *mut u8,
    /// Data area size (a power of two), after the control page.
    size: usize,
}

/// The sampling events of one program, with their ring buffers.
pub struct Recorder {
    rings: Vec<Ring>,
    page: usize,
}

// SAFETY: the mappings and descriptors are owned by the Recorder and used by one thread at a
// time (through &mut self).
unsafe impl Send for Recorder {}

/// CPUs the kernel may run the program on (`/sys/devices/system/cpu/possible`, e.g. "0-1").
fn possible_cpus() -> Vec<i32> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.parse::<i32>(), b.parse::<i32>()) {
            cpus.extend(a..=b);
        }
    }
    if cpus.is_empty() {
        // SAFETY: sysconf has no memory effects.
        let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1);
        cpus.extend(0..n as i32);
    }
    cpus
}

impl Recorder {
    /// Open the events on process `pid` (not running its program yet: they start at its
    /// `exec`), sampling one fault in `period`, copying `stack_bytes` of user stack per
    /// sample, with a ring of `ring_pages` pages (a power of two) per CPU.
    pub fn open(
        pid: i32,
        period: u64,
        stack_bytes: u32,
        ring_pages: usize,
    ) -> io::Result<Recorder> {
        let attr = PerfEventAttr {
            type_: PERF_TYPE_SOFTWARE,
            size: std::mem::size_of::<PerfEventAttr>() as u32,
            config: PERF_COUNT_SW_PAGE_FAULTS,
            sample_period: period.max(1),
            sample_type: SAMPLE_IP
                | SAMPLE_TID
                | SAMPLE_TIME
                | SAMPLE_ADDR
                | SAMPLE_CALLCHAIN
                | SAMPLE_REGS_USER
                | SAMPLE_STACK_USER,
            flags: FLAG_DISABLED
                | FLAG_INHERIT
                | FLAG_EXCLUDE_HV
                | FLAG_MMAP
                | FLAG_MMAP2
                | FLAG_ENABLE_ON_EXEC
                | FLAG_EXCLUDE_CALLCHAIN_KERNEL
                | FLAG_USE_CLOCKID
                | FLAG_WATERMARK,
            // Wake the reader when a quarter of the ring is full (it also polls every few
            // milliseconds): one wake-up per sample would cost the program a context switch
            // per fault.
            wakeup_events: (ring_pages.next_power_of_two() * 4096 / 4) as u32,
            sample_regs_user: REGS.iter().fold(0, |m, r| m | 1 << r),
            sample_stack_user: stack_bytes & !7,
            clockid: libc::CLOCK_MONOTONIC,
            sample_max_stack: MAX_CALLCHAIN,
            ..PerfEventAttr::default()
        };
        // SAFETY: sysconf has no memory effects.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let size = ring_pages.next_power_of_two() * page;
        let mut rec = Recorder {
            rings: Vec::new(),
            page,
        };
        for cpu in possible_cpus() {
            // SAFETY: perf_event_open reads `attr` (valid, sized) and returns a descriptor.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_perf_event_open,
                    &attr as *const PerfEventAttr,
                    pid,
                    cpu,
                    -1i32,
                    PERF_FLAG_FD_CLOEXEC,
                )
            } as libc::c_int;
            if fd < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ENODEV) {
                    continue; // a possible CPU that is not present
                }
                return Err(e);
            }
            // SAFETY: mapping the event's ring buffer: control page plus data area, shared.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    page + size,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                let e = io::Error::last_os_error();
                // SAFETY: closing the descriptor we opened.
                unsafe { libc::close(fd) };
                return Err(e);
            }
            rec.rings.push(Ring {
                fd,
                base: base as *mut u8,
                size,
            });
        }
        Ok(rec)
    }

    /// Wait up to `timeout_ms` for data on any CPU's ring.
    pub fn wait(&self, timeout_ms: i32) {
        let mut fds: Vec<libc::pollfd> = self
            .rings
            .iter()
            .map(|r| libc::pollfd {
                fd: r.fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: polling valid pollfds.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    }

    /// Append every record waiting in the rings to `out`, as the kernel wrote them, and
    /// free their space; returns the bytes copied. This is all the reading thread does, so
    /// that it keeps up with the program: records are parsed (`parse_records`) and unwound
    /// elsewhere, at leisure.
    pub fn copy_out(&mut self, out: &mut Vec<u8>) -> usize {
        use std::sync::atomic::AtomicU64;
        let before = out.len();
        for r in &self.rings {
            // SAFETY: the control page holds data_head at byte 1024 and data_tail at 1032
            // (struct perf_event_mmap_page), 8-byte aligned, mapped while `self` lives.
            let (head_a, tail_a) = unsafe {
                (
                    &*(r.base.add(1024) as *const AtomicU64),
                    &*(r.base.add(1032) as *const AtomicU64),
                )
            };
            let head = head_a.load(Ordering::Acquire);
            let tail = tail_a.load(Ordering::Relaxed);
            if head <= tail {
                continue;
            }
            // SAFETY: the data area follows the control page and is `size` bytes long.
            let data = unsafe { std::slice::from_raw_parts(r.base.add(self.page), r.size) };
            // The kernel never runs more than a ring ahead of the tail it was given, and
            // it publishes head only at record boundaries: [tail, head) is whole records.
            let len = ((head - tail) as usize).min(r.size);
            let at = (tail & (r.size as u64 - 1)) as usize;
            let first = len.min(r.size - at);
            out.reserve(len);
            out.extend_from_slice(&data[at..at + first]);
            out.extend_from_slice(&data[..len - first]);
            fence(Ordering::Release);
            tail_a.store(head, Ordering::Release);
        }
        out.len() - before
    }
}

/// Hand each record of `buf` (whole records, as `Recorder::copy_out` wrote them) to `f`.
pub fn parse_records(buf: &[u8], mut f: impl FnMut(Event<'_>)) {
    let mut at = 0;
    while at + 8 <= buf.len() {
        let hdr = &buf[at..at + 8];
        let ty = u32::from_le_bytes(hdr[0..4].try_into().expect("4"));
        let misc = u16::from_le_bytes(hdr[4..6].try_into().expect("2"));
        let len = u16::from_le_bytes(hdr[6..8].try_into().expect("2")) as usize;
        if len < 8 || at + len > buf.len() {
            break; // cannot happen; do not loop forever or read past the end if it does
        }
        let rec = &buf[at..at + len];
        match ty {
            RECORD_SAMPLE => {
                if let Some(s) = parse_sample(&rec[8..]) {
                    f(Event::Sample(s));
                }
            }
            RECORD_MMAP2 => {
                if let Some(m) = parse_mmap2(&rec[8..], misc) {
                    f(Event::Mapping(m));
                }
            }
            RECORD_LOST if rec.len() >= 24 => {
                f(Event::Lost(u64::from_le_bytes(
                    rec[16..24].try_into().expect("8"),
                )));
            }
            _ => {}
        }
        at += len;
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        for r in &self.rings {
            // SAFETY: unmapping and closing what `open` created.
            unsafe {
                libc::munmap(r.base as *mut libc::c_void, self.page + r.size);
                libc::close(r.fd);
            }
        }
    }
}

/// A little-endian reader over a record body.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn u64(&mut self) -> Option<u64> {
        let (a, b) = self.0.split_at_checked(8)?;
        self.0 = b;
        Some(u64::from_le_bytes(a.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        let (a, b) = self.0.split_at_checked(4)?;
        self.0 = b;
        Some(u32::from_le_bytes(a.try_into().ok()?))
    }
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let (a, b) = self.0.split_at_checked(n)?;
        self.0 = b;
        Some(a)
    }
}

/// The fields in the order `sample_type` puts them (see `perf_event_open(2)`).
fn parse_sample(body: &[u8]) -> Option<Sample<'_>> {
    let mut c = Cursor(body);
    let _ip = c.u64()?;
    let pid = c.u32()?;
    let tid = c.u32()?;
    let time_ns = c.u64()?;
    let addr = c.u64()?;
    let nr = c.u64()? as usize;
    let mut callchain = Vec::with_capacity(nr.min(MAX_CALLCHAIN as usize + 8));
    for _ in 0..nr {
        let ip = c.u64()?;
        // Context markers (PERF_CONTEXT_USER...) are the top 4095 values.
        if ip < u64::MAX - 4095 {
            callchain.push(ip);
        }
    }
    let abi = c.u64()?;
    let regs = if abi != 0 {
        let mut v = [0u64; REGS.len()];
        for r in v.iter_mut() {
            *r = c.u64()?;
        }
        // REGS is ascending: bx, bp, sp, ip, r12..r15.
        Some(Regs {
            bx: v[0],
            bp: v[1],
            sp: v[2],
            ip: v[3],
            r12: v[4],
            r13: v[5],
            r14: v[6],
            r15: v[7],
        })
    } else {
        None
    };
    let size = c.u64()? as usize;
    let stack = if size > 0 {
        let data = c.bytes(size)?;
        let dyn_size = c.u64()? as usize;
        &data[..dyn_size.min(size)]
    } else {
        &[][..]
    };
    Some(Sample {
        pid,
        tid,
        time_ns,
        addr,
        regs,
        stack,
        callchain,
    })
}

fn parse_mmap2(body: &[u8], misc: u16) -> Option<Mapping> {
    let mut c = Cursor(body);
    let pid = c.u32()?;
    let _tid = c.u32()?;
    let start = c.u64()?;
    let len = c.u64()?;
    let file_offset = c.u64()?;
    // maj, min, ino, ino_generation; or (misc & MISC_MMAP_BUILD_ID) build_id_size u8,
    // 3 reserved, build_id[20]: 24 bytes either way, unused here.
    let _ = misc & MISC_MMAP_BUILD_ID;
    c.bytes(24)?;
    let prot = c.u32()?;
    let _flags = c.u32()?;
    let name = c.0;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let path = String::from_utf8_lossy(&name[..end]).into_owned();
    (prot & libc::PROT_EXEC as u32 != 0).then_some(Mapping {
        pid,
        start,
        len,
        file_offset,
        path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_has_the_version_8_size() {
        assert_eq!(std::mem::size_of::<PerfEventAttr>(), 136);
    }

    #[test]
    fn a_sample_body_decodes_field_by_field() {
        let mut b = Vec::new();
        let push = |b: &mut Vec<u8>, v: u64| b.extend_from_slice(&v.to_le_bytes());
        push(&mut b, 0xffff_ffff_8100_0000); // kernel ip
        b.extend_from_slice(&7u32.to_le_bytes());
        b.extend_from_slice(&9u32.to_le_bytes());
        push(&mut b, 1_000); // time
        push(&mut b, 0x7000_1000); // addr
        push(&mut b, 3); // callchain: marker + two ips
        push(&mut b, u64::MAX - 511); // PERF_CONTEXT_USER
        push(&mut b, 0x40_1000);
        push(&mut b, 0x40_2000);
        push(&mut b, 2); // abi 64
        for v in [11u64, 22, 33, 44, 55, 66, 77, 88] {
            push(&mut b, v);
        }
        push(&mut b, 16); // stack size
        b.extend_from_slice(&[0xAB; 16]);
        push(&mut b, 8); // dyn size
        let s = parse_sample(&b).unwrap();
        assert_eq!(
            (s.pid, s.tid, s.time_ns, s.addr),
            (7, 9, 1_000, 0x7000_1000)
        );
        assert_eq!(s.callchain, [0x40_1000, 0x40_2000]);
        let r = s.regs.unwrap();
        assert_eq!((r.bx, r.bp, r.sp, r.ip, r.r15), (11, 22, 33, 44, 88));
        assert_eq!(s.stack, &[0xAB; 8]);
        assert!(parse_sample(&b[..b.len() - 9]).is_none(), "truncated");
    }
}

#[cfg(test)]
mod open_tests {
    use super::*;

    /// `PERF_EVENT_IOC_ENABLE`: the events start at exec otherwise.
    const IOC_ENABLE: libc::c_ulong = 0x2400;

    /// The records copied out of a ring that wraps many times are whole and in order: every
    /// page this thread touches comes back as one sample of its address.
    #[test]
    fn copied_records_survive_the_ring_wrapping_around() {
        // 16 pages of ring, 2 KiB of stack per sample: a few dozen samples per lap.
        let mut r = Recorder::open(0, 1, 2048, 16).unwrap();
        // Touched before sampling starts: growing it would fault more than the small ring holds.
        let mut raw = vec![1u8; 32 << 20];
        raw.clear();
        for ring in &r.rings {
            // SAFETY: enabling an event this test opened.
            assert_eq!(unsafe { libc::ioctl(ring.fd, IOC_ENABLE, 0) }, 0);
        }
        let pages = 2000;
        // SAFETY: a private anonymous mapping, touched below and unmapped at the end.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                pages * 4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as *mut u8;
        assert_ne!(base as *mut libc::c_void, libc::MAP_FAILED);
        for i in 0..pages {
            // SAFETY: within the mapping.
            unsafe { base.add(i * 4096).write_volatile(1) };
            if i % 8 == 7 {
                r.copy_out(&mut raw);
            }
        }
        r.copy_out(&mut raw);
        let (mut seen, mut lost) = (std::collections::HashSet::new(), 0);
        parse_records(&raw, |ev| match ev {
            Event::Sample(s) => {
                seen.insert(s.addr & !4095);
            }
            Event::Lost(n) => lost += n,
            Event::Mapping(_) => {}
        });
        let missing = (0..pages)
            .filter(|i| !seen.contains(&(base as u64 + (*i as u64) * 4096)))
            .count();
        // SAFETY: unmapping the mapping made above.
        unsafe { libc::munmap(base.cast(), pages * 4096) };
        assert_eq!((missing, lost), (0, 0), "of {pages} pages");
        assert!(raw.len() > 16 * 4096 * 4, "the ring wrapped several times");
    }

    #[test]
    fn a_truncated_record_ends_the_parse() {
        let mut rec = Vec::new();
        rec.extend_from_slice(&RECORD_LOST.to_le_bytes());
        rec.extend_from_slice(&0u16.to_le_bytes());
        rec.extend_from_slice(&24u16.to_le_bytes());
        rec.extend_from_slice(&[0; 8]); // id
        rec.extend_from_slice(&5u64.to_le_bytes());
        let mut two = rec.clone();
        two.extend_from_slice(&rec[..20]);
        let mut lost = 0;
        parse_records(&two, |ev| {
            if let Event::Lost(n) = ev {
                lost += n
            }
        });
        assert_eq!(lost, 5);
    }

    #[test]
    fn opens_on_itself() {
        let r = super::Recorder::open(0, 1, 16384, 64);
        assert!(
            r.as_ref().is_ok_and(|r| !r.rings.is_empty()),
            "{:?}",
            r.as_ref().err()
        );
        assert!(r.is_ok(), "{:?}", r.err());
    }
}
