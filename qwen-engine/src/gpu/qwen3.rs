//! The dense Qwen3 forward pass on the GPU: per layer a decode pass is five launches,
//!
//! ```text
//! qkv      gemv_norm  x = rmsnorm(h) -> [q; k; v]
//! attn     attention  q/k norm, RoPE, k and v into the paged cache; split-KV over each row's blocks
//! o_proj   gemv       h += o
//! gate_up  gemv_norm  x = rmsnorm(h) -> silu(gate) * up
//! down     gemv       h += down
//! ```
//!
//! then `lm_head` (with the final norm) and sampling (the equations of `model::qwen3`).

use aot_kernels::ops::attention::{attention_decode, AttnDecode, AttnScratch};
use aot_kernels::ops::embedding::embedding;
use aot_kernels::ops::gemv::{
    gemv, gemv_with, residual_groups, GemvInput, GemvOptions, GemvOutput,
};
use aot_kernels::ops::{dev, dev_mut, OpsError};

use aot_kernels::device::CudaSlice;
use aot_kernels::dispatch::LoadedKernels;
use half::bf16;

use super::persistent::DecodeStep;
use super::weights::LayerWeights;
use super::{inputs, GpuRunner, PassBuffers};
use crate::model::Qwen3Config;

impl GpuRunner {
    /// Launches one forward pass over the first `m` rows of the pass buffers; attention with
    /// `grid_splits` splits deep, pipelined or not, its splits merged in clusters or not.
    pub(super) fn launch_forward(
        &mut self,
        m: usize,
        grid_splits: usize,
        pipelined: bool,
        cluster: bool,
    ) -> Result<(), OpsError> {
        if self.step.step != DecodeStep::Launches {
            return self.launch_forward_persistent(m, grid_splits, pipelined, cluster);
        }
        let c = &self.cfg;
        let kernels = &self.kernels;
        let b = &mut self.b;
        let (h, i, v) = (c.hidden_size, c.intermediate_size, c.vocab_size);
        let eps = c.rms_norm_eps as f32;
        embedding(
            kernels,
            dev_mut(kernels, &mut b.h),
            h,
            Some(dev_mut(kernels, &mut b.ssq)),
            dev(kernels, &self.w.embed),
            v,
            h,
            dev(kernels, &inputs::tokens(&b.inputs)),
            m,
        )?;
        let mut ssq_groups = 1;
        // qkv and o_proj stage their first weights while the kernel before them (down or the
        // embedding; attention) still runs, and attention requests its first cache blocks while
        // qkv ends, where the GPU and image allow it (GemvOptions, AttnDecode).
        let overlap = GemvOptions::overlap_previous(true);
        for (l, lw) in self.w.layers.iter().enumerate() {
            gemv_with(
                kernels,
                dev(kernels, &lw.qkv),
                c.qkv_dim(),
                h,
                m,
                &GemvInput::Norm {
                    h: dev(kernels, &b.h),
                    ld_h: h,
                    ssq: dev(kernels, &b.ssq),
                    ssq_groups,
                    weight: dev(kernels, &lw.input_norm),
                    eps,
                    weight_offset: 0.0,
                },
                GemvOutput::Bf16 {
                    out: dev_mut(kernels, &mut b.qkv),
                    ld_out: c.qkv_dim(),
                },
                overlap,
            )?;
            attention_layer(
                kernels,
                c,
                AttnLayer {
                    lw,
                    k_cache: &mut self.k_cache[l],
                    v_cache: &mut self.v_cache[l],
                    rope: &self.rope,
                    max_pos: self.max_pos,
                    block_table: &self.block_table,
                    ld_bt: self.ld_bt,
                },
                b,
                (m, grid_splits, pipelined, cluster),
            )?;
            gemv_with(
                kernels,
                dev(kernels, &lw.o),
                h,
                c.q_dim(),
                m,
                &GemvInput::Plain {
                    x: dev(kernels, &b.attn),
                    ld_x: c.q_dim(),
                },
                GemvOutput::Residual {
                    h: dev_mut(kernels, &mut b.h),
                    ld_h: h,
                    ssq_out: dev_mut(kernels, &mut b.ssq),
                },
                overlap,
            )?;
            ssq_groups = residual_groups(h);
            gemv(
                kernels,
                dev(kernels, &lw.gate_up),
                2 * i,
                h,
                m,
                &GemvInput::Norm {
                    h: dev(kernels, &b.h),
                    ld_h: h,
                    ssq: dev(kernels, &b.ssq),
                    ssq_groups,
                    weight: dev(kernels, &lw.post_norm),
                    eps,
                    weight_offset: 0.0,
                },
                GemvOutput::SiluMul {
                    out: dev_mut(kernels, &mut b.act),
                    ld_out: i,
                    intermediate: i,
                },
            )?;
            gemv(
                kernels,
                dev(kernels, &lw.down),
                h,
                i,
                m,
                &GemvInput::Plain {
                    x: dev(kernels, &b.act),
                    ld_x: i,
                },
                GemvOutput::Residual {
                    h: dev_mut(kernels, &mut b.h),
                    ld_h: h,
                    ssq_out: dev_mut(kernels, &mut b.ssq),
                },
            )?;
        }
        gemv(
            kernels,
            dev(kernels, self.w.lm_head()),
            v,
            h,
            m,
            &GemvInput::Norm {
                h: dev(kernels, &b.h),
                ld_h: h,
                ssq: dev(kernels, &b.ssq),
                ssq_groups,
                weight: dev(kernels, &self.w.final_norm),
                eps,
                weight_offset: 0.0,
            },
            GemvOutput::F32 {
                out: dev_mut(kernels, &mut b.logits),
                ld_out: v,
            },
        )?;
        b.sample(kernels, m, v)
    }
}

