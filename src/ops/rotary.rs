//! Rotary position embedding, NeoX (rotate-half) layout (module `rotary`), in place on q and k.

use cudarc::driver::{CudaSlice, LaunchConfig};
use half::bf16;

use super::launch::{block_threads, check_len, launch, to_i32, Arg, OpsError};
use crate::dispatch::LoadedKernels;

pub const MODULE: &str = "rotary";
pub const ENTRY: &str = "rotary_neox_bf16";
/// The (module, entry) pairs this file's launchers call ([`super::launched_entries`]).
pub const LAUNCHED: &[(&str, &str)] = &[(MODULE, ENTRY)];

/// Shape of one rotary call: `tokens` tokens of `q_heads` and `kv_heads` heads of `head_dim`,
/// rotating the first `rot_dim` dimensions of each head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotaryParams {
    pub tokens: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rot_dim: usize,
}

/// The `[max_position, rot_dim]` fp32 table the kernel reads: `cos(p * f_i)` for the first half,
/// `sin(p * f_i)` for the second, `f_i = theta^(-2i / rot_dim)`. Computed in float64.
pub fn cos_sin_cache(max_position: usize, rot_dim: usize, theta: f64) -> Vec<f32> {
    let half = rot_dim / 2;
    let mut cache = Vec::with_capacity(max_position * rot_dim);
    for p in 0..max_position {
        let angles: Vec<f64> = (0..half)
            .map(|i| p as f64 * theta.powf(-(2.0 * i as f64) / rot_dim as f64))
            .collect();
        cache.extend(angles.iter().map(|a| a.cos() as f32));
        cache.extend(angles.iter().map(|a| a.sin() as f32));
    }
    cache
}

fn rotate_heads(x: &mut [bf16], heads: usize, p: &RotaryParams, cs: &[f32]) {
    let half = p.rot_dim / 2;
    for head in x.chunks_exact_mut(p.head_dim).take(heads) {
        for i in 0..half {
            let (c, s) = (f64::from(cs[i]), f64::from(cs[i + half]));
            let (x1, x2) = (
                f64::from(head[i].to_f32()),
                f64::from(head[i + half].to_f32()),
            );
            head[i] = bf16::from_f64(x1 * c - x2 * s);
            head[i + half] = bf16::from_f64(x2 * c + x1 * s);
        }
    }
}

/// Reference for `rotary_neox_bf16` on contiguous `q` (`tokens x q_heads x head_dim`) and `k`.
pub fn rotary_neox_reference(
    q: &mut [bf16],
    k: &mut [bf16],
    positions: &[i32],
    cos_sin: &[f32],
    p: &RotaryParams,
) {
    assert_eq!(q.len(), p.tokens * p.q_heads * p.head_dim, "q shape");
    assert_eq!(k.len(), p.tokens * p.kv_heads * p.head_dim, "k shape");
    assert!(
        p.rot_dim <= p.head_dim && p.rot_dim.is_multiple_of(2),
        "rot_dim must be even and at most head_dim"
    );
    for (t, &pos) in positions.iter().enumerate().take(p.tokens) {
        let cs = &cos_sin[pos as usize * p.rot_dim..(pos as usize + 1) * p.rot_dim];
        rotate_heads(
            &mut q[t * p.q_heads * p.head_dim..(t + 1) * p.q_heads * p.head_dim],
            p.q_heads,
            p,
            cs,
        );
        rotate_heads(
            &mut k[t * p.kv_heads * p.head_dim..(t + 1) * p.kv_heads * p.head_dim],
            p.kv_heads,
            p,
            cs,
        );
    }
}

