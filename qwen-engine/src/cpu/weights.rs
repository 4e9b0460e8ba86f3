//! The model's weights widened once to fp32, found by role through the tensor table: typed per
//! layer for the dense family ([`CpuWeights`]), by (role, layer) for any family ([`RoleTensors`]).

use std::collections::HashMap;

use crate::model::qwen3::{tensor_table, Qwen3Config};
use crate::model::{Role, TensorSpec};
use crate::weights::Weights;

/// One decoder layer's weights, each row-major as stored (`[out][in]` for projections).
#[derive(Debug, Default)]
pub struct LayerWeights {
    pub input_norm: Vec<f32>,
    pub q_proj: Vec<f32>,
    pub k_proj: Vec<f32>,
    pub v_proj: Vec<f32>,
    pub o_proj: Vec<f32>,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub post_norm: Vec<f32>,
    pub gate_proj: Vec<f32>,
    pub up_proj: Vec<f32>,
    pub down_proj: Vec<f32>,
}

#[derive(Debug)]
pub struct CpuWeights {
    pub embed: Vec<f32>,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Vec<f32>,
    /// `None` when the embedding is tied to the output projection.
    pub lm_head: Option<Vec<f32>>,
}

impl CpuWeights {
    /// Every table tensor of `weights` (loaded or synthetic), widened to fp32. A loaded tensor
    /// whose name or shape differs from the table (weights checked against another config) is an
    /// error naming it.
    pub fn new(config: &Qwen3Config, weights: &Weights) -> Result<CpuWeights, String> {
        let mut w = CpuWeights {
            embed: Vec::new(),
            layers: (0..config.num_hidden_layers)
                .map(|_| LayerWeights::default())
                .collect(),
            final_norm: Vec::new(),
            lm_head: None,
        };
        for (index, spec) in tensor_table(config).into_iter().enumerate() {
            let values = checked_tensor(&spec, weights, index)?;
            let layer = spec.layer.map(|l| &mut w.layers[l]);
            let slot = match (spec.role, layer) {
                (Role::Embed, None) => &mut w.embed,
                (Role::FinalNorm, None) => &mut w.final_norm,
                (Role::LmHead, None) => w.lm_head.insert(Vec::new()),
                (Role::InputNorm, Some(l)) => &mut l.input_norm,
                (Role::QProj, Some(l)) => &mut l.q_proj,
                (Role::KProj, Some(l)) => &mut l.k_proj,
                (Role::VProj, Some(l)) => &mut l.v_proj,
                (Role::OProj, Some(l)) => &mut l.o_proj,
                (Role::QNorm, Some(l)) => &mut l.q_norm,
                (Role::KNorm, Some(l)) => &mut l.k_norm,
                (Role::PostNorm, Some(l)) => &mut l.post_norm,
                (Role::GateProj, Some(l)) => &mut l.gate_proj,
                (Role::UpProj, Some(l)) => &mut l.up_proj,
                (Role::DownProj, Some(l)) => &mut l.down_proj,
                (role, _) => {
                    return Err(format!(
                        "tensor table entry `{}`: role {role:?} in layer {:?} has no place in the model",
                        spec.name, spec.layer
                    ))
                }
            };
            *slot = values;
        }
        Ok(w)
    }

    /// The output projection `[vocab][hidden]`: lm_head, or the embedding when tied.
    pub fn output(&self) -> &[f32] {
        self.lm_head.as_deref().unwrap_or(&self.embed)
    }

    pub fn bytes(&self) -> usize {
        let layer_floats: usize = self
            .layers
            .iter()
            .map(|l| {
                [
                    &l.input_norm,
                    &l.q_proj,
                    &l.k_proj,
                    &l.v_proj,
                    &l.o_proj,
                    &l.q_norm,
                    &l.k_norm,
                    &l.post_norm,
                    &l.gate_proj,
                    &l.up_proj,
                    &l.down_proj,
                ]
                .iter()
                .map(|v| v.len())
                .sum::<usize>()
            })
            .sum();
        let rest =
            self.embed.len() + self.final_norm.len() + self.lm_head.as_ref().map_or(0, Vec::len);
        (layer_floats + rest) * 4
    }
}

/// Every table tensor of `weights` widened to fp32, found by (role, layer): the loader of any
/// family's CPU model, which takes each tensor out once.
#[derive(Debug, Default)]
pub struct RoleTensors {
    tensors: HashMap<(Role, Option<usize>), Vec<f32>>,
    bytes: usize,
}

impl RoleTensors {
    /// Widens every tensor of `table` (the config's tensor table) from `weights`; a loaded
    /// tensor whose name or shape differs from the table is an error naming it.
    pub fn new(table: &[TensorSpec], weights: &Weights) -> Result<RoleTensors, String> {
        let mut out = RoleTensors::default();
        for (index, spec) in table.iter().enumerate() {
            let values = checked_tensor(spec, weights, index)?;
            out.bytes += values.len() * 4;
            out.tensors.insert((spec.role, spec.layer), values);
        }
        Ok(out)
    }

    /// Takes the tensor of `role` in `layer` out (an error names what is missing).
    pub fn take(&mut self, role: Role, layer: Option<usize>) -> Result<Vec<f32>, String> {
        self.tensors
            .remove(&(role, layer))
            .ok_or_else(|| format!("the weights have no {role:?} tensor for layer {layer:?}"))
    }

    /// fp32 bytes of every tensor read.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Table entry `index` of `weights` widened to fp32, checked against its spec.
fn checked_tensor(spec: &TensorSpec, weights: &Weights, index: usize) -> Result<Vec<f32>, String> {
    let tensor = weights.host_tensor(spec, index).ok_or_else(|| {
        format!(
            "the weights have no tensor {index} (`{}`): they were loaded for another config",
            spec.name
        )
    })?;
    if tensor.spec.name != spec.name || tensor.spec.shape != spec.shape {
        return Err(format!(
            "tensor {index} is `{}` {:?}, the config's table expects `{}` {:?}: the weights were loaded for another config",
            tensor.spec.name, tensor.spec.shape, spec.name, spec.shape
        ));
    }
    Ok(tensor.f32())
}
