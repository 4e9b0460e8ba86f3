//! Check an image's bytes against the sha256 the build recorded, before the driver sees them.
//!
//! Registry images are `'static` and cannot change after the first check, so each is hashed once
//! per process; images handed in by a caller (tests, tools) are hashed every time.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use fatbin_verify::Target;
use sha2::{Digest, Sha256};

/// The bytes do not hash to what the build recorded: the binary was altered after the build.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "image {target} of module {module} is corrupt or tampered: sha256 {actual} but the build recorded {expected}; \
     refusing to load it. Rebuild the crate from a clean checkout (and check what modified the binary)"
)]
pub struct HashMismatch {
    pub module: String,
    pub target: Target,
    pub expected: String,
    pub actual: String,
}

/// Outcome of a successful check, with what it cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashCheck {
    /// Microseconds spent hashing in this call (0 when the result came from the cache).
    pub micros: u64,
    /// The image had already been checked in this process.
    pub cached: bool,
}

/// sha256 of `bytes` as lowercase hex, as the build records it.
pub fn sha256_hex(bytes: &[u8]) -> String {
    fatbin_verify::sha256_hex(&Sha256::digest(bytes).into())
}

/// Hash `bytes` and compare with `expected` (hex, case-insensitive); every call hashes.
pub fn verify_image(
    module: &str,
    target: Target,
    bytes: &[u8],
    expected: &str,
) -> Result<HashCheck, HashMismatch> {
    let start = Instant::now();
    let actual = sha256_hex(bytes);
    let micros = start.elapsed().as_micros() as u64;
    if actual.eq_ignore_ascii_case(expected.trim()) {
        Ok(HashCheck {
            micros,
            cached: false,
        })
    } else {
        Err(HashMismatch {
            module: module.to_string(),
            target,
            expected: expected.to_string(),
            actual,
        })
    }
}

/// Like [`verify_image`], for bytes that live for the whole process (the embedded registry):
/// a success is remembered by address, length and expected hash, so later loads skip the hash.
pub fn verify_static_image(
    module: &str,
    target: Target,
    bytes: &'static [u8],
    expected: &str,
) -> Result<HashCheck, HashMismatch> {
    type Key = (usize, usize, String);
    static VERIFIED: OnceLock<Mutex<HashMap<Key, ()>>> = OnceLock::new();
    let key: Key = (
        bytes.as_ptr() as usize,
        bytes.len(),
        expected.to_ascii_lowercase(),
    );
    let cache = VERIFIED.get_or_init(Default::default);
    // A poisoned lock only means another thread panicked mid-insert; the map is still valid.
    if cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains_key(&key)
    {
        return Ok(HashCheck {
            micros: 0,
            cached: true,
        });
    }
    let check = verify_image(module, target, bytes, expected)?;
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, ());
    Ok(check)
}

#[cfg(test)]
mod tests {
    use super::*;

    // sha256("abc"), FIPS 180-2 test vector.
    const ABC: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    #[test]
    fn accepts_matching_bytes_and_refuses_altered_ones_naming_module_and_target() {
        let t = Target::sass(90);
        assert!(!verify_image("rmsnorm", t, b"abc", ABC).unwrap().cached);
        assert!(verify_image("rmsnorm", t, b"abc", &ABC.to_uppercase()).is_ok());
        let err = verify_image("rmsnorm", t, b"abd", ABC).unwrap_err();
        assert_eq!((err.module.as_str(), err.target), ("rmsnorm", t));
        let msg = err.to_string();
        assert!(
            msg.contains("sm_90") && msg.contains("rmsnorm") && msg.contains("refusing"),
            "{msg}"
        );
    }

    #[test]
    fn static_images_are_hashed_once() {
        static BYTES: &[u8] = b"abc";
        let t = Target::ptx(80);
        let first = verify_static_image("m", t, BYTES, ABC).unwrap();
        let second = verify_static_image("m", t, BYTES, ABC).unwrap();
        assert!(second.cached && second.micros == 0, "{first:?} {second:?}");
        // A wrong expectation is never served from the cache.
        assert!(verify_static_image("m", t, BYTES, &"0".repeat(64)).is_err());
    }
}