/// Applies NeoX rotary in place on the GPU. `q`, `k` are contiguous per token; `positions` holds
/// `tokens` positions, each below `max_position`, the number of rows in `cos_sin`. Positions live
/// on the device, so they are checked there: one out of range makes the kernel trap (the launch
/// fails and the CUDA context is lost) rather than read past the table.
pub fn rotary_neox(
    kernels: &LoadedKernels,
    q: &mut CudaSlice<bf16>,
    k: &mut CudaSlice<bf16>,
    positions: &CudaSlice<i32>,
    cos_sin: &CudaSlice<f32>,
    max_position: usize,
    p: &RotaryParams,
) -> Result<(), OpsError> {
    let op = "rotary_neox";
    if p.tokens == 0 || p.rot_dim == 0 || !p.rot_dim.is_multiple_of(2) || p.rot_dim > p.head_dim {
        return Err(OpsError::Shape {
            op,
            message: format!("{p:?}: need tokens > 0 and an even rot_dim in 2..=head_dim"),
        });
    }
    check_len(op, "q", q, &[p.tokens, p.q_heads, p.head_dim])?;
    check_len(op, "k", k, &[p.tokens, p.kv_heads, p.head_dim])?;
    check_len(op, "positions", positions, &[p.tokens])?;
    check_len(op, "cos_sin", cos_sin, &[max_position, p.rot_dim])?;
    let cfg = LaunchConfig {
        grid_dim: (
            u32::try_from(p.tokens).map_err(|_| OpsError::Shape {
                op,
                message: "too many tokens".into(),
            })?,
            1,
            1,
        ),
        block_dim: (
            block_threads((p.q_heads + p.kv_heads) * p.rot_dim / 2),
            1,
            1,
        ),
        shared_mem_bytes: 0,
    };
    let q_stride = to_i32(op, "q token stride", p.q_heads * p.head_dim)?;
    let k_stride = to_i32(op, "k token stride", p.kv_heads * p.head_dim)?;
    launch(
        kernels,
        op,
        MODULE,
        ENTRY,
        cfg,
        &mut [
            Arg::Out(q),
            Arg::Out(k),
            Arg::InI32(positions),
            Arg::InF32(cos_sin),
            Arg::I32(to_i32(op, "max_position", max_position)?),
            Arg::I32(to_i32(op, "q_heads", p.q_heads)?),
            Arg::I32(to_i32(op, "kv_heads", p.kv_heads)?),
            Arg::I32(to_i32(op, "head_dim", p.head_dim)?),
            Arg::I32(to_i32(op, "rot_dim", p.rot_dim)?),
            Arg::I32(q_stride),
            Arg::I32(k_stride),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn position_zero_is_identity_and_pairs_keep_their_norm() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
        let p = RotaryParams {
            tokens: 2,
            q_heads: 2,
            kv_heads: 1,
            head_dim: 16,
            rot_dim: 8,
        };
        let cache = cos_sin_cache(64, p.rot_dim, 1e6);
        let q0: Vec<bf16> = (0..p.tokens * p.q_heads * p.head_dim)
            .map(|_| bf16::from_f32(rng.gen_range(-2.0..2.0)))
            .collect();
        let k0: Vec<bf16> = (0..p.tokens * p.kv_heads * p.head_dim)
            .map(|_| bf16::from_f32(rng.gen_range(-2.0..2.0)))
            .collect();
        let (mut q, mut k) = (q0.clone(), k0.clone());
        rotary_neox_reference(&mut q, &mut k, &[0, 37], &cache, &p);
        // Token 0 at position 0: cos 1, sin 0.
        assert_eq!(q[..p.q_heads * p.head_dim], q0[..p.q_heads * p.head_dim]);
        // Token 1: each (i, i + half) pair keeps its length; dims past rot_dim are untouched.
        let base = p.q_heads * p.head_dim;
        for i in 0..p.rot_dim / 2 {
            let n0 = q0[base + i].to_f32().hypot(q0[base + i + 4].to_f32());
            let n1 = q[base + i].to_f32().hypot(q[base + i + 4].to_f32());
            assert!((n0 - n1).abs() <= n0 * 0.01 + 1e-3, "{n0} {n1}");
        }
        assert_eq!(
            q[base + p.rot_dim..base + p.head_dim],
            q0[base + p.rot_dim..base + p.head_dim]
        );
        assert_ne!(k[p.head_dim..], k0[p.head_dim..]);
    }
}
