//! Seeded random weights: tensor `index` of the table is stream `index` of the counter-based
//! generator, value `i` is `bf16(fma(scale, u_i, offset))` (the table's [`Init`]), exactly what
//! the backend's `fill_uniform_bf16` kernel writes on the GPU. Never zeros: every value is drawn.
//!
//! [`Init`]: crate::model::Init

use aot_kernels::ops::random::fill_uniform_bf16_reference;
use half::bf16;

use crate::model::TensorSpec;

/// The values of one synthetic tensor, as the GPU generator makes them.
pub fn generate(spec: &TensorSpec, seed: u64, index: u64) -> Vec<bf16> {
    fill_uniform_bf16_reference(
        spec.elements(),
        seed,
        index,
        spec.init.scale,
        spec.init.offset,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::qwen3::{tensor_table, Qwen3Config};

    #[test]
    fn tensors_are_seeded_distinct_and_never_zero() {
        let c = Qwen3Config::tiny();
        let t = tensor_table(&c);
        let a = generate(&t[1], 42, 1);
        let b = generate(&t[1], 43, 1);
        assert_ne!(a, b, "the seed changes the weights");
        assert_eq!(a, generate(&t[1], 42, 1), "same seed, same weights");
        let norm = generate(&t[1], 42, 1);
        assert!(
            norm.iter().all(|v| (0.89..=1.11).contains(&v.to_f32())),
            "norm weights near 1"
        );
        let proj = generate(&t[2], 42, 2);
        assert!(proj.iter().filter(|v| v.to_f32() == 0.0).count() < proj.len() / 100);
    }
}
