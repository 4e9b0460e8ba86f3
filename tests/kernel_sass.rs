//! The machine code the crate ships, read back with NVIDIA's `nvdisasm` (a test oracle from PyPI,
//! which `bash scripts/setup-toolchain.sh` installs beside the pinned nvcc): every cubin of every
//! CUDA module, for every target and toolchain, Thor's sm_110 included. Without the oracle these
//! tests fail, never skip.
//!
//! The rule: no CUDA kernel rounds through the conversion unit, `F2F.BF16.F32`. nvcc makes it of
//! cuda_bf16.h's widening (`cvt.f32.bf16`, which the header uses for sm_90 and later) after a
//! rounding to bf16, and on the H200 builds with it ran the decode step 1.3% slower at eight rows
//! (qkv 14.0 -> 13.4 us) than with the ALU form that `aot::to_f32` compiles to (README.md,
//! "Results on the H200"). tests/kernel_sources.rs keeps the header's conversions out of the
//! sources; this test checks what the compilers made of them, so a new path to the slow form
//! shows here too.

use std::path::{Path, PathBuf};
use std::process::Command;

use aot_kernels::registry::{self, ImageFormat, ModuleKind};

const SLOW: &str = "F2F.BF16.F32";

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `name` (nvcc, nvdisasm) in the pinned toolchain's bin folder (`AOT_CUDA_HOME` as the oracle
/// tests read it); missing, the test fails with the command that installs it.
fn tool(name: &str) -> PathBuf {
    let home = std::env::var_os("AOT_CUDA_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".toolchain/site/nvidia/cu13"));
    let tool = home.join("bin").join(name);
    assert!(
        tool.is_file(),
        "{} not found: these tests need the pinned toolchain and NVIDIA's disassembler from \
         aot-manifest.toml's oracle_packages; run `bash scripts/setup-toolchain.sh` in {} (or set \
         AOT_CUDA_HOME)",
        tool.display(),
        workspace().display()
    );
    tool
}

/// Runs `cmd` to success and returns its stdout; a failure names `what` and shows stderr.
fn run(cmd: &mut Command, what: &str) -> Vec<u8> {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The SASS text of the cubin at `path`.
fn disassemble(nvdisasm: &Path, path: &Path) -> String {
    let sass = run(
        Command::new(nvdisasm).arg(path),
        &format!("nvdisasm {}", path.display()),
    );
    String::from_utf8(sass).expect("nvdisasm writes text")
}

/// Each function's count of `op` in a disassembly, in order, as (function, count), for those that
/// have any.
fn uses_of(sass: &str, op: &str) -> Vec<(String, usize)> {
    let mut found: Vec<(String, usize)> = Vec::new();
    let mut function = String::from("(before any function)");
    for line in sass.lines() {
        if let Some(name) = line.trim().strip_prefix(".text.") {
            function = name.trim_end_matches(':').to_string();
        } else if line.contains(op) {
            match found.last_mut() {
                Some((f, n)) if *f == function => *n += 1,
                _ => found.push((function.clone(), 1)),
            }
        }
    }
    found
}

#[test]
fn no_cuda_kernel_rounds_through_the_conversion_unit() {
    let nvdisasm = tool("nvdisasm");
    let dir = tempfile::tempdir().unwrap();
    let cuda: Vec<_> = registry::modules()
        .iter()
        .filter(|m| m.kind == ModuleKind::Cuda)
        .collect();
    let jobs: Vec<_> = cuda
        .iter()
        .flat_map(|m| m.images.iter().map(move |i| (m, i)))
        .filter(|(_, i)| i.format == ImageFormat::Cubin)
        .collect();
    // Every CUDA module has SASS for both toolchains; a build cut by AOT_TARGETS may hold only one
    // image for some of them.
    let least = if registry::build_info().target_filter.is_none() {
        2 * cuda.len()
    } else {
        1
    };
    assert!(
        !cuda.is_empty() && jobs.len() >= least,
        "only {} cubins of {} CUDA modules in the build",
        jobs.len(),
        cuda.len()
    );
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().min(8));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((module, image)) = jobs.get(k) else {
                    break;
                };
                let name = format!("{}.{}.{}.cubin", module.name, image.toolchain, image.target);
                let path = dir.path().join(&name);
                std::fs::write(&path, image.bytes()).unwrap();
                let sass = disassemble(&nvdisasm, &path);
                // The disassembly is of the module: every entry point is in it.
                for entry in module.entries {
                    assert!(
                        sass.contains(&format!(".text.{entry}:")),
                        "{name}: nvdisasm shows no function {entry}"
                    );
                }
                let uses = uses_of(&sass, SLOW);
                results.lock().unwrap().push((name, uses));
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort();
    assert_eq!(results.len(), jobs.len());
    let bad: Vec<String> = results
        .iter()
        .filter(|(_, uses)| !uses.is_empty())
        .map(|(name, uses)| format!("{name}: {uses:?}"))
        .collect();
    eprintln!(
        "{} cubins disassembled, {} with {SLOW}",
        results.len(),
        bad.len()
    );
    assert!(
        bad.is_empty(),
        "{SLOW} (bf16 rounding through the conversion unit) in:\n  {}\nWiden bf16 with \
         aot::to_f32 / to_f32x2 (kernels/include/aot_common.cuh), not cuda_bf16.h's conversions",
        bad.join("\n  ")
    );
}

/// The rule's reason, and proof that the check sees it: nvcc 13.0 builds `F2F.BF16.F32` from the
/// header's widening after a rounding for sm_90, and not from `aot::to_f32`.
#[test]
fn the_header_widening_compiles_to_the_conversion_unit_and_ours_does_not() {
    let (nvcc, nvdisasm) = (tool("nvcc"), tool("nvdisasm"));
    let dir = tempfile::tempdir().unwrap();
    let kernel = |widen: &str| {
        format!(
            "#include \"aot_common.cuh\"\n\
             extern \"C\" __global__ void k(const float* x, float* y) {{\n\
                 const float v = x[threadIdx.x];\n\
                 y[threadIdx.x] = {widen}(__float2bfloat16_rn(v)) * v;\n\
             }}\n"
        )
    };
    let mut counts = Vec::new();
    for (name, widen) in [("header", "__bfloat162float"), ("ours", "aot::to_f32")] {
        let src = dir.path().join(format!("{name}.cu"));
        let cubin = dir.path().join(format!("{name}.cubin"));
        std::fs::write(&src, kernel(widen)).unwrap();
        run(
            Command::new(&nvcc)
                .args(["-cubin", "-arch=sm_90", "-O3", "-std=c++17", "-I"])
                .arg(workspace().join("kernels/include"))
                .arg(&src)
                .arg("-o")
                .arg(&cubin),
            &format!("nvcc {name}"),
        );
        let sass = disassemble(&nvdisasm, &cubin);
        assert!(sass.contains(".text.k:"), "{name}: no kernel in the SASS");
        counts.push(uses_of(&sass, SLOW));
    }
    assert_eq!(
        counts[0],
        vec![("k".to_string(), 1)],
        "the header's widening"
    );
    assert_eq!(counts[1], vec![], "aot::to_f32");
}
