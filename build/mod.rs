//! The ahead-of-time kernel build: manifest -> a compiler run per (module, toolchain, target)
//! (nvcc for the primary CUDA 13.0, NVRTC for extra toolchains such as CUDA 12.9) -> fatbin
//! containers per module -> read back and check -> lock check -> registry source for
//! `src/registry.rs`.
//!
//! `build.rs` is a thin wrapper around [`run`]; the tests call [`run`] directly on temporary
//! manifests, so every failure mode is tested through the same code the build uses.

pub mod compile;
pub mod nvrtc;
pub mod registry_gen;
pub mod toolchain;
pub mod triton;

use std::path::{Path, PathBuf};

use fatbin_verify::lock::{Lock, LockDiff, LockError, LockedImage, LockedModule, LOCK_FORMAT};
use fatbin_verify::manifest::{Manifest, ManifestError};
use fatbin_verify::{CudaRelease, Target};

pub use compile::{BuiltModule, ImageFormat, Toolchains};
pub use toolchain::{ExtraToolchain, Toolchain};

/// Environment variables the build reads (each is a `rerun-if-env-changed`).
pub const ENV_KNOBS: &[&str] = &[
    "AOT_CUDA_HOME",
    "CUDA_HOME",
    "CUDA_PATH",
    "PATH",
    "AOT_TARGETS",
    "AOT_UPDATE_LOCK",
    "AOT_JOBS",
    "AOT_MANIFEST",
];

#[derive(Debug, Clone)]
pub struct Config {
    /// Folder the manifest's relative paths (`kernels/...`) resolve against.
    pub project_root: PathBuf,
    pub manifest_path: PathBuf,
    pub lock_path: PathBuf,
    /// Where images, fatbins, the cache and the registry source go.
    pub out_dir: PathBuf,
    /// `AOT_TARGETS`: build only these SASS targets (the PTX fallback is always built).
    pub target_filter: Option<Vec<Target>>,
    /// `AOT_UPDATE_LOCK=1`: rewrite the lock from this build instead of checking against it.
    pub update_lock: bool,
    /// Parallel compiler processes.
    pub jobs: usize,
}

impl Config {
    /// The configuration `build.rs` uses: the crate's own manifest and lock, knobs from the environment.
    pub fn from_env(
        crate_dir: &Path,
        out_dir: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, BuildError> {
        let manifest_path = env("AOT_MANIFEST")
            .map(PathBuf::from)
            .unwrap_or_else(|| crate_dir.join("aot-manifest.toml"));
        let project_root = manifest_path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| crate_dir.to_path_buf());
        let lock_path = manifest_path.with_extension("lock");
        let target_filter = match env("AOT_TARGETS").filter(|v| !v.trim().is_empty()) {
            None => None,
            Some(list) => Some(parse_target_filter(&list)?),
        };
        let update_lock = matches!(env("AOT_UPDATE_LOCK").as_deref(), Some("1") | Some("true"));
        let jobs = match env("AOT_JOBS") {
            Some(j) => j.parse().ok().filter(|&n: &usize| n > 0).ok_or_else(|| {
                BuildError::Config(format!(
                    "AOT_JOBS={j} is not a positive whole number; unset it to use every core"
                ))
            })?,
            None => std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2),
        };
        Ok(Config {
            project_root,
            manifest_path,
            lock_path,
            out_dir: out_dir.to_path_buf(),
            target_filter,
            update_lock,
            jobs,
        })
    }
}

/// `AOT_TARGETS="sm_90 sm_110"` (spaces or commas) -> targets; PTX names are refused (it is always built).
pub fn parse_target_filter(list: &str) -> Result<Vec<Target>, BuildError> {
    let mut targets = Vec::new();
    for name in list.split([',', ' ']).filter(|s| !s.is_empty()) {
        let t: Target = name
            .parse()
            .map_err(|e| BuildError::Config(format!("AOT_TARGETS: {e}")))?;
        if t.virtual_arch {
            return Err(BuildError::Config(format!(
                "AOT_TARGETS: `{t}` is a PTX target; list SASS targets only (the PTX fallback is always built)"
            )));
        }
        targets.push(t);
    }
    Ok(targets)
}

