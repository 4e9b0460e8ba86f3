//! An engine outside the aot-kernels workspace, linking the backend as any downstream crate does:
//! it makes its own CUDA context and stream, loads the kernels on that context, and runs
//! RMSNorm -> GEMV -> argmax on its stream, checking each step against the backend's CPU
//! references.
//!
//! ```text
//! cargo run --release -- [--rows R] [--hidden H] [--vocab V] [--seed S] [--device N]
//! ```
//!
//! Exit codes: 0 every check passed; 1 a check failed or the GPU reported an error; 2 bad
//! arguments (the message names the argument); 3 no CUDA driver or device (nothing ran).

use std::process::ExitCode;
use std::sync::Arc;

use aot_kernels::device::{CudaContext, CudaSlice, CudaStream};
use aot_kernels::dispatch::{load_available, open_context, DispatchError, ModuleSource, Policy};
use aot_kernels::ops::compare::compare;
use aot_kernels::ops::gemv::{gemv, gemv_reference, GemvInput, GemvOutput, MAX_TOKENS};
use aot_kernels::ops::rmsnorm::{rmsnorm, rmsnorm_reference, RmsNormParams};
use aot_kernels::ops::sampling::{
    argmax_reference, sample_tokens, DeviceSamplingParams, LogitsShape,
};
use aot_kernels::ops::{dev, dev_mut};
use half::bf16;

/// The problem: `rows` token rows of `hidden` values, a `vocab x hidden` output projection.
#[derive(Debug, Clone, Copy)]
struct Args {
    rows: usize,
    hidden: usize,
    vocab: usize,
    seed: u64,
    device: usize,
}

enum Failure {
    Usage(String),
    NoGpu(String),
    Check(String),
}

fn parse_args() -> Result<Args, Failure> {
    let mut a = Args {
        rows: 4,
        hidden: 2048,
        vocab: 32000,
        seed: 1,
        device: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| Failure::Usage(format!("{flag} needs a value")))?;
        let number = |what: &str| {
            value.parse::<u64>().map_err(|_| {
                Failure::Usage(format!("{what}: `{value}` is not a non-negative integer"))
            })
        };
        match flag.as_str() {
            "--rows" => a.rows = number("--rows")? as usize,
            "--hidden" => a.hidden = number("--hidden")? as usize,
            "--vocab" => a.vocab = number("--vocab")? as usize,
            "--seed" => a.seed = number("--seed")?,
            "--device" => a.device = number("--device")? as usize,
            other => {
                return Err(Failure::Usage(format!(
                    "unknown argument `{other}` (use --rows, --hidden, --vocab, --seed, --device)"
                )))
            }
        }
    }
    if a.rows == 0 || a.rows > MAX_TOKENS {
        return Err(Failure::Usage(format!(
            "--rows {}: the GEMV takes 1..={MAX_TOKENS} rows",
            a.rows
        )));
    }
    if a.hidden == 0 || !a.hidden.is_multiple_of(8) {
        return Err(Failure::Usage(format!(
            "--hidden {}: needs a positive multiple of 8",
            a.hidden
        )));
    }
    if a.vocab == 0 {
        return Err(Failure::Usage("--vocab 0: needs at least one row".into()));
    }
    Ok(a)
}

/// Deterministic values in `[-scale, scale)` (a small LCG: the example needs no RNG crate).
fn values(seed: u64, n: usize, scale: f32) -> Vec<bf16> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            bf16::from_f32((2.0 * u - 1.0) * scale)
        })
        .collect()
}

fn gpu<T>(what: &str) -> impl Fn(T) -> Failure + '_
where
    T: std::fmt::Display,
{
    move |e| Failure::Check(format!("{what}: {e}"))
}

