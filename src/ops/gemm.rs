//! Prefill GEMM (module `gemm_bf16`): `C[m, n] = A[m, k] . W[n, k]^T` on tensor cores (mma.sync,
//! every target), bf16 inputs, fp32 accumulation, bf16 or fp32 output.
//!
//! `A` holds activations (one row per token), `W` weights as Hugging Face stores them (`[out,
//! in]`), `C` one row per token. Every output element is computed by one thread in a fixed order
//! over `k`, so it is bitwise independent of `m` and of where its row falls in a tile: a prefill
//! split into chunks of any size gives the same bits.

use cudarc::driver::{CudaSlice, LaunchConfig};
use half::bf16;

use super::launch::{check_rows, grid_dim, launch, to_i32, Arg, OpsError, MAX_GRID_X};
use crate::dispatch::LoadedKernels;

pub const MODULE: &str = "gemm_bf16";
pub const ENTRY_BF16: &str = "gemm_bf16";
pub const ENTRY_F32: &str = "gemm_bf16_f32out";

/// The kernel's tile and launch constants (`kernels/gemm/gemm_bf16.cu`).
const TILE_M: usize = 128;
const TILE_N: usize = 256;
const THREADS: u32 = 256;
const SHARED_BYTES: u32 = 4 * (128 + 256) * 32 * 2;

/// Shape of one product: `m` rows of activations, `n` outputs, `k` inputs, and the row strides
/// (in elements) of `A`, `W` and `C`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmShape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lda: usize,
    pub ldw: usize,
    pub ldc: usize,
}

impl GemmShape {
    /// Densely packed `A`, `W` and `C`.
    pub fn dense(m: usize, n: usize, k: usize) -> Self {
        GemmShape {
            m,
            n,
            k,
            lda: k,
            ldw: k,
            ldc: n,
        }
    }

    /// What the kernel needs: `n` and `k` multiples of 8 (16-byte chunks), strides of `A` and `W`
    /// multiples of 8 and of `C` even, every dimension at least 1 and within 32-bit indices.
    fn check(&self, op: &'static str) -> Result<(), OpsError> {
        let bad = |message: String| Err(OpsError::Shape { op, message });
        if self.m == 0 || self.n == 0 || self.k == 0 {
            return bad(format!("{self:?}: empty shape"));
        }
        if !self.n.is_multiple_of(8) || !self.k.is_multiple_of(8) {
            return bad(format!("{self:?}: n and k must be multiples of 8"));
        }
        if !self.lda.is_multiple_of(8) || !self.ldw.is_multiple_of(8) || !self.ldc.is_multiple_of(2)
        {
            return bad(format!(
                "{self:?}: lda and ldw must be multiples of 8 (16-byte rows), ldc even"
            ));
        }
        for (what, v) in [
            ("m", self.m),
            ("lda", self.lda),
            ("ldw", self.ldw),
            ("ldc", self.ldc),
        ] {
            to_i32(op, what, v)?;
        }
        Ok(())
    }

