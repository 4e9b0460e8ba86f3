//! Compiling every (module, toolchain, target) image in parallel with a content-keyed cache,
//! packing one fatbin container per module and toolchain (the containers of a module back to back
//! in one file), and reading each image back to check what the compiler really made.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use fatbin_verify::manifest::{Manifest, ModuleKind};
use fatbin_verify::{CudaRelease, ImageKind, Target};
use sha2::{Digest, Sha256};

use super::nvrtc;
use super::toolchain::ExtraToolchain;
use super::{io_err, BuildError, Config, Toolchain};

/// Bump when the way images are compiled changes, so stale cache entries are not reused.
const CACHE_VERSION: &str = "aot-kernels image cache v2";

/// Flags every kernel is compiled with by nvcc; module flags come after them.
const COMMON_FLAGS: &[&str] = &["-std=c++17", "-O3", "--Werror", "all-warnings"];

/// Flags every kernel is compiled with by NVRTC (optimised by default; warnings are made errors
/// by the build, which refuses any log that reports one).
const NVRTC_FLAGS: &[&str] = &["-std=c++17"];

/// Every compiler of this build: the primary nvcc and the extra NVRTC toolchains.
pub struct Toolchains<'a> {
    pub primary: &'a Toolchain,
    pub primary_cuda: CudaRelease,
    pub extra: &'a [ExtraToolchain],
}

impl Toolchains<'_> {
    fn extra(&self, cuda: CudaRelease) -> Option<&ExtraToolchain> {
        self.extra.iter().find(|e| e.cuda == cuda)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    Cubin,
    Ptx,
}

#[derive(Debug, Clone)]
pub struct BuiltImage {
    /// CUDA release of the toolchain that made it.
    pub toolchain: CudaRelease,
    pub target: Target,
    pub format: ImageFormat,
    /// sha256 (hex) of the image's identity bytes as stored in the fatbin.
    pub sha256: String,
    pub size: usize,
    /// Where the identity bytes start in the module's fatbin (stored uncompressed).
    pub offset: usize,
    pub ptx_version: Option<(u32, u32)>,
}

#[derive(Debug, Clone)]
pub struct BuiltModule {
    pub name: String,
    pub entries: Vec<String>,
    pub source_sha256: String,
    /// One fatbin container per toolchain, back to back (8-aligned) in this file.
    pub fatbin: PathBuf,
    pub images: Vec<BuiltImage>,
}

/// One compiler run: a module's source for one target with one toolchain.
#[derive(Debug, Clone)]
pub struct Job {
    pub module: String,
    pub toolchain: CudaRelease,
    pub target: Target,
    pub source: PathBuf,
    pub flags: Vec<String>,
    /// Cache file: its name carries the key, so a changed input never hits a stale file.
    pub output: PathBuf,
    pub recipe: Recipe,
}

/// What makes a job's image: the job's toolchain compiling a CUDA source (nvcc for the primary,
/// NVRTC for an extra toolchain), or the primary's ptxas on a Triton module's committed PTX.
#[derive(Debug, Clone)]
pub enum Recipe {
    Cuda,
    Triton(super::triton::TritonRecipe),
}

#[derive(Debug)]
pub struct Plan {
    /// Per manifest module, in order: its jobs (per toolchain, primary first: SASS targets, then PTX).
    pub modules: Vec<(String, Vec<Job>)>,
    pub inputs: Vec<PathBuf>,
}

#[derive(Debug)]
pub struct Compiled {
    pub module: String,
    pub toolchain: CudaRelease,
    pub target: Target,
    pub path: PathBuf,
    pub from_cache: bool,
}

fn include_dir(config: &Config) -> PathBuf {
    config.project_root.join("kernels/include")
}

