//! Kernel operations: for each kernel module a CPU reference that mirrors its arithmetic
//! (fp32 math, one bf16 rounding per stored value, as transformers does) and a typed launcher.
//!
//! The references are the oracle: every GPU kernel is checked against its reference on fresh
//! random inputs, and [`compare`] measures the distance in bf16 units in the last place.

pub mod activation;
pub mod compare;
pub mod gated_delta_net;
pub mod launch;
pub mod moe;
pub mod rmsnorm;
pub mod rotary;
pub mod triton;

pub use launch::{OpsError, LAUNCHED_ENTRIES};
