//! The launchers, on the caller's device pointers and stream. Each call checks its arguments
//! first (shapes, then every buffer: null, alignment, declared length, overlap), so a bad argument
//! gets its status and name even without a backend or a GPU; then the backend; then the launch.
//!
//! Lengths are in elements of the buffer's type. The stream is a `CUstream` of the backend's
//! context (null: the legacy default stream). Launches are asynchronous, as in CUDA: the buffers
//! must stay allocated until the stream has run them.
//!
//! Decode attention: [`aot_attention_decode_bf16`] on an [`AotAttentionDecode`], with its workspace
//! sized by [`aot_attention_decode_workspace_bytes`].
//!
//! The hybrid Qwen3.5/3.6-35B-A3B layers: the output gate of gated attention
//! ([`aot_sigmoid_gate_mul_bf16`]), Gated DeltaNet ([`aot_gdn_recurrent_bf16`] on an [`AotGdn`],
//! workspace [`aot_gdn_recurrent_workspace_bytes`]) and the MoE block ([`aot_moe_forward_bf16`] on
//! an [`AotMoe`], workspace [`aot_moe_forward_workspace_bytes`]). The last two run Triton modules
//! built with CUDA 13 only, at the model's shapes only: on an older driver they are not loaded,
//! and a launch says so with `AOT_STATUS_LOAD`.

use std::ffi::c_void;

use aot_kernels::ops::gemv::{gemv, GemvInput, GemvOutput, MAX_TOKENS};
use aot_kernels::ops::sampling::{sample_tokens, DeviceSamplingParams, LogitsShape, MAX_VOCAB};
use aot_kernels::ops::{activation, dev, dev_mut, embedding, rmsnorm, DevMut};
use half::bf16;

use crate::args::{device_buffer, disjoint, need, positive, strided_need, AotDevicePtr, DeviceArg};
use crate::backend::{backend_ref, span, AotBackend};
use crate::borrow::Borrowed;
use crate::last_error::boundary;
use crate::status::{AotStatus, CapiError};

mod attention;
mod gated_delta_net;
mod moe;
mod output_gate;
pub use attention::{
    aot_attention_decode_bf16, aot_attention_decode_workspace_bytes, AotAttentionDecode,
};
pub use gated_delta_net::{aot_gdn_recurrent_bf16, aot_gdn_recurrent_workspace_bytes, AotGdn};
pub use moe::{aot_moe_forward_bf16, aot_moe_forward_workspace_bytes, AotMoe};
pub use output_gate::aot_sigmoid_gate_mul_bf16;

/// bf16 and f32 buffers that kernels read one element at a time.
const ALIGN_BF16: u64 = 2;
const ALIGN_F32: u64 = 4;
const ALIGN_U64: u64 = 8;
/// Buffers read in 16-byte vectors (8 bf16).
const ALIGN_VEC: u64 = 16;

fn finite(name: &str, v: f32) -> Result<f32, CapiError> {
    if !v.is_finite() {
        return Err(CapiError::invalid(format!(
            "`{name}` {v} must be a finite number"
        )));
    }
    Ok(v)
}

/// The value a Triton module was compiled for as its constexpr `name`.
fn constexpr(module: &str, name: &str) -> Result<usize, CapiError> {
    aot_kernels::ops::triton::record(module)
        .and_then(|r| r.constexpr(name))
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| {
            CapiError::new(
                AotStatus::Internal,
                format!("module `{module}` has no constexpr `{name}` in this build"),
            )
        })
}

/// `value` if the Triton module was compiled for it as its constexpr `name`, else an error naming
/// the field and the value the kernels take (they are built for one model's shapes).
fn compiled_for(field: &str, value: usize, module: &str, name: &str) -> Result<usize, CapiError> {
    let built = constexpr(module, name)?;
    if value != built {
        return Err(CapiError::invalid(format!(
            "`{field}` {value}: the `{module}` kernels are built for {built} only (the Qwen3.5/3.6-35B-A3B shape)"
        )));
    }
    Ok(value)
}

/// Byte offsets of arrays of `bytes` bytes laid one after another, each starting 16-byte aligned
/// (the Triton kernels are compiled assuming every pointer is), and the bytes they take in all.
fn aligned_parts<const N: usize>(bytes: [usize; N]) -> ([usize; N], usize) {
    let mut offsets = [0; N];
    let mut end = 0usize;
    for (offset, b) in offsets.iter_mut().zip(bytes) {
        *offset = end.next_multiple_of(ALIGN_VEC as usize);
        end = *offset + b;
    }
    (offsets, end)
}

