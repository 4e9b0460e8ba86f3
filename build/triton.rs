//! Triton modules (`kind = "triton"`): no Triton or Python at build time. `scripts/triton-gen.sh`
//! commits, per module, the PTX of every target and a `meta.json` under
//! `kernels/triton/generated/<module>/`; here each SASS target's PTX is assembled with the pinned
//! ptxas and the flags Triton itself used (the cubin must equal the one Triton made, whose sha256
//! the metadata records), the fallback's PTX is taken as it is, and both go through the same
//! fatbin packing, read-back, lock and registry as CUDA modules. The launch facts (signature,
//! constexprs, warps, shared memory, scratch sizes) become a table for the Rust launchers.
//!
//! Triton modules are built by the primary toolchain (CUDA 13) only: the manifest gives extra
//! toolchains (`[[extra_toolchain]]`, CUDA 12.9 via NVRTC) `kind = "cuda"` modules alone, since
//! the committed PTX is what Triton wrote for the pinned CUDA 13.0 ptxas (`.version 9.0`). So a
//! Triton module has no CUDA 12 image; on a 12.x driver the dispatcher reports it unavailable.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use fatbin_verify::manifest::{Manifest, Module};
use fatbin_verify::{Target, Variant};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::compile::{hex, module_images, Job, Recipe, Toolchains};
use super::{io_err, BuildError, Config, Toolchain};

/// Where the generated PTX and metadata of Triton modules live, relative to the project.
pub const GENERATED_DIR: &str = "kernels/triton/generated";

const REGENERATE: &str =
    "run `make triton` (bash scripts/triton-gen.sh) and commit kernels/triton/generated/";

/// `meta.json` of one module, as scripts/triton_gen.py writes it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TritonMeta {
    pub module: String,
    pub entry: String,
    pub source: String,
    pub source_sha256: String,
    pub triton_version: String,
    pub ptxas_version: String,
    /// Non-constexpr parameters in order: (name, Triton type such as `*bf16`, `i32`, `fp32`).
    pub signature: Vec<(String, String)>,
    /// The extra pointer parameters Triton appends (global scratch, profile scratch).
    pub scratch_params: Vec<String>,
    /// Pointer parameters compiled assuming 16-byte alignment.
    pub divisibility_16: Vec<String>,
    pub constexprs: BTreeMap<String, i64>,
    pub num_warps: u32,
    pub num_ctas: u32,
    pub num_stages: u32,
    /// Per target name (`sm_90a`, `compute_80`).
    pub images: BTreeMap<String, TritonImageMeta>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TritonImageMeta {
    pub ptx: String,
    pub ptx_sha256: String,
    pub ptx_version: String,
    pub ptx_target: String,
    pub shared: u32,
    pub tmem_size: u32,
    pub global_scratch_size: u32,
    pub global_scratch_align: u32,
    pub profile_scratch_size: u32,
    pub profile_scratch_align: u32,
    pub launch_pdl: bool,
    pub launch_cooperative_grid: bool,
    #[serde(default)]
    pub cubin_sha256: Option<String>,
    #[serde(default)]
    pub ptxas_args: Option<Vec<String>>,
    #[serde(default)]
    pub registers: Option<u32>,
    #[serde(default)]
    pub spill_store_bytes: Option<u32>,
    #[serde(default)]
    pub spill_load_bytes: Option<u32>,
    /// The pipeline depth, where this target takes another than the module's `num_stages` (a
    /// shallower one where a block may use less shared memory; scripts/triton_gen.py). Read by
    /// people: the launch needs only `shared`.
    #[serde(default)]
    #[allow(dead_code)]
    pub num_stages: Option<u32>,
}

/// How one image of a Triton module is made from its committed PTX.
#[derive(Debug, Clone)]
pub enum TritonRecipe {
    /// `ptxas <args> ptx -o cubin`; the result must hash to `cubin_sha256` (Triton's own cubin).
    Assemble {
        ptx: PathBuf,
        args: Vec<String>,
        cubin_sha256: String,
    },
    /// The PTX fallback, packed as it is.
    Ptx { ptx: PathBuf },
}

