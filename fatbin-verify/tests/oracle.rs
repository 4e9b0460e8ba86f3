//! Oracle tests: a corpus built at test time with the pinned nvcc 13.0 and the pinned NVRTC 12.9
//! (the CUDA 12 toolchain, packed by nvcc 13.0's fatbinary as the build packs it), listed and
//! extracted both by this crate and by NVIDIA's `cuobjdump`; kinds, architectures, versions,
//! entry names and the sha256 of every extracted image must agree.
//!
//! Needs the toolchains (`bash scripts/setup-toolchain.sh`); without them these tests fail, never skip.

/// The build's NVRTC binding (build/nvrtc.rs), shared rather than copied.
#[path = "../../build/nvrtc.rs"]
#[allow(dead_code)]
mod nvrtc;

/// Running cuobjdump and reading its output, shared with qwen-engine's test of the built binary.
#[path = "common/cuobjdump.rs"]
#[allow(dead_code)]
mod cuobjdump_oracle;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use fatbin_verify::{
    image_bytes, list_images, sha256_hex, Compression, ImageInfo, ImageKind, Target, Variant,
};
use sha2::{Digest, Sha256};

const KERNELS_A: &str = r#"
extern "C" __global__ void add_one(float *x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }
extern "C" __global__ void scale(float *x, float s, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= s; }
"#;
const KERNELS_B: &str = r#"
extern "C" __global__ void square(float *x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= x[i]; }
"#;
const HOST_MAIN: &str = r#"
#include <cstdio>
extern "C" __global__ void add_one(float *x, int n);
int main() { printf("%p\n", (void *)add_one); return 0; }
"#;

struct Toolchain {
    bin: PathBuf,
    lib: PathBuf,
    /// The CUDA 12.9 toolchain's wheels (`.toolchain/cuda-12.9/site/nvidia`).
    cu12: PathBuf,
}

fn toolchain() -> &'static Toolchain {
    static TC: OnceLock<Toolchain> = OnceLock::new();
    TC.get_or_init(|| {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf();
        let home = std::env::var_os("AOT_CUDA_HOME").map(PathBuf::from).unwrap_or_else(|| workspace.join(".toolchain/site/nvidia/cu13"));
        let bin = home.join("bin");
        for tool in ["nvcc", "cuobjdump"] {
            assert!(
                bin.join(tool).is_file(),
                "{} not found: the oracle tests need the pinned CUDA toolchain; run `bash scripts/setup-toolchain.sh` in {} (or set AOT_CUDA_HOME)",
                bin.join(tool).display(),
                workspace.display()
            );
        }
        let cu12 = workspace.join(".toolchain/cuda-12.9/site/nvidia");
        assert!(
            cu12.join("cuda_nvrtc/lib/libnvrtc.so.12").is_file(),
            "{} not found: the oracle tests need the pinned CUDA 12.9 toolchain; run `bash scripts/setup-toolchain.sh` in {}",
            cu12.display(),
            workspace.display()
        );
        Toolchain { lib: home.join("lib"), bin, cu12 }
    })
}

/// The corpus: name -> path of a file nvcc made (plus one made by concatenation).
struct Corpus {
    _dir: tempfile::TempDir,
    files: BTreeMap<&'static str, PathBuf>,
}

fn corpus() -> &'static Corpus {
    static CORPUS: OnceLock<Corpus> = OnceLock::new();
    CORPUS.get_or_init(build_corpus)
}

