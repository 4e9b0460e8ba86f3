//! aot-kernels: ahead-of-time compiled CUDA kernels for Qwen decode.
//!
//! Data flows one way: `aot-manifest.toml` + `kernels/` --build.rs--> fatbins checked against
//! `aot-manifest.lock` --> [`registry`] (embedded images) --> dispatcher (device, driver -> image)
//! --> typed launchers in [`ops`], each with a CPU reference.

pub mod device;
pub mod dispatch;
pub mod ops;
pub mod registry;
