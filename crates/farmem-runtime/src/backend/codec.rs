//! The page compressor of the in-process tiers (`local+lz4://`, the compressed part of
//! `tiered://`), chosen for the whole runtime as zswap's is (`FARMEM_COMPRESSOR`): LZ4 by
//! default (fast, what zram and zswap default to), or zstd at a level (denser, slower).

use std::cell::RefCell;
use std::os::raw::c_int;

/// A page compressor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Codec {
    #[default]
    Lz4,
    /// zstd at this level (1..=19).
    Zstd(i32),
}

thread_local! {
    /// zstd contexts, made once per thread (a context costs more to make than a page to
    /// compress); the compressor's level with it.
    static ZSTD_C: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(None) };
    static ZSTD_D: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
}

/// Set up this thread's compression contexts' slots now (see `fetch::warm_thread_locals`).
pub(crate) fn warm_thread_locals() {
    ZSTD_C.with(|_| ());
    ZSTD_D.with(|_| ());
}

/// A length as LZ4's C interface takes it.
fn c_len(n: usize) -> Option<c_int> {
    c_int::try_from(n).ok()
}

impl Codec {
    /// `lz4`, `zstd` (level 3) or `zstd:LEVEL`.
    pub fn parse(s: &str) -> Result<Codec, String> {
        let s = s.trim();
        match s.split_once(':') {
            None if s == "lz4" => Ok(Codec::Lz4),
            None if s == "zstd" => Ok(Codec::Zstd(3)),
            Some(("zstd", l)) => match l.trim().parse::<i32>() {
                Ok(l) if (1..=19).contains(&l) => Ok(Codec::Zstd(l)),
                _ => Err(format!("compressor {s}: the zstd level must be 1..=19")),
            },
            _ => Err(format!(
                "compressor {s}: expected lz4, zstd or zstd:LEVEL (1..=19)"
            )),
        }
    }

    pub fn name(&self) -> String {
        match self {
            Codec::Lz4 => "lz4".into(),
            Codec::Zstd(l) => format!("zstd:{l}"),
        }
    }

    /// Room a compressed page may need (output buffers are this long).
    pub(crate) fn max_len(page: usize) -> usize {
        // SAFETY: a pure function of its argument.
        let lz4 = unsafe { lz4_sys::LZ4_compressBound(page as c_int) } as usize;
        lz4.max(zstd::zstd_safe::compress_bound(page))
    }

    /// Compress `page` into `out`; its length, or None if it failed.
    pub(crate) fn compress(&self, page: &[u8], out: &mut [u8]) -> Option<usize> {
        match *self {
            Codec::Lz4 => {
                let (src, cap) = (c_len(page.len())?, c_len(out.len())?);
                // SAFETY: LZ4 reads `src` bytes of `page` and writes at most `cap` bytes into
                // `out`, both borrowed for the call; it keeps no pointer (its state is on its
                // stack). 0 means the output did not fit.
                let n = unsafe {
                    lz4_sys::LZ4_compress_default(
                        page.as_ptr().cast(),
                        out.as_mut_ptr().cast(),
                        src,
                        cap,
                    )
                };
                (n > 0).then_some(n as usize)
            }
            Codec::Zstd(level) => ZSTD_C.with(|c| {
                let mut c = c.borrow_mut();
                if c.as_ref().is_none_or(|(l, _)| *l != level) {
                    let mut z = zstd::bulk::Compressor::new(level).ok()?;
                    // The length is known from the page size; no checksum (the store is
                    // this process's memory).
                    z.include_contentsize(false).ok()?;
                    z.include_checksum(false).ok()?;
                    *c = Some((level, z));
                }
                let (_, z) = c.as_mut()?;
                z.compress_to_buffer(page, out).ok()
            }),
        }
    }

    /// Decompress `c` into `out`; the length written.
    pub(crate) fn decompress(&self, c: &[u8], out: &mut [u8]) -> Result<usize, String> {
        match self {
            Codec::Lz4 => {
                let too_long = || format!("{} bytes is too long for LZ4", c.len().max(out.len()));
                let (src, cap) = (
                    c_len(c.len()).ok_or_else(too_long)?,
                    c_len(out.len()).ok_or_else(too_long)?,
                );
                // SAFETY: the safe decoder reads at most `src` bytes of `c` and writes at most
                // `cap` bytes into `out` whatever the input (corrupt input gives a negative
                // result), both borrowed for the call.
                let n = unsafe {
                    lz4_sys::LZ4_decompress_safe(
                        c.as_ptr().cast(),
                        out.as_mut_ptr().cast(),
                        src,
                        cap,
                    )
                };
                usize::try_from(n).map_err(|_| format!("corrupt LZ4 block (error {n})"))
            }
            Codec::Zstd(_) => ZSTD_D.with(|d| {
                let mut d = d.borrow_mut();
                if d.is_none() {
                    *d = Some(zstd::bulk::Decompressor::new().map_err(|e| e.to_string())?);
                }
                let z = d.as_mut().expect("made above");
                z.decompress_to_buffer(c, out).map_err(|e| e.to_string())
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_come_back_through_both_codecs_and_zstd_is_denser_on_text() {
        let page: Vec<u8> = (0..4096u32)
            .map(|i| b"the quick brown fox jumps over the lazy dog "[(i as usize * 7) % 44])
            .collect();
        let mut lens = Vec::new();
        for codec in [Codec::Lz4, Codec::Zstd(3), Codec::Zstd(19)] {
            let mut c = vec![0; Codec::max_len(4096)];
            let n = codec.compress(&page, &mut c).expect("compresses");
            let mut back = vec![0; 4096];
            assert_eq!(codec.decompress(&c[..n], &mut back), Ok(4096));
            assert_eq!(back, page, "{codec:?}");
            lens.push(n);
        }
        assert!(
            lens[1] <= lens[0],
            "zstd {} against lz4 {}",
            lens[1],
            lens[0]
        );
        assert_eq!(Codec::parse("zstd:7"), Ok(Codec::Zstd(7)));
        // A cut block is an error, never a crash or a short page taken for a whole one (LZ4
        // has no checksum: other damage may decode to a wrong page, which is why the store
        // is this process's own memory).
        let mut c = vec![0; Codec::max_len(4096)];
        let n = Codec::Lz4.compress(&page, &mut c).expect("compresses");
        let mut back = vec![0; 4096];
        assert!(Codec::Lz4.decompress(&c[..n - 1], &mut back) != Ok(4096));
        assert!(Codec::Lz4.decompress(&c[..n / 2], &mut back) != Ok(4096));
        assert_eq!(Codec::parse("lz4"), Ok(Codec::Lz4));
        assert!(Codec::parse("zstd:0").is_err() && Codec::parse("gzip").is_err());
    }
}
