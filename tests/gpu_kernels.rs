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

mod gpu_common;

use std::sync::Arc;

use aot_kernels::device::CudaContext;
use aot_kernels::dispatch::{
    load_available, open_context, DispatchError, LoadedKernels, ModuleSource, OpenDevice, Policy,
    ToolchainChoice,
};
use aot_kernels::ops::activation::{silu_and_mul, silu_and_mul_reference};
use aot_kernels::ops::compare::{compare, UlpReport};
use aot_kernels::ops::output_gate::{sigmoid_gate_mul, sigmoid_gate_reference};
use aot_kernels::ops::rmsnorm::{
    fused_add_rmsnorm, fused_add_rmsnorm_reference, rmsnorm, rmsnorm_reference, RmsNormParams,
};
use aot_kernels::ops::rotary::{cos_sin_cache, rotary_neox, rotary_neox_reference, RotaryParams};
use aot_kernels::ops::{dev, dev_mut};
use aot_kernels::registry::ModuleKind;
use gpu_common::{device, load, load_both_paths, random_bf16, test_seed};
use half::bf16;
use rand::{Rng, SeedableRng};

/// The reference rounds from float64 where the kernel rounds from fp32 (and may fuse a multiply-add):
/// a value that lands next to a bf16 rounding boundary can round the other way, and one such flip
/// in an intermediate (the normalised value, the activation) moves the final product by up to two ulps.
const MAX_ULPS_VS_REFERENCE: u32 = 2;

/// One op's output under one loaded kernel set.
type Outputs = Vec<(String, Vec<bf16>)>;

struct Inputs {
    seed: u64,
}