fn stale(module: &str, message: String) -> BuildError {
    BuildError::Triton {
        module: module.to_string(),
        message: format!("{message}; {REGENERATE}"),
    }
}

pub fn read_meta(config: &Config, module: &str) -> Result<(PathBuf, TritonMeta), BuildError> {
    let dir = config.project_root.join(GENERATED_DIR).join(module);
    let path = dir.join("meta.json");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        stale(
            module,
            format!("cannot read {GENERATED_DIR}/{module}/meta.json ({e})"),
        )
    })?;
    let meta: TritonMeta = serde_json::from_str(&text).map_err(|e| {
        stale(
            module,
            format!("{GENERATED_DIR}/{module}/meta.json is not what triton_gen.py writes ({e})"),
        )
    })?;
    Ok((dir, meta))
}

/// The newest PTX ISA a CUDA toolkit writes (nvcc 13.0 -> 9.0, 12.9 -> 8.8, 12.8 -> 8.7).
pub fn toolkit_ptx_isa(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    let (major, minor) = (parts.next()??, parts.next()??);
    match (major, minor) {
        (13, m) => Some((9, m)),
        (12, m @ 0..=5) => Some((8, m)),
        (12, m @ 6..=9) => Some((8, m - 1)),
        _ => None,
    }
}

fn parse_isa(text: &str) -> Option<(u32, u32)> {
    let (a, b) = text.split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Checks a Triton module's committed files and makes one job per target: the lock's source hash,
/// the jobs, and the files whose change reruns the build.
pub fn plan_module(
    manifest: &Manifest,
    module: &Module,
    config: &Config,
    toolchains: &Toolchains,
    toolchain_id: &str,
    cache_version: &str,
) -> Result<(String, Vec<Job>, Vec<PathBuf>), BuildError> {
    let toolchain = toolchains.primary;
    let name = module.name.as_str();
    let (dir, meta) = read_meta(config, name)?;
    if meta.module != name {
        return Err(stale(
            name,
            format!("meta.json describes module `{}`", meta.module),
        ));
    }
    if module.entries != [meta.entry.clone()] {
        return Err(BuildError::Triton {
            module: name.into(),
            message: format!(
                "{}: entries must be [\"{}\"], the one kernel the Triton module exports",
                config.manifest_path.display(),
                meta.entry
            ),
        });
    }
    let source_rel = module.source.to_string_lossy().to_string();
    if meta.source != source_rel {
        return Err(stale(
            name,
            format!(
                "generated from {}, the manifest says {source_rel}",
                meta.source
            ),
        ));
    }
    let source = config.project_root.join(&module.source);
    let source_bytes = std::fs::read(&source).map_err(io_err(&source))?;
    let source_now = hex(Sha256::digest(&source_bytes));
    if source_now != meta.source_sha256 {
        return Err(stale(
            name,
            format!(
                "{source_rel} changed since its PTX was generated (recorded sha256 {}, now {source_now})",
                meta.source_sha256
            ),
        ));
    }
    let isa_limit = toolkit_ptx_isa(&toolchain.version);
    let meta_path = dir.join("meta.json");
    let mut own_files = vec![source.clone(), meta_path.clone()];
    let mut jobs = Vec::new();
    for (cuda, target) in module_images(manifest, module, config) {
        if cuda != toolchains.primary_cuda {
            return Err(BuildError::Triton {
                module: name.into(),
                message: format!(
                    "the manifest asks for a CUDA {cuda} image; Triton modules are built by the primary toolchain (CUDA {}) only",
                    toolchains.primary_cuda
                ),
            });
        }
        let image = meta.images.get(&target.to_string()).ok_or_else(|| {
            stale(
                name,
                format!("meta.json has no image for {target}, which the manifest asks for"),
            )
        })?;
        let ptx = dir.join(&image.ptx);
        let ptx_bytes = std::fs::read(&ptx).map_err(io_err(&ptx))?;
        let ptx_sha = hex(Sha256::digest(&ptx_bytes));
        if ptx_sha != image.ptx_sha256 {
            return Err(stale(
                name,
                format!(
                    "{} does not match its recorded sha256 (hand-edited or corrupt)",
                    ptx.display()
                ),
            ));
        }
        let info = fatbin_verify::ptx::parse_ptx(&ptx_bytes);
        let isa = parse_isa(&image.ptx_version);
        if info.version.is_none() || info.version != isa {
            return Err(stale(
                name,
                format!(
                    "{}: `.version` {:?} differs from the recorded {}",
                    image.ptx, info.version, image.ptx_version
                ),
            ));
        }
        if let (Some(isa), Some(limit)) = (isa, isa_limit) {
            if isa > limit {
                return Err(BuildError::Triton {
                    module: name.into(),
                    message: format!(
                        "{} has PTX .version {}.{}, newer than nvcc {} writes ({}.{}); generate with the pinned toolchain",
                        image.ptx, isa.0, isa.1, toolchain.version, limit.0, limit.1
                    ),
                });
            }
        }
        let recipe = if target.virtual_arch {
            TritonRecipe::Ptx { ptx: ptx.clone() }
        } else {
            let (Some(args), Some(cubin_sha256)) = (&image.ptxas_args, &image.cubin_sha256) else {
                return Err(stale(
                    name,
                    format!("meta.json records no ptxas arguments or cubin hash for {target}"),
                ));
            };
            if image.ptx_target != target.to_string() {
                return Err(stale(
                    name,
                    format!("{} targets {}, not {target}", image.ptx, image.ptx_target),
                ));
            }
            TritonRecipe::Assemble {
                ptx: ptx.clone(),
                args: args.clone(),
                cubin_sha256: cubin_sha256.clone(),
            }
        };
        let mut key = Sha256::new();
        for part in [cache_version, toolchain_id, &target.to_string(), &ptx_sha] {
            key.update(part.as_bytes());
            key.update([0]);
        }
        if let TritonRecipe::Assemble {
            args, cubin_sha256, ..
        } = &recipe
        {
            for a in args.iter().chain(std::iter::once(cubin_sha256)) {
                key.update(a.as_bytes());
                key.update([0]);
            }
        }
        let key = hex(key.finalize());
        let ext = if target.virtual_arch { "ptx" } else { "cubin" };
        jobs.push(Job {
            module: name.to_string(),
            toolchain: cuda,
            target,
            source: ptx,
            flags: Vec::new(),
            output: config
                .out_dir
                .join("cache")
                .join(name)
                .join(format!("{cuda}-{target}-{}.{ext}", &key[..16])),
            recipe: Recipe::Triton(recipe),
        });
    }
    // The lock's source hash covers every committed file of the module, whichever targets this
    // build makes, so it does not depend on AOT_TARGETS.
    for image in meta.images.values() {
        own_files.push(dir.join(&image.ptx));
    }
    own_files.sort();
    own_files.dedup();
    let kernels_dir = config.project_root.join("kernels");
    let source_sha256 = super::compile::hash_files(&kernels_dir, &own_files)?;
    Ok((source_sha256, jobs, own_files))
}

/// Makes one image into `tmp`: runs ptxas (and checks the cubin is Triton's), or copies the PTX.
pub fn make_image(
    job: &Job,
    recipe: &TritonRecipe,
    toolchain: &Toolchain,
    tmp: &Path,
) -> Result<(), BuildError> {
    match recipe {
        TritonRecipe::Ptx { ptx } => {
            std::fs::copy(ptx, tmp).map_err(io_err(ptx))?;
        }
        TritonRecipe::Assemble {
            ptx,
            args,
            cubin_sha256,
        } => {
            let ptxas = toolchain.bin.join("ptxas");
            let out = std::process::Command::new(&ptxas)
                .args(args)
                .arg(ptx)
                .arg("-o")
                .arg(tmp)
                .output()
                .map_err(|e| {
                    BuildError::Toolchain(format!("cannot run {}: {e}", ptxas.display()))
                })?;
            if !out.status.success() {
                return Err(BuildError::Compile {
                    module: job.module.clone(),
                    target: job.target,
                    toolchain: job.toolchain,
                    source_path: ptx.clone(),
                    stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
                });
            }
            let bytes = std::fs::read(tmp).map_err(io_err(tmp))?;
            let got = hex(Sha256::digest(&bytes));
            if &got != cubin_sha256 {
                let _ = std::fs::remove_file(tmp);
                return Err(BuildError::Triton {
                    module: job.module.clone(),
                    message: format!(
                        "ptxas {} {} made a {} cubin with sha256 {got}, Triton's own was {cubin_sha256}: the toolchain is not the one the PTX was generated with ({})",
                        toolchain.version,
                        args.join(" "),
                        job.target,
                        REGENERATE
                    ),
                });
            }
        }
    }
    Ok(())
}

fn variant_name(v: Variant) -> &'static str {
    match v {
        Variant::Baseline => "Baseline",
        Variant::ArchSpecific => "ArchSpecific",
        Variant::Family => "Family",
    }
}

