//! Every kernel on a real GPU, under both dispatch paths, against its CPU reference.
//!
//! These tests need a CUDA GPU, so they are `#[ignore]`d: `cargo test` without a GPU lists them as
//! ignored, never as passed. On the GPU machine run them with `--ignored` (the GPU bundle's run.sh
//! does); there a missing device is a failure.
//!
//! For each op: fresh random inputs (the seed is printed), the kernel loaded from the exact SASS
//! (`auto`) and from the PTX fallback (`ptx-only`, JIT), outputs compared bitwise between the two
//! paths and, in bf16 ulps, with the CPU reference. The same for the CUDA 12 images (forced, as
//! a 12.x driver would get them): SASS and PTX JIT, bitwise equal to the CUDA 13 images' outputs.

use aot_kernels::dispatch::{
    load_available, open_device, LoadedKernels, ModuleSource, OpenDevice, Policy, ToolchainChoice,
};
use aot_kernels::ops::activation::{silu_and_mul, silu_and_mul_reference};
use aot_kernels::ops::compare::{compare, UlpReport};
use aot_kernels::ops::rmsnorm::{
    fused_add_rmsnorm, fused_add_rmsnorm_reference, rmsnorm, rmsnorm_reference, RmsNormParams,
};
use aot_kernels::ops::rotary::{cos_sin_cache, rotary_neox, rotary_neox_reference, RotaryParams};
use aot_kernels::registry::ModuleKind;
use half::bf16;
use rand::{Rng, SeedableRng};

/// The reference rounds from float64 where the kernel rounds from fp32 (and may fuse a multiply-add):
/// a value that lands next to a bf16 rounding boundary can round the other way, and one such flip
/// in an intermediate (the normalised value, the activation) moves the final product by up to two ulps.
const MAX_ULPS_VS_REFERENCE: u32 = 2;

fn device() -> OpenDevice {
    open_device(0)
        .unwrap_or_else(|e| panic!("this GPU test needs a CUDA device and found none: {e}"))
}

fn random_bf16(rng: &mut impl Rng, n: usize, scale: f32) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(rng.gen_range(-scale..scale)))
        .collect()
}

/// One op's output under one loaded kernel set.
type Outputs = Vec<(String, Vec<bf16>)>;

struct Inputs {
    seed: u64,
}

