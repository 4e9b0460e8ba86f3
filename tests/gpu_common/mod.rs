//! Helpers for the GPU test binaries (`tests/gpu_*.rs`): the device, both dispatch paths, random
//! inputs and CUDA-event timing. Each binary uses some of them.
#![allow(dead_code)]

use aot_kernels::dispatch::{
    load_available, open_device, LoadedKernels, ModuleSource, OpenDevice, Policy,
};
use cudarc::driver::sys::CUevent_flags;
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub fn device() -> OpenDevice {
    open_device(0)
        .unwrap_or_else(|e| panic!("this GPU test needs a CUDA device and found none: {e}"))
}

/// Every module the registry serves on this device under `policy`.
pub fn load(d: &OpenDevice, policy: Policy) -> LoadedKernels {
    load_available(d, policy, &ModuleSource::registry()).unwrap()
}

/// Every module loaded under `auto` (exact SASS on a promised GPU).
pub fn load_auto(d: &OpenDevice) -> LoadedKernels {
    load(d, Policy::Auto)
}

/// Fresh random inputs each run; `AOT_TEST_SEED=N` replays the inputs of a printed seed.
pub fn test_seed(test: &str) -> u64 {
    let s: u64 = match std::env::var("AOT_TEST_SEED") {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            panic!("AOT_TEST_SEED={v:?} is not a seed: give the number a test printed")
        }),
        Err(_) => rand::random(),
    };
    eprintln!("[{test}] input seed {s}");
    s
}

/// A generator seeded by [`test_seed`].
pub fn seed(test: &str) -> StdRng {
    StdRng::seed_from_u64(test_seed(test))
}

/// Every module loaded from its exact SASS (`auto`) and from the PTX fallback (`ptx-only`, JIT),
/// each checked to be what it says.
pub fn load_both_paths(d: &OpenDevice) -> [(&'static str, LoadedKernels); 2] {
    // Fast paths built for other GPUs (the sm_90a GEMM elsewhere, and under ptx-only) are
    // unavailable by design and left out, as the engine leaves them out.
    let sass = load_available(d, Policy::Auto, &ModuleSource::registry()).unwrap();
    let ptx = load_available(d, Policy::PtxOnly, &ModuleSource::registry()).unwrap();
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
    [("sass", sass), ("ptx", ptx)]
}

/// Registers, shared memory and image of each entry of `module`, as the driver loaded it.
pub fn describe(kernels: &LoadedKernels, module: &str) -> String {
    let mut out = String::new();
    if let Some(m) = kernels.report().module(module) {
        for e in &m.entries {
            out += &format!(
                "  {}/{} [{}]: {} registers, {} B static smem\n",
                m.module, e.entry, m.target, e.attributes.registers, e.attributes.shared_bytes
            );
        }
    }
    out
}

/// Uniform in (-scale, scale), never all zero.
pub fn random_bf16(rng: &mut impl Rng, n: usize, scale: f32) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(rng.gen_range(-scale..scale)))
        .collect()
}

/// Milliseconds per call of `f`, by CUDA events around `reps` calls after one warm-up call.
pub fn time_ms(kernels: &LoadedKernels, reps: usize, mut f: impl FnMut()) -> f32 {
    let stream = kernels.stream();
    f();
    let start = stream
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .unwrap();
    for _ in 0..reps {
        f();
    }
    let end = stream
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .unwrap();
    start.elapsed_ms(&end).unwrap() / reps as f32
}
