//! Prefill GEMM: `C[m, n] = A[m, k] . W[n, k]^T` on tensor cores, bf16 inputs, fp32
//! accumulation, bf16 or fp32 output. Two kernels compute it:
//!
//! - module `gemm_bf16` (mma.sync, every target; `kernels/gemm/gemm_bf16.cu`);
//! - module `gemm_bf16_sm90` (Hopper's wgmma, built for `sm_90a` only;
//!   `kernels/gemm/gemm_bf16_sm90.cu`): the faster of the two where its image loads.
//!
//! [`gemm_bf16`] takes the wgmma kernel where its `sm_90a` SASS is loaded (an sm_90 GPU under
//! `auto`), else mma.sync ([`GemmKernel::best`]); [`gemm_bf16_on`] names one. Both take the same
//! k16 steps in the same order (k = 0 upward, no split-K), and on the H200 they give the same bits
//! (the GPU test compares them), so `auto` and `ptx-only` (which loads the compute_80 PTX, hence
//! mma.sync) agree.
//!
//! `A` holds activations (one row per token), `W` weights as Hugging Face stores them (`[out,
//! in]`), `C` one row per token. Every output element is computed by one thread (mma.sync) or one
//! warpgroup (wgmma) in a fixed order over `k`, so it is bitwise independent of `m` and of where
//! its row falls in a tile: a prefill split into chunks of any size gives the same bits.

use cudarc::driver::{CudaSlice, LaunchConfig};
use fatbin_verify::{Target, Variant};
use half::bf16;

use super::launch::{
    check_aligned, check_rows, dev, grid_dim, launch, to_i32, Arg, DevRef, OpsError, MAX_GRID_X,
};
use crate::dispatch::LoadedKernels;

pub const MODULE: &str = "gemm_bf16";
pub const ENTRY_BF16: &str = "gemm_bf16";
pub const ENTRY_F32: &str = "gemm_bf16_f32out";
pub const MODULE_SM90: &str = "gemm_bf16_sm90";
pub const ENTRY_SM90_BF16: &str = "gemm_bf16_sm90";
pub const ENTRY_SM90_F32: &str = "gemm_bf16_sm90_f32out";
/// The (module, entry) pairs this file's launchers call ([`super::launched_entries`]).
pub const LAUNCHED: &[(&str, &str)] = &[
    (MODULE, ENTRY_BF16),
    (MODULE, ENTRY_F32),
    (MODULE_SM90, ENTRY_SM90_BF16),
    (MODULE_SM90, ENTRY_SM90_F32),
];

/// The tile both kernels use (one CTA per 128 x 256 block of `C`) and their block size.
const TILE_M: usize = 128;
const TILE_N: usize = 256;
const THREADS: u32 = 256;

/// Which kernel computes a product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmKernel {
    /// `gemm_bf16`: mma.sync.m16n8k16, a 4-stage pipeline of 32-wide k tiles; every target.
    MmaSync,
    /// `gemm_bf16_sm90`: wgmma.m64n256k16, a 4-stage pipeline of 64-wide k tiles; runs only as
    /// `sm_90a` SASS (its other images trap).
    Wgmma,
}

impl GemmKernel {
    /// The kernel for a device whose `gemm_bf16_sm90` module was loaded as `image` (`None`: not
    /// loaded): wgmma only for the module's exact `sm_90a` SASS; its compute_80 PTX (which
    /// `ptx-only` loads, and any other GPU would) has no wgmma.
    pub fn for_sm90_image(image: Option<Target>) -> Self {
        match image {
            Some(t) if !t.virtual_arch && t.sm == 90 && t.variant == Variant::ArchSpecific => {
                GemmKernel::Wgmma
            }
            _ => GemmKernel::MmaSync,
        }
    }

    /// The fastest kernel the loaded images allow.
    pub fn best(kernels: &LoadedKernels) -> Self {
        GemmKernel::for_sm90_image(kernels.loaded_target(MODULE_SM90))
    }

