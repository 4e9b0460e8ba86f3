//! qwen-engine: Qwen decode on the aot-kernels backend.
//!
//! Rooms, each with one job (the backend is reached only through `aot_kernels`' public API):
//! - [`config`] and [`model`]: hyperparameters and the tensor table (names, shapes, init).
//! - [`weights`]: a Hugging Face folder (memory-mapped safetensors, checked against the table) or
//!   seeded synthetic weights.
//! - [`tokenizer`]: `tokenizer.json`, or bytes for the tiny model.
//! - [`kv`]: the paged KV cache's blocks and who owns them (pure bookkeeping).
//! - [`scheduler`]: request slots, admission and continuous batching: which sequences run each step.
//! - [`runner`]: the interface a device implements; [`cpu`] (fp32 reference) and [`gpu`] (AOT kernels).
//! - [`engine`]: scheduler + runner + streaming of tokens.

pub mod config;
pub mod cpu;
pub mod engine;
pub mod gpu;
pub mod kv;
pub mod load;
pub mod model;
pub mod runner;
pub mod scheduler;
pub mod source;
pub mod tokenizer;
pub mod weights;

pub use aot_kernels;
