//! The streaming-read kernel (module `bench`): reads a buffer once at full speed, folding it into
//! an XOR per block. Benchmarks time it to measure the read bandwidth in the same run as the
//! engine; the fold proves every byte was read.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::launch::{check_view, to_i32, DevMut, DevRef, OpsError};
use crate::dispatch::LoadedKernels;

pub const MODULE: &str = "bench";
pub const ENTRY: &str = "stream_read_u32";
const THREADS: u32 = 512;

/// Blocks the launch uses on a GPU of `sm_count` SMs (the length `block_xor` needs).
pub fn stream_read_blocks(sm_count: usize) -> usize {
    4 * sm_count.max(1)
}

/// Reference: the XOR of every 32-bit word.
pub fn xor_reference(data: &[u32]) -> u32 {
    data.iter().fold(0, |a, &b| a ^ b)
}

/// Reads `data` (a multiple of 4 words) once; `block_xor` gets one fold per block.
pub fn stream_read(
    kernels: &LoadedKernels,
    data: DevRef<'_, u32>,
    block_xor: DevMut<'_, u32>,
) -> Result<(), OpsError> {
    let op = "stream_read";
    if data.is_empty() || !data.len().is_multiple_of(4) {
        return Err(OpsError::Shape {
            op,
            message: format!(
                "{} words: need a positive multiple of 4 (16-byte reads)",
                data.len()
            ),
        });
    }
    let blocks = stream_read_blocks(kernels.sm_count());
    check_view(op, "block_xor", block_xor.len(), &[blocks])?;
    let function = kernels.function(MODULE, ENTRY)?;
    let cfg = LaunchConfig {
        grid_dim: (to_i32(op, "blocks", blocks)? as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let (d, w, x) = (data.addr(), (data.len() / 4) as u64, block_xor.addr());
    let stream = kernels.stream();
    let mut b = stream.launch_builder(&function);
    b.arg(&d).arg(&w).arg(&x);
    // SAFETY: `data` holds `w` 16-byte words and `block_xor` one word per block (checked above);
    // the argument order is the kernel's signature in kernels/bench/stream_read.cu.
    unsafe { b.launch(cfg) }
        .map(|_| ())
        .map_err(|source| OpsError::Driver { op, source })
}
