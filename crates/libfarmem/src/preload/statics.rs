//! The program's static arrays: the executable's `.bss` beyond its first 64 KiB, when it is
//! large, is put in far memory like the heap (Linux swap covers it too; an unmodified STREAM,
//! whose arrays are static, ran at a 229 MiB budget with 919 MiB resident before).
//!
//! Only the anonymous part of `.bss` can be registered with userfaultfd (the part that
//! shares a page with the file-backed `.data` cannot), and its first 64 KiB stay ordinary:
//! that is where the linker puts the copies of library variables the executable refers to
//! (`environ`, `stdout`), which the runtime's own threads may read through libc and must
//! never fault on. Initialized arrays (`.data`) are file-backed and stay ordinary too.

use farmem_runtime::Runtime;
use farmem_sys::mem::PAGE_SIZE;

/// The part of `.bss` kept ordinary (copy-relocated library variables live there).
const KEEP_LOCAL: usize = 64 << 10;
/// Smaller static areas are not worth a region.
const MIN_SIZE: usize = 1 << 20;

/// One line of `/proc/self/maps`: range, permissions, inode and path.
struct Mapping<'a> {
    start: usize,
    end: usize,
    perms: &'a str,
    inode: u64,
    path: &'a str,
}

fn parse(line: &str) -> Option<Mapping<'_>> {
    let mut f = line.split_ascii_whitespace();
    let (range, perms, _off, _dev, inode) = (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
    let (a, b) = range.split_once('-')?;
    Some(Mapping {
        start: usize::from_str_radix(a, 16).ok()?,
        end: usize::from_str_radix(b, 16).ok()?,
        perms,
        inode: inode.parse().ok()?,
        path: f.next().unwrap_or(""),
    })
}

/// The executable's anonymous `.bss` mapping in `maps` (the text of `/proc/self/maps`): the
/// anonymous read-write mapping that starts where the executable's last mapping ends.
fn bss_of(maps: &str, exe: &str) -> Option<(usize, usize)> {
    let lines: Vec<Mapping> = maps.lines().filter_map(parse).collect();
    let last = lines.iter().rposition(|m| m.path == exe)?;
    let next = lines.get(last + 1)?;
    (next.start == lines[last].end
        && next.inode == 0
        && next.path.is_empty()
        && next.perms == "rw-p")
        .then_some((next.start, next.end))
}

/// The range of `.bss` to put in far memory, if it is worth it.
fn far_part(start: usize, end: usize) -> Option<(usize, usize)> {
    let a = (start + KEEP_LOCAL).next_multiple_of(PAGE_SIZE);
    let e = end & !(PAGE_SIZE - 1);
    (e > a && e - a >= MIN_SIZE).then_some((a, e - a))
}

/// Put the executable's large static arrays in far memory (before the program's threads
/// exist). Failures leave them ordinary memory, with a warning.
pub fn adopt(rt: &Runtime) {
    let (Ok(maps), Ok(exe)) = (
        std::fs::read_to_string("/proc/self/maps"),
        std::fs::read_link("/proc/self/exe"),
    ) else {
        return;
    };
    let Some((a, len)) = exe
        .to_str()
        .and_then(|e| bss_of(&maps, e))
        .and_then(|(s, e)| far_part(s, e))
    else {
        return;
    };
    // SAFETY: the executable's .bss is anonymous private memory that is never unmapped; the
    // program's threads do not exist yet; the runtime never reads it (library variables
    // copied there stay in the first KEEP_LOCAL bytes, left out).
    if let Err(e) = unsafe { rt.adopt_range(a, len) } {
        eprintln!("farmem: the program's static arrays stay in local memory: {e}");
    } else {
        tracing::debug!("static arrays at {a:#x}, {len} bytes, in far memory");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fe:01 1234 /usr/bin/stream
55d0c0a01000-55d0c0a02000 r-xp 00001000 fe:01 1234 /usr/bin/stream
55d0c0a03000-55d0c0a04000 rw-p 00002000 fe:01 1234 /usr/bin/stream
55d0c0a04000-55d0f8a04000 rw-p 00000000 00:00 0 
55d0f9000000-55d0f9021000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000001000 r--p 00000000 fe:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
";

    #[test]
    fn the_anonymous_mapping_after_the_executable_is_its_bss() {
        let (s, e) = bss_of(MAPS, "/usr/bin/stream").expect("bss");
        assert_eq!((s, e), (0x55d0c0a04000, 0x55d0f8a04000));
        let (a, len) = far_part(s, e).unwrap();
        assert_eq!(a, s + KEEP_LOCAL);
        assert_eq!(a + len, e);
        assert!(bss_of(MAPS, "/usr/bin/other").is_none());
        // Small: not worth it.
        assert!(far_part(0x1000, 0x1000 + KEEP_LOCAL + (MIN_SIZE - PAGE_SIZE)).is_none());
        // No anonymous mapping right after the executable: none.
        let no_bss = MAPS.replace("55d0c0a04000-55d0f8a04000 rw-p 00000000 00:00 0 \n", "");
        assert!(bss_of(&no_bss, "/usr/bin/stream").is_none());
    }
}