/// The epsilon of an RMSNorm: finite and not negative.
fn norm_eps(name: &str, eps: f32) -> Result<f32, CapiError> {
    if finite(name, eps)? < 0.0 {
        return Err(CapiError::invalid(format!("`{name}` {eps} must be >= 0")));
    }
    Ok(eps)
}

fn rmsnorm_params(
    rows: usize,
    hidden: usize,
    eps: f32,
    weight_offset: f32,
) -> Result<rmsnorm::RmsNormParams, CapiError> {
    let eps = norm_eps("eps", eps)?;
    Ok(rmsnorm::RmsNormParams {
        rows: positive("rows", rows)?,
        hidden: positive("hidden", hidden)?,
        eps,
        weight_offset: finite("weight_offset", weight_offset)?,
    })
}

/// `out = bf16((weight + weight_offset) * bf16(x * rsqrt(mean(x^2) + eps)))` per row: `x` and `out`
/// are `rows x hidden` bf16, `weight` is `hidden` bf16 (`weight_offset` 0 for Qwen3, 1 for the
/// zero-centred norms of Qwen3.5/3.6). `out` must not overlap `x`.
///
/// # Safety
/// `backend` is null or live; each non-null pointer addresses at least its declared length of
/// device memory in the backend's context; `stream` is null or a live stream.
#[no_mangle]
pub unsafe extern "C" fn aot_rmsnorm_bf16(
    backend: *const AotBackend,
    stream: *mut c_void,
    out: AotDevicePtr,
    out_len: usize,
    x: AotDevicePtr,
    x_len: usize,
    weight: AotDevicePtr,
    weight_len: usize,
    rows: usize,
    hidden: usize,
    eps: f32,
    weight_offset: f32,
) -> AotStatus {
    boundary("aot_rmsnorm_bf16", || {
        let p = rmsnorm_params(rows, hidden, eps, weight_offset)?;
        let rows_hidden = need(&[("rows", rows), ("hidden", hidden)])?;
        let out = device_buffer::<bf16>("out", out, out_len, &rows_hidden, ALIGN_BF16)?;
        let x = device_buffer::<bf16>("x", x, x_len, &rows_hidden, ALIGN_BF16)?;
        let w = device_buffer::<bf16>(
            "weight",
            weight,
            weight_len,
            &need(&[("hidden", hidden)])?,
            ALIGN_BF16,
        )?;
        disjoint(&out, &x)?;
        disjoint(&out, &w)?;
        let b = backend_ref(backend)?;
        b.launch(stream, &[span(&out), span(&x), span(&w)], |k| {
            // SAFETY: checked buffers on the caller's contract (see `Borrowed::new`).
            let (mut out, x, w) = unsafe {
                (
                    Borrowed::new(k.stream(), out),
                    Borrowed::new(k.stream(), x),
                    Borrowed::new(k.stream(), w),
                )
            };
            rmsnorm::rmsnorm(k, &mut out, &x, &w, &p)
        })
    })
}

/// In place: `residual = bf16(x + residual)`, then `x = rmsnorm(residual)` as
/// [`aot_rmsnorm_bf16`]. `x` and `residual` are `rows x hidden` bf16 and must not overlap.
///
/// # Safety
/// As for [`aot_rmsnorm_bf16`].
#[no_mangle]
pub unsafe extern "C" fn aot_fused_add_rmsnorm_bf16(
    backend: *const AotBackend,
    stream: *mut c_void,
    x: AotDevicePtr,
    x_len: usize,
    residual: AotDevicePtr,
    residual_len: usize,
    weight: AotDevicePtr,
    weight_len: usize,
    rows: usize,
    hidden: usize,
    eps: f32,
    weight_offset: f32,
) -> AotStatus {
    boundary("aot_fused_add_rmsnorm_bf16", || {
        let p = rmsnorm_params(rows, hidden, eps, weight_offset)?;
        let rows_hidden = need(&[("rows", rows), ("hidden", hidden)])?;
        let x = device_buffer::<bf16>("x", x, x_len, &rows_hidden, ALIGN_BF16)?;
        let r =
            device_buffer::<bf16>("residual", residual, residual_len, &rows_hidden, ALIGN_BF16)?;
        let w = device_buffer::<bf16>(
            "weight",
            weight,
            weight_len,
            &need(&[("hidden", hidden)])?,
            ALIGN_BF16,
        )?;
        disjoint(&x, &r)?;
        disjoint(&x, &w)?;
        disjoint(&r, &w)?;
        let b = backend_ref(backend)?;
        b.launch(stream, &[span(&x), span(&r), span(&w)], |k| {
            // SAFETY: checked buffers on the caller's contract (see `Borrowed::new`).
            let (mut x, mut r, w) = unsafe {
                (
                    Borrowed::new(k.stream(), x),
                    Borrowed::new(k.stream(), r),
                    Borrowed::new(k.stream(), w),
                )
            };
            rmsnorm::fused_add_rmsnorm(k, &mut x, &mut r, &w, &p)
        })
    })
}

