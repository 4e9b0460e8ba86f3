//! qwen-engine: Qwen decode on the aot-kernels backend.
//!
//! Rooms, each with one job (the backend is reached only through `aot_kernels`' public API):
//! - [`model`]: one file per family: hyperparameters (read through [`config`]), the tensor table
//!   (names, shapes, init) and the equations; the engine sees only its description.
//! - [`weights`]: a Hugging Face folder (memory-mapped safetensors, checked against the table) or
//!   seeded synthetic weights.
//! - [`tokenizer`]: `tokenizer.json`, or bytes for the tiny model.
//! - [`memory`]: the paged KV cache's blocks and the recurrent-state slots, and who owns them
//!   (pure bookkeeping).
//! - [`scheduler`]: the request queue, slots, admission and continuous batching: which sequences
//!   run each step.
//! - [`runner`]: the interface a device implements; [`cpu`] (fp32 reference) and [`gpu`] (AOT kernels).
//! - [`engine`]: scheduler + runner + streaming of tokens.
//! - [`bench`]: the benchmark's evidence bundle (schema, checks, table, chart); no GPU needed.

pub mod bench;
pub mod config;
pub mod cpu;
pub mod engine;
pub mod gpu;
pub mod load;
pub mod memory;
pub mod model;
pub mod runner;
pub mod scheduler;
pub mod source;
pub mod tokenizer;
pub mod weights;

pub use aot_kernels;
