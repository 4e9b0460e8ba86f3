//! The C ABI on a real GPU: launches through it give the Rust launchers' bits, the caller's
//! context stays current and alive, the pointer check names a short allocation.
//!
//! `#[ignore]`d (they need a CUDA GPU): run them with `--ignored` on the GPU machine.

use std::ffi::CStr;
use std::ptr::null_mut;
use std::sync::Arc;

use aot_kernels::device::{CudaContext, CudaSlice, CudaStream};
use aot_kernels::dispatch::{load_available, open_context, ModuleSource, Policy};
use aot_kernels::ops::gemv::{gemv, GemvInput, GemvOutput};
use aot_kernels::ops::rmsnorm::{rmsnorm, RmsNormParams};
use aot_kernels::ops::{dev, dev_mut};
use aot_kernels_capi::backend::{aot_backend_create_in_context, aot_backend_destroy};
use aot_kernels_capi::last_error::aot_last_error_message;
use aot_kernels_capi::ops::{aot_gemv_bf16_f32, aot_rmsnorm_bf16};
use aot_kernels_capi::{AotBackend, AotStatus};
use cudarc::driver::sys;
use cudarc::driver::DevicePtr;
use half::bf16;
use rand::{Rng, SeedableRng};

fn last_error() -> String {
    // SAFETY: this thread's message, valid until its next call.
    unsafe { CStr::from_ptr(aot_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

fn addr<T>(stream: &CudaStream, s: &CudaSlice<T>) -> u64 {
    s.device_ptr(stream).0
}

fn random(n: usize, seed: u64, scale: f32) -> Vec<bf16> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| bf16::from_f32(rng.gen_range(-scale..scale)))
        .collect()
}

fn backend_in(ctx: &Arc<CudaContext>) -> *mut AotBackend {
    let mut backend = null_mut();
    // SAFETY: a live context, storage for one pointer.
    let status = unsafe { aot_backend_create_in_context(ctx.cu_ctx().cast(), 0, 0, &mut backend) };
    assert_eq!(status, AotStatus::Ok, "{}", last_error());
    backend
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_rmsnorm_and_gemv_through_the_c_abi_give_the_rust_launchers_bits() {
    let ctx = CudaContext::new(0).unwrap();
    let backend = backend_in(&ctx);
    let kernels = load_available(
        &open_context(ctx.clone()).unwrap(),
        Policy::Auto,
        &ModuleSource::registry(),
    )
    .unwrap();
    let stream = kernels.stream().clone();
    let (rows, hidden, vocab) = (4, 2048, 4096);
    let x = stream.clone_htod(&random(rows * hidden, 1, 4.0)).unwrap();
    let w = stream.clone_htod(&random(hidden, 2, 1.0)).unwrap();
    let proj = stream.clone_htod(&random(vocab * hidden, 3, 0.05)).unwrap();
    let p = RmsNormParams {
        rows,
        hidden,
        eps: 1e-6,
        weight_offset: 0.0,
    };

    let mut normed_rust = stream.alloc_zeros::<bf16>(rows * hidden).unwrap();
    rmsnorm(&kernels, &mut normed_rust, &x, &w, &p).unwrap();
    let mut logits_rust = stream.alloc_zeros::<f32>(rows * vocab).unwrap();
    gemv(
        &kernels,
        dev(&kernels, &proj),
        vocab,
        hidden,
        rows,
        &GemvInput::Plain {
            x: dev(&kernels, &normed_rust),
            ld_x: hidden,
        },
        GemvOutput::F32 {
            out: dev_mut(&kernels, &mut logits_rust),
            ld_out: vocab,
        },
    )
    .unwrap();

    let normed_c = stream.alloc_zeros::<bf16>(rows * hidden).unwrap();
    let logits_c = stream.alloc_zeros::<f32>(rows * vocab).unwrap();
    let s = stream.cu_stream().cast();
    // The C call, with `out` declared `out_len` elements long.
    let rmsnorm_c = |out_len: usize| {
        // SAFETY: every address is a live allocation on this context, of the declared length but
        // for `out_len` (which the pointer check must refuse when it is too long).
        unsafe {
            aot_rmsnorm_bf16(
                backend,
                s,
                addr(&stream, &normed_c),
                out_len,
                addr(&stream, &x),
                rows * hidden,
                addr(&stream, &w),
                hidden,
                rows,
                hidden,
                1e-6,
                0.0,
            )
        }
    };
    let status = rmsnorm_c(rows * hidden);
    assert_eq!(status, AotStatus::Ok, "{}", last_error());
    // SAFETY: as above.
    let status = unsafe {
        aot_gemv_bf16_f32(
            backend,
            s,
            addr(&stream, &proj),
            vocab * hidden,
            vocab,
            hidden,
            addr(&stream, &normed_c),
            rows * hidden,
            hidden,
            rows,
            addr(&stream, &logits_c),
            rows * vocab,
            vocab,
        )
    };
    assert_eq!(status, AotStatus::Ok, "{}", last_error());
    stream.synchronize().unwrap();
    assert_eq!(
        stream.clone_dtoh(&normed_c).unwrap(),
        stream.clone_dtoh(&normed_rust).unwrap(),
        "rmsnorm bits"
    );
    let (c, r) = (
        stream.clone_dtoh(&logits_c).unwrap(),
        stream.clone_dtoh(&logits_rust).unwrap(),
    );
    assert!(
        c.iter().zip(&r).all(|(a, b)| a.to_bits() == b.to_bits()),
        "gemv bits"
    );

    // A declared length past the allocation is refused by the pointer check, naming the buffer.
    let status = rmsnorm_c(2 * rows * hidden);
    assert_eq!(status, AotStatus::BadPointer, "{}", last_error());
    assert!(last_error().contains("`out`"), "{}", last_error());
    // SAFETY: the backend from above, no longer used.
    assert_eq!(unsafe { aot_backend_destroy(backend) }, AotStatus::Ok);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_the_callers_context_stays_current_and_alive_after_destroy() {
    let ctx = CudaContext::new(0).unwrap();
    let mut none: sys::CUcontext = null_mut();
    // Nothing current on this thread: the backend binds its context while it works, then restores.
    // SAFETY: plain driver calls on this thread.
    unsafe { sys::cuCtxSetCurrent(null_mut()).result().unwrap() };
    let backend = backend_in(&ctx);
    // SAFETY: writes one handle.
    unsafe { sys::cuCtxGetCurrent(&mut none).result().unwrap() };
    assert!(none.is_null(), "the thread's current context was changed");
    // SAFETY: the backend from above.
    assert_eq!(unsafe { aot_backend_destroy(backend) }, AotStatus::Ok);
    // The context still works: the backend never destroyed it.
    let stream = ctx.new_stream().unwrap();
    let back = stream
        .clone_dtoh(&stream.clone_htod(&[1u32, 2, 3]).unwrap())
        .unwrap();
    assert_eq!(back, [1, 2, 3]);
}
