//! Helpers shared by the dispatcher tests: registry modules with one image replaced.

use aot_kernels::dispatch::source::parse_ptx_version;
use aot_kernels::dispatch::verify::sha256_hex;
use aot_kernels::dispatch::{ImageBytes, ImageSource, ModuleSource};
use aot_kernels::registry;
use fatbin_verify::Target;

/// A registry module with its `target` image replaced by `bytes`, recorded as `sha256` / `ptx_version`.
pub fn altered(
    module: &str,
    target: Target,
    bytes: Vec<u8>,
    sha256: String,
    ptx_version: Option<(u32, u32)>,
) -> ModuleSource {
    let mut m = ModuleSource::from_record(registry::module(module).unwrap());
    let img = m.images.iter_mut().find(|i| i.target == target).unwrap();
    *img = ImageSource {
        target,
        sha256,
        ptx_version,
        bytes: ImageBytes::Owned(bytes),
    };
    m
}

/// The real compute_80 PTX of `module` with `.version 9.0` rewritten to `new`, recorded honestly:
/// the hash is computed over the rewritten bytes and the recorded ISA is what the text now says,
/// as a build with a newer toolkit would record it. Only the ISA check can then refuse it.
/// Returns the module and the rewritten PTX bytes.
pub fn ptx_with_version(module: &str, new: &str) -> (ModuleSource, Vec<u8>) {
    let rec = registry::module(module).unwrap();
    let ptx = rec
        .images
        .iter()
        .find(|i| i.target == Target::ptx(80))
        .unwrap();
    let text = std::str::from_utf8(ptx.bytes()).unwrap();
    assert!(
        text.contains(".version 9.0"),
        "the PTX fallback was expected to come from nvcc 13.0"
    );
    let bytes = text
        .replacen(".version 9.0", &format!(".version {new}"), 1)
        .into_bytes();
    let isa = parse_ptx_version(&bytes);
    let m = altered(
        module,
        Target::ptx(80),
        bytes.clone(),
        sha256_hex(&bytes),
        isa,
    );
    (m, bytes)
}
