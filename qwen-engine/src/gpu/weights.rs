//! The model's weights on the GPU, in the layout the kernels read: per layer one fused `[q; k; v]`
//! projection and one fused `[gate; up]` projection (row blocks of the checkpoint's matrices, so
//! the prefill GEMM and the decode GEMV read the same buffers). Uploaded from a checkpoint, or
//! generated on the GPU for synthetic models (the same values the CPU generator makes).

use aot_kernels::device::CudaSlice;
use aot_kernels::dispatch::LoadedKernels;
use aot_kernels::ops::dev_mut;
use aot_kernels::ops::init::fill_uniform_bf16;
use half::bf16;

use super::dev_err;
use crate::model::qwen3::{tensor_table, Qwen3Config};
use crate::model::{Role, TensorSpec};
use crate::runner::RunnerError;
use crate::weights::Weights;

pub struct LayerWeights {
    pub qkv: CudaSlice<bf16>,
    pub o: CudaSlice<bf16>,
    pub gate_up: CudaSlice<bf16>,
    pub down: CudaSlice<bf16>,
    pub input_norm: CudaSlice<bf16>,
    pub post_norm: CudaSlice<bf16>,
    pub q_norm: CudaSlice<bf16>,
    pub k_norm: CudaSlice<bf16>,
}

pub struct DeviceWeights {
    pub embed: CudaSlice<bf16>,
    /// `None` when tied to the embedding.
    pub lm_head: Option<CudaSlice<bf16>>,
    pub final_norm: CudaSlice<bf16>,
    pub layers: Vec<LayerWeights>,
    pub bytes: usize,
}

impl DeviceWeights {
    pub fn lm_head(&self) -> &CudaSlice<bf16> {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }
}

/// Where a tensor lands inside its device buffer: the buffer's role and the row offset.
fn placement(c: &Qwen3Config, role: Role) -> (Role, usize) {
    let h = c.head_dim;
    match role {
        Role::QProj => (Role::QProj, 0),
        Role::KProj => (Role::QProj, c.num_attention_heads * h * c.hidden_size),
        Role::VProj => (
            Role::QProj,
            (c.num_attention_heads + c.num_key_value_heads) * h * c.hidden_size,
        ),
        Role::GateProj => (Role::GateProj, 0),
        Role::UpProj => (Role::GateProj, c.intermediate_size * c.hidden_size),
        other => (other, 0),
    }
}

/// Allocates every buffer and fills it from `weights`; `progress` is told each tensor's bytes.
pub fn upload(
    kernels: &LoadedKernels,
    c: &Qwen3Config,
    weights: &Weights,
    progress: &mut dyn FnMut(usize),
) -> Result<DeviceWeights, RunnerError> {
    let s = kernels.stream();
    let alloc = |n: usize, what: &str| -> Result<CudaSlice<bf16>, RunnerError> {
        // SAFETY: every element is written below before any kernel reads it.
        unsafe { s.alloc::<bf16>(n) }.map_err(dev_err(what))
    };
    let (hd, h, i) = (c.head_dim, c.hidden_size, c.intermediate_size);
    let mut layers = Vec::with_capacity(c.num_hidden_layers);
    for _ in 0..c.num_hidden_layers {
        layers.push(LayerWeights {
            qkv: alloc(c.qkv_dim() * h, "qkv weights")?,
            o: alloc(h * c.q_dim(), "o_proj weights")?,
            gate_up: alloc(2 * i * h, "gate_up weights")?,
            down: alloc(h * i, "down_proj weights")?,
            input_norm: alloc(h, "norm weights")?,
            post_norm: alloc(h, "norm weights")?,
            q_norm: alloc(hd, "q_norm weights")?,
            k_norm: alloc(hd, "k_norm weights")?,
        });
    }
    let mut dw = DeviceWeights {
        embed: alloc(c.vocab_size * h, "embedding")?,
        lm_head: if c.tie_word_embeddings {
            None
        } else {
            Some(alloc(c.vocab_size * h, "lm_head")?)
        },
        final_norm: alloc(h, "final norm")?,
        layers,
        bytes: 0,
    };
    for (index, spec) in tensor_table(c).into_iter().enumerate() {
        let (buffer_role, offset) = placement(c, spec.role);
        let dst = buffer(&mut dw, buffer_role, spec.layer)?;
        fill(kernels, dst, offset, &spec, weights, index)?;
        dw.bytes += spec.elements() * 2;
        progress(spec.elements() * 2);
    }
    s.synchronize().map_err(dev_err("uploading weights"))?;
    Ok(dw)
}

fn buffer(
    dw: &mut DeviceWeights,
    role: Role,
    layer: Option<usize>,
) -> Result<&mut CudaSlice<bf16>, RunnerError> {
    let missing =
        || RunnerError::Device(format!("no device buffer for {role:?} of layer {layer:?}"));
    if let Some(l) = layer {
        let lw = dw.layers.get_mut(l).ok_or_else(missing)?;
        return Ok(match role {
            Role::QProj => &mut lw.qkv,
            Role::OProj => &mut lw.o,
            Role::GateProj => &mut lw.gate_up,
            Role::DownProj => &mut lw.down,
            Role::InputNorm => &mut lw.input_norm,
            Role::PostNorm => &mut lw.post_norm,
            Role::QNorm => &mut lw.q_norm,
            Role::KNorm => &mut lw.k_norm,
            _ => return Err(missing()),
        });
    }
    match role {
        Role::Embed => Ok(&mut dw.embed),
        Role::FinalNorm => Ok(&mut dw.final_norm),
        Role::LmHead => dw.lm_head.as_mut().ok_or_else(missing),
        _ => Err(missing()),
    }
}

/// Writes tensor `index` of the table at `offset` elements into `dst`.
pub(super) fn fill(
    kernels: &LoadedKernels,
    dst: &mut CudaSlice<bf16>,
    offset: usize,
    spec: &TensorSpec,
    weights: &Weights,
    index: usize,
) -> Result<(), RunnerError> {
    let n = spec.elements();
    match weights {
        Weights::Synthetic { seed } => {
            let view = dev_mut(kernels, dst)
                .skip(offset)
                .map_err(|e| RunnerError::Device(format!("{}: {e}", spec.name)))?;
            fill_uniform_bf16(
                kernels,
                view,
                n,
                *seed,
                index as u64,
                spec.init.scale,
                spec.init.offset,
            )
            .map_err(|e| RunnerError::Device(format!("generating {}: {e}", spec.name)))
        }
        Weights::Loaded(_) => {
            let t = weights.host_tensor(spec, index).ok_or_else(|| {
                RunnerError::Device(format!("{}: not in the loaded weights", spec.name))
            })?;
            let values = t.bf16();
            let mut sub = dst.slice_mut(offset..offset + n);
            kernels
                .stream()
                .memcpy_htod(values.as_ref(), &mut sub)
                .map_err(dev_err(&spec.name))
        }
    }
}
