//! Inputs for the Triton kernels' GPU tests at the real Qwen3.6-35B-A3B shapes: fresh random
//! data (the seed is printed), the device buffers, and the cases written for the transformers
//! oracle (scripts/triton_oracle.py).

#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use aot_kernels::ops::gated_delta_net::{
    GdnInputs, GdnLayer, GdnParamsHost, GdnSequences, GdnShape, SeqSpec,
};
use aot_kernels::ops::moe::{MoeLayer, MoeShape, MoeWeightsHost};
use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use half::bf16;
use rand::{Rng, SeedableRng};

pub const GDN: GdnShape = GdnShape::QWEN3_5_A3B;
pub const MOE: MoeShape = MoeShape::QWEN3_5_A3B;

pub fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

pub fn bf(rng: &mut impl Rng, n: usize, scale: f32) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(rng.gen_range(-scale..scale)))
        .collect()
}

/// splitmix64: the counter-based generator the oracle reimplements in numpy, so both sides make
/// the same 800 M expert weights without writing them to disk.
pub fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Element `i` of tensor `stream` for `seed`: uniform in [-scale, scale) (scale a power of two),
/// computed exactly in f32 and rounded to bf16, the same in Rust and numpy.
pub fn hashed(seed: u64, stream: u64, i: u64, scale: f32) -> bf16 {
    let u = (splitmix(seed ^ (stream << 48) ^ i) >> 40) as f32 / 16_777_216.0;
    bf16::from_f32((u * 2.0 - 1.0) * scale)
}

pub fn hashed_vec(seed: u64, stream: u64, n: usize, scale: f32) -> Vec<bf16> {
    (0..n as u64)
        .map(|i| hashed(seed, stream, i, scale))
        .collect()
}

pub fn upload<T: DeviceRepr>(stream: &Arc<CudaStream>, v: &[T]) -> CudaSlice<T> {
    stream.clone_htod(v).unwrap()
}

pub fn download<T: DeviceRepr + ValidAsZeroBits + Clone + Default>(
    stream: &Arc<CudaStream>,
    s: &CudaSlice<T>,
) -> Vec<T> {
    stream.clone_dtoh(s).unwrap()
}

/// One GDN layer's parameters, random but shaped like the model's.
pub fn gdn_params(rng: &mut impl Rng) -> GdnParamsHost {
    let s = GDN;
    GdnParamsHost {
        conv_weight: bf(rng, s.conv_dim() * s.conv_width, 0.5),
        // As the model initialises them: A in [0.01, 16), dt_bias around 1; stored bf16-exact.
        a_log: (0..s.value_heads)
            .map(|_| bf16::from_f32(rng.gen_range(0.01f32..16.0).ln()).to_f32())
            .collect(),
        dt_bias: (0..s.value_heads)
            .map(|_| bf16::from_f32(rng.gen_range(0.5f32..1.5)).to_f32())
            .collect(),
        norm_weight: (0..s.value_dim)
            .map(|_| bf16::from_f32(rng.gen_range(0.5f32..1.5)))
            .collect(),
        eps: 1e-6,
    }
}

/// One batch's inputs for `tokens` tokens.
pub struct GdnBatchHost {
    pub seqs: Vec<SeqSpec>,
    pub qkv: Vec<bf16>,
    pub a: Vec<bf16>,
    pub b: Vec<bf16>,
    pub z: Vec<bf16>,
}

pub fn gdn_batch(
    rng: &mut impl Rng,
    lens: &[usize],
    slots: &[usize],
    has_state: &[bool],
) -> GdnBatchHost {
    let s = GDN;
    let mut seqs = Vec::new();
    let mut start = 0;
    for ((&len, &slot), &has) in lens.iter().zip(slots).zip(has_state) {
        seqs.push(SeqSpec {
            start,
            len,
            slot,
            has_state: has,
        });
        start += len;
    }
    GdnBatchHost {
        seqs,
        qkv: bf(rng, start * s.conv_dim(), 2.0),
        a: bf(rng, start * s.value_heads, 2.0),
        b: bf(rng, start * s.value_heads, 3.0),
        z: bf(rng, start * s.value_width(), 2.0),
    }
}

pub fn cu_seqlens(seqs: &[SeqSpec]) -> Vec<i32> {
    let mut v = vec![0i32];
    for s in seqs {
        v.push((s.start + s.len) as i32);
    }
    v
}

