//! The streaming-read kernels (kernel module `bench`, one entry per [`Reader`]): each reads a
//! buffer once at full speed, folding it into an XOR per block. Benchmarks time them to measure the
//! read bandwidth in the same run as the engine; the fold proves every byte was read.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::launch::{check_view, to_i32, DevMut, DevRef, OpsError};
use crate::dispatch::LoadedKernels;

pub const MODULE: &str = "bench";
pub const ENTRY: &str = "stream_read_u32";
/// The bulk-copy reader ([`Reader::Bulk`]).
pub const ENTRY_BULK: &str = "stream_read_bulk_u32";
/// The (module, entry) pairs this file's launchers call ([`super::launched_entries`]).
pub const LAUNCHED: &[(&str, &str)] = &[(MODULE, ENTRY), (MODULE, ENTRY_BULK)];
const THREADS: u32 = 512;
/// The bulk reader's launch, as the kernel declares it (kBulkThreads, kBulkStages, kBulkChunk in
/// kernels/bench/stream_read.cu): one producer warp and four consumer warps, a ring of four 16 KiB
/// slots.
const BULK_THREADS: u32 = 160;
const BULK_STAGES: usize = 4;
const BULK_CHUNK: usize = 16384;

/// The two ways the module reads: plain 16-byte loads (every GPU) or bulk copies into shared
/// memory through the Tensor Memory Accelerator (sm_90 images; older images fold with loads).
/// Which is faster depends on the GPU, so a benchmark times both and takes the faster as the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    Loads,
    Bulk,
}

impl Reader {
    pub const ALL: [Reader; 2] = [Reader::Loads, Reader::Bulk];

    /// The kernel's entry in module [`MODULE`].
    pub fn entry(self) -> &'static str {
        match self {
            Reader::Loads => ENTRY,
            Reader::Bulk => ENTRY_BULK,
        }
    }

    /// Blocks a launch uses on a GPU of `sm_count` SMs (the length `block_xor` needs).
    pub fn blocks(self, sm_count: usize) -> usize {
        match self {
            Reader::Loads => 4 * sm_count.max(1),
            Reader::Bulk => 2 * sm_count.max(1),
        }
    }

    fn threads(self) -> u32 {
        match self {
            Reader::Loads => THREADS,
            Reader::Bulk => BULK_THREADS,
        }
    }

    /// Dynamic shared memory: the bulk reader's ring.
    fn smem(self) -> usize {
        match self {
            Reader::Loads => 0,
            Reader::Bulk => BULK_STAGES * BULK_CHUNK,
        }
    }
}

/// Reference: the XOR of every 32-bit word.
pub fn xor_reference(data: &[u32]) -> u32 {
    data.iter().fold(0, |a, &b| a ^ b)
}

/// Reads `data` (a multiple of 4 words) once with `reader`; `block_xor` gets one fold per block
/// (`reader.blocks(sm_count)` of them).
pub fn stream_read(
    kernels: &LoadedKernels,
    reader: Reader,
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
    if !data.addr().is_multiple_of(16) {
        return Err(OpsError::Shape {
            op,
            message: format!(
                "data starts at {:#x}: need a 16-byte aligned view (16-byte reads and bulk copies)",
                data.addr()
            ),
        });
    }
    let blocks = reader.blocks(kernels.sm_count());
    check_view(op, "block_xor", block_xor.len(), &[blocks])?;
    let entry = reader.entry();
    let function = kernels.function(MODULE, entry)?;
    kernels.allow_dynamic_smem(MODULE, entry, reader.smem())?;
    let cfg = LaunchConfig {
        grid_dim: (to_i32(op, "blocks", blocks)? as u32, 1, 1),
        block_dim: (reader.threads(), 1, 1),
        shared_mem_bytes: reader.smem() as u32,
    };
    let (d, w, x) = (data.addr(), (data.len() / 4) as u64, block_xor.addr());
    let stream = kernels.stream();
    let mut b = stream.launch_builder(&function);
    b.arg(&d).arg(&w).arg(&x);
    // SAFETY: `data` holds `w` 16-byte words and `block_xor` one word per block (checked above);
    // the argument order is both kernels' signature in kernels/bench/stream_read.cu.
    unsafe { b.launch(cfg) }
        .map(|_| ())
        .map_err(|source| OpsError::Driver { op, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bulk_launch_mirrors_the_kernel() {
        // The host sizes the bulk reader's threads and ring from these; the kernel runs kBulkThreads
        // threads and fills kBulkStages slots of kBulkChunk bytes.
        let src = include_str!("../../kernels/bench/stream_read.cu");
        for decl in [
            format!("constexpr int kBulkThreads = {BULK_THREADS};"),
            format!("constexpr int kBulkStages = {BULK_STAGES};"),
            format!("constexpr int kBulkChunk = {BULK_CHUNK};"),
        ] {
            assert!(src.contains(&decl), "stream_read.cu lacks `{decl}`");
        }
        assert_eq!(Reader::Bulk.threads(), BULK_THREADS);
        assert_eq!(Reader::Bulk.smem(), 65536);
    }
}
