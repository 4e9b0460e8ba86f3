//! Seeded initialisation (module `init`): `fill_uniform_bf16` writes exactly
//! [`fill_uniform_bf16_reference`](super::random::fill_uniform_bf16_reference), so synthetic
//! weights generated on the GPU equal the ones the CPU reference engine generates.

use cudarc::driver::LaunchConfig;
use half::bf16;

use super::launch::{check_view, launch, Arg, DevMut, OpsError};
use crate::dispatch::LoadedKernels;

pub const MODULE: &str = "init";
pub const ENTRY_FILL_UNIFORM: &str = "fill_uniform_bf16";
/// The (module, entry) pairs this file's launchers call ([`super::launched_entries`]).
pub const LAUNCHED: &[(&str, &str)] = &[(MODULE, ENTRY_FILL_UNIFORM)];

const THREADS: u32 = 256;
/// Enough blocks to fill any GPU; the kernel strides over the rest.
const MAX_BLOCKS: u64 = 1 << 16;

/// `out[i] = bf16(fma(scale, u_i, offset))` for `i < n`, `u_i` uniform in `[-1, 1)` from
/// `(seed, stream, i)`. `n == 0` writes nothing.
pub fn fill_uniform_bf16(
    kernels: &LoadedKernels,
    out: DevMut<'_, bf16>,
    n: usize,
    seed: u64,
    stream: u64,
    scale: f32,
    offset: f32,
) -> Result<(), OpsError> {
    let op = "fill_uniform_bf16";
    check_view(op, "out", out.len(), &[n])?;
    if n == 0 {
        return Ok(());
    }
    let blocks = (n as u64).div_ceil(u64::from(THREADS)).min(MAX_BLOCKS) as u32;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(
        kernels,
        op,
        MODULE,
        ENTRY_FILL_UNIFORM,
        cfg,
        &mut [
            Arg::U64(out.addr()),
            Arg::U64(n as u64),
            Arg::U64(seed),
            Arg::U64(stream),
            Arg::F32(scale),
            Arg::F32(offset),
        ],
    )
}