fn build_corpus() -> Corpus {
    let tc = toolchain();
    let dir = tempfile::tempdir().expect("temp dir");
    let src = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).expect("write source");
        p.display().to_string()
    };
    let (a, b, main) = (
        src("ka.cu", KERNELS_A),
        src("kb.cu", KERNELS_B),
        src("main.cu", HOST_MAIN),
    );
    let lib = format!("-L{}", tc.lib.display());
    let sm80_ptx80 = "-gencode=arch=compute_80,code=[sm_80,compute_80]";
    // Each case: output name and nvcc arguments. Small sources and few targets per call keep
    // the whole corpus to a few seconds per call on a 2-core box.
    let cases: Vec<(&'static str, Vec<String>)> = vec![
        (
            "default.fatbin",
            vec!["-fatbin".into(), sm80_ptx80.into(), a.clone()],
        ),
        (
            "nocompress.fatbin",
            vec![
                "-fatbin".into(),
                "--no-compress".into(),
                sm80_ptx80.into(),
                a.clone(),
            ],
        ),
        (
            "size.fatbin",
            vec![
                "-fatbin".into(),
                "--compress-mode=size".into(),
                sm80_ptx80.into(),
                a.clone(),
            ],
        ),
        (
            "speed.fatbin",
            vec![
                "-fatbin".into(),
                "--compress-mode=speed".into(),
                sm80_ptx80.into(),
                a.clone(),
            ],
        ),
        (
            "debug.fatbin",
            vec![
                "-fatbin".into(),
                "-G".into(),
                "-gencode=arch=compute_90,code=[sm_90,compute_90]".into(),
                a.clone(),
            ],
        ),
        (
            "af.fatbin",
            vec![
                "-fatbin".into(),
                "-gencode=arch=compute_90a,code=sm_90a".into(),
                "-gencode=arch=compute_100f,code=sm_100f".into(),
                a.clone(),
            ],
        ),
        (
            "rdc.fatbin",
            vec![
                "-fatbin".into(),
                "-rdc=true".into(),
                sm80_ptx80.into(),
                a.clone(),
            ],
        ),
        (
            "multi.fatbin",
            vec![
                "-fatbin".into(),
                "-gencode=arch=compute_87,code=sm_87".into(),
                "-gencode=arch=compute_110,code=sm_110".into(),
                "-gencode=arch=compute_120,code=sm_120".into(),
                "-gencode=arch=compute_80,code=compute_80".into(),
                b.clone(),
            ],
        ),
        ("dc.o", vec!["-dc".into(), "-arch=sm_80".into(), b.clone()]),
        (
            "app",
            vec![
                sm80_ptx80.into(),
                lib.clone(),
                a.clone(),
                b.clone(),
                main.clone(),
            ],
        ),
        (
            "libk.so",
            vec![
                "-shared".into(),
                "-Xcompiler".into(),
                "-fPIC".into(),
                "-arch=sm_90".into(),
                lib.clone(),
                a.clone(),
            ],
        ),
        (
            "k.cubin",
            vec!["-cubin".into(), "-arch=sm_90a".into(), a.clone()],
        ),
        (
            "k.ptx",
            vec!["-ptx".into(), "-arch=compute_80".into(), a.clone()],
        ),
    ];
    // Two at a time: the CI box has 2 cores.
    let mut files = BTreeMap::new();
    for pair in cases.chunks(2) {
        let children: Vec<_> = pair
            .iter()
            .map(|(name, args)| {
                let out = dir.path().join(name);
                let child = Command::new(tc.bin.join("nvcc"))
                    .args(args)
                    .arg("-o")
                    .arg(&out)
                    .current_dir(dir.path())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("spawn nvcc");
                (*name, out, child)
            })
            .collect();
        for (name, out, child) in children {
            let result = child.wait_with_output().expect("nvcc runs");
            assert!(
                result.status.success(),
                "nvcc for {name} failed: {}",
                String::from_utf8_lossy(&result.stderr)
            );
            files.insert(name, out);
        }
    }
    build_cuda12_corpus(tc, &a, dir.path(), &mut files);
    // Several containers in one file: two fatbins back to back, the second 8-aligned.
    let mut concat = std::fs::read(&files["default.fatbin"]).expect("read");
    concat.resize(concat.len().div_ceil(8) * 8, 0);
    concat.extend(std::fs::read(&files["af.fatbin"]).expect("read"));
    let concat_path = dir.path().join("concat.fatbin");
    std::fs::write(&concat_path, concat).expect("write");
    files.insert("concat.fatbin", concat_path);
    Corpus { _dir: dir, files }
}