fn run_ops(kernels: &LoadedKernels, inputs: &Inputs) -> (Outputs, Outputs) {
    let stream = kernels.stream();
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
        rmsnorm(kernels, &mut dout, &dx, &dw, &p).unwrap();
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
        fused_add_rmsnorm(kernels, &mut dx, &mut dr, &dw, &p).unwrap();
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
        rotary_neox(kernels, &mut dq, &mut dk, &dpos, &dcache, max_position, &p).unwrap();
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
        silu_and_mul(kernels, &mut dout, &dinput, rows, d).unwrap();
        gpu.push((name.into(), stream.clone_dtoh(&dout).unwrap()));
        cpu.push((name.into(), silu_and_mul_reference(&input, rows, d)));
    }

    // The output gate of gated attention, in place, with the gate a column range of a wider row
    // (Qwen3.5-35B-A3B: 16 heads of 256 gated, the gates after [q | k | v] in rows of 9216).
    for (name, rows, width, ld_gate, gate_at) in [
        ("sigmoid_gate_mul 8x4096", 8, 4096, 9216, 5120),
        ("sigmoid_gate_mul 3x300", 3, 300, 700, 33),
    ] {
        let x = random_bf16(&mut rng, rows * width, 4.0);
        let g = random_bf16(&mut rng, rows * ld_gate, 8.0);
        let mut dx = stream.clone_htod(&x).unwrap();
        let dg = stream.clone_htod(&g).unwrap();
        sigmoid_gate_mul(
            kernels,
            dev_mut(kernels, &mut dx),
            width,
            dev(kernels, &dg).skip(gate_at).unwrap(),
            ld_gate,
            rows,
            width,
        )
        .unwrap();
        let mut want = x.clone();
        sigmoid_gate_reference(&mut want, width, &g[gate_at..], ld_gate, rows, width);
        gpu.push((name.into(), stream.clone_dtoh(&dx).unwrap()));
        cpu.push((name.into(), want));
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

/// Fresh inputs (the seed printed under `test`), on the device.
fn inputs(test: &str, d: &OpenDevice) -> Inputs {
    eprintln!("device \"{}\": {}", d.name, d.spec);
    Inputs {
        seed: test_seed(test),
    }
}

/// Both paths' outputs of every op on the same inputs, with the CPU reference's.
fn run_both_paths(test: &str) -> (Outputs, Outputs, Outputs) {
    let d = device();
    let inputs = inputs(test, &d);
    let sass = load(&d, Policy::Auto);
    let ptx = load(&d, Policy::PtxOnly);
    eprintln!("{}", sass.report().to_table());
    eprintln!("{}", ptx.report().to_table());
    let (gpu_sass, cpu) = run_ops(&sass, &inputs);
    let (gpu_ptx, _) = run_ops(&ptx, &inputs);
    (gpu_sass, gpu_ptx, cpu)
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_auto_loads_sass_and_ptx_only_jits_ptx() {
    // `load_both_paths` asserts what each path loaded.
    load_both_paths(&device());
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_every_kernel_matches_its_reference_from_sass() {
    let (gpu_sass, _, cpu) = run_both_paths("reference-sass");
    check_against_reference("sass", &gpu_sass, &cpu);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_every_kernel_matches_its_reference_from_ptx() {
    let (_, gpu_ptx, cpu) = run_both_paths("reference-ptx");
    check_against_reference("ptx", &gpu_ptx, &cpu);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_every_kernel_sass_equals_ptx() {
    let (gpu_sass, gpu_ptx, _) = run_both_paths("sass-ptx");
    for ((name, a), (_, b)) in gpu_sass.iter().zip(&gpu_ptx) {
        let r = compare(a, b);
        eprintln!("{name}: SASS vs PTX JIT: {r}");
        assert!(r.bitwise_equal(), "{name}: SASS and PTX paths differ: {r}");
    }
}

/// The backend as an outside engine links it: the kernels loaded on a context the engine made
/// (`open_context`), every one launched on the engine's own stream (`on_stream`), give the bits
/// they give on the backend's own stream.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_every_kernel_on_the_engines_context_and_stream_gives_the_same_bits() {
    let ctx = CudaContext::new(0).expect("this GPU test needs a CUDA device");
    // A context that tracks events is refused (`DispatchError::EventTracking`).
    assert!(matches!(
        open_context(ctx.clone()),
        Err(aot_kernels::dispatch::DispatchError::EventTracking { ordinal: 0 })
    ));
    // SAFETY: no buffer of this context exists yet; the test orders its streams itself.
    unsafe { ctx.disable_event_tracking() };
    let d = open_context(ctx.clone()).unwrap();
    let kernels = load_available(&d, Policy::Auto, &ModuleSource::registry()).unwrap();
    let own = ctx.new_stream().unwrap();
    let on_own = kernels.on_stream(own.clone()).unwrap();
    assert!(Arc::ptr_eq(on_own.stream(), &own));
    let inputs = inputs("engine-stream", &d);
    let (backend, cpu) = run_ops(&kernels, &inputs);
    let (engine, _) = run_ops(&on_own, &inputs);
    assert_eq!(engine.len(), cpu.len());
    for ((name, a), (_, b)) in backend.iter().zip(&engine) {
        let r = compare(a, b);
        eprintln!("{name}: the engine's stream vs the backend's: {r}");
        assert!(
            r.bitwise_equal(),
            "{name}: the engine's stream gives other bits: {r}"
        );
    }
}

/// A stream of another context (here a second context on the same GPU) is refused, naming the fix.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_a_stream_of_another_context_is_refused_with_the_fix() {
    let kernels = load(&device(), Policy::Auto);
    let other = CudaContext::new_non_primary(0, 0).unwrap();
    let err = kernels
        .on_stream(other.new_stream().unwrap())
        .expect_err("a stream of another context");
    assert!(matches!(err, DispatchError::ForeignStream { .. }), "{err}");
    assert!(
        err.to_string().contains("kernels.context().new_stream()"),
        "{err}"
    );
}

/// The CUDA modules with one toolchain's images (the Triton modules have no CUDA 12 images),
/// loaded under `policy`.
fn forced_toolchain(d: &OpenDevice, major: u32, policy: Policy) -> LoadedKernels {
    let modules: Vec<ModuleSource> = ModuleSource::registry_of_kind(ModuleKind::Cuda)
        .into_iter()
        .map(|m| m.with_toolchains(ToolchainChoice::Major(major)))
        .collect();
    let kernels = load_available(d, policy, &modules).unwrap();
    eprintln!("{}", kernels.report().to_table());
    kernels
}

/// The CUDA 13 SASS, the CUDA 12 SASS and the CUDA 12 PTX (JIT), each forced, with the major
/// each must come from.
fn forced_toolchains(d: &OpenDevice) -> [(&'static str, u32, LoadedKernels); 3] {
    [
        ("cuda13 sass", 13, forced_toolchain(d, 13, Policy::Auto)),
        ("cuda12 sass", 12, forced_toolchain(d, 12, Policy::Auto)),
        ("cuda12 ptx", 12, forced_toolchain(d, 12, Policy::PtxOnly)),
    ]
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_forced_toolchain_loads_only_its_own_images() {
    for (name, major, kernels) in forced_toolchains(&device()) {
        assert!(
            kernels
                .report()
                .modules
                .iter()
                .all(|m| m.toolchain.major == major),
            "{name}: a module of another toolchain"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_forced_cuda12_sass_loads_without_a_jit() {
    let cu12_sass = forced_toolchain(&device(), 12, Policy::Auto);
    assert!(
        cu12_sass.report().modules.iter().all(|m| !m.jit),
        "CUDA 12 SASS must load on this GPU without a JIT"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_forced_cuda12_ptx_is_jitted() {
    let cu12_ptx = forced_toolchain(&device(), 12, Policy::PtxOnly);
    assert!(cu12_ptx.report().modules.iter().all(|m| m.jit));
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_forced_toolchain_images_match_the_reference() {
    let d = device();
    let inputs = inputs("toolchain-reference", &d);
    for (name, _, kernels) in forced_toolchains(&d) {
        let (gpu, cpu) = run_ops(&kernels, &inputs);
        check_against_reference(name, &gpu, &cpu);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_cuda12_images_compute_what_cuda13_images_compute() {
    let d = device();
    let inputs = inputs("cuda12-cuda13", &d);
    let [(_, _, cu13), others @ ..] = forced_toolchains(&d);
    let (gpu13, _) = run_ops(&cu13, &inputs);
    for (other, _, kernels) in others {
        let (outputs, _) = run_ops(&kernels, &inputs);
        for ((name, a), (_, b)) in gpu13.iter().zip(&outputs) {
            let r = compare(a, b);
            eprintln!("{name}: cuda13 SASS vs {other}: {r}");
            assert!(
                r.bitwise_equal(),
                "{name}: CUDA 13 SASS and {other} differ: {r}"
            );
        }
    }
}

type Buffer = cudarc::driver::CudaSlice<bf16>;

/// The loaded kernels and two 10-element buffers (an input and an output), too small for the
/// launches below.
fn small_buffers() -> (LoadedKernels, Buffer, Buffer) {
    let kernels = load(&device(), Policy::Auto);
    let small = kernels.stream().alloc_zeros::<bf16>(10).unwrap();
    let out = kernels.stream().alloc_zeros::<bf16>(10).unwrap();
    (kernels, small, out)
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_rmsnorm_refuses_an_output_too_small_without_launching() {
    let (kernels, small, mut out) = small_buffers();
    let p = RmsNormParams {
        rows: 2,
        hidden: 64,
        eps: 1e-6,
        weight_offset: 0.0,
    };
    let err = rmsnorm(&kernels, &mut out, &small, &small, &p)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("rmsnorm: `out` holds 10 elements, the shape needs 128"),
        "{err}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_silu_and_mul_refuses_zero_rows_without_launching() {
    let (kernels, small, mut out) = small_buffers();
    let err = silu_and_mul(&kernels, &mut out, &small, 0, 8)
        .unwrap_err()
        .to_string();
    assert!(err.contains("silu_and_mul: rows 0"), "{err}");
}
