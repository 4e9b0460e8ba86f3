//! The tensor table's vocabulary, shared by every model family: what a tensor is for ([`Role`]),
//! its name and shape as stored ([`TensorSpec`]), and how a synthetic model fills it ([`Init`]).

use serde::Serialize;

/// What a tensor is for; the runners find tensors by role, never by parsing names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Embed,
    InputNorm,
    QProj,
    KProj,
    VProj,
    OProj,
    QNorm,
    KNorm,
    PostNorm,
    GateProj,
    UpProj,
    DownProj,
    FinalNorm,
    LmHead,
    /// Gated DeltaNet: the fused `[q | k | v]` input projection.
    GdnInProjQkv,
    /// Gated DeltaNet: the output gate's projection (`z`).
    GdnInProjZ,
    /// Gated DeltaNet: the write strength's projection (`b`, `beta = sigmoid(b)`).
    GdnInProjB,
    /// Gated DeltaNet: the decay's projection (`a`).
    GdnInProjA,
    /// Gated DeltaNet: the depthwise causal convolution `[channels, 1, kernel]`.
    GdnConv1d,
    GdnALog,
    GdnDtBias,
    /// Gated DeltaNet: the gated norm's weight (plain `w`, not zero-centred).
    GdnNorm,
    GdnOutProj,
    /// MoE: the router `[experts, hidden]`.
    MoeRouter,
    /// MoE: every expert's `[gate | up]` projection, `[experts, 2 * inter, hidden]`.
    MoeExpertsGateUp,
    /// MoE: every expert's down projection, `[experts, hidden, inter]`.
    MoeExpertsDown,
    SharedGateProj,
    SharedUpProj,
    SharedDownProj,
    /// MoE: the shared expert's scalar gate `[1, hidden]`.
    SharedExpertGate,
}

/// How a synthetic model fills a tensor: `offset + scale * u`, `u` uniform in [-1, 1).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Init {
    pub offset: f32,
    pub scale: f32,
}

impl Init {
    /// A projection with `fan_in` inputs: unit variance in, unit variance out.
    pub fn linear(fan_in: usize) -> Init {
        Init {
            offset: 0.0,
            scale: (3.0 / fan_in as f32).sqrt(),
        }
    }

    /// A norm weight used as `w` (near 1).
    pub const NORM: Init = Init {
        offset: 1.0,
        scale: 0.1,
    };

    /// A zero-centred norm weight used as `1 + w` (near 0).
    pub const CENTRED_NORM: Init = Init {
        offset: 0.0,
        scale: 0.1,
    };

    pub const EMBEDDING: Init = Init {
        offset: 0.0,
        scale: 1.0,
    };
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TensorSpec {
    /// The name in the checkpoint (`model.layers.3.self_attn.q_proj.weight`).
    pub name: String,
    /// Row-major shape as stored (`[out_features, in_features]` for projections).
    pub shape: Vec<usize>,
    pub role: Role,
    pub layer: Option<usize>,
    pub init: Init,
    /// Another way a checkpoint may store this tensor: these tensors, each of [`Self::part_shape`],
    /// back to back in order (experts stored one by one instead of fused). Empty when the tensor
    /// has one form.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub part_shape: Vec<usize>,
}

impl TensorSpec {
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Says that a checkpoint may store this tensor as `parts`, each of `part_shape`, back to back.
    pub fn stored_as_parts(&mut self, parts: Vec<String>, part_shape: Vec<usize>) {
        debug_assert_eq!(
            parts.len() * part_shape.iter().product::<usize>(),
            self.elements()
        );
        self.parts = parts;
        self.part_shape = part_shape;
    }
}

/// Builds a table in order (the order is each tensor's index for the synthetic generator, so it
/// never changes for a given config).
#[derive(Debug, Default)]
pub struct TableBuilder {
    pub specs: Vec<TensorSpec>,
}

impl TableBuilder {
    pub fn push(
        &mut self,
        name: String,
        shape: Vec<usize>,
        role: Role,
        layer: Option<usize>,
        init: Init,
    ) -> &mut TensorSpec {
        self.specs.push(TensorSpec {
            name,
            shape,
            role,
            layer,
            init,
            parts: Vec::new(),
            part_shape: Vec::new(),
        });
        self.specs.last_mut().expect("just pushed")
    }
}