fn run(a: &Args) -> Result<(), Failure> {
    if !aot_kernels::dispatch::driver::driver_present() {
        return Err(Failure::NoGpu(
            "libcuda cannot be opened (no NVIDIA driver on this machine)".into(),
        ));
    }
    // The engine's own context and stream; the backend loads onto them.
    let ctx = CudaContext::new(a.device)
        .map_err(|e| Failure::NoGpu(format!("device {}: {e}", a.device)))?;
    // The backend's launches are not tracked by cudarc's events: switch them off before the
    // first allocation and order the streams explicitly (this engine uses one).
    // SAFETY: no buffer of this context exists yet.
    unsafe { ctx.disable_event_tracking() };
    let device = open_context(ctx.clone()).map_err(|e| match e {
        DispatchError::NoDriver => Failure::NoGpu(e.to_string()),
        other => Failure::Check(other.to_string()),
    })?;
    let kernels = load_available(&device, Policy::Auto, &ModuleSource::registry())
        .map_err(gpu("loading the kernels"))?;
    let stream: Arc<CudaStream> = ctx.new_stream().map_err(gpu("making a stream"))?;
    let k = kernels
        .on_stream(stream.clone())
        .map_err(gpu("on_stream"))?;
    println!(
        "device {} \"{}\" ({}): kernels loaded on the engine's context, launching on its stream",
        a.device, device.name, device.spec
    );

    let (m, h, v) = (a.rows, a.hidden, a.vocab);
    let x = values(a.seed, m * h, 3.0);
    let norm_w = values(a.seed ^ 1, h, 1.5);
    let w = values(a.seed ^ 2, v * h, 1.0 / (h as f32).sqrt());
    let up = |data: &[bf16], what: &str| stream.clone_htod(data).map_err(gpu(what));
    let (dx, dnorm, dw) = (up(&x, "x")?, up(&norm_w, "norm")?, up(&w, "weights")?);

    // RMSNorm.
    let p = RmsNormParams {
        rows: m,
        hidden: h,
        eps: 1e-6,
        weight_offset: 0.0,
    };
    let mut normed: CudaSlice<bf16> = stream.alloc_zeros(m * h).map_err(gpu("alloc"))?;
    rmsnorm(&k, &mut normed, &dx, &dnorm, &p).map_err(gpu("rmsnorm"))?;
    let got_norm = stream.clone_dtoh(&normed).map_err(gpu("read back"))?;
    let r = compare(&got_norm, &rmsnorm_reference(&x, &norm_w, &p));
    println!("rmsnorm {m}x{h}: {r}");
    if r.max_ulps > 2 {
        return Err(Failure::Check(format!("rmsnorm: {r} (more than 2 ulps)")));
    }

    // GEMV: logits = normed W^T, fp32.
    let mut logits: CudaSlice<f32> = stream.alloc_zeros(m * v).map_err(gpu("alloc"))?;
    gemv(
        &k,
        dev(&k, &dw),
        v,
        h,
        m,
        &GemvInput::Plain {
            x: dev(&k, &normed),
            ld_x: h,
        },
        GemvOutput::F32 {
            out: dev_mut(&k, &mut logits),
            ld_out: v,
        },
    )
    .map_err(gpu("gemv"))?;
    let got_logits = stream.clone_dtoh(&logits).map_err(gpu("read back"))?;
    let want = gemv_reference(&w, v, h, &got_norm, m);
    let mut worst = 0.0f64;
    for (t, (g, r)) in got_logits.iter().zip(&want).enumerate() {
        let row = &got_norm[(t / v) * h..(t / v + 1) * h];
        let wr = &w[(t % v) * h..(t % v + 1) * h];
        let scale: f64 = row
            .iter()
            .zip(wr)
            .map(|(a, b)| (f64::from(a.to_f32()) * f64::from(b.to_f32())).abs())
            .sum();
        let err = (f64::from(*g) - r).abs() / scale.max(1e-30);
        worst = worst.max(err);
    }
    println!("gemv {v}x{h} for {m} rows: worst |error| {worst:.2e} of the sum of |terms|");
    if worst > 1e-5 {
        return Err(Failure::Check(format!(
            "gemv: error {worst:.2e} of the sum of |terms| (an fp32 sum stays under 1e-5)"
        )));
    }

    // Argmax: the sampling kernel with greedy parameters, against the reference on the same logits.
    let zeros_f = stream.alloc_zeros::<f32>(m).map_err(gpu("alloc"))?;
    let zeros_u = stream.alloc_zeros::<u32>(m).map_err(gpu("alloc"))?;
    let ones = stream.clone_htod(&vec![1.0f32; m]).map_err(gpu("alloc"))?;
    let zeros_64 = stream.alloc_zeros::<u64>(m).map_err(gpu("alloc"))?;
    let mut tokens: CudaSlice<i32> = stream.alloc_zeros(m).map_err(gpu("alloc"))?;
    sample_tokens(
        &k,
        &mut tokens,
        &logits,
        &LogitsShape {
            rows: m,
            vocab: v,
            row_stride: v,
        },
        &DeviceSamplingParams {
            temperature: dev(&k, &zeros_f),
            top_k: dev(&k, &zeros_u),
            top_p: dev(&k, &ones),
            seed: dev(&k, &zeros_64),
            counter: dev(&k, &zeros_64),
        },
    )
    .map_err(gpu("sample_tokens"))?;
    let got_tokens = stream.clone_dtoh(&tokens).map_err(gpu("read back"))?;
    for (t, &tok) in got_tokens.iter().enumerate() {
        let want = argmax_reference(&got_logits[t * v..(t + 1) * v]);
        if tok as u32 != want {
            return Err(Failure::Check(format!(
                "argmax row {t}: the GPU chose {tok}, the reference {want}"
            )));
        }
    }
    println!("argmax: {got_tokens:?}, equal to the reference");
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(Failure::Usage(msg)) => {
            eprintln!("error: {msg}");
            return ExitCode::from(2);
        }
        Err(_) => unreachable!("parse_args only fails on usage"),
    };
    match run(&args) {
        Ok(()) => {
            println!(
                "ok: RMSNorm -> GEMV -> argmax on the engine's own stream match the references"
            );
            ExitCode::SUCCESS
        }
        Err(Failure::NoGpu(msg)) => {
            eprintln!("no GPU: {msg}; nothing ran (this example needs a CUDA driver and device)");
            ExitCode::from(3)
        }
        Err(Failure::Usage(msg)) | Err(Failure::Check(msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(1)
        }
    }
}