/// Every file the module's source includes, as nvcc's preprocessor finds them (`nvcc -M`):
/// the project's headers and the toolkit's and system's.
fn dependencies(
    toolchain: &Toolchain,
    config: &Config,
    module: &fatbin_verify::manifest::Module,
    source: &Path,
) -> Result<Vec<PathBuf>, BuildError> {
    let out = toolchain
        .nvcc_command()
        .args(["-M", "-x", "cu", "-std=c++17"])
        .arg("-I")
        .arg(include_dir(config))
        .args(&module.flags)
        .arg(source)
        .output()
        .map_err(|e| {
            BuildError::Toolchain(format!("cannot run {}: {e}", toolchain.nvcc().display()))
        })?;
    if !out.status.success() {
        return Err(BuildError::Dependencies {
            module: module.name.clone(),
            source_path: module.source.clone(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(parse_make_deps(&String::from_utf8_lossy(&out.stdout)))
}

/// `x.o : a.cu \\\n  b.h c.h` -> [a.cu, b.h, c.h], canonical and sorted. Escaped spaces are kept.
fn parse_make_deps(text: &str) -> Vec<PathBuf> {
    const SPACE: char = '\u{1}';
    let joined = text.replace("\\\n", " ").replace("\\ ", &SPACE.to_string());
    let mut deps: Vec<PathBuf> = joined
        .split_once(':')
        .map(|(_, rest)| rest)
        .unwrap_or("")
        .split_whitespace()
        .map(|p| {
            let p = PathBuf::from(p.replace(SPACE, " "));
            p.canonicalize().unwrap_or(p)
        })
        .collect();
    deps.sort();
    deps.dedup();
    deps
}

pub(crate) fn hash_files(root: &Path, files: &[PathBuf]) -> Result<String, BuildError> {
    let mut h = Sha256::new();
    for f in files {
        let rel = f.strip_prefix(root).unwrap_or(f);
        h.update(rel.to_string_lossy().as_bytes());
        h.update([0]);
        let bytes = std::fs::read(f).map_err(io_err(f))?;
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Ok(hex(h.finalize()))
}

/// Hash of file contents alone, in the given (sorted) order.
fn hash_contents(files: &[PathBuf]) -> Result<String, BuildError> {
    let mut h = Sha256::new();
    for f in files {
        let bytes = std::fs::read(f).map_err(io_err(f))?;
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Ok(hex(h.finalize()))
}

/// A finished sha256 as lowercase hex.
pub fn hex(digest: sha2::digest::Output<Sha256>) -> String {
    fatbin_verify::sha256_hex(&digest.into())
}

/// Images this build makes for a module, by (toolchain, target): the manifest's, SASS cut by
/// `AOT_TARGETS`, every PTX fallback kept. A filter entry admits every variant of its
/// architecture (`sm_90` keeps a module's `sm_90a`), so a quick build for one GPU still carries
/// the Triton modules' arch-specific SASS.
pub fn module_images(
    manifest: &Manifest,
    module: &fatbin_verify::manifest::Module,
    config: &Config,
) -> Vec<(CudaRelease, Target)> {
    manifest
        .module_images(module)
        .into_iter()
        .filter(|(_, t)| {
            t.virtual_arch
                || config
                    .target_filter
                    .as_ref()
                    .is_none_or(|f| f.iter().any(|x| x.sm == t.sm))
        })
        .collect()
}

pub fn plan(
    manifest: &Manifest,
    config: &Config,
    toolchains: &Toolchains,
) -> Result<(Plan, Vec<String>), BuildError> {
    let toolchain = toolchains.primary;
    let mut modules = Vec::new();
    let mut source_hashes = Vec::new();
    let mut inputs = vec![config.project_root.join("kernels")];
    let kernels_dir = config.project_root.join("kernels");
    let kernels_dir = kernels_dir.canonicalize().unwrap_or(kernels_dir);
    // Toolchain identity beyond nvcc's version: the pinned packages (headers come from the
    // runtime and cccl wheels, versioned apart from nvcc).
    let toolchain_id = format!(
        "{} {}",
        toolchain.version,
        manifest.toolchain.packages.join(" ")
    );
    // An extra toolchain is its exact wheels (compiler and headers) plus the build's shims.
    let shims = super::toolchain::nvrtc_shim_dir();
    let mut shim_files: Vec<PathBuf> = std::fs::read_dir(&shims)
        .map_err(io_err(&shims))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    shim_files.sort();
    let shim_sha256 = hash_files(&shims, &shim_files)?;
    inputs.extend(shim_files);
    let extra_ids: Vec<(CudaRelease, String)> = manifest
        .extra_toolchains
        .iter()
        .map(|e| {
            let found = toolchains.extra(e.cuda).map_or("", |x| x.version.as_str());
            (
                e.cuda,
                format!("nvrtc {found} {} {shim_sha256}", e.packages.join(" ")),
            )
        })
        .collect();
    for module in &manifest.modules {
        if module.kind == ModuleKind::Triton {
            let (source_sha256, jobs, files) = super::triton::plan_module(
                manifest,
                module,
                config,
                toolchains,
                &toolchain_id,
                CACHE_VERSION,
            )?;
            inputs.extend(files);
            source_hashes.push(source_sha256);
            modules.push((module.name.clone(), jobs));
            continue;
        }
        let source = config.project_root.join(&module.source);
        let deps = dependencies(toolchain, config, module, &source)?;
        // The lock's source hash covers the project's own files, named relative to the project,
        // so clones in different folders and toolkits in different places agree on it.
        let (own, external): (Vec<PathBuf>, Vec<PathBuf>) = deps
            .iter()
            .cloned()
            .partition(|d| d.starts_with(&kernels_dir));
        let source_sha256 = hash_files(&kernels_dir, &own)?;
        // The cache key also covers toolkit and system headers, by content.
        let external_sha256 = hash_contents(&external)?;
        inputs.extend(deps);

        let mut jobs = Vec::new();
        for (cuda, target) in module_images(manifest, module, config) {
            let (id, common, external) = if cuda == toolchains.primary_cuda {
                (
                    toolchain_id.as_str(),
                    COMMON_FLAGS,
                    external_sha256.as_str(),
                )
            } else {
                let id = extra_ids
                    .iter()
                    .find(|(c, _)| *c == cuda)
                    .map_or("", |(_, id)| id.as_str());
                (id, NVRTC_FLAGS, "")
            };
            let mut key = Sha256::new();
            for part in [
                CACHE_VERSION,
                id,
                &target.to_string(),
                &source_sha256,
                external,
            ] {
                key.update(part.as_bytes());
                key.update([0]);
            }
            for flag in common
                .iter()
                .copied()
                .chain(module.flags.iter().map(String::as_str))
            {
                key.update(flag.as_bytes());
                key.update([0]);
            }
            let key = hex(key.finalize());
            let ext = if target.virtual_arch { "ptx" } else { "cubin" };
            let output = config
                .out_dir
                .join("cache")
                .join(&module.name)
                .join(format!("{cuda}-{target}-{}.{ext}", &key[..16]));
            jobs.push(Job {
                module: module.name.clone(),
                toolchain: cuda,
                target,
                source: source.clone(),
                flags: module.flags.clone(),
                output,
                recipe: Recipe::Cuda,
            });
        }
        source_hashes.push(source_sha256);
        modules.push((module.name.clone(), jobs));
    }
    inputs.sort();
    inputs.dedup();
    Ok((Plan { modules, inputs }, source_hashes))
}

/// Runs every job not already in the cache, `config.jobs` at a time.
pub fn compile_all(
    plan: &Plan,
    toolchains: &Toolchains,
    config: &Config,
    log: &(dyn Fn(&str) + Sync),
) -> Result<Vec<Compiled>, BuildError> {
    let jobs: Vec<&Job> = plan.modules.iter().flat_map(|(_, jobs)| jobs).collect();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<Compiled, BuildError>>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    let workers = config.jobs.clamp(1, jobs.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let result = compile_one(job, toolchains, config, log);
                if let Ok(mut r) = results.lock() {
                    r[i] = Some(result);
                }
            });
        }
    });
    let results = results.into_inner().unwrap_or_default();
    // Report the first failure in manifest order, so the error does not depend on thread timing.
    results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| Err(BuildError::Config("a compile worker stopped early".into())))
        })
        .collect()
}