/// CUDA 12.9 images as the build makes them: NVRTC compiles (ELF ABI 7 below sm_100, 8 with a
/// toolkit string from sm_100 on; PTX ISA 8.8), nvcc 13.0's fatbinary packs, plain and compressed.
fn build_cuda12_corpus(
    tc: &Toolchain,
    source: &str,
    dir: &Path,
    files: &mut BTreeMap<&'static str, PathBuf>,
) {
    let nvrtc = nvrtc::Nvrtc::open(&tc.cu12.join("cuda_nvrtc/lib/libnvrtc.so.12"))
        .expect("open NVRTC 12.9");
    let text = std::fs::read_to_string(source).expect("read source");
    let mut images = Vec::new();
    for arch in ["sm_80", "sm_87", "sm_90a", "sm_100", "sm_120", "compute_80"] {
        let options = vec![format!("-arch={arch}"), "-std=c++17".to_string()];
        let bytes = match nvrtc.compile(&text, "ka.cu", &options).expect("NVRTC runs") {
            nvrtc::Output::Image { bytes, .. } => bytes,
            nvrtc::Output::Failed { log } => panic!("NVRTC {arch}: {log}"),
        };
        let ext = if arch.starts_with("sm_") {
            "cubin"
        } else {
            "ptx"
        };
        let path = dir.join(format!("cu12-{arch}.{ext}"));
        std::fs::write(&path, bytes).expect("write image");
        images.push((arch, path));
    }
    let mut pack = |name: &'static str, extra: &[&str]| {
        let out = dir.join(name);
        let mut cmd = Command::new(tc.bin.join("fatbinary"));
        cmd.arg("--64")
            .args(extra)
            .arg(format!("--create={}", out.display()));
        for (arch, path) in &images {
            let (kind, sm) = match arch.strip_prefix("sm_") {
                Some(sm) => ("elf", sm),
                None => ("ptx", arch.trim_start_matches("compute_")),
            };
            cmd.arg(format!(
                "--image3=kind={kind},sm={sm},file={}",
                path.display()
            ));
        }
        let result = cmd.output().expect("run fatbinary");
        assert!(
            result.status.success(),
            "fatbinary {name}: {}",
            String::from_utf8_lossy(&result.stderr)
        );
        files.insert(name, out);
    };
    pack("cu12.fatbin", &["--compress=false"]);
    pack("cu12-zstd.fatbin", &["--compress-all"]);
    files.insert("cu12.cubin", images[2].1.clone());
    files.insert("cu12.ptx", images[5].1.clone());
}

fn cuobjdump_tool() -> PathBuf {
    toolchain().bin.join("cuobjdump")
}

fn cuobjdump(args: &[&str], file: &Path, cwd: &Path) -> String {
    cuobjdump_oracle::stdout(&cuobjdump_tool(), args, file, cwd)
}

/// `cuobjdump -symbols`, unlike `--list-elf`, prints the family suffix (`sm_100f`).
fn symbols_arch(t: Target) -> String {
    let suffix = match t.variant {
        Variant::Baseline => "",
        Variant::ArchSpecific => "a",
        Variant::Family => "f",
    };
    format!("sm_{}{suffix}", t.sm)
}

fn kind_name(kind: ImageKind) -> &'static str {
    match kind {
        ImageKind::Elf => "ELF",
        ImageKind::Ptx => "PTX",
        _ => "OTHER",
    }
}

/// Images of the kinds cuobjdump lists and extracts (cubins and PTX).
fn listed(path: &Path) -> (Vec<u8>, Vec<ImageInfo>) {
    let bytes = std::fs::read(path).expect("read corpus file");
    let images = list_images(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (bytes, images)
}

fn cuobjdump_list(path: &Path) -> Vec<(String, String)> {
    cuobjdump_oracle::parse_list(&cuobjdump(
        &["--list-elf", "--list-ptx"],
        path,
        path.parent().expect("dir"),
    ))
}

/// Our listing as `cuobjdump --list-elf --list-ptx` prints it: sorted `(kind, arch)` pairs.
fn our_list(images: &[ImageInfo]) -> Vec<(String, String)> {
    let mut ours: Vec<(String, String)> = images
        .iter()
        .map(|i| {
            (
                kind_name(i.kind).to_string(),
                cuobjdump_oracle::arch(i.target.expect("every corpus image has a target")),
            )
        })
        .collect();
    ours.sort();
    ours
}

#[test]
fn listing_matches_cuobjdump_list() {
    let mut checked = 0;
    for (name, path) in &corpus().files {
        if name.ends_with(".ptx") {
            continue; // cuobjdump reads no bare PTX ("does not contain device code")
        }
        let (_, images) = listed(path);
        let ours = our_list(&images);
        assert_eq!(
            ours,
            cuobjdump_list(path),
            "{name}: our listing differs from cuobjdump --list-elf --list-ptx"
        );
        assert!(!ours.is_empty(), "{name}: no images");
        checked += ours.len();
    }
    assert!(checked >= 30, "only {checked} images in the corpus");
}

/// One block of `cuobjdump -symbols`: kind, arch, `code version = [a,b]` and STO_ENTRY symbols.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct SymbolBlock {
    kind: String,
    arch: String,
    version: (u32, u32),
    entries: Vec<String>,
}