/// The checked inputs of a GEMV: `w` `[n][k]`, `x` `m` rows of `k` every `ld_x`.
struct GemvArgs {
    w: DeviceArg<bf16>,
    x: DeviceArg<bf16>,
    n: usize,
    k: usize,
    m: usize,
    ld_x: usize,
}

#[allow(clippy::too_many_arguments)]
fn gemv_args(
    w: AotDevicePtr,
    w_len: usize,
    n: usize,
    k: usize,
    x: AotDevicePtr,
    x_len: usize,
    ld_x: usize,
    m: usize,
) -> Result<GemvArgs, CapiError> {
    positive("n", n)?;
    if !positive("k", k)?.is_multiple_of(8) {
        return Err(CapiError::invalid(format!(
            "`k` {k} must be a multiple of 8 (rows are read 8 bf16 at a time)"
        )));
    }
    if !(1..=MAX_TOKENS).contains(&m) {
        return Err(CapiError::invalid(format!(
            "`m` {m}: one GEMV takes 1..={MAX_TOKENS} token rows; split larger batches"
        )));
    }
    if !ld_x.is_multiple_of(8) {
        return Err(CapiError::invalid(format!(
            "`ld_x` {ld_x} must be a multiple of 8 (rows start 16-byte aligned)"
        )));
    }
    let w = device_buffer::<bf16>("w", w, w_len, &need(&[("n", n), ("k", k)])?, ALIGN_VEC)?;
    let x = device_buffer::<bf16>(
        "x",
        x,
        x_len,
        &strided_need(m, ("k", k), ("ld_x", ld_x))?,
        ALIGN_VEC,
    )?;
    Ok(GemvArgs {
        w,
        x,
        n,
        k,
        m,
        ld_x,
    })
}

