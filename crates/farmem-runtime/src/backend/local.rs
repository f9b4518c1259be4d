//! The embedded backend: pages kept in this process's ordinary memory, outside the regions,
//! optionally LZ4-compressed. Zero set-up, and the fastest tier there is, so benchmarks on it
//! show the runtime's own overheads.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use farmem_proto::{IoClass, PageKey};
use farmem_sys::mem::PAGE_SIZE;

use super::error::BackendError;
use super::io::{Backend, Completion, IoDone, PageBuf};

const SHARDS: usize = 64;

enum Stored {
    Raw(Box<[u8]>),
    Lz4(Box<[u8]>),
}

impl Stored {
    fn size(&self) -> usize {
        match self {
            Stored::Raw(b) | Stored::Lz4(b) => b.len(),
        }
    }
}

pub struct LocalBackend {
    lz4: bool,
    shards: Vec<Mutex<HashMap<(u32, u64), Stored>>>,
    bytes: AtomicU64,
}

impl LocalBackend {
    pub fn new(lz4: bool) -> LocalBackend {
        LocalBackend {
            lz4,
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            bytes: AtomicU64::new(0),
        }
    }

    fn shard(&self, k: PageKey) -> &Mutex<HashMap<(u32, u64), Stored>> {
        // Neighbouring pages go to different shards so a batch does not serialize on one lock.
        let h = (k.page ^ ((k.region as u64) << 40)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.shards[(h >> 58) as usize % SHARDS]
    }

    fn encode(&self, page: &[u8]) -> Stored {
        if self.lz4 {
            let c = lz4_flex::block::compress(page);
            if c.len() < PAGE_SIZE {
                return Stored::Lz4(c.into_boxed_slice());
            }
        }
        Stored::Raw(page.to_vec().into_boxed_slice())
    }

    fn read_into(&self, k: PageKey, out: &mut [u8]) -> Result<(), BackendError> {
        let shard = self.shard(k).lock();
        match shard.get(&(k.region, k.page)) {
            Some(Stored::Raw(b)) => out.copy_from_slice(b),
            Some(Stored::Lz4(c)) => {
                let n = lz4_flex::block::decompress_into(c, out).map_err(|e| {
                    BackendError::Failed(format!(
                        "corrupt compressed page {} of region {}: {e}",
                        k.page, k.region
                    ))
                })?;
                if n != PAGE_SIZE {
                    return Err(BackendError::Failed(format!(
                        "compressed page {} of region {} decodes to {n} bytes",
                        k.page, k.region
                    )));
                }
            }
            None => {
                return Err(BackendError::Failed(format!(
                    "page {} of region {} is not stored",
                    k.page, k.region
                )))
            }
        }
        Ok(())
    }
}

impl Backend for LocalBackend {
    fn describe(&self) -> String {
        if self.lz4 { "local+lz4" } else { "local" }.to_string()
    }

    fn open_region(&self, _region: u32, _npages: u64) -> Result<(), BackendError> {
        Ok(())
    }

    fn close_region(&self, region: u32) {
        for s in &self.shards {
            let mut freed = 0u64;
            s.lock().retain(|&(r, _), v| {
                if r == region {
                    freed += v.size() as u64;
                    false
                } else {
                    true
                }
            });
            self.bytes.fetch_sub(freed, Ordering::Relaxed);
        }
    }

    fn submit_read(&self, _class: IoClass, keys: Vec<PageKey>, mut buf: PageBuf) -> Completion {
        buf.set_len(keys.len());
        for (i, &k) in keys.iter().enumerate() {
            if let Err(e) = self.read_into(k, buf.page_mut(i)) {
                return Completion::ready(Err(e));
            }
        }
        Completion::ready(Ok(IoDone { keys, buf }))
    }

    fn submit_write(&self, _class: IoClass, keys: Vec<PageKey>, buf: PageBuf) -> Completion {
        if buf.len() < keys.len() {
            return Completion::ready(Err(BackendError::Failed(format!(
                "write of {} pages with a buffer of {}",
                keys.len(),
                buf.len()
            ))));
        }
        for (i, &k) in keys.iter().enumerate() {
            let v = self.encode(buf.page(i));
            let add = v.size() as u64;
            let old = self.shard(k).lock().insert((k.region, k.page), v);
            let sub = old.map_or(0, |o| o.size() as u64);
            self.bytes.fetch_add(add, Ordering::Relaxed);
            self.bytes.fetch_sub(sub, Ordering::Relaxed);
        }
        Completion::ready(Ok(IoDone { keys, buf }))
    }

    fn longest_wait(&self) -> std::time::Duration {
        // Every request completes during its submission: nothing is ever waited for.
        std::time::Duration::from_secs(60)
    }

    fn completes_inline(&self) -> bool {
        true
    }

    fn stored_bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(lz4: bool) {
        let b = LocalBackend::new(lz4);
        let keys: Vec<PageKey> = (0..4).map(|p| PageKey { region: 7, page: p }).collect();
        let mut buf = PageBuf::new(4);
        buf.set_len(4);
        for (i, x) in buf.bytes_mut().iter_mut().enumerate() {
            *x = (i % 251) as u8;
        }
        let expect = buf.bytes().to_vec();
        let done = b
            .submit_write(IoClass::WriteBack, keys.clone(), buf)
            .wait(std::time::Duration::from_secs(5))
            .unwrap();
        let got = b
            .submit_read(IoClass::Demand, keys, done.buf)
            .wait(std::time::Duration::from_secs(5))
            .unwrap();
        assert_eq!(got.buf.bytes(), &expect[..]);
        assert!(b.stored_bytes() > 0);
        let missing = b.submit_read(
            IoClass::Demand,
            vec![PageKey { region: 8, page: 0 }],
            PageBuf::new(1),
        );
        assert!(
            missing.wait(std::time::Duration::from_secs(5)).is_err(),
            "an absent page must be an error"
        );
        b.close_region(7);
        assert_eq!(b.stored_bytes(), 0);
    }

    #[test]
    fn raw_roundtrip() {
        roundtrip(false);
    }

    #[test]
    fn lz4_roundtrip() {
        roundtrip(true);
    }
}
