//! The output gate of gated attention (module `output_gate`), in place:
//! `x = bf16(x * bf16(sigmoid(gate)))`, for `rows` rows of `width` values. `x` and `gate` are views
//! with their own row strides, so that the gate can be a column range of a fused projection.

use cudarc::driver::LaunchConfig;
use half::bf16;

use super::launch::{check_rows, grid_dim, launch, to_i32, Arg, DevMut, DevRef, OpsError};
use crate::dispatch::LoadedKernels;

pub const MODULE: &str = "output_gate";
pub const ENTRY: &str = "sigmoid_gate_mul_bf16";
/// The (module, entry) pairs this file's launchers call ([`super::launched_entries`]).
pub const LAUNCHED: &[(&str, &str)] = &[(MODULE, ENTRY)];

const THREADS: usize = 256;

/// Reference: `x` (`rows` rows `ld_x` apart) gated in place by `gate` (rows `ld_gate` apart).
pub fn sigmoid_gate_reference(
    x: &mut [bf16],
    ld_x: usize,
    gate: &[bf16],
    ld_gate: usize,
    rows: usize,
    width: usize,
) {
    for r in 0..rows {
        for j in 0..width {
            let g = f64::from(gate[r * ld_gate + j].to_f32());
            let s = bf16::from_f64(1.0 / (1.0 + (-g).exp())).to_f32();
            let v = &mut x[r * ld_x + j];
            *v = bf16::from_f32(v.to_f32() * s);
        }
    }
}

/// `x = x * sigmoid(gate)` on the GPU, in place.
pub fn sigmoid_gate_mul(
    kernels: &LoadedKernels,
    x: DevMut<'_, bf16>,
    ld_x: usize,
    gate: DevRef<'_, bf16>,
    ld_gate: usize,
    rows: usize,
    width: usize,
) -> Result<(), OpsError> {
    let op = "sigmoid_gate_mul";
    if width == 0 {
        return Err(OpsError::Shape {
            op,
            message: "width 0: nothing to gate".into(),
        });
    }
    check_rows(op, "x", x.len(), rows, width, ld_x)?;
    check_rows(op, "gate", gate.len(), rows, width, ld_gate)?;
    let cfg = LaunchConfig {
        grid_dim: (
            grid_dim(op, "column blocks", width.div_ceil(THREADS), u32::MAX)?,
            grid_dim(op, "rows", rows, 65535)?,
            1,
        ),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    launch(
        kernels,
        op,
        MODULE,
        ENTRY,
        cfg,
        &mut [
            Arg::U64(x.addr()),
            Arg::I32(to_i32(op, "ld_x", ld_x)?),
            Arg::U64(gate.addr()),
            Arg::I32(to_i32(op, "ld_gate", ld_gate)?),
            Arg::I32(to_i32(op, "width", width)?),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gates_by_the_rounded_sigmoid_and_leaves_the_stride_gap_alone() {
        let b = |v: f32| bf16::from_f32(v);
        // Two rows of width 2, stride 3: the third column of each row is not touched.
        let mut x = vec![b(2.0), b(-3.0), b(7.0), b(0.5), b(1.0), b(7.0)];
        let gate = [b(0.0), b(40.0), b(-40.0), b(1.0)];
        sigmoid_gate_reference(&mut x, 3, &gate, 2, 2, 2);
        let s1 = bf16::from_f64(1.0 / (1.0 + (-1.0f64).exp())).to_f32();
        assert_eq!(x[0], b(1.0)); // sigmoid(0) = 0.5
        assert_eq!(x[1], b(-3.0)); // sigmoid(40) rounds to 1
        assert_eq!(x[2], b(7.0));
        assert!(x[3].to_f32() > 0.0 && x[3].to_f32() < 1e-17); // sigmoid(-40): tiny, not 0 or NaN
        assert_eq!(x[4], b(s1));
        assert_eq!(x[5], b(7.0));
    }
}
