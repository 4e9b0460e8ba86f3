//! Finding the CUDA compilers and learning what they can build.
//!
//! The primary toolchain (nvcc): `AOT_CUDA_HOME`, then `CUDA_HOME` / `CUDA_PATH`, then the
//! project-local `.toolchain/` that `make setup` installs from PyPI, then `nvcc` on `PATH`.
//! Extra toolchains (NVRTC, e.g. CUDA 12.9): the project-local `.toolchain/cuda-<release>/` only,
//! since their exact wheels are what the lock records.

use std::path::{Path, PathBuf};
use std::process::Command;

use fatbin_verify::CudaRelease;

use super::nvrtc::{self, Nvrtc};
use super::BuildError;

/// Where a toolchain was found, for the build report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolchainSource {
    Explicit(&'static str),
    ProjectLocal,
    Path,
}

impl std::fmt::Display for ToolchainSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ToolchainSource::Explicit(var) => write!(f, "${var}"),
            ToolchainSource::ProjectLocal => f.write_str("project-local .toolchain/"),
            ToolchainSource::Path => f.write_str("nvcc on PATH"),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Toolchain {
    /// Folder holding nvcc, ptxas and fatbinary.
    pub bin: PathBuf,
    pub source: ToolchainSource,
    /// Exact version, e.g. "13.0.88".
    pub version: String,
    /// Real architectures it can build (`nvcc --list-gpu-code`): 75, 80, ... 121.
    pub sm_list: Vec<u32>,
}

impl Toolchain {
    pub fn nvcc(&self) -> PathBuf {
        self.bin.join("nvcc")
    }

    pub fn fatbinary(&self) -> PathBuf {
        self.bin.join("fatbinary")
    }

    /// A command running this toolchain's nvcc; see [`nvcc_command`].
    pub fn nvcc_command(&self) -> Command {
        nvcc_command(&self.nvcc())
    }
}

/// nvcc reads extra flags and the host compiler from these.
const NVCC_ENV_CLEARED: &[&str] = &["NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN"];

/// nvcc with the environment variables that would change its behaviour cleared: the build's
/// flags are the manifest's alone, so the cache key and the lock describe what really ran.
fn nvcc_command(nvcc: &Path) -> Command {
    let mut cmd = Command::new(nvcc);
    for var in NVCC_ENV_CLEARED {
        cmd.env_remove(var);
    }
    cmd
}

/// The folder the project-local toolchain's binaries land in.
pub fn project_local_bin(project_root: &Path) -> PathBuf {
    project_root.join(".toolchain/site/nvidia/cu13/bin")
}

/// Environment variables that pick a toolchain, in the order they are tried.
pub const ENV_VARS: &[&str] = &["AOT_CUDA_HOME", "CUDA_HOME", "CUDA_PATH"];

pub fn find(
    project_root: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Toolchain, BuildError> {
    let mut tried = Vec::new();
    for var in ENV_VARS {
        if let Some(home) = env(var).filter(|v| !v.is_empty()) {
            let bin = Path::new(&home).join("bin");
            if bin.join("nvcc").is_file() {
                return probe(bin, ToolchainSource::Explicit(var));
            }
            if *var == "AOT_CUDA_HOME" {
                // An explicit choice that does not hold a compiler is an error, not a reason to look elsewhere.
                return Err(BuildError::Toolchain(format!(
                    "AOT_CUDA_HOME={home} has no bin/nvcc; point it at a CUDA 13.0 toolkit or unset it"
                )));
            }
            tried.push(format!("${var}={home} (no bin/nvcc)"));
        }
    }
    let local = project_local_bin(project_root);
    if local.join("nvcc").is_file() {
        return probe(local, ToolchainSource::ProjectLocal);
    }
    tried.push(format!("{} (not installed)", local.display()));
    if let Some(path) = env("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("nvcc").is_file() {
                return probe(dir, ToolchainSource::Path);
            }
        }
    }
    tried.push("nvcc on PATH (not found)".into());
    Err(BuildError::Toolchain(format!(
        "no CUDA compiler found; tried {}. Install the pinned CUDA 13.0 compiler with `bash scripts/setup-toolchain.sh` (or `make setup`)",
        tried.join(", ")
    )))
}