fn cuobjdump_symbols(path: &Path) -> Vec<SymbolBlock> {
    let text = cuobjdump(&["-symbols"], path, path.parent().expect("dir"));
    let mut blocks: Vec<SymbolBlock> = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("Fatbin elf code") || line.starts_with("Fatbin ptx code") {
            let kind = if line.contains("elf") { "ELF" } else { "PTX" };
            blocks.push(SymbolBlock {
                kind: kind.into(),
                arch: String::new(),
                version: (0, 0),
                entries: Vec::new(),
            });
        } else if let Some(block) = blocks.last_mut() {
            if let Some(arch) = line.strip_prefix("arch = ") {
                block.arch = arch.to_string();
            } else if let Some(v) = line.strip_prefix("code version = [") {
                let (a, b) = v
                    .trim_end_matches(']')
                    .split_once(',')
                    .expect("version pair");
                block.version = (
                    a.trim().parse().expect("major"),
                    b.trim().parse().expect("minor"),
                );
            } else if line.starts_with("STT_FUNC") && line.contains("STO_ENTRY") {
                block.entries.push(
                    line.split_whitespace()
                        .last()
                        .expect("symbol name")
                        .to_string(),
                );
            }
        }
    }
    for b in &mut blocks {
        b.entries.sort();
    }
    blocks.sort();
    blocks
}

#[test]
fn versions_and_entries_match_cuobjdump_symbols() {
    for (name, path) in &corpus().files {
        if name.ends_with(".cubin") || name.ends_with(".ptx") {
            continue; // cuobjdump -symbols reads fatbins and hosts only
        }
        let (_, images) = listed(path);
        let mut ours: Vec<SymbolBlock> = images
            .iter()
            .map(|i| {
                let target = i.target.expect("target");
                let (kind, version, mut entries) = match i.kind {
                    // cuobjdump prints the fatbin header's (major, minor): (1, ABI) for cubins.
                    ImageKind::Elf => ("ELF", (1, i.elf_abi.expect("abi")), i.kernels.clone()),
                    // cuobjdump lists no PTX entries in -symbols.
                    _ => ("PTX", i.ptx_version.expect("ptx version"), Vec::new()),
                };
                entries.sort();
                SymbolBlock {
                    kind: kind.into(),
                    arch: symbols_arch(target),
                    version,
                    entries,
                }
            })
            .collect();
        ours.sort();
        assert_eq!(
            ours,
            cuobjdump_symbols(path),
            "{name}: differs from cuobjdump -symbols"
        );
    }
}

fn sha_of(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

fn cuobjdump_extracted(path: &Path) -> BTreeMap<&'static str, Vec<String>> {
    cuobjdump_oracle::extracted(&cuobjdump_tool(), path)
}

#[test]
fn extracted_hashes_match_cuobjdump_extract() {
    for (name, path) in &corpus().files {
        if name.ends_with(".cubin") || name.ends_with(".ptx") {
            continue;
        }
        let (bytes, images) = listed(path);
        let mut ours: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
        for info in &images {
            let data = image_bytes(&bytes, info).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(data.len(), info.size, "{name}: image_bytes length");
            assert_eq!(
                sha_of(&data),
                sha256_hex(&info.sha256),
                "{name}: listed sha256 is not that of image_bytes"
            );
            if let Some(range) = &info.raw_range {
                assert_eq!(
                    &bytes[range.clone()],
                    &data[..],
                    "{name}: raw_range does not slice the image"
                );
            }
            ours.entry(kind_name(info.kind))
                .or_default()
                .push(sha256_hex(&info.sha256));
        }
        ours.values_mut().for_each(|v| v.sort());
        assert_eq!(
            ours,
            cuobjdump_extracted(path),
            "{name}: extracted sha256 differ from cuobjdump -xelf/-xptx"
        );
    }
}

fn only(images: &[ImageInfo], kind: ImageKind) -> Vec<&ImageInfo> {
    images.iter().filter(|i| i.kind == kind).collect()
}

