//! The fp32 building blocks of the reference forward pass, written as transformers computes them
//! in float32 (the comments name the torch expression each one mirrors).

/// `a · b` in fp32 with eight partial sums (a fixed order that the compiler can vectorise; like
/// BLAS, not a single running sum).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0.0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (a8.remainder(), b8.remainder());
    for (x, y) in a8.zip(b8) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    for (i, (x, y)) in ra.iter().zip(rb).enumerate() {
        acc[i] += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// Rows of `x` processed together so that a weight row is reused while it is in cache.
const ROW_TILE: usize = 16;

/// `y = x W^T` (`nn.Linear` without bias): `w` is `[out][in]` row-major, `x` is `[rows][in]`,
/// `y` is `[rows][out]`. Each output is one [`dot`], so a row's result does not depend on which
/// other rows are in the batch.
pub fn linear(w: &[f32], out_dim: usize, x: &[f32], in_dim: usize, y: &mut [f32]) {
    let rows = x.len() / in_dim;
    debug_assert_eq!(w.len(), out_dim * in_dim);
    debug_assert_eq!(y.len(), rows * out_dim);
    for tile in (0..rows).step_by(ROW_TILE) {
        let end = (tile + ROW_TILE).min(rows);
        for (o, w_row) in w.chunks_exact(in_dim).enumerate() {
            for t in tile..end {
                y[t * out_dim + o] = dot(w_row, &x[t * in_dim..(t + 1) * in_dim]);
            }
        }
    }
}

/// Qwen3RMSNorm: `w * (x * rsqrt(mean(x^2) + eps))`, in place.
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let variance = dot(x, x) / x.len() as f32;
    let r = 1.0 / (variance + eps).sqrt();
    for (v, &g) in x.iter_mut().zip(w) {
        *v = g * (*v * r);
    }
}

/// Qwen3NextRMSNorm, zero-centred: `(x * rsqrt(mean(x^2) + eps)) * (1 + w)`, in place.
pub fn rms_norm_centred(x: &mut [f32], w: &[f32], eps: f32) {
    let variance = dot(x, x) / x.len() as f32;
    let r = 1.0 / (variance + eps).sqrt();
    for (v, &g) in x.iter_mut().zip(w) {
        *v = (*v * r) * (1.0 + g);
    }
}

/// The gated DeltaNet's l2norm: `x * rsqrt(sum(x^2) + eps)`, in place.
pub fn l2_norm(x: &mut [f32], eps: f32) {
    let r = 1.0 / (dot(x, x) + eps).sqrt();
    for v in x.iter_mut() {
        *v *= r;
    }
}

/// `x * sigmoid(x)`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `1 / (1 + exp(-x))`.
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `F.softplus` with torch's defaults (beta 1, threshold 20: linear above it).
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Softmax over `s` in place: `exp(s - max) / sum`.
pub fn softmax(s: &mut [f32]) {
    let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in s.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in s.iter_mut() {
        *v /= sum;
    }
}

/// Rotary position embedding, NeoX layout (rotate-half) over the whole head.
#[derive(Debug, Clone)]
pub struct Rope {
    /// `1 / theta^(2i/d)`, computed in fp32 as transformers' `compute_default_rope_parameters`
    /// does: `1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))`.
    inv_freq: Vec<f32>,
}

impl Rope {
    pub fn new(head_dim: usize, theta: f64) -> Rope {
        let base = theta as f32;
        let inv_freq = (0..head_dim / 2)
            .map(|i| 1.0 / base.powf((2 * i) as f32 / head_dim as f32))
            .collect();
        Rope { inv_freq }
    }

    /// `x * cos + rotate_half(x) * sin` at `pos`; the angle is the fp32 product `pos * inv_freq`
    /// (transformers' `inv_freq @ position_ids` in float32), its cos/sin rounded to fp32.
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        let half = self.inv_freq.len();
        debug_assert_eq!(x.len(), 2 * half);
        for (i, &f) in self.inv_freq.iter().enumerate() {
            let angle = f64::from(pos as f32 * f);
            let (sin, cos) = (angle.sin() as f32, angle.cos() as f32);
            let (a, b) = (x[i], x[i + half]);
            x[i] = a * cos + (-b) * sin;
            x[i + half] = b * cos + a * sin;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_and_linear_match_f64() {
        let a: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let want: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum();
        assert!((f64::from(dot(&a, &b)) - want).abs() < 1e-5);
        // Two outputs of two rows: y = x W^T.
        let w = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let x = [1.0, 0.0, -1.0, 0.5, 0.5, 0.5];
        let mut y = [0.0; 4];
        linear(&w, 2, &x, 3, &mut y);
        assert_eq!(y, [-2.0, -2.0, 3.0, 7.5]);
    }

    #[test]
    fn norm_softmax_silu_values() {
        let mut x = [3.0f32, 4.0];
        rms_norm(&mut x, &[1.0, 2.0], 0.0);
        let r = (12.5f32).sqrt();
        assert!((x[0] - 3.0 / r).abs() < 1e-6 && (x[1] - 8.0 / r).abs() < 1e-6);
        let mut s = [0.0f32, (2.0f32).ln()];
        softmax(&mut s);
        assert!((s[0] - 1.0 / 3.0).abs() < 1e-6 && (s[1] - 2.0 / 3.0).abs() < 1e-6);
        assert_eq!(silu(0.0), 0.0);
        assert!((silu(2.0) - 2.0 / (1.0 + (-2.0f32).exp())).abs() < 1e-7);
    }

    #[test]
    fn hybrid_helpers_match_their_formulas() {
        let mut x = [3.0f32, 4.0];
        rms_norm_centred(&mut x, &[0.0, 1.0], 0.0);
        let r = (12.5f32).sqrt();
        assert!((x[0] - 3.0 / r).abs() < 1e-6 && (x[1] - 8.0 / r).abs() < 1e-6);
        let mut y = [3.0f32, 4.0];
        l2_norm(&mut y, 0.0);
        assert!((y[0] - 0.6).abs() < 1e-6 && (y[1] - 0.8).abs() < 1e-6);
        assert!((sigmoid(0.0) - 0.5).abs() < 1e-7);
        assert!((softplus(0.0) - 2.0f32.ln()).abs() < 1e-6);
        assert_eq!(softplus(30.0), 30.0);
        assert!((softplus(-5.0) - (1.0 + (-5.0f32).exp()).ln()).abs() < 1e-7);
    }

    #[test]
    fn rope_rotates_pairs_half_a_head_apart() {
        let rope = Rope::new(4, 10_000.0);
        // inv_freq = [1, 1/100]; position 0 is the identity.
        let mut x = [1.0f32, 2.0, 3.0, 4.0];
        rope.apply(&mut x, 0);
        assert_eq!(x, [1.0, 2.0, 3.0, 4.0]);
        rope.apply(&mut x, 1);
        let (c, s) = (1.0f32.cos(), 1.0f32.sin());
        assert!((x[0] - (c - 3.0 * s)).abs() < 1e-6);
        assert!((x[2] - (3.0 * c + s)).abs() < 1e-6);
        let (c2, s2) = ((0.01f32).cos(), (0.01f32).sin());
        assert!((x[1] - (2.0 * c2 - 4.0 * s2)).abs() < 1e-6);
        // A rotation keeps each pair's length.
        assert!(((x[0] * x[0] + x[2] * x[2]) - 10.0).abs() < 1e-5);
    }
}