fn probe(bin: PathBuf, source: ToolchainSource) -> Result<Toolchain, BuildError> {
    let nvcc = bin.join("nvcc");
    let run = |arg: &str| -> Result<String, BuildError> {
        let out = nvcc_command(&nvcc).arg(arg).output().map_err(|e| {
            BuildError::Toolchain(format!("{}: cannot run `nvcc {arg}`: {e}", nvcc.display()))
        })?;
        if !out.status.success() {
            return Err(BuildError::Toolchain(format!(
                "{}: `nvcc {arg}` failed: {}",
                nvcc.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let version = parse_version(&run("--version")?).ok_or_else(|| {
        BuildError::Toolchain(format!(
            "{}: `nvcc --version` printed no `V<major>.<minor>.<patch>`",
            nvcc.display()
        ))
    })?;
    let sm_list = parse_gpu_codes(&run("--list-gpu-code")?);
    Ok(Toolchain {
        bin,
        source,
        version,
        sm_list,
    })
}

/// "Cuda compilation tools, release 13.0, V13.0.88" -> "13.0.88".
pub fn parse_version(text: &str) -> Option<String> {
    text.split_whitespace()
        .find_map(fatbin_verify::toolkit::version_of_toolkit_string)
}

/// `sm_75 sm_80 ...` (one per line) -> [75, 80, ...]; `a`/`f` variants count as their base.
pub fn parse_gpu_codes(text: &str) -> Vec<u32> {
    let mut list: Vec<u32> = text
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("sm_"))
        .filter_map(|w| w.trim_end_matches(['a', 'f']).parse().ok())
        .collect();
    list.sort_unstable();
    list.dedup();
    list
}

/// Where `make setup` installs an extra toolchain's wheels: `.toolchain/cuda-12.9/site`.
pub fn project_local_extra_site(project_root: &Path, cuda: CudaRelease) -> PathBuf {
    project_root.join(format!(".toolchain/cuda-{cuda}/site"))
}

/// Headers the build adds for NVRTC runs only (C library shims NVRTC lacks). They belong to the
/// build code, so they are found beside it, whatever project the manifest describes.
pub fn nvrtc_shim_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("build/nvrtc-include")
}

/// An extra toolchain found and probed: NVRTC and the headers of its wheels.
pub struct ExtraToolchain {
    pub cuda: CudaRelease,
    pub nvrtc: Nvrtc,
    /// Exact version, from the toolkit comment NVRTC writes into PTX ("12.9.86").
    pub version: String,
    /// SM numbers it compiles for (`nvrtcGetSupportedArchs`).
    pub sm_list: Vec<u32>,
    /// Include folders after the project's: the shims, the runtime headers, CCCL.
    pub include: Vec<PathBuf>,
}

impl std::fmt::Debug for ExtraToolchain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtraToolchain")
            .field("cuda", &self.cuda)
            .field("nvrtc", &self.nvrtc.path())
            .field("version", &self.version)
            .field("sm_list", &self.sm_list)
            .finish()
    }
}

/// Finds the extra toolchain of release `cuda` under `.toolchain/` and probes it: its NVRTC
/// library, release, exact version and targets.
pub fn find_extra(
    project_root: &Path,
    cuda: CudaRelease,
    manifest: &Path,
) -> Result<ExtraToolchain, BuildError> {
    let site = project_local_extra_site(project_root, cuda);
    let nvidia = site.join("nvidia");
    let lib = nvidia.join(format!("cuda_nvrtc/lib/libnvrtc.so.{}", cuda.major));
    let include = vec![
        nvrtc_shim_dir(),
        nvidia.join("cuda_runtime/include"),
        nvidia.join("cuda_cccl/include"),
    ];
    let missing: Vec<String> = std::iter::once(&lib)
        .chain(&include)
        .filter(|p| !p.exists())
        .map(|p| p.display().to_string())
        .collect();
    if !missing.is_empty() {
        return Err(BuildError::Toolchain(format!(
            "the CUDA {cuda} toolchain of {} is not installed ({} missing); install it with `bash scripts/setup-toolchain.sh` (or `make setup`)",
            manifest.display(),
            missing.join(", ")
        )));
    }
    let nvrtc = Nvrtc::open(&lib).map_err(BuildError::Toolchain)?;
    let (major, minor) = nvrtc.version().map_err(BuildError::Toolchain)?;
    if (major, Some(minor)) != (cuda.major, cuda.minor) {
        return Err(BuildError::Toolchain(format!(
            "{}: NVRTC {major}.{minor} where the manifest's extra toolchain is CUDA {cuda}; reinstall with `bash scripts/setup-toolchain.sh`",
            lib.display()
        )));
    }
    let sm_list = nvrtc.supported_sms().map_err(BuildError::Toolchain)?;
    // The exact version is in the toolkit comment of any PTX it writes.
    let probe = nvrtc
        .compile(
            "extern \"C\" __global__ void aot_probe() {}\n",
            "aot_probe.cu",
            &["-arch=compute_80".to_string()],
        )
        .map_err(BuildError::Toolchain)?;
    let version = match &probe {
        nvrtc::Output::Image { bytes, .. } => {
            fatbin_verify::toolkit::ptx_toolkit_string(bytes)
                .and_then(|s| fatbin_verify::toolkit::version_of_toolkit_string(&s))
        }
        nvrtc::Output::Failed { .. } => None,
    }
    .ok_or_else(|| {
        BuildError::Toolchain(format!(
            "{}: a probe compile gave no PTX with a `Cuda compilation tools ... V<version>` comment ({probe:?})",
            lib.display()
        ))
    })?;
    Ok(ExtraToolchain {
        cuda,
        nvrtc,
        version,
        sm_list,
        include,
    })
}