#[test]
fn compression_modes_are_reported() {
    let modes = |name: &str| -> Vec<(ImageKind, Compression)> {
        let (_, images) = listed(&corpus().files[name]);
        let mut v: Vec<_> = images.iter().map(|i| (i.kind, i.compression)).collect();
        v.sort_by_key(|(k, _)| kind_name(*k));
        v
    };
    use Compression::*;
    use ImageKind::*;
    assert_eq!(modes("default.fatbin"), [(Elf, None), (Ptx, Zstd)]);
    assert_eq!(modes("nocompress.fatbin"), [(Elf, None), (Ptx, None)]);
    assert_eq!(modes("size.fatbin"), [(Elf, Zstd), (Ptx, Zstd)]);
    assert_eq!(modes("speed.fatbin"), [(Elf, None), (Ptx, Lz4)]);
}

#[test]
fn targets_flags_and_metadata_are_exact() {
    let files = &corpus().files;
    let (_, af) = listed(&files["af.fatbin"]);
    let targets: Vec<String> = af
        .iter()
        .map(|i| i.target.expect("target").to_string())
        .collect();
    assert_eq!(targets, ["sm_90a", "sm_100f"]);
    for i in &af {
        assert_eq!(i.elf_abi, Some(8));
        assert_eq!(i.virtual_sm, Some(i.target.expect("target").sm));
        assert!(
            i.toolkit
                .as_deref()
                .is_some_and(|t| t.contains("release 13.0")),
            "{:?}",
            i.toolkit
        );
        assert_eq!(
            i.kernels
                .iter()
                .map(String::as_str)
                .collect::<std::collections::BTreeSet<_>>(),
            ["add_one", "scale"].into()
        );
    }

    let (_, multi) = listed(&files["multi.fatbin"]);
    let mut targets: Vec<String> = multi
        .iter()
        .map(|i| i.target.expect("target").to_string())
        .collect();
    targets.sort();
    assert_eq!(targets, ["compute_80", "sm_110", "sm_120", "sm_87"]);
    let ptx = only(&multi, ImageKind::Ptx);
    assert_eq!(ptx.len(), 1);
    assert_eq!(ptx[0].ptx_version, Some((9, 0)));
    assert_eq!(ptx[0].kernels, ["square"]);

    let (_, debug) = listed(&files["debug.fatbin"]);
    assert!(
        debug.iter().all(|i| i.debug),
        "-G images must carry the debug flag"
    );
    let (_, default) = listed(&files["default.fatbin"]);
    assert!(default.iter().all(|i| !i.debug));

    // Bare files: the cubin knows `a` from .nv.compat, the PTX its ISA and target.
    let (_, cubin) = listed(&files["k.cubin"]);
    assert_eq!(cubin.len(), 1);
    assert_eq!(cubin[0].target, Some("sm_90a".parse().expect("target")));
    assert_eq!(cubin[0].source.container_offset, None);
    let (_, ptx) = listed(&files["k.ptx"]);
    assert_eq!(
        (ptx[0].target, ptx[0].ptx_version),
        (Some("compute_80".parse().expect("target")), Some((9, 0)))
    );
    assert_eq!(ptx[0].kernels, ["add_one", "scale"]);

    // The executable links two translation units: two containers, all three kernels.
    let (_, app) = listed(&files["app"]);
    let containers: std::collections::BTreeSet<_> =
        app.iter().map(|i| i.source.container_offset).collect();
    assert!(
        containers.len() >= 2,
        "app: expected a container per translation unit, got {containers:?}"
    );
    let mut kernels: Vec<&str> = only(&app, ImageKind::Elf)
        .iter()
        .flat_map(|i| i.kernels.iter().map(String::as_str))
        .collect();
    kernels.sort();
    assert_eq!(kernels, ["add_one", "scale", "square"]);
    assert!(
        app.iter()
            .all(|i| i.source.section.as_deref() == Some(".nv_fatbin")),
        "{:?}",
        app.iter().map(|i| &i.source.section).collect::<Vec<_>>()
    );

    let (_, concat) = listed(&files["concat.fatbin"]);
    assert_eq!(concat.len(), 4);
    assert_eq!(concat[0].source.container_offset, Some(0));
    assert!(concat[3]
        .source
        .container_offset
        .is_some_and(|o| o > 0 && o % 8 == 0));
}

