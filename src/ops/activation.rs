//! SiLU-and-mul (module `activation`): rows `[gate (d) | up (d)]` -> `bf16(bf16(silu(gate)) * up)`.

use cudarc::driver::{CudaSlice, LaunchConfig};
use half::bf16;

use super::launch::{check_len, launch, to_i32, Arg, OpsError};
use crate::dispatch::LoadedKernels;

pub const MODULE: &str = "activation";
pub const ENTRY: &str = "silu_and_mul_bf16";
/// The (module, entry) pairs this file's launchers call ([`super::launched_entries`]).
pub const LAUNCHED: &[(&str, &str)] = &[(MODULE, ENTRY)];

/// Threads per block; each thread handles 8 outputs.
const THREADS: usize = 256;

/// Reference for `silu_and_mul_bf16`: `input` is `rows x 2d`, the result `rows x d`.
pub fn silu_and_mul_reference(input: &[bf16], rows: usize, d: usize) -> Vec<bf16> {
    assert_eq!(input.len(), rows * 2 * d, "input must be rows x 2d");
    let mut out = Vec::with_capacity(rows * d);
    for row in input.chunks_exact(2 * d) {
        let (gate, up) = row.split_at(d);
        for (&g, &u) in gate.iter().zip(up) {
            let g = f64::from(g.to_f32());
            let act = bf16::from_f64(g / (1.0 + (-g).exp()));
            out.push(bf16::from_f32(act.to_f32() * u.to_f32()));
        }
    }
    out
}

/// `out = silu(gate) * up` on the GPU; `input` is `rows x 2d`, `out` is `rows x d`.
pub fn silu_and_mul(
    kernels: &LoadedKernels,
    out: &mut CudaSlice<bf16>,
    input: &CudaSlice<bf16>,
    rows: usize,
    d: usize,
) -> Result<(), OpsError> {
    let op = "silu_and_mul";
    if rows == 0 || d == 0 || rows > 65535 {
        return Err(OpsError::Shape {
            op,
            message: format!("rows {rows} x d {d}: rows must be 1..=65535 and d > 0"),
        });
    }
    check_len(op, "out", out, &[rows, d])?;
    check_len(op, "input", input, &[rows, 2, d])?;
    let d_i32 = to_i32(op, "d", 2 * d)? / 2;
    let cfg = LaunchConfig {
        grid_dim: (d.div_ceil(8 * THREADS) as u32, rows as u32, 1),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(
        kernels,
        op,
        MODULE,
        ENTRY,
        cfg,
        &mut [Arg::Out(out), Arg::In(input), Arg::I32(d_i32)],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_silu_at_known_points() {
        // silu(0) = 0, silu(large) ~ x, silu(-large) ~ 0; up scales the result.
        let input: Vec<bf16> = [0.0f32, 8.0, -8.0, 1.0, 2.0, 3.0, 0.5, 1.0]
            .iter()
            .map(|&x| bf16::from_f32(x))
            .collect();
        let out = silu_and_mul_reference(&input, 1, 4);
        let silu = |x: f64| x / (1.0 + (-x).exp());
        let want = [0.0, silu(8.0) * 3.0, silu(-8.0) * 0.5, silu(1.0)];
        for (o, w) in out.iter().zip(want) {
            assert!(
                (f64::from(o.to_f32()) - w).abs() <= w.abs() * 0.01 + 1e-6,
                "{o} vs {w}"
            );
        }
    }
}
