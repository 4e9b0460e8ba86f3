//! RMSNorm (module `rmsnorm`): `y = bf16((w + weight_offset) * bf16(x * rsqrt(mean(x^2) + eps)))`.
//! `weight_offset` is 0 for Qwen3 and 1 for the zero-centred norms of Qwen3.5/3.6.

use cudarc::driver::{CudaSlice, LaunchConfig};
use half::bf16;

use super::launch::{block_threads, check_len, launch, to_i32, Arg, OpsError};
use crate::dispatch::LoadedKernels;

pub const MODULE: &str = "rmsnorm";
pub const ENTRY_PLAIN: &str = "rmsnorm_bf16";
pub const ENTRY_FUSED_ADD: &str = "fused_add_rmsnorm_bf16";
/// The (module, entry) pairs this file's launchers call ([`super::launched_entries`]).
pub const LAUNCHED: &[(&str, &str)] = &[(MODULE, ENTRY_PLAIN), (MODULE, ENTRY_FUSED_ADD)];

/// Shape and constants of one RMSNorm call over `rows` rows of `hidden` values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RmsNormParams {
    pub rows: usize,
    pub hidden: usize,
    pub eps: f32,
    pub weight_offset: f32,
}

fn norm_row(row: &[bf16], weight: &[bf16], p: &RmsNormParams, out: &mut [bf16]) {
    // The kernel sums squares in fp32 in a launch-dependent order; a float64 sum is the exact
    // value that order approximates, so the reference is at least as accurate as the kernel.
    let sum_sq: f64 = row.iter().map(|v| f64::from(v.to_f32()).powi(2)).sum();
    let scale = 1.0 / (sum_sq / p.hidden as f64 + f64::from(p.eps)).sqrt();
    for ((o, &x), &w) in out.iter_mut().zip(row).zip(weight) {
        let normed = bf16::from_f64(f64::from(x.to_f32()) * scale);
        *o = bf16::from_f32((w.to_f32() + p.weight_offset) * normed.to_f32());
    }
}

/// Reference for `rmsnorm_bf16`: `x` is `rows x hidden`, `weight` is `hidden`.
pub fn rmsnorm_reference(x: &[bf16], weight: &[bf16], p: &RmsNormParams) -> Vec<bf16> {
    assert_eq!(x.len(), p.rows * p.hidden, "x must be rows x hidden");
    assert_eq!(weight.len(), p.hidden, "weight must be hidden long");
    let mut out = vec![bf16::ZERO; x.len()];
    for (row, out_row) in x.chunks_exact(p.hidden).zip(out.chunks_exact_mut(p.hidden)) {
        norm_row(row, weight, p, out_row);
    }
    out
}

/// Reference for `fused_add_rmsnorm_bf16`: returns `(normed, new_residual)` where
/// `new_residual = bf16(x + residual)` and `normed = rmsnorm(new_residual)`.
pub fn fused_add_rmsnorm_reference(
    x: &[bf16],
    residual: &[bf16],
    weight: &[bf16],
    p: &RmsNormParams,
) -> (Vec<bf16>, Vec<bf16>) {
    assert_eq!(
        x.len(),
        residual.len(),
        "x and residual must have the same shape"
    );
    let new_residual: Vec<bf16> = x
        .iter()
        .zip(residual)
        .map(|(a, b)| bf16::from_f32(a.to_f32() + b.to_f32()))
        .collect();
    (rmsnorm_reference(&new_residual, weight, p), new_residual)
}

fn config(p: &RmsNormParams) -> Result<LaunchConfig, OpsError> {
    if p.hidden == 0 || p.rows == 0 {
        return Err(OpsError::Shape {
            op: "rmsnorm",
            message: format!("empty shape {} x {}", p.rows, p.hidden),
        });
    }
    Ok(LaunchConfig {
        grid_dim: (
            u32::try_from(p.rows).map_err(|_| OpsError::Shape {
                op: "rmsnorm",
                message: format!("{} rows is too many", p.rows),
            })?,
            1,
            1,
        ),
        block_dim: (block_threads(p.hidden.div_ceil(4)), 1, 1),
        shared_mem_bytes: 0,
    })
}