    fn module(self) -> &'static str {
        match self {
            GemmKernel::MmaSync => MODULE,
            GemmKernel::Wgmma => MODULE_SM90,
        }
    }

    fn entry(self, f32_out: bool) -> &'static str {
        match (self, f32_out) {
            (GemmKernel::MmaSync, false) => ENTRY_BF16,
            (GemmKernel::MmaSync, true) => ENTRY_F32,
            (GemmKernel::Wgmma, false) => ENTRY_SM90_BF16,
            (GemmKernel::Wgmma, true) => ENTRY_SM90_F32,
        }
    }

    /// Dynamic shared memory: four stages of a 128-row A tile and a 256-row W tile, 32 (mma.sync)
    /// or 64 (wgmma) bf16 wide; wgmma adds 1 KiB to align its stages to the 128-byte swizzle's
    /// 1024-byte atoms.
    fn shared_bytes(self) -> u32 {
        match self {
            GemmKernel::MmaSync => 4 * (128 + 256) * 32 * 2,
            GemmKernel::Wgmma => 4 * (128 + 256) * 64 * 2 + 1024,
        }
    }
}

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

    fn config(&self, op: &'static str, kernel: GemmKernel) -> Result<LaunchConfig, OpsError> {
        let tiles = self.m.div_ceil(TILE_M) * self.n.div_ceil(TILE_N);
        Ok(LaunchConfig {
            grid_dim: (grid_dim(op, "tiles", tiles, MAX_GRID_X)?, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: kernel.shared_bytes(),
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

/// `C = A . W^T` with bf16 output on the GPU (`C` is `m` rows of `n`, `ldc` apart), on the
/// fastest kernel loaded ([`GemmKernel::best`]).
pub fn gemm_bf16(
    kernels: &LoadedKernels,
    c: &mut CudaSlice<bf16>,
    a: &CudaSlice<bf16>,
    w: &CudaSlice<bf16>,
    s: &GemmShape,
) -> Result<(), OpsError> {
    gemm_bf16_on(kernels, GemmKernel::best(kernels), c, a, w, s)
}

/// [`gemm_bf16`] with W as a view: rows of a larger matrix, such as one of several projections
/// stored together (a DeltaNet layer's `in_proj_*`, which decode reads in one GEMV). The view
/// must start on a 16-byte boundary. The same bits as [`gemm_bf16`] on a copy of those rows.
pub fn gemm_bf16_w_view(
    kernels: &LoadedKernels,
    c: &mut CudaSlice<bf16>,
    a: &CudaSlice<bf16>,
    w: DevRef<'_, bf16>,
    s: &GemmShape,
) -> Result<(), OpsError> {
    check_aligned("gemm_bf16", "w", w.addr(), 16)?;
    let c_len = c.len();
    run(
        kernels,
        "gemm_bf16",
        GemmKernel::best(kernels),
        Arg::Out(c),
        c_len,
        a,
        w,
        s,
    )
}

/// `C = A . W^T` with fp32 output (no rounding to bf16): lm_head logits.
pub fn gemm_bf16_f32out(
    kernels: &LoadedKernels,
    c: &mut CudaSlice<f32>,
    a: &CudaSlice<bf16>,
    w: &CudaSlice<bf16>,
    s: &GemmShape,
) -> Result<(), OpsError> {
    gemm_bf16_f32out_on(kernels, GemmKernel::best(kernels), c, a, w, s)
}

/// [`gemm_bf16`] on the kernel named (tests and benchmarks). Asking for [`GemmKernel::Wgmma`]
/// where its `sm_90a` SASS is not loaded is an error, never a launch of the trapping fallback.
pub fn gemm_bf16_on(
    kernels: &LoadedKernels,
    kernel: GemmKernel,
    c: &mut CudaSlice<bf16>,
    a: &CudaSlice<bf16>,
    w: &CudaSlice<bf16>,
    s: &GemmShape,
) -> Result<(), OpsError> {
    let c_len = c.len();
    run(
        kernels,
        "gemm_bf16",
        kernel,
        Arg::Out(c),
        c_len,
        a,
        dev(kernels, w),
        s,
    )
}

/// [`gemm_bf16_f32out`] on the kernel named.
pub fn gemm_bf16_f32out_on(
    kernels: &LoadedKernels,
    kernel: GemmKernel,
    c: &mut CudaSlice<f32>,
    a: &CudaSlice<bf16>,
    w: &CudaSlice<bf16>,
    s: &GemmShape,
) -> Result<(), OpsError> {
    let c_len = c.len();
    run(
        kernels,
        "gemm_bf16_f32out",
        kernel,
        Arg::OutF32(c),
        c_len,
        a,
        dev(kernels, w),
        s,
    )
}

/// Checks the shapes and launches `kernel` into `c` (`Arg::Out` for bf16, `Arg::OutF32` for
/// fp32, holding `c_len` elements).
#[allow(clippy::too_many_arguments)]
fn run<'a>(
    kernels: &LoadedKernels,
    op: &'static str,
    kernel: GemmKernel,
    c: Arg<'a>,
    c_len: usize,
    a: &'a CudaSlice<bf16>,
    w: DevRef<'_, bf16>,
    s: &GemmShape,
) -> Result<(), OpsError> {
    let cfg = checked_config(op, kernels, kernel, a, w.len(), s)?;
    check_rows(op, "c", c_len, s.m, s.n, s.ldc)?;
    let entry = kernel.entry(matches!(c, Arg::OutF32(_)));
    let mut args = args(s, a, w.addr());
    args.insert(0, c);
    launch(kernels, op, kernel.module(), entry, cfg, &mut args)
}

fn checked_config(
    op: &'static str,
    kernels: &LoadedKernels,
    kernel: GemmKernel,
    a: &CudaSlice<bf16>,
    w_len: usize,
    s: &GemmShape,
) -> Result<LaunchConfig, OpsError> {
    if kernel == GemmKernel::Wgmma && GemmKernel::best(kernels) != GemmKernel::Wgmma {
        return Err(OpsError::Shape {
            op,
            message: format!(
                "the wgmma kernel needs module `{MODULE_SM90}` loaded as sm_90a SASS (an sm_90 GPU under the `auto` policy); use GemmKernel::best"
            ),
        });
    }
    s.check(op)?;
    check_rows(op, "a", a.len(), s.m, s.k, s.lda)?;
    check_rows(op, "w", w_len, s.n, s.k, s.ldw)?;
    s.config(op, kernel)
}

/// The kernel arguments after `C`; the shape was checked to fit 32 bits.
fn args<'a>(s: &GemmShape, a: &'a CudaSlice<bf16>, w: u64) -> Vec<Arg<'a>> {
    let i = |v: usize| Arg::I32(v as i32);
    vec![
        Arg::In(a),
        Arg::U64(w),
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

    #[test]
    fn wgmma_only_for_exact_sm90a_sass() {
        let sm90a = Target {
            sm: 90,
            variant: Variant::ArchSpecific,
            virtual_arch: false,
        };
        assert_eq!(GemmKernel::for_sm90_image(Some(sm90a)), GemmKernel::Wgmma);
        for other in [
            None,
            Some(Target::sass(90)),
            Some(Target::ptx(80)),
            Some(Target {
                virtual_arch: true,
                ..sm90a
            }),
            Some(Target { sm: 100, ..sm90a }),
        ] {
            assert_eq!(
                GemmKernel::for_sm90_image(other),
                GemmKernel::MmaSync,
                "{other:?}"
            );
        }
    }
}