fn compile_one(
    job: &Job,
    toolchains: &Toolchains,
    config: &Config,
    log: &(dyn Fn(&str) + Sync),
) -> Result<Compiled, BuildError> {
    let done = |from_cache| Compiled {
        module: job.module.clone(),
        toolchain: job.toolchain,
        target: job.target,
        path: job.output.clone(),
        from_cache,
    };
    if job.output.is_file() {
        return Ok(done(true));
    }
    let dir = job.output.parent().unwrap_or(&config.out_dir);
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let tmp = job
        .output
        .with_extension(format!("tmp{}", std::process::id()));
    let started = Instant::now();
    if let Recipe::Triton(recipe) = &job.recipe {
        super::triton::make_image(job, recipe, toolchains.primary, &tmp)?;
        std::fs::rename(&tmp, &job.output).map_err(io_err(&job.output))?;
        prune_stale(job);
        log(&format!(
            "assembled {} {} (CUDA {}) in {:.2} s",
            job.module,
            job.target,
            job.toolchain,
            started.elapsed().as_secs_f64()
        ));
        return Ok(done(false));
    }
    if job.toolchain != toolchains.primary_cuda {
        let extra = toolchains.extra(job.toolchain).ok_or_else(|| {
            BuildError::Toolchain(format!("no CUDA {} toolchain was found", job.toolchain))
        })?;
        let bytes = compile_with_nvrtc(job, extra, config)?;
        std::fs::write(&tmp, bytes).map_err(io_err(&tmp))?;
    } else {
        compile_with_nvcc(job, toolchains.primary, config, &tmp)?;
    }
    std::fs::rename(&tmp, &job.output).map_err(io_err(&job.output))?;
    prune_stale(job);
    log(&format!(
        "compiled {} {} (CUDA {}) in {:.2} s",
        job.module,
        job.target,
        job.toolchain,
        started.elapsed().as_secs_f64()
    ));
    Ok(done(false))
}

