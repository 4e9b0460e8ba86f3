//! The no-GPU half of `qwen-decode bench`: the evidence bundle's schema, its checks, the Markdown
//! matrix and the chart. The GPU half (running the cells) is in the `qwen-decode` binary.

pub mod chart;
pub mod report;
pub mod traffic;
pub mod validate;
