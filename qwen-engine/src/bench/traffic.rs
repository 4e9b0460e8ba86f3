//! What one decode step must move through memory, and what a prefill computes, for each family:
//! the yardsticks the bench divides by.
//!
//! A decode step of `c` rows reads every weight it uses once (batched rows share the read), each
//! row's KV cache up to its position and writes the new position, and, for a recurrent layer,
//! reads and writes each row's state. A dense model uses every weight. A routed MoE block uses
//! only the experts some row chose: the bench counts them from the routing the step actually took
//! (the distinct experts of each MoE call, which the hybrid runner logs), never from an assumption.
//! The embedding table is read one row per token, which is left out for an untied embedding; a
//! tied one is the lm_head and read whole.

use crate::model::{ModelConfig, Qwen35MoeConfig};

/// Bytes of bf16.
const BF16: f64 = 2.0;

/// The hybrid family's recurrent state as the GPU keeps it, per sequence and linear layer: the
/// conv's last `kernel - 1` inputs in bf16 and the delta rule's `[dk x dv]` per value head in fp32.
pub fn gpu_state_bytes_per_layer(c: &Qwen35MoeConfig) -> f64 {
    let conv = (c.conv_dim() * (c.linear_conv_kernel_dim - 1)) as f64 * BF16;
    let delta =
        (c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim) as f64 * 4.0;
    conv + delta
}

/// One routed expert's weights (gate, up and down), in bytes.
pub fn expert_bytes(c: &Qwen35MoeConfig) -> f64 {
    (3 * c.hidden_size * c.moe_intermediate_size) as f64 * BF16
}

/// Bytes a decode step of `concurrency` rows moves, at a mean context of `mean_ctx` tokens.
/// `distinct_experts_per_layer`: the mean number of distinct experts a step's MoE call read
/// (needed for a MoE model; `None` for a dense one).
pub fn decode_step_bytes(
    config: &ModelConfig,
    concurrency: usize,
    mean_ctx: f64,
    distinct_experts_per_layer: Option<f64>,
) -> Result<f64, String> {
    let model = config.describe();
    let kv = concurrency as f64 * (mean_ctx + 1.0) * model.kv_bytes_per_token as f64;
    match config {
        ModelConfig::Qwen3(_) => Ok(model.parameter_count as f64 * BF16 + kv),
        ModelConfig::Qwen35Moe(c) => {
            let distinct = distinct_experts_per_layer.ok_or(
                "a MoE model's bytes per step need the distinct experts its steps read (the runner's log)",
            )?;
            let routed = (c.num_hidden_layers * c.num_experts) as f64 * expert_bytes(c);
            let embed = if c.tie_word_embeddings {
                0.0
            } else {
                (c.vocab_size * c.hidden_size) as f64 * BF16
            };
            let dense_part = model.parameter_count as f64 * BF16 - routed - embed;
            let experts = distinct * c.num_hidden_layers as f64 * expert_bytes(c);
            let state =
                2.0 * concurrency as f64 * c.linear_layers() as f64 * gpu_state_bytes_per_layer(c);
            Ok(dense_part + experts + kv + state)
        }
    }
}

/// The weight bytes a MoE model's decode step reads at least: every weight but the routed experts
/// and the untied embedding table, plus `top_k` experts per layer. `None` for a dense model.
pub fn min_step_weight_bytes(config: &ModelConfig) -> Option<u64> {
    match config {
        ModelConfig::Qwen3(_) => None,
        ModelConfig::Qwen35Moe(c) => {
            decode_step_bytes(config, 0, 0.0, Some(c.num_experts_per_tok as f64))
                .ok()
                .map(|b| b as u64)
        }
    }
}

/// FLOPs of a prefill of `tokens` tokens, `per_seq` per sequence: twice the parameters each token
/// multiplies (the embedding excepted; a MoE block's top-k experts and its shared expert, not all
/// experts), plus causal attention's two products over the attention layers.
pub fn prefill_flops(config: &ModelConfig, tokens: usize, per_seq: usize) -> f64 {
    let model = config.describe();
    let (linear, attention_layers, q_dim) = match config {
        ModelConfig::Qwen3(c) => (
            model.parameter_count as f64 - (c.vocab_size * c.hidden_size) as f64,
            c.num_hidden_layers,
            c.num_attention_heads * c.head_dim,
        ),
        ModelConfig::Qwen35Moe(c) => {
            let per_expert = expert_bytes(c) / BF16;
            let unused =
                (c.num_hidden_layers * (c.num_experts - c.num_experts_per_tok)) as f64 * per_expert;
            (
                model.parameter_count as f64 - (c.vocab_size * c.hidden_size) as f64 - unused,
                c.attention_layers(),
                c.q_dim(),
            )
        }
    };
    let attn = 4.0 * (per_seq as f64).powi(2) / 2.0 * q_dim as f64 * attention_layers as f64;
    2.0 * linear * tokens as f64 + attn * (tokens / per_seq.max(1)) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Qwen3Config;

    #[test]
    fn a_dense_step_reads_every_weight_and_the_cache() {
        let c = Qwen3Config::qwen3_4b();
        let config = ModelConfig::Qwen3(c.clone());
        let one = decode_step_bytes(&config, 1, 100.0, None).unwrap();
        let want = c.parameter_count() as f64 * 2.0 + 101.0 * c.kv_bytes_per_token() as f64;
        assert_eq!(one, want);
    }

    #[test]
    fn a_moe_step_reads_the_experts_it_chose_and_each_rows_state_twice() {
        let c = Qwen35MoeConfig::qwen3_6_35b_a3b();
        let config = ModelConfig::Qwen35Moe(c.clone());
        assert!(decode_step_bytes(&config, 1, 0.0, None).is_err());
        let c1 = decode_step_bytes(&config, 1, 0.0, Some(8.0)).unwrap();
        let c1_more = decode_step_bytes(&config, 1, 0.0, Some(9.0)).unwrap();
        // One more distinct expert per layer: one expert's bytes per layer.
        let per_layer = 3.0 * 2048.0 * 512.0 * 2.0;
        assert!((c1_more - c1 - 40.0 * per_layer).abs() < 1.0);
        // A second row at the same routing adds its state read and write and its cache row.
        let c2 = decode_step_bytes(&config, 2, 0.0, Some(8.0)).unwrap();
        let state = 2.0 * 30.0 * (8192.0 * 3.0 * 2.0 + 32.0 * 128.0 * 128.0 * 4.0);
        assert!((c2 - c1 - state - c.kv_bytes_per_token() as f64).abs() < 1.0);
        // About 3B parameters active at c1: between 5 and 8 GB.
        assert!(c1 > 5e9 && c1 < 8e9, "{c1}");
    }
}