/// What the build did with the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockStatus {
    /// Every image built equals its lock entry.
    Verified { partial: bool },
    /// `AOT_UPDATE_LOCK=1` rewrote the lock.
    Written,
    /// A toolchain other than the pinned one: its images cannot be compared with the lock.
    NotApplicable { toolchain: String, pinned: String },
}

impl std::fmt::Display for LockStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockStatus::Verified { partial: false } => {
                f.write_str("verified: every image equals aot-manifest.lock")
            }
            LockStatus::Verified { partial: true } => {
                f.write_str("verified (partial build): every image built equals aot-manifest.lock")
            }
            LockStatus::Written => {
                f.write_str("written: aot-manifest.lock rewritten from this build")
            }
            LockStatus::NotApplicable { toolchain, pinned } => write!(
                f,
                "not applicable: built with {toolchain}, the lock is for the pinned {pinned}"
            ),
        }
    }
}

#[derive(Debug)]
pub struct BuildOutput {
    #[allow(dead_code)] // read by the tests and kept for the build report
    pub toolchain: Toolchain,
    /// The extra (NVRTC) toolchains, in manifest order.
    #[allow(dead_code)] // read by the tests and kept for the build report
    pub extra_toolchains: Vec<ExtraToolchain>,
    pub modules: Vec<BuiltModule>,
    pub lock_status: LockStatus,
    /// Files whose change must rerun the build.
    pub inputs: Vec<PathBuf>,
    /// (module, target) images compiled now and taken from the cache.
    pub compiled: usize,
    pub cached: usize,
    /// The generated registry source.
    pub registry_rs: PathBuf,
    /// The generated launch facts of the Triton modules (`src/ops/triton.rs` includes it).
    pub triton_meta_rs: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{0}")]
    Manifest(#[from] ManifestError),
    #[error("{0}")]
    Lock(#[from] LockError),
    #[error("{path}: no lock file; create it with `make lock` (AOT_UPDATE_LOCK=1 cargo build) and commit it")]
    LockMissing { path: PathBuf },
    #[error("{path}: {n} difference(s) from the lock:\n{diff}\nIf the change is intended (a kernel or flag changed), run `make lock` and commit aot-manifest.lock; otherwise the toolchain is not the pinned one or the build is not deterministic.", n = diffs.len(), diff = diffs.iter().map(|d| format!("  - {d}")).collect::<Vec<_>>().join("\n"))]
    LockMismatch { path: PathBuf, diffs: Vec<LockDiff> },
    #[error("refusing to write the lock: {0}")]
    LockRefused(String),
    #[error("CUDA toolchain: {0}")]
    Toolchain(String),
    #[error("{manifest}: {key}: nvcc {version} at {bin} cannot build `{target}`; install the pinned CUDA 13.0 compiler with `bash scripts/setup-toolchain.sh` (or point AOT_CUDA_HOME at a CUDA 13.0+ toolkit)")]
    UnsupportedTarget {
        manifest: PathBuf,
        key: String,
        target: Target,
        version: String,
        bin: PathBuf,
    },
    #[error("{manifest}: module[{index}] ({module}).source: `{}` does not exist; fix the path (relative to the manifest's folder) or add the file", path.display())]
    MissingSource {
        manifest: PathBuf,
        index: usize,
        module: String,
        path: PathBuf,
    },
    #[error("Triton module {module}: {message}")]
    Triton { module: String, message: String },
    #[error("module {module}: {} failed to compile for {target} with CUDA {toolchain}:\n{stderr}\nFix the kernel source; kernels build with warnings as errors, with every toolchain of the manifest.", source_path.display())]
    Compile {
        module: String,
        target: Target,
        toolchain: CudaRelease,
        source_path: PathBuf,
        stderr: String,
    },
    #[error("module {module}: {} failed to preprocess (`nvcc -M`, listing its includes):\n{stderr}", source_path.display())]
    Dependencies {
        module: String,
        source_path: PathBuf,
        stderr: String,
    },
    #[error("{manifest}: module {module}.entries: `{entry}` is not in the {target} image (it has: {present}); add `extern \"C\" __global__ void {entry}(...)` to the source or fix the entry list")]
    MissingEntry {
        manifest: PathBuf,
        module: String,
        target: Target,
        entry: String,
        present: String,
    },
    #[error("module {module}: reading back {what}: {message}")]
    Readback {
        module: String,
        what: String,
        message: String,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("build configuration: {0}")]
    Config(String),
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> BuildError + '_ {
    move |source| BuildError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Runs the whole kernel build. `log` receives one line per step (the build script prints them).
pub fn run(
    config: &Config,
    env: &dyn Fn(&str) -> Option<String>,
    log: &(dyn Fn(&str) + Sync),
) -> Result<BuildOutput, BuildError> {
    let manifest = Manifest::from_path(&config.manifest_path)?;
    let mut inputs = vec![config.manifest_path.clone(), config.lock_path.clone()];

    for (index, module) in manifest.modules.iter().enumerate() {
        let path = config.project_root.join(&module.source);
        if !path.is_file() {
            return Err(BuildError::MissingSource {
                manifest: config.manifest_path.clone(),
                index,
                module: module.name.clone(),
                path: module.source.clone(),
            });
        }
    }

    let toolchain = toolchain::find(&config.project_root, env)?;
    log(&format!(
        "toolchain: nvcc {} from {} ({})",
        toolchain.version,
        toolchain.source,
        toolchain.bin.display()
    ));
    check_targets_supported(&manifest, config, &toolchain)?;
    let mut extra_toolchains = Vec::new();
    for (index, extra) in manifest.extra_toolchains.iter().enumerate() {
        let found = toolchain::find_extra(&config.project_root, extra.cuda, &config.manifest_path)?;
        log(&format!(
            "toolchain: CUDA {} NVRTC {} ({})",
            found.cuda,
            found.version,
            found.nvrtc.path().display()
        ));
        check_extra_targets_supported(&manifest, config, index, &found)?;
        extra_toolchains.push(found);
    }
    let toolchains = Toolchains {
        primary: &toolchain,
        primary_cuda: manifest.toolchain.cuda,
        extra: &extra_toolchains,
    };

    let (plan, source_hashes) = compile::plan(&manifest, config, &toolchains)?;
    inputs.extend(plan.inputs.iter().cloned());
    let compiled = compile::compile_all(&plan, &toolchains, config, log)?;
    let modules = compile::assemble_and_read_back(
        &manifest,
        config,
        &toolchains,
        &plan,
        &compiled,
        &source_hashes,
    )?;

    let built_lock = lock_of(&manifest, &toolchains, &modules);
    let lock_status = check_lock(&manifest, config, &toolchains, &built_lock)?;
    log(&format!("lock: {lock_status}"));

    let registry_rs = registry_gen::write(config, &manifest, &toolchains, &lock_status, &modules)?;
    let triton_meta_rs = triton::write_meta_rs(config, &manifest)?;
    let cached = compiled.iter().filter(|c| c.from_cache).count();
    Ok(BuildOutput {
        toolchain,
        extra_toolchains,
        modules,
        lock_status,
        inputs,
        compiled: compiled.len() - cached,
        cached,
        registry_rs,
        triton_meta_rs,
    })
}

fn check_targets_supported(
    manifest: &Manifest,
    config: &Config,
    toolchain: &Toolchain,
) -> Result<(), BuildError> {
    let unsupported = |key: String, target: Target| BuildError::UnsupportedTarget {
        manifest: config.manifest_path.clone(),
        key,
        target,
        version: toolchain.version.clone(),
        bin: toolchain.bin.clone(),
    };
    let supports = |t: &Target| toolchain.sm_list.contains(&t.sm);
    for t in manifest
        .targets
        .sass
        .iter()
        .chain(std::iter::once(&manifest.targets.ptx))
    {
        if !supports(t) {
            let key = if t.virtual_arch {
                "targets.ptx"
            } else {
                "targets.sass"
            };
            return Err(unsupported(key.into(), *t));
        }
    }
    for (i, m) in manifest.modules.iter().enumerate() {
        for t in m.targets.iter().flatten() {
            if !supports(t) {
                return Err(unsupported(format!("module[{i}] ({}).targets", m.name), *t));
            }
        }
    }
    Ok(())
}

/// An extra toolchain that cannot build one of its manifest targets (NVRTC 12.9 has no `sm_110`).
fn check_extra_targets_supported(
    manifest: &Manifest,
    config: &Config,
    index: usize,
    found: &ExtraToolchain,
) -> Result<(), BuildError> {
    let extra = &manifest.extra_toolchains[index];
    for (key, t) in extra
        .sass
        .iter()
        .map(|t| ("sass", t))
        .chain(std::iter::once(("ptx", &extra.ptx)))
    {
        if !found.sm_list.contains(&t.sm) {
            return Err(BuildError::Config(format!(
                "{}: extra_toolchain[{index}] ({}).{key}: NVRTC {} at {} cannot build `{t}` (it builds sm_{}); remove it from this toolchain's list",
                config.manifest_path.display(),
                extra.cuda,
                found.version,
                found.nvrtc.path().display(),
                found
                    .sm_list
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(" sm_")
            )));
        }
    }
    Ok(())
}

fn lock_of(manifest: &Manifest, toolchains: &Toolchains, modules: &[BuiltModule]) -> Lock {
    let versions = std::iter::once((manifest.toolchain.cuda, toolchains.primary.version.clone()))
        .chain(toolchains.extra.iter().map(|e| (e.cuda, e.version.clone())))
        .collect();
    Lock {
        format: LOCK_FORMAT,
        toolchains: versions,
        modules: modules
            .iter()
            .map(|m| LockedModule {
                name: m.name.clone(),
                source_sha256: m.source_sha256.clone(),
                images: m
                    .images
                    .iter()
                    .map(|i| LockedImage {
                        toolchain: i.toolchain,
                        target: i.target,
                        sha256: i.sha256.clone(),
                        size: i.size as u64,
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn check_lock(
    manifest: &Manifest,
    config: &Config,
    toolchains: &Toolchains,
    built: &Lock,
) -> Result<LockStatus, BuildError> {
    // The first toolchain that is not the pinned one, as (what was found, what is pinned).
    let unpinned = std::iter::once((
        format!("nvcc {}", toolchains.primary.version),
        toolchains.primary.version == manifest.toolchain.nvcc_version,
        manifest.toolchain.nvcc_version.clone(),
    ))
    .chain(
        toolchains
            .extra
            .iter()
            .zip(&manifest.extra_toolchains)
            .map(|(found, want)| {
                (
                    format!("NVRTC {}", found.version),
                    found.version == want.version,
                    want.version.clone(),
                )
            }),
    )
    .find(|(_, pinned, _)| !pinned)
    .map(|(found, _, pinned)| (found, pinned));
    if config.update_lock {
        if let Some((found, pinned)) = &unpinned {
            return Err(BuildError::LockRefused(format!(
                "{found} is not the pinned {pinned}; the lock records the pinned toolchains' images (install them with `bash scripts/setup-toolchain.sh`)"
            )));
        }
        if config.target_filter.is_some() {
            return Err(BuildError::LockRefused(
                "AOT_TARGETS limits this build; the lock needs every target: unset AOT_TARGETS"
                    .into(),
            ));
        }
        let text = built.to_toml_string();
        std::fs::write(&config.lock_path, text).map_err(io_err(&config.lock_path))?;
        return Ok(LockStatus::Written);
    }
    let lock = match Lock::from_path(&config.lock_path) {
        Ok(lock) => lock,
        Err(LockError::Read { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Err(BuildError::LockMissing {
                path: config.lock_path.clone(),
            })
        }
        Err(e) => return Err(e.into()),
    };
    if let Some((toolchain, pinned)) = unpinned {
        return Ok(LockStatus::NotApplicable { toolchain, pinned });
    }
    let partial = config.target_filter.is_some();
    let diffs = lock.diff(built, partial);
    if !diffs.is_empty() {
        return Err(BuildError::LockMismatch {
            path: config.lock_path.clone(),
            diffs,
        });
    }
    Ok(LockStatus::Verified { partial })
}
