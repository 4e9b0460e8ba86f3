//! The kernel images embedded in this crate, as `build.rs` made and checked them.
//!
//! One fatbin file per module (a container per toolchain, back to back) is embedded once; every
//! [`ImageRecord`] is a slice of it (the fatbins are stored uncompressed for that). On Linux the
//! files live in the ELF section `.nv_fatbin`, where nvcc puts its own, so NVIDIA's `cuobjdump`
//! lists the images of any binary that links this crate. The table is generated from
//! `aot-manifest.toml`: no module, entry, toolchain or target name is written by hand in Rust.

pub use fatbin_verify::manifest::ModuleKind;
use fatbin_verify::{CudaRelease, Target, Variant};
use serde::Serialize;

/// What an image holds: machine code for one architecture, or PTX the driver compiles at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    Cubin,
    Ptx,
}

/// One image of one module.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ImageRecord {
    pub module: &'static str,
    /// CUDA release of the toolchain that made it (13.0, 12.9): the driver it needs follows.
    pub toolchain: CudaRelease,
    pub target: Target,
    pub format: ImageFormat,
    /// sha256 (hex) recorded by the build, checked against the lock.
    pub sha256: &'static str,
    /// Bytes of the image (cubin whole; PTX text without its NUL).
    pub size: usize,
    #[serde(skip)]
    offset: usize,
    /// PTX ISA version `(major, minor)` for PTX images.
    pub ptx_version: Option<(u32, u32)>,
}

impl ImageRecord {
    /// The image's bytes, a slice of the embedded fatbin.
    pub fn bytes(&self) -> &'static [u8] {
        let module =
            module(self.module).expect("image records are generated from the module table");
        // The build read these bounds back from this very fatbin; `get` keeps a bad table from panicking.
        module
            .fatbin
            .get(self.offset..self.offset + self.size)
            .unwrap_or(&[])
    }
}

/// One kernel module: its entry points and every image built for it.
#[derive(Debug, Serialize)]
pub struct ModuleRecord {
    pub name: &'static str,
    /// `cuda` (built by every toolchain of the manifest) or `triton` (committed Triton PTX,
    /// built by the primary CUDA 13 toolchain only, so its images need a 13.0 driver).
    pub kind: ModuleKind,
    /// `false`: a fast path that runs only as its own SASS targets; its PTX holds no working code
    /// (manifest `portable = false`). Elsewhere the dispatcher reports it unavailable.
    pub portable: bool,
    pub entries: &'static [&'static str],
    pub source_sha256: &'static str,
    #[serde(skip)]
    pub fatbin: &'static [u8],
    pub images: &'static [ImageRecord],
}

/// One toolchain of the build.
#[derive(Debug, Serialize)]
pub struct ToolchainInfo {
    pub cuda: CudaRelease,
    /// `nvcc` (the primary) or `nvrtc` (an extra toolchain).
    pub compiler: &'static str,
    /// Exact version, e.g. "12.9.86".
    pub version: &'static str,
    /// Where the build found it.
    pub source: &'static str,
}

/// How the embedded images were built.
#[derive(Debug, Serialize)]
pub struct BuildInfo {
    /// The primary toolchain's nvcc version, e.g. "13.0.88".
    pub toolchain: &'static str,
    /// Where the build found it.
    pub toolchain_source: &'static str,
    /// Every toolchain, the primary first.
    pub toolchains: &'static [ToolchainInfo],
    /// What the build did with aot-manifest.lock.
    pub lock_status: &'static str,
    /// `AOT_TARGETS` when the build was limited to some targets.
    pub target_filter: Option<&'static str>,
    #[serde(skip)]
    pub manifest_toml: &'static str,
    #[serde(skip)]
    pub lock_toml: &'static str,
}

/// A module's fatbin file as embedded: 8-byte aligned like nvcc's own fatbin data, because
/// NVIDIA's tools read `.nv_fatbin` as containers on an 8-byte grid.
#[repr(C, align(8))]
struct EmbeddedFatbin<const N: usize>([u8; N]);

include!(env!("AOT_REGISTRY_RS"));

/// Every module, in manifest order.
pub fn modules() -> &'static [ModuleRecord] {
    MODULES
}

pub fn module(name: &str) -> Option<&'static ModuleRecord> {
    MODULES.iter().find(|m| m.name == name)
}

pub fn build_info() -> &'static BuildInfo {
    &BUILD
}

// `Variant` is named by the generated table.
#[allow(unused_imports)]
use Variant as _;

/// Total bytes of the embedded fatbin files (every module, every toolchain).
pub fn embedded_bytes() -> usize {
    MODULES.iter().map(|m| m.fatbin.len()).sum()
}
