//! Randomness for nonces and session ids.

/// `N` bytes from the kernel's CSPRNG (`getrandom`).
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    let mut got = 0;
    while got < N {
        // SAFETY: writing at most N - got bytes into the live array from offset `got`.
        let r = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), N - got, 0) };
        if r > 0 {
            got += r as usize;
        } else if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // getrandom cannot fail for small requests once the pool is initialized; a
            // predictable nonce would be worse than stopping.
            panic!(
                "getrandom failed: {}; cannot make a nonce",
                std::io::Error::last_os_error()
            );
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_differ() {
        assert_ne!(random_bytes::<32>(), random_bytes::<32>());
    }
}