fn run_ops(k: &LoadedKernels, inputs: &Inputs) -> (Outputs, Outputs) {
    let stream = k.stream();
    let mut rng = rand::rngs::StdRng::seed_from_u64(inputs.seed);
    let mut gpu: Outputs = Vec::new();
    let mut cpu: Outputs = Vec::new();

    // RMSNorm: Qwen3-4B layer norm (8 x 2560), per-head q_norm (8*32 x 128), and the zero-centred
    // Qwen3.5 variant with the fused residual add (8 x 2048).
    for (name, rows, hidden, offset) in [
        ("rmsnorm 8x2560", 8, 2560, 0.0f32),
        ("rmsnorm q_norm 256x128", 256, 128, 0.0),
    ] {
        let p = RmsNormParams {
            rows,
            hidden,
            eps: 1e-6,
            weight_offset: offset,
        };
        let x = random_bf16(&mut rng, rows * hidden, 3.0);
        let w = random_bf16(&mut rng, hidden, 1.5);
        let (dx, dw) = (
            stream.clone_htod(&x).unwrap(),
            stream.clone_htod(&w).unwrap(),
        );
        let mut dout = stream.alloc_zeros::<bf16>(rows * hidden).unwrap();
        rmsnorm(k, &mut dout, &dx, &dw, &p).unwrap();
        gpu.push((name.into(), stream.clone_dtoh(&dout).unwrap()));
        cpu.push((name.into(), rmsnorm_reference(&x, &w, &p)));
    }
    for (name, rows, hidden, offset) in [
        ("fused_add_rmsnorm 8x2560", 8, 2560, 0.0f32),
        ("fused_add_rmsnorm (1+w) 8x2048", 8, 2048, 1.0),
    ] {
        let p = RmsNormParams {
            rows,
            hidden,
            eps: 1e-6,
            weight_offset: offset,
        };
        let x = random_bf16(&mut rng, rows * hidden, 2.0);
        let r = random_bf16(&mut rng, rows * hidden, 2.0);
        let w = random_bf16(&mut rng, hidden, 0.5);
        let (mut dx, mut dr, dw) = (
            stream.clone_htod(&x).unwrap(),
            stream.clone_htod(&r).unwrap(),
            stream.clone_htod(&w).unwrap(),
        );
        fused_add_rmsnorm(k, &mut dx, &mut dr, &dw, &p).unwrap();
        let (want_x, want_r) = fused_add_rmsnorm_reference(&x, &r, &w, &p);
        gpu.push((format!("{name} out"), stream.clone_dtoh(&dx).unwrap()));
        gpu.push((format!("{name} residual"), stream.clone_dtoh(&dr).unwrap()));
        cpu.push((format!("{name} out"), want_x));
        cpu.push((format!("{name} residual"), want_r));
    }

    // Rotary: Qwen3-4B (32/8 heads of 128, full rotation) and Qwen3.5 attention (16/2 heads of 256, 64 rotated).
    for (name, p, theta) in [
        (
            "rotary qwen3 8 tokens",
            RotaryParams {
                tokens: 8,
                q_heads: 32,
                kv_heads: 8,
                head_dim: 128,
                rot_dim: 128,
            },
            1e6,
        ),
        (
            "rotary qwen3.5 partial 8 tokens",
            RotaryParams {
                tokens: 8,
                q_heads: 16,
                kv_heads: 2,
                head_dim: 256,
                rot_dim: 64,
            },
            1e7,
        ),
    ] {
        let max_position = 4096;
        let cache = cos_sin_cache(max_position, p.rot_dim, theta);
        let positions: Vec<i32> = (0..p.tokens)
            .map(|_| rng.gen_range(0..max_position as i32))
            .collect();
        let q = random_bf16(&mut rng, p.tokens * p.q_heads * p.head_dim, 2.0);
        let kk = random_bf16(&mut rng, p.tokens * p.kv_heads * p.head_dim, 2.0);
        let (mut dq, mut dk) = (
            stream.clone_htod(&q).unwrap(),
            stream.clone_htod(&kk).unwrap(),
        );
        let (dpos, dcache) = (
            stream.clone_htod(&positions).unwrap(),
            stream.clone_htod(&cache).unwrap(),
        );
        rotary_neox(k, &mut dq, &mut dk, &dpos, &dcache, max_position, &p).unwrap();
        let (mut wq, mut wk) = (q.clone(), kk.clone());
        rotary_neox_reference(&mut wq, &mut wk, &positions, &cache, &p);
        gpu.push((format!("{name} q"), stream.clone_dtoh(&dq).unwrap()));
        gpu.push((format!("{name} k"), stream.clone_dtoh(&dk).unwrap()));
        cpu.push((format!("{name} q"), wq));
        cpu.push((format!("{name} k"), wk));
    }

    // SiLU-and-mul: Qwen3-4B MLP (8 x 9728, vector path) and an odd width (scalar path).
    for (name, rows, d) in [
        ("silu_and_mul 8x9728", 8, 9728),
        ("silu_and_mul 3x1001", 3, 1001),
    ] {
        let input = random_bf16(&mut rng, rows * 2 * d, 6.0);
        let dinput = stream.clone_htod(&input).unwrap();
        let mut dout = stream.alloc_zeros::<bf16>(rows * d).unwrap();
        silu_and_mul(k, &mut dout, &dinput, rows, d).unwrap();
        gpu.push((name.into(), stream.clone_dtoh(&dout).unwrap()));
        cpu.push((name.into(), silu_and_mul_reference(&input, rows, d)));
    }
    stream.synchronize().unwrap();
    (gpu, cpu)
}

