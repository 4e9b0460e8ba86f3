//! Feeds arbitrary bytes to the parser: it must return Ok or Err, never panic, never read out
//! of bounds, never allocate past its limits.
#![no_main]

use fatbin_verify::{image_bytes_with_limits, list_images_with_limits, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // A small cap keeps a lying size header from looking like an out-of-memory crash.
    let limits = Limits {
        max_decompressed_total: 64 << 20,
    };
    if let Ok(images) = list_images_with_limits(data, &limits) {
        for info in &images {
            let bytes = image_bytes_with_limits(data, info, &limits)
                .expect("a listed image must be extractable");
            assert_eq!(bytes.len(), info.size);
        }
    }
});
