//! An out-of-range rotary position makes the kernel trap instead of reading past the cos/sin table.
//! A trap loses the CUDA context, so this test has a process (a test binary) of its own.
//! `#[ignore]`d: it needs a GPU (run with `--include-ignored` there; the GPU bundle does).

use aot_kernels::dispatch::{load_available, open_device, ModuleSource, Policy};
use aot_kernels::ops::rotary::{cos_sin_cache, rotary_neox, RotaryParams};
use half::bf16;

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_rotary_position_out_of_range_traps() {
    let d = open_device(0).unwrap_or_else(|e| panic!("this GPU test needs a CUDA device: {e}"));
    let kernels = load_available(&d, Policy::Auto, &ModuleSource::registry()).unwrap();
    let stream = kernels.stream();
    let p = RotaryParams {
        tokens: 2,
        q_heads: 2,
        kv_heads: 1,
        head_dim: 64,
        rot_dim: 64,
    };
    let max_position = 16;
    let cache = stream
        .clone_htod(&cos_sin_cache(max_position, p.rot_dim, 1e6))
        .unwrap();
    let mut q = stream
        .alloc_zeros::<bf16>(p.tokens * p.q_heads * p.head_dim)
        .unwrap();
    let mut kk = stream
        .alloc_zeros::<bf16>(p.tokens * p.kv_heads * p.head_dim)
        .unwrap();

    // In range first: the same call succeeds.
    let positions = stream.clone_htod(&[3i32, 15]).unwrap();
    rotary_neox(
        &kernels,
        &mut q,
        &mut kk,
        &positions,
        &cache,
        max_position,
        &p,
    )
    .unwrap();
    stream.synchronize().unwrap();

    let positions = stream.clone_htod(&[3i32, max_position as i32]).unwrap();
    let launched = rotary_neox(
        &kernels,
        &mut q,
        &mut kk,
        &positions,
        &cache,
        max_position,
        &p,
    );
    let synced = stream.synchronize();
    eprintln!("position {max_position} with a {max_position}-row table: launch {launched:?}, synchronize {synced:?}");
    assert!(
        launched.is_err() || synced.is_err(),
        "an out-of-range position must fail the launch"
    );
}