/// Writes `triton_meta.rs` into OUT_DIR: the launch facts of every Triton module, per target,
/// for `src/ops/triton.rs`.
pub fn write_meta_rs(config: &Config, manifest: &Manifest) -> Result<PathBuf, BuildError> {
    let mut s = String::from(
        "// Generated by build.rs from kernels/triton/generated/*/meta.json. Do not edit.\n\n",
    );
    s.push_str("pub(crate) static TRITON_KERNELS: &[TritonKernelRecord] = &[\n");
    for module in manifest
        .modules
        .iter()
        .filter(|m| m.kind == fatbin_verify::manifest::ModuleKind::Triton)
    {
        let (_, meta) = read_meta(config, &module.name)?;
        let _ = writeln!(s, "    TritonKernelRecord {{");
        let _ = writeln!(s, "        module: {:?},", meta.module);
        let _ = writeln!(s, "        entry: {:?},", meta.entry);
        let _ = writeln!(s, "        source_sha256: {:?},", meta.source_sha256);
        let _ = writeln!(s, "        triton_version: {:?},", meta.triton_version);
        let _ = writeln!(s, "        ptxas_version: {:?},", meta.ptxas_version);
        let _ = writeln!(s, "        params: &[");
        for (name, ty) in &meta.signature {
            let aligned = meta.divisibility_16.contains(name);
            let _ = writeln!(
                s,
                "            TritonParam {{ name: {name:?}, ty: {ty:?}, aligned_16: {aligned} }},"
            );
        }
        let _ = writeln!(s, "        ],");
        let _ = writeln!(s, "        scratch_params: &{:?},", meta.scratch_params);
        let _ = writeln!(s, "        constexprs: &[");
        for (name, value) in &meta.constexprs {
            let _ = writeln!(s, "            ({name:?}, {value}),");
        }
        let _ = writeln!(s, "        ],");
        let _ = writeln!(s, "        num_warps: {},", meta.num_warps);
        let _ = writeln!(s, "        num_ctas: {},", meta.num_ctas);
        let _ = writeln!(s, "        num_stages: {},", meta.num_stages);
        let _ = writeln!(s, "        images: &[");
        for (target, image) in &meta.images {
            let t: Target = target
                .parse()
                .map_err(|e| stale(&module.name, format!("meta.json image key `{target}`: {e}")))?;
            let _ = writeln!(
                s,
                "            TritonImageRecord {{ target: Target {{ sm: {}, variant: Variant::{}, virtual_arch: {} }}, ptx_version: {:?}, shared: {}, tmem_size: {}, global_scratch_size: {}, global_scratch_align: {}, profile_scratch_size: {}, profile_scratch_align: {}, launch_pdl: {}, launch_cooperative_grid: {}, registers: {:?}, spill_store_bytes: {:?}, spill_load_bytes: {:?} }},",
                t.sm,
                variant_name(t.variant),
                t.virtual_arch,
                image.ptx_version,
                image.shared,
                image.tmem_size,
                image.global_scratch_size,
                image.global_scratch_align,
                image.profile_scratch_size,
                image.profile_scratch_align,
                image.launch_pdl,
                image.launch_cooperative_grid,
                image.registers,
                image.spill_store_bytes,
                image.spill_load_bytes,
            );
        }
        let _ = writeln!(s, "        ],\n    }},");
    }
    s.push_str("];\n");
    let path = config.out_dir.join("triton_meta.rs");
    std::fs::write(&path, s).map_err(io_err(&path))?;
    Ok(path)
}