/// The element a GEMV stores: its alignment and the epilogue that writes it.
trait GemvStore: Sized {
    const ALIGN: u64;
    fn output(out: DevMut<'_, Self>, ld_out: usize) -> GemvOutput<'_>;
}

impl GemvStore for bf16 {
    const ALIGN: u64 = ALIGN_BF16;
    fn output(out: DevMut<'_, bf16>, ld_out: usize) -> GemvOutput<'_> {
        GemvOutput::Bf16 { out, ld_out }
    }
}

impl GemvStore for f32 {
    const ALIGN: u64 = ALIGN_F32;
    fn output(out: DevMut<'_, f32>, ld_out: usize) -> GemvOutput<'_> {
        GemvOutput::F32 { out, ld_out }
    }
}

/// One GEMV call storing `T`: the body of [`aot_gemv_bf16`] and [`aot_gemv_bf16_f32`].
///
/// # Safety
/// As for [`aot_rmsnorm_bf16`].
#[allow(clippy::too_many_arguments)]
unsafe fn gemv_storing<T: GemvStore>(
    call: &'static str,
    backend: *const AotBackend,
    stream: *mut c_void,
    w: AotDevicePtr,
    w_len: usize,
    n: usize,
    k: usize,
    x: AotDevicePtr,
    x_len: usize,
    ld_x: usize,
    m: usize,
    out: AotDevicePtr,
    out_len: usize,
    ld_out: usize,
) -> AotStatus {
    boundary(call, || {
        let g = gemv_args(w, w_len, n, k, x, x_len, ld_x, m)?;
        let out_need = strided_need(m, ("n", n), ("ld_out", ld_out))?;
        let out = device_buffer::<T>("out", out, out_len, &out_need, T::ALIGN)?;
        disjoint(&out, &g.w)?;
        disjoint(&out, &g.x)?;
        let b = backend_ref(backend)?;
        b.launch(stream, &[span(&g.w), span(&g.x), span(&out)], |kern| {
            let s = kern.stream();
            // SAFETY: checked buffers on the caller's contract (see `Borrowed::new`).
            let (w, x, mut o) = unsafe {
                (
                    Borrowed::new(s, g.w),
                    Borrowed::new(s, g.x),
                    Borrowed::new(s, out),
                )
            };
            let input = GemvInput::Plain {
                x: dev(kern, &*x),
                ld_x: g.ld_x,
            };
            let output = T::output(dev_mut(kern, &mut *o), ld_out);
            gemv(kern, dev(kern, &*w), g.n, g.k, g.m, &input, output)
        })
    })
}

/// `out[t][r] = sum_i w[r][i] * x[t][i]` for `m` (1..=8) token rows, stored as bf16: `w` is
/// `n x k` bf16 row-major (16-byte aligned, `k` a multiple of 8), `x` holds `m` rows of `k` every
/// `ld_x` (16-byte aligned, `ld_x` a multiple of 8), `out` `m` rows of `n` every `ld_out`.
///
/// # Safety
/// As for [`aot_rmsnorm_bf16`].
#[no_mangle]
pub unsafe extern "C" fn aot_gemv_bf16(
    backend: *const AotBackend,
    stream: *mut c_void,
    w: AotDevicePtr,
    w_len: usize,
    n: usize,
    k: usize,
    x: AotDevicePtr,
    x_len: usize,
    ld_x: usize,
    m: usize,
    out: AotDevicePtr,
    out_len: usize,
    ld_out: usize,
) -> AotStatus {
    gemv_storing::<bf16>(
        "aot_gemv_bf16",
        backend,
        stream,
        w,
        w_len,
        n,
        k,
        x,
        x_len,
        ld_x,
        m,
        out,
        out_len,
        ld_out,
    )
}

/// [`aot_gemv_bf16`] with fp32 output (logits for sampling): `out` holds `m` rows of `n` floats
/// every `ld_out`.
///
/// # Safety
/// As for [`aot_rmsnorm_bf16`].
#[no_mangle]
pub unsafe extern "C" fn aot_gemv_bf16_f32(
    backend: *const AotBackend,
    stream: *mut c_void,
    w: AotDevicePtr,
    w_len: usize,
    n: usize,
    k: usize,
    x: AotDevicePtr,
    x_len: usize,
    ld_x: usize,
    m: usize,
    out: AotDevicePtr,
    out_len: usize,
    ld_out: usize,
) -> AotStatus {
    gemv_storing::<f32>(
        "aot_gemv_bf16_f32",
        backend,
        stream,
        w,
        w_len,
        n,
        k,
        x,
        x_len,
        ld_x,
        m,
        out,
        out_len,
        ld_out,
    )
}

/// `out[r][i] = bf16(bf16(silu(gate[r][i])) * up[r][i])`: `input` is `rows x 2d` bf16 (`[gate | up]`
/// per row), `out` `rows x d` bf16; `rows` 1..=65535. When `d` is a multiple of 8 both buffers are
/// read in 16-byte vectors and must be 16-byte aligned.
///
/// # Safety
/// As for [`aot_rmsnorm_bf16`].
#[no_mangle]
pub unsafe extern "C" fn aot_silu_and_mul_bf16(
    backend: *const AotBackend,
    stream: *mut c_void,
    out: AotDevicePtr,
    out_len: usize,
    input: AotDevicePtr,
    input_len: usize,
    rows: usize,
    d: usize,
) -> AotStatus {
    boundary("aot_silu_and_mul_bf16", || {
        if !(1..=65535).contains(&rows) {
            return Err(CapiError::invalid(format!(
                "`rows` {rows} must be 1..=65535 (one grid row each)"
            )));
        }
        positive("d", d)?;
        let align = if d.is_multiple_of(8) {
            ALIGN_VEC
        } else {
            ALIGN_BF16
        };
        let out = device_buffer::<bf16>(
            "out",
            out,
            out_len,
            &need(&[("rows", rows), ("d", d)])?,
            align,
        )?;
        let input = device_buffer::<bf16>(
            "input",
            input,
            input_len,
            &need(&[("rows", rows), ("2", 2), ("d", d)])?,
            align,
        )?;
        disjoint(&out, &input)?;
        let b = backend_ref(backend)?;
        b.launch(stream, &[span(&out), span(&input)], |k| {
            // SAFETY: checked buffers on the caller's contract (see `Borrowed::new`).
            let (mut o, i) = unsafe {
                (
                    Borrowed::new(k.stream(), out),
                    Borrowed::new(k.stream(), input),
                )
            };
            activation::silu_and_mul(k, &mut o, &i, rows, d)
        })
    })
}

/// `out[r] = table[tokens[r]]` for `rows` rows (`out` rows `ld_out` apart), and with a non-null
/// `ssq_out` (`rows` floats) each row's sum of squares. `table` is `vocab x hidden` bf16, `tokens`
/// `rows` int32. A token outside `0..vocab` traps the kernel (the context is then unusable, as
/// after any device fault): check ids on the host.
///
/// # Safety
/// As for [`aot_rmsnorm_bf16`].
#[no_mangle]
pub unsafe extern "C" fn aot_embedding_bf16(
    backend: *const AotBackend,
    stream: *mut c_void,
    out: AotDevicePtr,
    out_len: usize,
    ld_out: usize,
    ssq_out: AotDevicePtr,
    ssq_len: usize,
    table: AotDevicePtr,
    table_len: usize,
    vocab: usize,
    hidden: usize,
    tokens: AotDevicePtr,
    tokens_len: usize,
    rows: usize,
) -> AotStatus {
    boundary("aot_embedding_bf16", || {
        positive("rows", rows)?;
        positive("vocab", vocab)?;
        positive("hidden", hidden)?;
        let out = device_buffer::<bf16>(
            "out",
            out,
            out_len,
            &strided_need(rows, ("hidden", hidden), ("ld_out", ld_out))?,
            ALIGN_BF16,
        )?;
        let table = device_buffer::<bf16>(
            "table",
            table,
            table_len,
            &need(&[("vocab", vocab), ("hidden", hidden)])?,
            ALIGN_BF16,
        )?;
        let tokens = device_buffer::<i32>(
            "tokens",
            tokens,
            tokens_len,
            &need(&[("rows", rows)])?,
            ALIGN_F32,
        )?;
        let ssq = match ssq_out {
            0 => None,
            p => Some(device_buffer::<f32>(
                "ssq_out",
                p,
                ssq_len,
                &need(&[("rows", rows)])?,
                ALIGN_F32,
            )?),
        };
        disjoint(&out, &table)?;
        disjoint(&out, &tokens)?;
        if let Some(s) = &ssq {
            disjoint(s, &out)?;
            disjoint(s, &table)?;
            disjoint(s, &tokens)?;
        }
        let b = backend_ref(backend)?;
        let mut spans = vec![span(&out), span(&table), span(&tokens)];
        spans.extend(ssq.as_ref().map(span));
        b.launch(stream, &spans, |k| {
            let s = k.stream();
            // SAFETY: checked buffers on the caller's contract (see `Borrowed::new`).
            let (mut o, t, ids, mut sq) = unsafe {
                (
                    Borrowed::new(s, out),
                    Borrowed::new(s, table),
                    Borrowed::new(s, tokens),
                    ssq.map(|a| Borrowed::new(s, a)),
                )
            };
            let ssq_view = sq.as_mut().map(|b| dev_mut(k, &mut **b));
            embedding::embedding(
                k,
                dev_mut(k, &mut *o),
                ld_out,
                ssq_view,
                dev(k, &*t),
                vocab,
                hidden,
                dev(k, &*ids),
                rows,
            )
        })
    })
}

/// Per-row sampling parameters on the device: each array holds at least `len` values, one per
/// row (`len >= rows`). `temperature` 0 (or `top_k` 1) is greedy; `top_p` 1 disables the cut.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AotSamplingParams {
    /// `float[len]`.
    pub temperature: AotDevicePtr,
    /// `uint32_t[len]`; 0 means no top-k cut.
    pub top_k: AotDevicePtr,
    /// `float[len]`, each in (0, 1].
    pub top_p: AotDevicePtr,
    /// `uint64_t[len]`: the row's random stream.
    pub seed: AotDevicePtr,
    /// `uint64_t[len]`: the draw within the stream (the request's step).
    pub counter: AotDevicePtr,
    pub len: usize,
}

/// `tokens[r]` = the token sampled from row `r` of `logits` (`rows` rows of `vocab` floats,
/// `row_stride` apart) under the row's parameters: greedy rows take the argmax (ties to the lower
/// index), seeded rows the same token on every run for the same seed and counter. Bit for bit the
/// backend's CPU reference (`aot_kernels::ops::sampling::sample_reference`).
///
/// # Safety
/// As for [`aot_rmsnorm_bf16`]; `params` is null (an error) or points to one `AotSamplingParams`.
#[no_mangle]
pub unsafe extern "C" fn aot_sample_tokens(
    backend: *const AotBackend,
    stream: *mut c_void,
    tokens: AotDevicePtr,
    tokens_len: usize,
    logits: AotDevicePtr,
    logits_len: usize,
    rows: usize,
    vocab: usize,
    row_stride: usize,
    params: *const AotSamplingParams,
) -> AotStatus {
    boundary("aot_sample_tokens", || {
        if !(1..=i32::MAX as usize).contains(&rows) {
            return Err(CapiError::invalid(format!(
                "`rows` {rows} must be 1..={}",
                i32::MAX
            )));
        }
        if !(1..=MAX_VOCAB).contains(&vocab) {
            return Err(CapiError::invalid(format!(
                "`vocab` {vocab} must be 1..={MAX_VOCAB}"
            )));
        }
        let tokens = device_buffer::<i32>(
            "tokens",
            tokens,
            tokens_len,
            &need(&[("rows", rows)])?,
            ALIGN_F32,
        )?;
        let logits = device_buffer::<f32>(
            "logits",
            logits,
            logits_len,
            &strided_need(rows, ("vocab", vocab), ("row_stride", row_stride))?,
            ALIGN_F32,
        )?;
        disjoint(&tokens, &logits)?;
        // SAFETY: null or one struct, the caller's contract.
        let p = unsafe { params.as_ref() }.ok_or_else(|| CapiError::null("params"))?;
        let per_row = need(&[("rows", rows)])?;
        let temperature = device_buffer::<f32>(
            "params->temperature",
            p.temperature,
            p.len,
            &per_row,
            ALIGN_F32,
        )?;
        let top_k = device_buffer::<u32>("params->top_k", p.top_k, p.len, &per_row, ALIGN_F32)?;
        let top_p = device_buffer::<f32>("params->top_p", p.top_p, p.len, &per_row, ALIGN_F32)?;
        let seed = device_buffer::<u64>("params->seed", p.seed, p.len, &per_row, ALIGN_U64)?;
        let counter =
            device_buffer::<u64>("params->counter", p.counter, p.len, &per_row, ALIGN_U64)?;
        disjoint(&tokens, &temperature)?;
        disjoint(&tokens, &top_k)?;
        disjoint(&tokens, &top_p)?;
        disjoint(&tokens, &seed)?;
        disjoint(&tokens, &counter)?;
        let b = backend_ref(backend)?;
        let spans = [
            span(&tokens),
            span(&logits),
            span(&temperature),
            span(&top_k),
            span(&top_p),
            span(&seed),
            span(&counter),
        ];
        b.launch(stream, &spans, |k| {
            let s = k.stream();
            // SAFETY: checked buffers on the caller's contract (see `Borrowed::new`).
            let (mut t, l, temp, tk, tp, sd, ct) = unsafe {
                (
                    Borrowed::new(s, tokens),
                    Borrowed::new(s, logits),
                    Borrowed::new(s, temperature),
                    Borrowed::new(s, top_k),
                    Borrowed::new(s, top_p),
                    Borrowed::new(s, seed),
                    Borrowed::new(s, counter),
                )
            };
            let params = DeviceSamplingParams {
                temperature: dev(k, &*temp),
                top_k: dev(k, &*tk),
                top_p: dev(k, &*tp),
                seed: dev(k, &*sd),
                counter: dev(k, &*ct),
            };
            let shape = LogitsShape {
                rows,
                vocab,
                row_stride,
            };
            sample_tokens(k, &mut t, &l, &shape, &params)
        })
    })
}
