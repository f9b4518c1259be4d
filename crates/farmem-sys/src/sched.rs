//! Where threads run: the CPU a thread of this process last ran on, and threads' CPU
//! affinity.

use std::io;

/// The CPU the thread `tid` of this process last ran on (`/proc/self/task/TID/stat`, field
/// 39), or `None` if the thread is gone or the file cannot be read. A thread blocked in a
/// page fault last ran where it faulted. Costs an open and a read (~10 us here).
pub fn thread_cpu(tid: u32) -> Option<u32> {
    let text = std::fs::read(format!("/proc/self/task/{tid}/stat")).ok()?;
    processor_field(&text)
}

/// Reads where one thread at a time last ran, keeping its `/proc` file open: a read of an
/// open stat file costs ~4.4 us here, opening it too ~11 us.
///
/// The file is opened only by [`ThreadCpu::open`], which the fault thread calls while the
/// thread it names waits in a fault: a runtime thread that opens a file while the program
/// runs takes a descriptor number the program may count on that moment (a forked child's
/// `dup2` onto 3 failed with EBUSY while the fault thread opened a stat file at 3).
#[derive(Default)]
pub struct ThreadCpu {
    open: Option<(u32, std::fs::File)>,
    wanted: Option<u32>,
}

impl ThreadCpu {
    /// The CPU thread `tid` of this process last ran on (as [`thread_cpu`]), if its file is
    /// open; otherwise `None`, and `tid` is the one [`ThreadCpu::wanted`].
    pub fn of(&mut self, tid: u32) -> Option<u32> {
        use std::os::unix::fs::FileExt;
        if self.open.as_ref().map(|(t, _)| *t) != Some(tid) {
            self.wanted = Some(tid);
            return None;
        }
        let (_, f) = self.open.as_ref()?;
        let mut buf = [0u8; 1024];
        let n = match f.read_at(&mut buf, 0) {
            Ok(n) if n > 0 => n,
            _ => {
                self.open = None;
                return None;
            }
        };
        processor_field(&buf[..n])
    }

    /// The thread whose file [`ThreadCpu::of`] lacked.
    pub fn wanted(&self) -> Option<u32> {
        self.wanted
    }

    /// Open the stat file of thread `tid` (in place of the one open), now.
    pub fn open(&mut self, tid: u32) {
        self.wanted = None;
        self.open = std::fs::File::open(format!("/proc/self/task/{tid}/stat"))
            .ok()
            // Out of the program's way (it may close every descriptor it did not open).
            .map(|f| (tid, crate::fds::keep(f)));
    }
}

/// Field 39 of a `/proc/.../stat` line. The command name (field 2) may hold spaces and
/// parentheses, so the count starts after its last `)`, which precedes field 3.
fn processor_field(line: &[u8]) -> Option<u32> {
    let close = line.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&line[close + 1..]).ok()?;
    rest.split_ascii_whitespace().nth(39 - 3)?.parse().ok()
}

/// The calling thread's id.
pub fn gettid() -> u32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::gettid() as u32 }
}

/// The CPU the calling thread runs on now.
pub fn current_cpu() -> Option<u32> {
    // SAFETY: no arguments; returns -1 on failure.
    let c = unsafe { libc::sched_getcpu() };
    u32::try_from(c).ok()
}

/// The CPUs the calling thread may run on.
pub fn allowed_cpus() -> io::Result<libc::cpu_set_t> {
    affinity_of(0)
}

/// The CPUs thread `tid` of this process (0: the calling thread) may run on.
pub fn affinity_of(tid: u32) -> io::Result<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is plain data; all zeros is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let r = unsafe { libc::sched_getaffinity(tid as i32, std::mem::size_of_val(&set), &mut set) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(set)
}

/// The set of `cpu` alone.
pub fn only(cpu: u32) -> io::Result<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is plain data; all zeros is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu as usize >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: the index is inside the set (checked above).
    unsafe { libc::CPU_SET(cpu as usize, &mut set) };
    Ok(set)
}

/// Words of a CPU set (to keep one in atomics), and back.
pub const SET_WORDS: usize = std::mem::size_of::<libc::cpu_set_t>() / 8;

pub fn set_to_words(set: &libc::cpu_set_t) -> [u64; SET_WORDS] {
    // SAFETY: cpu_set_t is plain data of exactly SET_WORDS * 8 bytes.
    unsafe { std::mem::transmute_copy(set) }
}

pub fn words_to_set(words: &[u64; SET_WORDS]) -> libc::cpu_set_t {
    // SAFETY: as above, the other way.
    unsafe { std::mem::transmute_copy(words) }
}

/// Whether two CPU sets are equal.
pub fn same_set(a: &libc::cpu_set_t, b: &libc::cpu_set_t) -> bool {
    set_to_words(a) == set_to_words(b)
}

/// Whether `cpu` is in `set`.
pub fn has_cpu(set: &libc::cpu_set_t, cpu: u32) -> bool {
    // SAFETY: the index is checked against the set's size first.
    (cpu as usize) < libc::CPU_SETSIZE as usize && unsafe { libc::CPU_ISSET(cpu as usize, set) }
}

/// Let thread `tid` of this process (0: the calling thread) run only on the CPUs of `set`.
pub fn set_affinity(tid: u32, set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let r = unsafe { libc::sched_setaffinity(tid as i32, std::mem::size_of_val(set), set) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Let the calling thread run only on `cpu`.
pub fn pin_to(cpu: u32) -> io::Result<()> {
    set_affinity(0, &only(cpu)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_processor_field_past_odd_names() {
        let mut line = b"1234 (a) b (c)) S".to_vec();
        for f in 4..=52 {
            line.extend_from_slice(format!(" {}", if f == 39 { 7 } else { 1000 + f }).as_bytes());
        }
        assert_eq!(processor_field(&line), Some(7));
        assert_eq!(processor_field(b"1 (x) S 1 2"), None, "too short");
    }

    #[test]
    fn a_thread_runs_where_its_stat_says() {
        let _serial = crate::fds::serial_for_tests();
        // SAFETY: gettid has no arguments.
        let tid = unsafe { libc::gettid() } as u32;
        let allowed = allowed_cpus().unwrap();
        let cpu = (0..libc::CPU_SETSIZE as u32)
            .find(|&c| has_cpu(&allowed, c))
            .unwrap();
        pin_to(cpu).unwrap();
        assert_eq!(current_cpu(), Some(cpu));
        assert_eq!(thread_cpu(tid), Some(cpu));
        // Still pinned: once the affinity is wide again the thread may move at any time.
        let mut reader = ThreadCpu::default();
        assert_eq!(reader.of(tid), None, "not opened yet");
        assert_eq!(reader.wanted(), Some(tid));
        reader.open(tid);
        assert_eq!(reader.wanted(), None);
        assert_eq!(reader.of(tid), Some(cpu));
        assert_eq!(reader.of(tid), Some(cpu), "again, from the open file");
        assert_eq!(reader.of(u32::MAX), None);
        reader.open(u32::MAX);
        assert_eq!(reader.of(u32::MAX), None, "no such thread");
        set_affinity(tid, &allowed).unwrap();
        assert!(same_set(&affinity_of(tid).unwrap(), &allowed));
        assert!(same_set(&words_to_set(&set_to_words(&allowed)), &allowed));
        assert!(!same_set(&only(cpu).unwrap(), &only(cpu + 1).unwrap()));
        assert_eq!(thread_cpu(u32::MAX), None, "no such thread");
    }
}