/// Expert weights from the hashed generator (streams 1 and 2), the rest from `rng`.
pub fn moe_weights(rng: &mut impl Rng, seed: u64) -> MoeWeightsHost {
    let (h, e, i) = (MOE.hidden, MOE.experts, MOE.inter);
    MoeWeightsHost {
        router: bf(rng, e * h, 0.05),
        shared_gate: bf(rng, h, 0.05),
        gate_up: hashed_vec(seed, 1, e * 2 * i * h, 0.0625),
        down: hashed_vec(seed, 2, e * h * i, 0.0625),
        shared_gate_up: bf(rng, 2 * i * h, 0.0625),
        shared_down: bf(rng, h * i, 0.0625),
    }
}

/// Writes raw little-endian arrays for the oracle.
pub fn write_bf16(dir: &Path, name: &str, v: &[bf16]) {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
    std::fs::write(dir.join(format!("{name}.bf16")), bytes).unwrap();
}

pub fn write_f32(dir: &Path, name: &str, v: &[f32]) {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(dir.join(format!("{name}.f32")), bytes).unwrap();
}

pub fn write_i32(dir: &Path, name: &str, v: &[i32]) {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(dir.join(format!("{name}.i32")), bytes).unwrap();
}

/// How far a bf16 result is from its reference: max |difference| relative to the largest
/// reference value, and the share of elements within 2 ulps.
pub fn bf16_error(got: &[bf16], want: &[bf16]) -> (f64, f64) {
    assert_eq!(got.len(), want.len());
    let scale = want
        .iter()
        .map(|v| f64::from(v.to_f32().abs()))
        .fold(1e-30, f64::max);
    let max = got
        .iter()
        .zip(want)
        .map(|(g, w)| f64::from((g.to_f32() - w.to_f32()).abs()))
        .fold(0.0, f64::max);
    let near = got
        .iter()
        .zip(want)
        .filter(|(g, w)| aot_kernels::ops::compare::ulp_distance(**g, **w) <= 2)
        .count();
    (max / scale, near as f64 / got.len() as f64)
}

/// The share of elements of a bf16 result within 2 ulps of its reference, an ulp taken at
/// `chain[i]`, the largest magnitude element i's chain of bf16 roundings passed through (e.g.
/// `MoeReference::out_chain`): a rounding that lands the other way in one step moves the result by
/// an ulp of that step, not of the result.
pub fn bf16_chain_near(got: &[bf16], want: &[bf16], chain: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    assert_eq!(got.len(), chain.len());
    let ulp = |v: f32| -> f32 {
        let b = bf16::from_f32(v.abs().max(f32::MIN_POSITIVE));
        f32::from_bits((b.to_f32().to_bits() & 0x7f80_0000).saturating_sub(7 << 23))
            .max(f32::MIN_POSITIVE)
    };
    let near = got
        .iter()
        .zip(want)
        .zip(chain)
        .filter(|((g, w), c)| (g.to_f32() - w.to_f32()).abs() <= 2.0 * ulp(c.max(w.to_f32().abs())))
        .count();
    near as f64 / got.len().max(1) as f64
}

/// How far an fp32 result is from its reference: max |difference| relative to the largest
/// reference value, and the share of elements within `F32_NEAR_REL` of it.
pub fn f32_error(got: &[f32], want: &[f32]) -> (f64, f64) {
    assert_eq!(got.len(), want.len());
    let scale = want
        .iter()
        .map(|v| f64::from(v.abs()))
        .fold(1e-30, f64::max);
    let diffs = got
        .iter()
        .zip(want)
        .map(|(g, w)| f64::from((g - w).abs()) / scale);
    let (max, near) = diffs.fold((0.0f64, 0usize), |(m, n), d| {
        (m.max(d), n + usize::from(d <= F32_NEAR_REL))
    });
    (max, near as f64 / got.len().max(1) as f64)
}

/// The tolerances every comparison uses (against the CPU reference and, in the oracle, against
/// transformers). bf16 outputs: within 2% of the tensor's largest value everywhere and within 2
/// ulps for 98% of elements (a bf16 rounding that lands the other way in one intermediate, as a
/// different fp32 summation order makes it, cascades through the later bf16 roundings). fp32
/// states: 99.9% of elements within 1e-4 of the largest value (TF32x3 products, fast exp), all
/// within 1%: one flipped bf16 conv output moves a whole state column by about beta |k| ulp(v).
pub const BF16_MAX_REL: f64 = 0.02;
pub const BF16_NEAR_SHARE: f64 = 0.98;
pub const F32_MAX_REL: f64 = 0.01;
pub const F32_NEAR_REL: f64 = 1e-4;
pub const F32_NEAR_SHARE: f64 = 0.999;

/// The GDN inputs every GPU test uses: one layer, random states for `slots` slots, a decode batch
/// of 8 requests in scattered slots and a varlen prefill batch (150, 37 and 1 tokens, the 37 a new
/// request over a stale slot).
pub struct GdnFixture {
    pub params: GdnParamsHost,
    pub conv0: Vec<bf16>,
    pub rec0: Vec<f32>,
    pub decode: GdnBatchHost,
    pub prefill: GdnBatchHost,
}