/// One layer's attention inputs beside the pass buffers.
pub(super) struct AttnLayer<'a> {
    pub lw: &'a LayerWeights,
    pub k_cache: &'a mut CudaSlice<bf16>,
    pub v_cache: &'a mut CudaSlice<bf16>,
    pub rope: &'a CudaSlice<f32>,
    pub max_pos: usize,
    pub block_table: &'a CudaSlice<i32>,
    pub ld_bt: usize,
}

/// A layer's decode attention over the first `m` rows of the pass buffers: `qkv` in, `attn` out
/// (`(m, grid_splits, pipelined, cluster)` as [`GpuRunner::launch_forward`] takes them).
pub(super) fn attention_layer(
    kernels: &LoadedKernels,
    c: &Qwen3Config,
    a: AttnLayer<'_>,
    b: &mut PassBuffers,
    (m, grid_splits, pipelined, cluster): (usize, usize, bool, bool),
) -> Result<(), OpsError> {
    let eps = c.rms_norm_eps as f32;
    let lw = a.lw;
    attention_decode(
        kernels,
        AttnDecode {
            qkv: dev(kernels, &b.qkv),
            ld_qkv: c.qkv_dim(),
            q_norm: dev(kernels, &lw.q_norm),
            k_norm: dev(kernels, &lw.k_norm),
            eps,
            weight_offset: 0.0,
            cos_sin: dev(kernels, a.rope),
            max_pos: a.max_pos,
            k_cache: dev_mut(kernels, a.k_cache),
            v_cache: dev_mut(kernels, a.v_cache),
            block_table: dev(kernels, a.block_table),
            ld_bt: a.ld_bt,
            slot_of_row: dev(kernels, &inputs::slots(&b.inputs)),
            positions: dev(kernels, &inputs::positions(&b.inputs)),
            out: dev_mut(kernels, &mut b.attn),
            m,
            q_heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            grid_splits,
            pipelined,
            cluster,
            // Its first cache blocks stream while qkv ends; positions, slots and the
            // block table are host copies, the cache's earlier positions earlier steps'.
            overlap_previous: true,
        },
        &mut AttnScratch {
            ws_ml: dev_mut(kernels, &mut b.attn_ml),
            ws_o: dev_mut(kernels, &mut b.attn_o),
            counters: dev_mut(kernels, &mut b.attn_counters),
        },
    )
}
