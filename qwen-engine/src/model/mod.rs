//! Model descriptions: hyperparameters come from [`crate::config`], tensors from the table here.

pub mod qwen3;