    fn config(&self, op: &'static str) -> Result<LaunchConfig, OpsError> {
        let tiles = self.m.div_ceil(TILE_M) * self.n.div_ceil(TILE_N);
        Ok(LaunchConfig {
            grid_dim: (grid_dim(op, "tiles", tiles, MAX_GRID_X)?, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: SHARED_BYTES,
        })
    }
}

/// One output element in float64 (exact products, a float64 sum), and `sum |a_i w_i|`, the
/// scale of the fp32 accumulation error.
pub fn gemm_element(a: &[bf16], w: &[bf16], s: &GemmShape, row: usize, col: usize) -> (f64, f64) {
    let a_row = &a[row * s.lda..row * s.lda + s.k];
    let w_row = &w[col * s.ldw..col * s.ldw + s.k];
    a_row
        .iter()
        .zip(w_row)
        .fold((0.0, 0.0), |(sum, mag), (&x, &y)| {
            let p = f64::from(x.to_f32()) * f64::from(y.to_f32());
            (sum + p, mag + p.abs())
        })
}

/// Reference for `gemm_bf16`: `m x n`, row-major (`ldc = n`), each element the float64 sum
/// rounded once to bf16. The kernel sums in fp32 on tensor cores in its own order, so it may differ
/// by its accumulation error (about `2^-16 sum |a_i w_i|` at most, see the GPU test) plus one ulp.
pub fn gemm_reference(a: &[bf16], w: &[bf16], s: &GemmShape) -> Vec<bf16> {
    assert!(a.len() >= (s.m - 1) * s.lda + s.k, "A is too short");
    assert!(w.len() >= (s.n - 1) * s.ldw + s.k, "W is too short");
    let mut c = Vec::with_capacity(s.m * s.n);
    for row in 0..s.m {
        for col in 0..s.n {
            c.push(bf16::from_f64(gemm_element(a, w, s, row, col).0));
        }
    }
    c
}

/// `C = A . W^T` with bf16 output on the GPU (`C` is `m` rows of `n`, `ldc` apart).
pub fn gemm_bf16(
    kernels: &LoadedKernels,
    c: &mut CudaSlice<bf16>,
    a: &CudaSlice<bf16>,
    w: &CudaSlice<bf16>,
    s: &GemmShape,
) -> Result<(), OpsError> {
    let op = "gemm_bf16";
    let cfg = checked_config(op, a, w, s)?;
    check_rows(op, "c", c.len(), s.m, s.n, s.ldc)?;
    let mut args = args(s, a, w);
    args.insert(0, Arg::Out(c));
    launch(kernels, op, MODULE, ENTRY_BF16, cfg, &mut args)
}

/// `C = A . W^T` with fp32 output (no rounding to bf16): lm_head logits.
pub fn gemm_bf16_f32out(
    kernels: &LoadedKernels,
    c: &mut CudaSlice<f32>,
    a: &CudaSlice<bf16>,
    w: &CudaSlice<bf16>,
    s: &GemmShape,
) -> Result<(), OpsError> {
    let op = "gemm_bf16_f32out";
    let cfg = checked_config(op, a, w, s)?;
    check_rows(op, "c", c.len(), s.m, s.n, s.ldc)?;
    let mut args = args(s, a, w);
    args.insert(0, Arg::OutF32(c));
    launch(kernels, op, MODULE, ENTRY_F32, cfg, &mut args)
}

fn checked_config(
    op: &'static str,
    a: &CudaSlice<bf16>,
    w: &CudaSlice<bf16>,
    s: &GemmShape,
) -> Result<LaunchConfig, OpsError> {
    s.check(op)?;
    check_rows(op, "a", a.len(), s.m, s.k, s.lda)?;
    check_rows(op, "w", w.len(), s.n, s.k, s.ldw)?;
    s.config(op)
}

/// The kernel arguments after `C`; the shape was checked to fit 32 bits.
fn args<'a>(s: &GemmShape, a: &'a CudaSlice<bf16>, w: &'a CudaSlice<bf16>) -> Vec<Arg<'a>> {
    let i = |v: usize| Arg::I32(v as i32);
    vec![
        Arg::In(a),
        Arg::In(w),
        i(s.m),
        i(s.n),
        i(s.k),
        i(s.lda),
        i(s.ldw),
        i(s.ldc),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_is_a_times_w_transposed() {
        // A = [[1, 2], [3, 4]] padded to k = 8, W = [[1, 0], [0, 1], [1, 1]] padded: C = A W^T.
        let s = GemmShape {
            m: 2,
            n: 3,
            k: 8,
            lda: 8,
            ldw: 8,
            ldc: 3,
        };
        let mut a = vec![bf16::ZERO; 16];
        let mut w = vec![bf16::ZERO; 24];
        for (i, v) in [(0, 1.0), (1, 2.0), (8, 3.0), (9, 4.0)] {
            a[i] = bf16::from_f32(v);
        }
        for i in [0, 9, 16, 17] {
            w[i] = bf16::ONE;
        }
        let c: Vec<f32> = gemm_reference(&a, &w, &s)
            .iter()
            .map(|v| v.to_f32())
            .collect();
        assert_eq!(c, [1.0, 2.0, 3.0, 3.0, 4.0, 7.0]);
        assert_eq!(gemm_element(&a, &w, &s, 1, 2), (7.0, 7.0));
    }

    #[test]
    fn shape_checks_name_the_problem() {
        let msg = |s: GemmShape| s.check("gemm").unwrap_err().to_string();
        assert!(msg(GemmShape::dense(0, 8, 8)).contains("empty"));
        assert!(msg(GemmShape::dense(4, 12, 8)).contains("multiples of 8"));
        assert!(msg(GemmShape {
            lda: 12,
            ..GemmShape::dense(4, 8, 8)
        })
        .contains("lda and ldw"));
        assert!(GemmShape::dense(8192, 19456, 2560).check("gemm").is_ok());
    }
}
