//! Embedding gather (module `embedding`): `out[r] = table[tokens[r]]`, optionally with each row's
//! sum of squares for the next projection's fused RMSNorm.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use half::bf16;

use super::launch::{check_view, to_i32, DevMut, DevRef, OpsError};
use crate::dispatch::LoadedKernels;

pub const MODULE: &str = "embedding";
pub const ENTRY: &str = "embedding_bf16";
/// The (module, entry) pairs this file's launchers call ([`super::launched_entries`]).
pub const LAUNCHED: &[(&str, &str)] = &[(MODULE, ENTRY)];

/// Reference: rows of the table, and their sums of squares.
pub fn embedding_reference(table: &[bf16], hidden: usize, tokens: &[u32]) -> (Vec<bf16>, Vec<f32>) {
    let mut out = Vec::with_capacity(tokens.len() * hidden);
    let mut ssq = Vec::with_capacity(tokens.len());
    for &t in tokens {
        let row = &table[t as usize * hidden..(t as usize + 1) * hidden];
        out.extend_from_slice(row);
        ssq.push(row.iter().map(|v| v.to_f32() * v.to_f32()).sum());
    }
    (out, ssq)
}

/// Gathers `rows` rows. Token ids live on the device: one outside `0..vocab` makes the kernel trap
/// (the launch fails) instead of reading past the table.
#[allow(clippy::too_many_arguments)]
pub fn embedding(
    kernels: &LoadedKernels,
    out: DevMut<'_, bf16>,
    ld_out: usize,
    ssq_out: Option<DevMut<'_, f32>>,
    table: DevRef<'_, bf16>,
    vocab: usize,
    hidden: usize,
    tokens: DevRef<'_, i32>,
    rows: usize,
) -> Result<(), OpsError> {
    let op = "embedding";
    if rows == 0 || hidden == 0 || ld_out < hidden {
        return Err(OpsError::Shape {
            op,
            message: format!("{rows} rows of {hidden} (stride {ld_out}): need rows, hidden > 0 and stride >= hidden"),
        });
    }
    check_view(op, "table", table.len(), &[vocab, hidden])?;
    check_view(op, "tokens", tokens.len(), &[rows])?;
    check_view(op, "out", out.len(), &[(rows - 1) * ld_out + hidden])?;
    if let Some(s) = &ssq_out {
        check_view(op, "ssq_out", s.len(), &[rows])?;
    }
    let function = kernels.function(MODULE, ENTRY)?;
    let cfg = LaunchConfig {
        grid_dim: (to_i32(op, "rows", rows)? as u32, 1, 1),
        block_dim: (super::launch::block_threads(hidden.div_ceil(4)), 1, 1),
        shared_mem_bytes: 0,
    };
    let (out_p, ssq_p, table_p, tokens_p) = (
        out.addr(),
        ssq_out.as_ref().map_or(0, |s| s.addr()),
        table.addr(),
        tokens.addr(),
    );
    let (vocab, hidden, ld) = (
        to_i32(op, "vocab", vocab)?,
        to_i32(op, "hidden", hidden)?,
        to_i32(op, "ld_out", ld_out)?,
    );
    let stream = kernels.stream();
    let mut b = stream.launch_builder(&function);
    b.arg(&out_p)
        .arg(&ssq_p)
        .arg(&table_p)
        .arg(&tokens_p)
        .arg(&vocab)
        .arg(&hidden)
        .arg(&ld);
    // SAFETY: the addresses come from views checked above against the kernel's shapes; the
    // argument order is the kernel's signature in kernels/embedding/embedding.cu.
    unsafe { b.launch(cfg) }
        .map(|_| ())
        .map_err(|source| OpsError::Driver { op, source })
}
