//! Kernel operations: for each kernel module a CPU reference that mirrors its arithmetic
//! (fp32 math, one bf16 rounding per stored value, as transformers does) and a typed launcher.
//!
//! The references are the oracle: every GPU kernel is checked against its reference on fresh
//! random inputs, and [`compare`] measures the distance in bf16 units in the last place.

pub mod activation;
pub mod attention;
pub mod attention_prefill;
pub mod compare;
pub mod embedding;
pub mod gated_delta_net;
pub mod gemm;
pub mod gemv;
pub mod init;
pub mod kv_cache;
pub mod launch;
pub mod moe;
pub mod output_gate;
pub mod persistent;
pub mod persistent_trace;
pub mod qk_norm_rope;
pub mod random;
pub mod rmsnorm;
pub mod rotary;
pub mod sampling;
pub mod stream_read;
pub mod triton;

pub use launch::{dev, dev_mut, DevMut, DevRef, OpsError};

/// Each op module's launched (module, entry) pairs, listed where the op modules are declared so
/// that the launch layer imports none of them.
const LAUNCHED: &[&[(&str, &str)]] = &[
    activation::LAUNCHED,
    attention::LAUNCHED,
    attention_prefill::LAUNCHED,
    embedding::LAUNCHED,
    gated_delta_net::LAUNCHED,
    gemm::LAUNCHED,
    gemv::LAUNCHED,
    init::LAUNCHED,
    moe::LAUNCHED,
    output_gate::LAUNCHED,
    persistent::LAUNCHED,
    qk_norm_rope::LAUNCHED,
    rmsnorm::LAUNCHED,
    rotary::LAUNCHED,
    sampling::LAUNCHED,
    stream_read::LAUNCHED,
];

/// Every (module, entry) a typed launcher calls. tests/registry.rs checks these against the
/// manifest, so a kernel added without a launcher (or a launcher without a kernel) is caught.
pub fn launched_entries() -> impl Iterator<Item = (&'static str, &'static str)> {
    LAUNCHED.iter().flat_map(|op| op.iter().copied())
}