/// `out = rmsnorm(x) * (weight + weight_offset)` on the GPU; buffers are `rows x hidden`.
pub fn rmsnorm(
    kernels: &LoadedKernels,
    out: &mut CudaSlice<bf16>,
    x: &CudaSlice<bf16>,
    weight: &CudaSlice<bf16>,
    p: &RmsNormParams,
) -> Result<(), OpsError> {
    let cfg = config(p)?;
    check_len("rmsnorm", "out", out, &[p.rows, p.hidden])?;
    check_len("rmsnorm", "x", x, &[p.rows, p.hidden])?;
    check_len("rmsnorm", "weight", weight, &[p.hidden])?;
    let hidden = to_i32("rmsnorm", "hidden", p.hidden)?;
    launch(
        kernels,
        "rmsnorm",
        MODULE,
        ENTRY_PLAIN,
        cfg,
        &mut [
            Arg::Out(out),
            Arg::In(x),
            Arg::In(weight),
            Arg::I32(hidden),
            Arg::I32(hidden),
            Arg::F32(p.eps),
            Arg::F32(p.weight_offset),
        ],
    )
}

/// `residual += x; x = rmsnorm(residual) * (weight + weight_offset)` on the GPU, in place.
pub fn fused_add_rmsnorm(
    kernels: &LoadedKernels,
    x: &mut CudaSlice<bf16>,
    residual: &mut CudaSlice<bf16>,
    weight: &CudaSlice<bf16>,
    p: &RmsNormParams,
) -> Result<(), OpsError> {
    let cfg = config(p)?;
    check_len("fused_add_rmsnorm", "x", x, &[p.rows, p.hidden])?;
    check_len(
        "fused_add_rmsnorm",
        "residual",
        residual,
        &[p.rows, p.hidden],
    )?;
    check_len("fused_add_rmsnorm", "weight", weight, &[p.hidden])?;
    let hidden = to_i32("fused_add_rmsnorm", "hidden", p.hidden)?;
    launch(
        kernels,
        "fused_add_rmsnorm",
        MODULE,
        ENTRY_FUSED_ADD,
        cfg,
        &mut [
            Arg::Out(x),
            Arg::Out(residual),
            Arg::In(weight),
            Arg::I32(hidden),
            Arg::I32(hidden),
            Arg::F32(p.eps),
            Arg::F32(p.weight_offset),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn random(n: usize, rng: &mut impl Rng, scale: f32) -> Vec<bf16> {
        (0..n)
            .map(|_| bf16::from_f32(rng.gen_range(-scale..scale)))
            .collect()
    }

    #[test]
    fn normalises_each_row_to_unit_rms_times_weight() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
        let p = RmsNormParams {
            rows: 3,
            hidden: 256,
            eps: 1e-6,
            weight_offset: 0.0,
        };
        let x = random(p.rows * p.hidden, &mut rng, 4.0);
        let ones = vec![bf16::ONE; p.hidden];
        let y = rmsnorm_reference(&x, &ones, &p);
        for row in y.chunks(p.hidden) {
            let rms = (row
                .iter()
                .map(|v| f64::from(v.to_f32()).powi(2))
                .sum::<f64>()
                / p.hidden as f64)
                .sqrt();
            assert!((rms - 1.0).abs() < 0.01, "rms {rms}");
        }
        // Zero-centred weights: w = 0 with offset 1 is the same as w = 1 with offset 0.
        let zeros = vec![bf16::ZERO; p.hidden];
        let centred = rmsnorm_reference(
            &x,
            &zeros,
            &RmsNormParams {
                weight_offset: 1.0,
                ..p
            },
        );
        assert_eq!(centred, y);
    }

    #[test]
    fn fused_add_is_add_then_norm() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
        let p = RmsNormParams {
            rows: 2,
            hidden: 64,
            eps: 1e-6,
            weight_offset: 0.0,
        };
        let x = random(128, &mut rng, 2.0);
        let r = random(128, &mut rng, 2.0);
        let w = random(64, &mut rng, 1.0);
        let (y, new_r) = fused_add_rmsnorm_reference(&x, &r, &w, &p);
        let sum: Vec<bf16> = x
            .iter()
            .zip(&r)
            .map(|(a, b)| bf16::from_f64(f64::from(a.to_f32()) + f64::from(b.to_f32())))
            .collect();
        assert_eq!(new_r, sum);
        assert_eq!(y, rmsnorm_reference(&sum, &w, &p));
    }
}
