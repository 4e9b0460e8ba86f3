//! The dispatcher's view of a module: its entries and images, taken from the embedded registry
//! or handed in by a caller (a registry subset, or an altered image in a test).

use fatbin_verify::{CudaRelease, Target};

use super::policy::ToolchainChoice;
use super::select::ImageCandidate;
use crate::registry::{self, ModuleKind, ModuleRecord};

/// Where an image's bytes live; only `'static` registry bytes may skip re-hashing.
#[derive(Debug, Clone)]
pub enum ImageBytes {
    Static(&'static [u8]),
    Owned(Vec<u8>),
}

impl ImageBytes {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            ImageBytes::Static(b) => b,
            ImageBytes::Owned(b) => b,
        }
    }
}

/// One image: a cubin (`sm_XY`) or PTX text (`compute_XY`, without a trailing NUL).
#[derive(Debug, Clone)]
pub struct ImageSource {
    /// CUDA release of the toolchain that made it.
    pub toolchain: CudaRelease,
    pub target: Target,
    /// Lower-case hex sha256 the build recorded for these bytes.
    pub sha256: String,
    /// PTX `.version` the build recorded; `None` for cubins.
    pub ptx_version: Option<(u32, u32)>,
    pub bytes: ImageBytes,
}

impl ImageSource {
    pub fn is_ptx(&self) -> bool {
        self.target.virtual_arch
    }

    pub fn candidate(&self) -> ImageCandidate {
        ImageCandidate {
            target: self.target,
            ptx_version: self.ptx_version,
            toolchain: self.toolchain,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ModuleSource {
    pub name: String,
    pub entries: Vec<String>,
    pub images: Vec<ImageSource>,
    /// The toolchains the build made this module with, newest first, whatever `images` has been
    /// cut to since (a toolchain choice, a test's subset). A module made with fewer toolchains
    /// than the others (the Triton modules: CUDA 13 only) is unavailable, not an error, where
    /// none of its toolchains can serve (see `plan`).
    pub toolchains: Vec<CudaRelease>,
    /// `false`: only the module's SASS is working code (manifest `portable = false`); where the
    /// selection would take its PTX, the module is unavailable (see `plan`).
    pub portable: bool,
}

impl ModuleSource {
    pub fn from_record(record: &'static ModuleRecord) -> Self {
        let images = record
            .images
            .iter()
            .map(|img| ImageSource {
                toolchain: img.toolchain,
                target: img.target,
                sha256: img.sha256.to_string(),
                ptx_version: img.ptx_version,
                bytes: ImageBytes::Static(img.bytes()),
            })
            .collect();
        let mut toolchains: Vec<CudaRelease> = record.images.iter().map(|i| i.toolchain).collect();
        toolchains.sort_by(|a, b| b.cmp(a));
        toolchains.dedup();
        ModuleSource {
            name: record.name.to_string(),
            entries: record.entries.iter().map(|e| e.to_string()).collect(),
            images,
            toolchains,
            portable: record.portable,
        }
    }

    /// Every module of the embedded registry, in manifest order.
    pub fn registry() -> Vec<ModuleSource> {
        registry::modules()
            .iter()
            .map(ModuleSource::from_record)
            .collect()
    }

    /// The registry's modules of one kind, in manifest order (the Qwen3 runner launches the
    /// `cuda` modules only).
    pub fn registry_of_kind(kind: ModuleKind) -> Vec<ModuleSource> {
        registry::modules()
            .iter()
            .filter(|r| r.kind == kind)
            .map(ModuleSource::from_record)
            .collect()
    }

    /// Every module of the embedded registry, limited to the images `choice` allows.
    pub fn registry_with(choice: ToolchainChoice) -> Vec<ModuleSource> {
        Self::registry()
            .into_iter()
            .map(|m| m.with_toolchains(choice))
            .collect()
    }

    /// The same module with only the images `choice` allows (`cuda12`: the CUDA 12 ones), as a
    /// build of that toolchain alone would carry them.
    pub fn with_toolchains(self, choice: ToolchainChoice) -> Self {
        self.retain_images(|img| choice.allows(img.toolchain))
    }

    /// The same module as a build without `target` (of any toolchain) would carry: the honest
    /// way to test a fallback without rebuilding.
    pub fn without_target(mut self, target: Target) -> Self {
        self.images.retain(|img| img.target != target);
        self
    }

    /// The same module with its PTX images only: under any policy it loads as the PTX JIT, so one
    /// module can take the fallback path while the others keep their SASS (which module's PTX
    /// moves a result, or a step's time).
    pub fn ptx_only(self) -> Self {
        self.retain_images(|img| img.target.virtual_arch)
    }

    /// Keep only the images `keep` accepts.
    pub fn retain_images(mut self, keep: impl FnMut(&ImageSource) -> bool) -> Self {
        self.images.retain(keep);
        self
    }

    pub fn candidates(&self) -> Vec<ImageCandidate> {
        self.images.iter().map(ImageSource::candidate).collect()
    }
}

/// The `.version` directive of PTX text (`.version 9.0` -> `(9, 0)`), if there is one, read by
/// the same parser fatbin-verify and the build use.
pub fn parse_ptx_version(ptx: &[u8]) -> Option<(u32, u32)> {
    fatbin_verify::ptx::parse_ptx(ptx).version
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_ptx_version_directive() {
        let ptx = b"//\n// Generated by NVIDIA NVVM Compiler\n\n.version 9.0\n.target sm_80\n";
        assert_eq!(parse_ptx_version(ptx), Some((9, 0)));
        assert_eq!(
            parse_ptx_version(b".version 8.7 // comment\n"),
            Some((8, 7))
        );
        assert_eq!(parse_ptx_version(b".target sm_80\n"), None);
        assert_eq!(parse_ptx_version(b".version x.y\n"), None);
        assert_eq!(parse_ptx_version(&[0xff, 0xfe]), None);
    }
}
