//! A block id outside the KV cache makes the prefill kernels trap instead of writing (or
//! reading) memory that is not the sequence's. Block ids live on the device, so only the kernel
//! can check them. A trap loses the CUDA context, so this test has a process of its own.
//! `#[ignore]`d: it needs a GPU (run with `--include-ignored` there; the GPU bundle does).

use aot_kernels::dispatch::{load_available, open_device, ModuleSource, Policy};
use aot_kernels::ops::kv_cache::{block_elements, BlockTable};
use aot_kernels::ops::qk_norm_rope::{qk_norm_rope_cache, QkNormRopeInputs, QkNormRopeParams};
use aot_kernels::ops::rotary::cos_sin_cache;
use aot_kernels::ops::{dev, dev_mut};
use cudarc::driver::CudaSlice;
use half::bf16;

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_block_id_outside_the_cache_traps() {
    let d = open_device(0).unwrap_or_else(|e| panic!("this GPU test needs a CUDA device: {e}"));
    let kernels = load_available(&d, Policy::Auto, &ModuleSource::registry()).unwrap();
    let s = kernels.stream();
    let (head_dim, tokens) = (64, 4);
    let p = QkNormRopeParams {
        tokens,
        q_heads: 1,
        kv_heads: 1,
        head_dim,
        qkv_stride: 3 * head_dim,
        start_pos: 14,
        eps: 1e-6,
        weight_offset: 0.0,
    };
    let qkv = s.alloc_zeros::<bf16>(tokens * 3 * head_dim).unwrap();
    let w = s.alloc_zeros::<bf16>(head_dim).unwrap();
    let cos_sin = s.clone_htod(&cos_sin_cache(32, head_dim, 1e6)).unwrap();
    let mut q = s.alloc_zeros::<bf16>(tokens * head_dim).unwrap();
    // Two blocks in the cache; positions 14..18 use table entries 0 and 1.
    let mut kc = s
        .alloc_zeros::<bf16>(2 * block_elements(1, head_dim))
        .unwrap();
    let mut vc = kc.clone();
    let run = |table: &[i32], kc: &mut _, vc: &mut _, q: &mut CudaSlice<bf16>| {
        let table = s.clone_htod(table).unwrap();
        let inputs = QkNormRopeInputs {
            qkv: dev(&kernels, &qkv),
            q_norm: &w,
            k_norm: &w,
            cos_sin: &cos_sin,
            max_position: 32,
            blocks: BlockTable {
                table: &table,
                offset: 0,
                len: 2,
            },
        };
        let launched = qk_norm_rope_cache(&kernels, &inputs, dev_mut(&kernels, q), kc, vc, &p);
        (launched, s.synchronize())
    };
    // In range first: the same call succeeds.
    let (launched, synced) = run(&[1, 0], &mut kc, &mut vc, &mut q);
    launched.unwrap();
    synced.unwrap();
    let (launched, synced) = run(&[1, 2], &mut kc, &mut vc, &mut q);
    eprintln!("block id 2 in a 2-block cache: launch {launched:?}, synchronize {synced:?}");
    assert!(
        launched.is_err() || synced.is_err(),
        "a block id outside the cache must fail the launch"
    );
}