#[test]
fn cuda12_images_say_which_toolchain_made_them() {
    let files = &corpus().files;
    let (_, images) = listed(&files["cu12.fatbin"]);
    let mut seen = Vec::new();
    for i in &images {
        let target = i.target.expect("target");
        let cuda = i.cuda.map(|c| c.to_string());
        seen.push(format!(
            "{target} {} {}",
            i.elf_abi
                .map(|a| format!("abi{a}"))
                .or(i.ptx_version.map(|(a, b)| format!("ptx{a}.{b}")))
                .unwrap_or_default(),
            cuda.unwrap_or_default()
        ));
    }
    // Below sm_100 ptxas 12.9 writes ELF ABI 7 and no toolkit note; from sm_100 on ABI 8 with
    // its toolkit string. fatbinary blanks the PTX comment that names the release.
    assert_eq!(
        seen,
        [
            "sm_80 abi7 12.x",
            "sm_87 abi7 12.x",
            "sm_90a abi7 12.x",
            "sm_100 abi8 12.9",
            "sm_120 abi8 12.9",
            "compute_80 ptx8.8 12.x",
        ]
    );
    // Compressed, the same images and hashes.
    let (_, zstd) = listed(&files["cu12-zstd.fatbin"]);
    assert!(zstd.iter().all(|i| i.compression == Compression::Zstd));
    let hashes = |v: &[ImageInfo]| v.iter().map(|i| i.sha256).collect::<Vec<_>>();
    assert_eq!(hashes(&zstd), hashes(&images));
    // A bare NVRTC PTX file still names its release in its header comment.
    let (_, ptx) = listed(&files["cu12.ptx"]);
    assert_eq!(
        ptx[0].toolkit.as_deref(),
        Some("Cuda compilation tools, release 12.9, V12.9.86")
    );
    assert_eq!(ptx[0].cuda, Some(fatbin_verify::CudaRelease::new(12, 9)));
    let (_, cubin) = listed(&files["cu12.cubin"]);
    assert_eq!(cubin[0].target, Some("sm_90a".parse().expect("target")));
    assert_eq!(cubin[0].elf_abi, Some(7));
}

#[test]
fn cli_extract_matches_cuobjdump() {
    let path = &corpus().files["app"];
    let out = tempfile::tempdir().expect("temp dir");
    let run = Command::new(env!("CARGO_BIN_EXE_fatbin-verify"))
        .arg("extract")
        .arg("--out")
        .arg(out.path())
        .arg(path)
        .output()
        .expect("run CLI");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let ours = cuobjdump_oracle::hashes_by_kind(out.path());
    assert_eq!(ours, cuobjdump_extracted(path));

    let list = Command::new(env!("CARGO_BIN_EXE_fatbin-verify"))
        .args(["list", "--json"])
        .arg(path)
        .output()
        .expect("run CLI");
    assert!(list.status.success());
    let json: serde_json::Value = serde_json::from_slice(&list.stdout).expect("JSON");
    let images = json[0]["images"].as_array().expect("images array");
    assert_eq!(images.len(), ours.values().map(Vec::len).sum::<usize>());
    assert_eq!(images[0]["sha256"].as_str().map(str::len), Some(64));
}

#[test]
fn cli_verify_passes_then_names_a_flipped_byte() {
    let fatbin = std::fs::read(&corpus().files["default.fatbin"]).expect("read");
    let images = list_images(&fatbin).expect("list");
    let dir = tempfile::tempdir().expect("temp dir");
    let manifest = dir.path().join("aot-manifest.toml");
    std::fs::write(
        &manifest,
        "[toolchain]\ncuda = \"13.0\"\nnvcc_version = \"13.0.88\"\n[targets]\nsass = [\"sm_80\"]\nptx = \"compute_80\"\n\
         [[module]]\nname = \"ka\"\nkind = \"cuda\"\nsource = \"ka.cu\"\nentries = [\"add_one\", \"scale\"]\n",
    )
    .expect("write manifest");
    let cu13 = fatbin_verify::CudaRelease::new(13, 0);
    let lock = fatbin_verify::lock::Lock {
        format: fatbin_verify::lock::LOCK_FORMAT,
        toolchains: [(cu13, "13.0.88".to_string())].into(),
        modules: vec![fatbin_verify::lock::LockedModule {
            name: "ka".into(),
            source_sha256: "0".repeat(64),
            images: images
                .iter()
                .map(|i| fatbin_verify::lock::LockedImage {
                    toolchain: cu13,
                    target: i.target.expect("target"),
                    sha256: sha256_hex(&i.sha256),
                    size: i.size as u64,
                })
                .collect(),
        }],
    };
    let lock_path = dir.path().join("aot-manifest.lock");
    std::fs::write(&lock_path, lock.to_toml_string()).expect("write lock");
    let verify = |file: &Path| {
        Command::new(env!("CARGO_BIN_EXE_fatbin-verify"))
            .arg("verify")
            .arg("--manifest")
            .arg(&manifest)
            .arg("--lock")
            .arg(&lock_path)
            .arg(file)
            .output()
            .expect("run CLI")
    };
    let good = verify(&corpus().files["default.fatbin"]);
    assert_eq!(
        good.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&good.stdout)
    );

    // Flip one byte in the middle of the uncompressed sm_80 cubin.
    let cubin = images
        .iter()
        .find(|i| i.kind == ImageKind::Elf)
        .expect("cubin");
    let range = cubin.raw_range.clone().expect("uncompressed cubin");
    let mut flipped = fatbin.clone();
    flipped[range.start + range.len() / 2] ^= 0x01;
    let flipped_path = dir.path().join("flipped.fatbin");
    std::fs::write(&flipped_path, &flipped).expect("write");
    let bad = verify(&flipped_path);
    let stdout = String::from_utf8_lossy(&bad.stdout);
    assert_eq!(bad.status.code(), Some(1), "{stdout}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(
        stdout.starts_with("ka sm_80 (CUDA 13.0): sha256 "),
        "{stdout}"
    );

    // A truncated file is unparsable: exit 2, naming the file.
    let cut_path = dir.path().join("cut.fatbin");
    std::fs::write(&cut_path, &fatbin[..100]).expect("write");
    let cut = verify(&cut_path);
    assert_eq!(cut.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&cut.stderr).contains("cut.fatbin"));
}