fn compile_error(job: &Job, config: &Config, stderr: String) -> BuildError {
    BuildError::Compile {
        module: job.module.clone(),
        target: job.target,
        toolchain: job.toolchain,
        source_path: job
            .source
            .strip_prefix(&config.project_root)
            .unwrap_or(&job.source)
            .to_path_buf(),
        stderr,
    }
}

/// One NVRTC run; a log that reports a warning fails it, as nvcc's `--Werror all-warnings` would.
fn compile_with_nvrtc(
    job: &Job,
    extra: &ExtraToolchain,
    config: &Config,
) -> Result<Vec<u8>, BuildError> {
    let source = std::fs::read_to_string(&job.source).map_err(io_err(&job.source))?;
    let mut options: Vec<String> = vec![format!("-arch={}", job.target)];
    options.extend(NVRTC_FLAGS.iter().map(|f| f.to_string()));
    options.push(format!("-I{}", include_dir(config).display()));
    options.extend(extra.include.iter().map(|d| format!("-I{}", d.display())));
    options.extend(job.flags.iter().cloned());
    let name = job
        .source
        .strip_prefix(&config.project_root)
        .unwrap_or(&job.source)
        .display()
        .to_string();
    match extra
        .nvrtc
        .compile(&source, &name, &options)
        .map_err(BuildError::Toolchain)?
    {
        nvrtc::Output::Failed { log } => Err(compile_error(job, config, log)),
        nvrtc::Output::Image { log, .. } if log.contains("warning") => Err(compile_error(
            job,
            config,
            format!("{log}\n(warnings are errors)"),
        )),
        nvrtc::Output::Image { bytes, .. } => Ok(bytes),
    }
}

