//! Helpers shared by the dispatcher tests: the build's toolchains, registry modules with one
//! image replaced.

#![allow(dead_code)] // each test binary uses its own subset

use aot_kernels::dispatch::source::parse_ptx_version;
use aot_kernels::dispatch::verify::sha256_hex;
use aot_kernels::dispatch::{ImageBytes, ImageSource, ModuleSource};
use aot_kernels::registry;
use fatbin_verify::{CudaRelease, Target};

/// The toolchain of this CUDA major the build used (from the registry, i.e. the manifest).
pub fn toolchain(major: u32) -> CudaRelease {
    registry::build_info()
        .toolchains
        .iter()
        .map(|t| t.cuda)
        .find(|c| c.major == major)
        .unwrap_or_else(|| panic!("the build has no CUDA {major} toolchain"))
}

/// The primary toolchain (CUDA 13.0).
pub fn cuda13() -> CudaRelease {
    toolchain(13)
}

/// The extra toolchain for older drivers (CUDA 12.9).
pub fn cuda12() -> CudaRelease {
    toolchain(12)
}

/// A registry module with its (`toolchain`, `target`) image replaced by `bytes`, recorded as
/// `sha256` / `ptx_version`.
pub fn altered(
    module: &str,
    toolchain: CudaRelease,
    target: Target,
    bytes: Vec<u8>,
    sha256: String,
    ptx_version: Option<(u32, u32)>,
) -> ModuleSource {
    let mut m = ModuleSource::from_record(registry::module(module).unwrap());
    let img = m
        .images
        .iter_mut()
        .find(|i| i.toolchain == toolchain && i.target == target)
        .unwrap();
    *img = ImageSource {
        toolchain,
        target,
        sha256,
        ptx_version,
        bytes: ImageBytes::Owned(bytes),
    };
    m
}

/// The real CUDA 13 compute_80 PTX of `module` with `.version 9.0` rewritten to `new`, recorded
/// honestly: the hash is computed over the rewritten bytes and the recorded ISA is what the text
/// now says, as a build with a newer toolkit would record it. Only the ISA check can then refuse
/// it. Returns the module (CUDA 13 images only, so no other PTX can stand in) and the PTX bytes.
pub fn ptx_with_version(module: &str, new: &str) -> (ModuleSource, Vec<u8>) {
    let rec = registry::module(module).unwrap();
    let ptx = rec
        .images
        .iter()
        .find(|i| i.toolchain == cuda13() && i.target == Target::ptx(80))
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
        cuda13(),
        Target::ptx(80),
        bytes.clone(),
        sha256_hex(&bytes),
        isa,
    )
    .retain_images(|i| i.toolchain == cuda13());
    (m, bytes)
}