pub fn gdn_fixture(rng: &mut impl Rng, slots: usize) -> GdnFixture {
    let params = gdn_params(rng);
    let conv0 = bf(rng, slots * GDN.conv_state_len(), 2.0);
    let rec0 = (0..slots * GDN.recurrent_state_len())
        .map(|_| rng.gen_range(-0.5f32..0.5))
        .collect();
    let decode = gdn_batch(rng, &[1; 8], &[3, 0, 7, 11, 5, 1, 9, 2], &[true; 8]);
    let prefill = gdn_batch(rng, &[150, 37, 1], &[4, 6, 8], &[true, false, true]);
    GdnFixture {
        params,
        conv0,
        rec0,
        decode,
        prefill,
    }
}

/// A GDN layer's parameters and one batch on the device, lent out as the launchers' views.
pub struct GdnDevice {
    conv_weight: CudaSlice<bf16>,
    a_log: CudaSlice<f32>,
    dt_bias: CudaSlice<f32>,
    norm_weight: CudaSlice<bf16>,
    eps: f32,
    cu_seqlens: CudaSlice<i32>,
    slots: CudaSlice<i32>,
    has_state: CudaSlice<i32>,
    qkv: CudaSlice<bf16>,
    a: CudaSlice<bf16>,
    b: CudaSlice<bf16>,
    z: CudaSlice<bf16>,
    pub n_seqs: usize,
    pub n_tokens: usize,
}

impl GdnDevice {
    pub fn new(st: &Arc<CudaStream>, p: &GdnParamsHost, batch: &GdnBatchHost) -> Self {
        let slots: Vec<i32> = batch.seqs.iter().map(|s| s.slot as i32).collect();
        let has: Vec<i32> = batch.seqs.iter().map(|s| i32::from(s.has_state)).collect();
        GdnDevice {
            conv_weight: upload(st, &p.conv_weight),
            a_log: upload(st, &p.a_log),
            dt_bias: upload(st, &p.dt_bias),
            norm_weight: upload(st, &p.norm_weight),
            eps: p.eps,
            cu_seqlens: upload(st, &cu_seqlens(&batch.seqs)),
            slots: upload(st, &slots),
            has_state: upload(st, &has),
            qkv: upload(st, &batch.qkv),
            a: upload(st, &batch.a),
            b: upload(st, &batch.b),
            z: upload(st, &batch.z),
            n_seqs: batch.seqs.len(),
            n_tokens: batch.seqs.iter().map(|s| s.len).sum(),
        }
    }

    pub fn layer(&self) -> GdnLayer<'_> {
        GdnLayer {
            conv_weight: &self.conv_weight,
            a_log: &self.a_log,
            dt_bias: &self.dt_bias,
            norm_weight: &self.norm_weight,
            eps: self.eps,
        }
    }

    pub fn seqs(&self) -> GdnSequences<'_> {
        GdnSequences {
            n_seqs: self.n_seqs,
            n_tokens: self.n_tokens,
            cu_seqlens: &self.cu_seqlens,
            slots: &self.slots,
            has_state: &self.has_state,
        }
    }

    pub fn inputs(&self) -> GdnInputs<'_> {
        GdnInputs {
            qkv: &self.qkv,
            a: &self.a,
            b: &self.b,
            z: &self.z,
        }
    }
}

/// An MoE block's weights on the device.
pub struct MoeDevice {
    router: CudaSlice<bf16>,
    shared_gate: CudaSlice<bf16>,
    gate_up: CudaSlice<bf16>,
    down: CudaSlice<bf16>,
    shared_gate_up: CudaSlice<bf16>,
    shared_down: CudaSlice<bf16>,
}

impl MoeDevice {
    /// `gate_up` and `down` replace the host weights' experts (for NaN-poisoned copies).
    pub fn new(st: &Arc<CudaStream>, w: &MoeWeightsHost, gate_up: &[bf16], down: &[bf16]) -> Self {
        MoeDevice {
            router: upload(st, &w.router),
            shared_gate: upload(st, &w.shared_gate),
            gate_up: upload(st, gate_up),
            down: upload(st, down),
            shared_gate_up: upload(st, &w.shared_gate_up),
            shared_down: upload(st, &w.shared_down),
        }
    }

    pub fn layer(&self) -> MoeLayer<'_> {
        MoeLayer {
            router: &self.router,
            shared_gate: &self.shared_gate,
            gate_up: &self.gate_up,
            down: &self.down,
            shared_gate_up: &self.shared_gate_up,
            shared_down: &self.shared_down,
        }
    }
}