fn compile_with_nvcc(
    job: &Job,
    toolchain: &Toolchain,
    config: &Config,
    tmp: &Path,
) -> Result<(), BuildError> {
    let mode = if job.target.virtual_arch {
        "-ptx"
    } else {
        "-cubin"
    };
    let output = toolchain
        .nvcc_command()
        .arg(mode)
        .arg(format!("-arch={}", job.target))
        .args(COMMON_FLAGS)
        .arg("-I")
        .arg(include_dir(config))
        .args(&job.flags)
        .arg("-o")
        .arg(tmp)
        .arg(&job.source)
        .output()
        .map_err(|e| {
            BuildError::Toolchain(format!("cannot run {}: {e}", toolchain.nvcc().display()))
        })?;
    if !output.status.success() {
        let _ = std::fs::remove_file(tmp);
        let mut stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
        if stderr.is_empty() {
            stderr = String::from_utf8_lossy(&output.stdout).trim().to_string();
        }
        return Err(compile_error(job, config, stderr));
    }
    Ok(())
}

/// Removes this (module, toolchain, target)'s cache entries made from older inputs, so the cache
/// stays one file per image.
fn prune_stale(job: &Job) {
    let (Some(dir), Some(current)) = (job.output.parent(), job.output.file_name()) else {
        return;
    };
    let prefix = format!("{}-{}-", job.toolchain, job.target);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name != current && name.to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Packs each module's images into uncompressed fatbin containers, one per toolchain, back to
/// back in one file (so the runtime can slice images out of it without copying), then reads every
/// image back and checks target, kind, toolchain and entry points.
pub fn assemble_and_read_back(
    manifest: &Manifest,
    config: &Config,
    toolchains: &Toolchains,
    plan: &Plan,
    compiled: &[Compiled],
    source_hashes: &[String],
) -> Result<Vec<BuiltModule>, BuildError> {
    let mut modules = Vec::new();
    for (((name, jobs), module), source_sha256) in plan
        .modules
        .iter()
        .zip(&manifest.modules)
        .zip(source_hashes)
    {
        let readback = |what: String, message: String| BuildError::Readback {
            module: name.clone(),
            what,
            message,
        };
        let fatbin = config.out_dir.join(format!("{name}.fatbin"));
        let mut whole: Vec<u8> = Vec::new();
        let mut built = Vec::new();
        let mut releases: Vec<CudaRelease> = jobs.iter().map(|j| j.toolchain).collect();
        releases.dedup();
        for cuda in releases {
            let jobs: Vec<&Job> = jobs.iter().filter(|j| j.toolchain == cuda).collect();
            let images: Vec<&Compiled> = compiled
                .iter()
                .filter(|c| &c.module == name && c.toolchain == cuda)
                .collect();
            // The primary's fatbinary packs every toolchain's images: the container format is the
            // same, and the CUDA 12 wheels carry no fatbinary.
            let part = config.out_dir.join(format!("{name}.cuda-{cuda}.fatbin"));
            let bytes = pack(toolchains.primary, &images, &part)
                .map_err(|message| readback("fatbinary".into(), message))?;
            let listed = fatbin_verify::list_images(&bytes)
                .map_err(|e| readback(part.display().to_string(), e.to_string()))?;
            if listed.len() != jobs.len() {
                return Err(readback(
                    part.display().to_string(),
                    format!("{} images where {} were packed", listed.len(), jobs.len()),
                ));
            }
            // Containers follow one another 8-aligned, as linkers place them.
            whole.resize(whole.len().div_ceil(8) * 8, 0);
            let base = whole.len();
            whole.extend_from_slice(&bytes);
            for (job, image) in jobs.iter().zip(&images) {
                built.push(read_back_one(
                    manifest, config, module, name, job, image, &listed, base,
                )?);
            }
        }
        std::fs::write(&fatbin, &whole).map_err(io_err(&fatbin))?;
        modules.push(BuiltModule {
            name: name.clone(),
            entries: module.entries.clone(),
            source_sha256: source_sha256.clone(),
            fatbin,
            images: built,
        });
    }
    Ok(modules)
}

/// One uncompressed container of `images`, written to `out` and returned.
fn pack(toolchain: &Toolchain, images: &[&Compiled], out: &Path) -> Result<Vec<u8>, String> {
    let mut cmd = Command::new(toolchain.fatbinary());
    cmd.arg("--64")
        .arg("--compress=false")
        .arg(format!("--create={}", out.display()));
    for image in images {
        let kind = if image.target.virtual_arch {
            "ptx"
        } else {
            "elf"
        };
        let sm = image.target.to_string();
        let sm = sm.trim_start_matches("sm_").trim_start_matches("compute_");
        cmd.arg(format!(
            "--image3=kind={kind},sm={sm},file={}",
            image.path.display()
        ));
    }
    let result = cmd
        .output()
        .map_err(|e| format!("cannot run {}: {e}", toolchain.fatbinary().display()))?;
    if !result.status.success() {
        return Err(String::from_utf8_lossy(&result.stderr).trim().to_string());
    }
    std::fs::read(out).map_err(|e| format!("{}: {e}", out.display()))
}

/// Checks one packed image against its job: kind, bytes, toolchain, entries; records where it lies
/// in the module's file (`base`: its container's offset there).
#[allow(clippy::too_many_arguments)]
fn read_back_one(
    manifest: &Manifest,
    config: &Config,
    module: &fatbin_verify::manifest::Module,
    name: &str,
    job: &Job,
    image: &Compiled,
    listed: &[fatbin_verify::ImageInfo],
    base: usize,
) -> Result<BuiltImage, BuildError> {
    let what = format!("{} image (CUDA {})", job.target, job.toolchain);
    let readback = |message: String| BuildError::Readback {
        module: name.to_string(),
        what: what.clone(),
        message,
    };
    let info = listed
        .iter()
        .find(|i| i.target == Some(job.target))
        .ok_or_else(|| readback(format!("no {} image in the fatbin", job.target)))?;
    let (format, want_kind) = if job.target.virtual_arch {
        (ImageFormat::Ptx, ImageKind::Ptx)
    } else {
        (ImageFormat::Cubin, ImageKind::Elf)
    };
    if info.kind != want_kind {
        return Err(readback(format!(
            "kind {:?} where {want_kind:?} was expected",
            info.kind
        )));
    }
    if format == ImageFormat::Cubin {
        // The fatbin must carry exactly the cubin the compiler wrote.
        let file = std::fs::read(&image.path).map_err(io_err(&image.path))?;
        if hex(Sha256::digest(&file)) != fatbin_verify::sha256_hex(&info.sha256) {
            return Err(readback(
                "the cubin in the fatbin differs from the file the compiler wrote".into(),
            ));
        }
    }
    if format == ImageFormat::Ptx && info.ptx_version.is_none() {
        return Err(readback("PTX without a `.version` line".into()));
    }
    // The image must say it comes from its toolchain (ELF ABI, PTX ISA, toolkit string).
    if fatbin_verify::verify::image_toolchain(manifest, info) != Some(job.toolchain) {
        return Err(readback(format!(
            "it reads as made by CUDA {} (ELF ABI {:?}, PTX {:?}, toolkit {:?}), not CUDA {}",
            info.cuda.map_or("unknown".into(), |c| c.to_string()),
            info.elf_abi,
            info.ptx_version,
            info.toolkit,
            job.toolchain
        )));
    }
    for entry in &module.entries {
        if !info.kernels.iter().any(|k| k == entry) {
            return Err(BuildError::MissingEntry {
                manifest: config.manifest_path.clone(),
                module: name.to_string(),
                target: job.target,
                entry: entry.clone(),
                present: if info.kernels.is_empty() {
                    "no kernels".into()
                } else {
                    info.kernels.join(", ")
                },
            });
        }
    }
    let range = info
        .raw_range
        .clone()
        .ok_or_else(|| readback("stored compressed; the fatbin must be uncompressed".into()))?;
    Ok(BuiltImage {
        toolchain: job.toolchain,
        target: job.target,
        format,
        sha256: fatbin_verify::sha256_hex(&info.sha256),
        size: info.size,
        offset: base + range.start,
        ptx_version: info.ptx_version,
    })
}