/// A host executable, built by the C compiler (`cc`, or `CC`), whose `.nv_fatbin` section holds
/// exactly `data`: a fatbin section laid out by hand.
fn host_with_fatbin_section(dir: &Path, name: &str, data: &[u8]) -> PathBuf {
    let bytes: Vec<String> = data.iter().map(u8::to_string).collect();
    let source = format!(
        "#include <stdio.h>\n\
         __attribute__((section(\".nv_fatbin\"), aligned(8), used))\n\
         static const unsigned char blob[{}] = {{{}}};\n\
         int main(void) {{ const unsigned char *volatile p = blob; printf(\"%d\\n\", p[0]); return 0; }}\n",
        data.len(),
        bytes.join(",")
    );
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, source).expect("write C source");
    let exe = dir.join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .arg(&c)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}` (set CC): {e}"));
    assert!(
        out.status.success(),
        "{cc} {name}.c: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

#[test]
fn fatbin_sections_are_read_as_cuobjdump_reads_them() {
    let a = std::fs::read(&corpus().files["nocompress.fatbin"]).expect("read");
    let b = std::fs::read(&corpus().files["af.fatbin"]).expect("read");
    assert_eq!((a.len() % 8, b.len() % 8), (0, 0));
    let dir = tempfile::tempdir().expect("temp dir");
    // Words of zeros before, between and after containers are padding to both.
    let padded = host_with_fatbin_section(
        dir.path(),
        "padded",
        &[vec![0; 8], a.clone(), vec![0; 16], b.clone(), vec![0; 8]].concat(),
    );
    let (_, images) = listed(&padded);
    assert_eq!(images.len(), 4);
    assert!(images
        .iter()
        .all(|i| i.source.section.as_deref() == Some(".nv_fatbin")));
    assert_eq!(our_list(&images), cuobjdump_list(&padded));
    // Anything else between containers, or a container off the 8-byte grid: cuobjdump stops
    // with "Invalid fatbin header", and fatbin-verify with an error naming the section.
    for (name, gap) in [("garbage", vec![0x11; 8]), ("off-grid", vec![0; 4])] {
        let exe = host_with_fatbin_section(dir.path(), name, &[a.clone(), gap, b.clone()].concat());
        let out = cuobjdump_oracle::output(
            &cuobjdump_tool(),
            &["--list-elf", "--list-ptx"],
            &exe,
            dir.path(),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("Invalid fatbin header"),
            "{name}: cuobjdump accepted it: {stderr}"
        );
        let bytes = std::fs::read(&exe).expect("read");
        match list_images(&bytes) {
            Err(fatbin_verify::Error::Malformed { what, detail, .. }) => {
                assert_eq!(what, "fatbin section", "{name}: {detail}");
                assert!(detail.contains("section `.nv_fatbin`"), "{name}: {detail}");
            }
            other => panic!("{name}: expected an error naming .nv_fatbin, got {other:?}"),
        }
    }
}