fn check_against_reference(path: &str, gpu: &Outputs, cpu: &Outputs) {
    for ((name, got), (_, want)) in gpu.iter().zip(cpu) {
        let r: UlpReport = compare(got, want);
        eprintln!("[{path}] {name}: vs CPU reference: {r}");
        assert!(
            got.iter().any(|v| v.to_f32() != 0.0),
            "{name}: the kernel wrote nothing"
        );
        assert!(r.max_ulps <= MAX_ULPS_VS_REFERENCE, "[{path}] {name}: {r}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_every_kernel_matches_its_reference_and_sass_equals_ptx() {
    let d = device();
    let seed: u64 = rand::random();
    eprintln!("device \"{}\": {}; input seed {seed}", d.name, d.spec);
    let inputs = Inputs { seed };

    let sass = load_available(&d, Policy::Auto, &ModuleSource::registry()).unwrap();
    let ptx = load_available(&d, Policy::PtxOnly, &ModuleSource::registry()).unwrap();
    eprintln!("{}", sass.report().to_table());
    eprintln!("{}", ptx.report().to_table());
    assert!(
        sass.report().modules.iter().all(|m| !m.jit),
        "auto must load SASS on this GPU"
    );
    assert!(
        ptx.report()
            .modules
            .iter()
            .all(|m| m.jit && m.target.virtual_arch),
        "ptx-only must JIT PTX"
    );

    let (gpu_sass, cpu) = run_ops(&sass, &inputs);
    let (gpu_ptx, _) = run_ops(&ptx, &inputs);
    check_against_reference("sass", &gpu_sass, &cpu);
    check_against_reference("ptx", &gpu_ptx, &cpu);
    for ((name, a), (_, b)) in gpu_sass.iter().zip(&gpu_ptx) {
        let r = compare(a, b);
        eprintln!("{name}: SASS vs PTX JIT: {r}");
        assert!(r.bitwise_equal(), "{name}: SASS and PTX paths differ: {r}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_cuda12_images_compute_what_cuda13_images_and_the_reference_compute() {
    let d = device();
    let seed: u64 = rand::random();
    eprintln!("device \"{}\": {}; input seed {seed}", d.name, d.spec);
    let inputs = Inputs { seed };

    // The CUDA modules with one toolchain's images (the Triton modules have no CUDA 12 images).
    let only = |major| -> Vec<ModuleSource> {
        ModuleSource::registry_of_kind(ModuleKind::Cuda)
            .into_iter()
            .map(|m| m.with_toolchains(ToolchainChoice::Major(major)))
            .collect()
    };
    let cu13 = load_available(&d, Policy::Auto, &only(13)).unwrap();
    let cu12 = only(12);
    let cu12_sass = load_available(&d, Policy::Auto, &cu12).unwrap();
    let cu12_ptx = load_available(&d, Policy::PtxOnly, &cu12).unwrap();
    for k in [&cu13, &cu12_sass, &cu12_ptx] {
        eprintln!("{}", k.report().to_table());
    }
    let majors = |k: &LoadedKernels| -> Vec<u32> {
        k.report()
            .modules
            .iter()
            .map(|m| m.toolchain.major)
            .collect()
    };
    assert!(majors(&cu13).iter().all(|&m| m == 13));
    assert!(majors(&cu12_sass).iter().all(|&m| m == 12));
    assert!(majors(&cu12_ptx).iter().all(|&m| m == 12));
    assert!(
        cu12_sass.report().modules.iter().all(|m| !m.jit),
        "CUDA 12 SASS must load on this GPU without a JIT"
    );
    assert!(cu12_ptx.report().modules.iter().all(|m| m.jit));

    let (gpu13, cpu) = run_ops(&cu13, &inputs);
    let (gpu12, _) = run_ops(&cu12_sass, &inputs);
    let (gpu12_ptx, _) = run_ops(&cu12_ptx, &inputs);
    check_against_reference("cuda13 sass", &gpu13, &cpu);
    check_against_reference("cuda12 sass", &gpu12, &cpu);
    check_against_reference("cuda12 ptx", &gpu12_ptx, &cpu);
    for (other, outputs) in [("cuda12 sass", &gpu12), ("cuda12 ptx", &gpu12_ptx)] {
        for ((name, a), (_, b)) in gpu13.iter().zip(outputs) {
            let r = compare(a, b);
            eprintln!("{name}: cuda13 SASS vs {other}: {r}");
            assert!(
                r.bitwise_equal(),
                "{name}: CUDA 13 SASS and {other} differ: {r}"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_launchers_refuse_bad_shapes_without_launching() {
    let d = device();
    let k = load_available(&d, Policy::Auto, &ModuleSource::registry()).unwrap();
    let stream = k.stream();
    let small = stream.alloc_zeros::<bf16>(10).unwrap();
    let mut out = stream.alloc_zeros::<bf16>(10).unwrap();
    let p = RmsNormParams {
        rows: 2,
        hidden: 64,
        eps: 1e-6,
        weight_offset: 0.0,
    };
    let err = rmsnorm(&k, &mut out, &small, &small, &p)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("rmsnorm: `out` holds 10 elements, the shape needs 128"),
        "{err}"
    );
    let err = silu_and_mul(&k, &mut out, &small, 0, 8)
        .unwrap_err()
        .to_string();
    assert!(err.contains("silu_and_mul: rows 0"), "{err}");
}
