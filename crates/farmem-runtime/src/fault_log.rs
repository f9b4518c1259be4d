//! The fault log `farmem trace` reads: with `FARMEM_TRACE_DIR` set, every unhinted fault the
//! runtime receives is appended to `DIR/faults.PID` as one fixed-size record.
//!
//! The tracer samples the same faults with `perf_event_open`, which gives the faulting
//! thread's stack but not what the runtime knows: whether the page was a first touch (zero
//! fill), a fetch from far memory or the first write to a page installed read-only, and
//! whether the access was a write. Samples and records are joined by thread, page and time
//! (both use `CLOCK_MONOTONIC`). Faults on ordinary memory have no record, so the join also
//! keeps only far-memory faults.
//!
//! Records are buffered and written in 64 KiB blocks, and at exit; a process that ends with
//! `_exit` loses its last block.

use std::io::Write;
use std::sync::OnceLock;

use parking_lot::Mutex;

/// What a fault needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FaultKind {
    /// The page was never written: materialized as zeros (an allocation's first touch).
    ZeroFill = 0,
    /// The page was read back from far memory.
    Fetch = 1,
    /// The first write to a page installed read-only.
    WriteProtect = 2,
    /// Already resolved when read (another thread's fault or hint brought the page in).
    Resolved = 3,
}

impl FaultKind {
    pub fn from_u8(v: u8) -> Option<FaultKind> {
        Some(match v {
            0 => FaultKind::ZeroFill,
            1 => FaultKind::Fetch,
            2 => FaultKind::WriteProtect,
            3 => FaultKind::Resolved,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::ZeroFill => "zero-fill",
            FaultKind::Fetch => "fetch",
            FaultKind::WriteProtect => "write-protect",
            FaultKind::Resolved => "resolved",
        }
    }
}

/// One fault, as stored: `time_ns u64 | tid u32 | kind u8 | write u8 | 0 u16 | addr u64`,
/// little endian.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultRecord {
    /// `CLOCK_MONOTONIC` when the runtime read the fault.
    pub time_ns: u64,
    pub tid: u32,
    pub kind: FaultKind,
    pub write: bool,
    /// Page-aligned faulting address.
    pub addr: u64,
}

pub const RECORD_LEN: usize = 24;

impl FaultRecord {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.time_ns.to_le_bytes());
        out.extend_from_slice(&self.tid.to_le_bytes());
        out.push(self.kind as u8);
        out.push(self.write as u8);
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&self.addr.to_le_bytes());
    }

    /// Decode a log; a truncated last record or an unknown kind ends it.
    pub fn decode_all(bytes: &[u8]) -> Vec<FaultRecord> {
        let u64_at = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8"));
        bytes
            .chunks_exact(RECORD_LEN)
            .map_while(|b| {
                Some(FaultRecord {
                    time_ns: u64_at(b, 0),
                    tid: u32::from_le_bytes(b[8..12].try_into().expect("4")),
                    kind: FaultKind::from_u8(b[12])?,
                    write: b[13] != 0,
                    addr: u64_at(b, 16),
                })
            })
            .collect()
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds (what the tracer asks perf to stamp samples with).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into valid memory.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

const FLUSH_AT: usize = 64 << 10;

struct Log {
    dir: String,
    /// The process the open file belongs to (a forked child opens its own).
    pid: u32,
    file: Option<std::fs::File>,
    buf: Vec<u8>,
}

impl Log {
    fn write_out(&mut self) {
        let pid = std::process::id();
        if self.pid != pid {
            // A forked child: its records go to its own file; the parent's are its own.
            self.file = None;
            self.buf.clear();
            self.pid = pid;
        }
        if self.buf.is_empty() {
            return;
        }
        if self.file.is_none() {
            let path = format!("{}/faults.{pid}", self.dir);
            self.file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| tracing::warn!("fault log {path}: {e}"))
                .ok();
        }
        if let Some(f) = &mut self.file {
            if let Err(e) = f.write_all(&self.buf) {
                tracing::warn!("writing the fault log: {e}");
            }
        }
        self.buf.clear();
    }
}

fn log() -> Option<&'static Mutex<Log>> {
    static LOG: OnceLock<Option<Mutex<Log>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let dir = std::env::var("FARMEM_TRACE_DIR").ok()?;
        (!dir.is_empty()).then(|| {
            Mutex::new(Log {
                dir,
                pid: std::process::id(),
                file: None,
                buf: Vec::with_capacity(FLUSH_AT + RECORD_LEN),
            })
        })
    })
    .as_ref()
}

/// Whether faults are being logged (`FARMEM_TRACE_DIR` is set).
pub(crate) fn enabled() -> bool {
    log().is_some()
}

/// Log one fault (no-op unless tracing).
pub(crate) fn record(r: FaultRecord) {
    if let Some(l) = log() {
        let mut l = l.lock();
        r.encode(&mut l.buf);
        if l.buf.len() >= FLUSH_AT {
            l.write_out();
        }
    }
}

/// Write what is buffered (at exit).
pub fn flush() {
    if let Some(l) = log() {
        l.lock().write_out();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_a_torn_tail_is_ignored() {
        let recs = [
            FaultRecord {
                time_ns: 123_456_789,
                tid: 4242,
                kind: FaultKind::Fetch,
                write: true,
                addr: 0x7f00_1234_5000,
            },
            FaultRecord {
                time_ns: 5,
                tid: 1,
                kind: FaultKind::ZeroFill,
                write: false,
                addr: 0x1000,
            },
        ];
        let mut b = Vec::new();
        for r in &recs {
            r.encode(&mut b);
        }
        assert_eq!(b.len(), 2 * RECORD_LEN);
        b.extend_from_slice(&[1, 2, 3]); // torn write at exit
        assert_eq!(FaultRecord::decode_all(&b), recs);
        let mut bad = b.clone();
        bad[RECORD_LEN + 12] = 9;
        assert_eq!(FaultRecord::decode_all(&bad), recs[..1]);
    }
}
