//! The C ABI on a real GPU: launches through it give the Rust launchers' bits (decode attention,
//! the output gate, Gated DeltaNet and MoE also the references' values), the caller's context stays
//! current and alive, the pointer check names a short allocation.
//!
//! Gated DeltaNet and MoE run Triton modules compiled for the Qwen3.5/3.6-35B-A3B shapes only (and
//! with CUDA 13 only: they need a driver of CUDA 13.0 or newer), so their tests use those shapes,
//! with the backend's own fixtures and tolerances (tests/triton_common).
//!
//! `#[ignore]`d (they need a CUDA GPU): run them with `--ignored` on the GPU machine.

use std::ffi::CStr;
use std::ptr::null_mut;
use std::sync::Arc;

use aot_kernels::device::{CudaContext, CudaSlice, CudaStream};
use aot_kernels::dispatch::{load_available, open_context, LoadedKernels, ModuleSource, Policy};
use aot_kernels::ops::attention::{
    attention_decode, attention_decode_reference, attn_scratch_needs, attn_splits,
    qkv_head_reference, AttnDecode, AttnScratch, QkvShape, BLOCK_TOKENS, MAX_SPLITS,
};
use aot_kernels::ops::compare::{compare, ulp_distance};
use aot_kernels::ops::gated_delta_net::{
    gdn_recurrent, gdn_reference, GdnInputs, GdnLayer, GdnParamsHost, GdnScratch, GdnSequences,
    GdnState,
};
use aot_kernels::ops::gemv::{gemv, GemvInput, GemvOutput};
use aot_kernels::ops::moe::{
    moe_forward, moe_reference, moe_reference_from_logits, moe_router_logits_reference, route,
    routing_margin_ulps, MoeLayer, MoeReference, MoeScratch, MoeWeightsHost,
};
use aot_kernels::ops::output_gate::{sigmoid_gate_mul, sigmoid_gate_reference};
use aot_kernels::ops::rmsnorm::{rmsnorm, RmsNormParams};
use aot_kernels::ops::rotary::cos_sin_cache;
use aot_kernels::ops::{dev, dev_mut};
use aot_kernels_capi::backend::{aot_backend_create_in_context, aot_backend_destroy};
use aot_kernels_capi::last_error::aot_last_error_message;
use aot_kernels_capi::ops::{
    aot_attention_decode_bf16, aot_attention_decode_workspace_bytes, aot_gdn_recurrent_bf16,
    aot_gdn_recurrent_workspace_bytes, aot_gemv_bf16_f32, aot_moe_forward_bf16,
    aot_moe_forward_workspace_bytes, aot_rmsnorm_bf16, aot_sigmoid_gate_mul_bf16,
};
use aot_kernels_capi::{AotAttentionDecode, AotBackend, AotGdn, AotMoe, AotStatus};
use cudarc::driver::sys;
use cudarc::driver::DevicePtr;
use half::bf16;
use rand::{Rng, SeedableRng};

/// The backend's fixtures and tolerances for its Triton kernels' GPU tests.
#[path = "../../tests/triton_common/mod.rs"]
mod triton_common;
use triton_common::{
    bf, bf16_chain_near, bf16_error, f32_error, gdn_batch, gdn_fixture, GdnBatchHost, BF16_MAX_REL,
    BF16_NEAR_SHARE, F32_MAX_REL, F32_NEAR_SHARE, GDN, MOE,
};

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
    // SAFETY: no buffer exists yet; the test orders its one stream itself.
    unsafe { ctx.disable_event_tracking() };
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
    // The C call into `out`, declared `out_len` elements long.
    let rmsnorm_into = |out: sys::CUdeviceptr, out_len: usize| {
        // SAFETY: every address is a live allocation on this context, of the declared length but
        // for `out_len` (which the pointer check must refuse when it is too long).
        unsafe {
            aot_rmsnorm_bf16(
                backend,
                s,
                out,
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
    let rmsnorm_c = |out_len: usize| rmsnorm_into(addr(&stream, &normed_c), out_len);
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

    // Managed memory passes the pointer check (the driver knows it, whatever device it names) and
    // gets the same bits.
    let mut managed: sys::CUdeviceptr = 0;
    let managed_bytes = rows * hidden * std::mem::size_of::<bf16>();
    // SAFETY: allocates `managed_bytes` of managed memory into `managed`, freed below.
    unsafe {
        sys::cuMemAllocManaged(
            &mut managed,
            managed_bytes,
            sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as u32,
        )
        .result()
        .unwrap()
    };
    let status = rmsnorm_into(managed, rows * hidden);
    assert_eq!(status, AotStatus::Ok, "{}", last_error());
    stream.synchronize().unwrap();
    let mut from_managed = vec![bf16::ZERO; rows * hidden];
    // SAFETY: copies the managed allocation, whole, into a host vector of its length; then frees it.
    unsafe {
        sys::cuMemcpyDtoH_v2(from_managed.as_mut_ptr().cast(), managed, managed_bytes)
            .result()
            .unwrap();
        sys::cuMemFree_v2(managed).result().unwrap();
    }
    assert_eq!(
        from_managed,
        stream.clone_dtoh(&normed_rust).unwrap(),
        "rmsnorm bits into managed memory"
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

/// Decode-attention inputs on the host: row r's new token at `positions[r]` of its own slot
/// (`slots[r]`), whose earlier positions hold random keys and values under a shuffled block table.
struct AttnCase {
    q_heads: usize,
    kv_heads: usize,
    hd: usize,
    weight_offset: f32,
    positions: Vec<usize>,
    slots: Vec<i32>,
    ld_bt: usize,
    table: Vec<i32>,
    max_pos: usize,
    /// `[rows][ld_qkv]`, the padding past each row's `[q | k | v]` random too.
    qkv: Vec<bf16>,
    ld_qkv: usize,
    q_norm: Vec<bf16>,
    k_norm: Vec<bf16>,
    cos_sin: Vec<f32>,
    kc: Vec<bf16>,
    vc: Vec<bf16>,
}

/// (q heads, KV heads, head dimension, the rows' positions, the norms' weight offset): one split
/// and several (1100: 8, merged through the workspace), every head dimension, groups 4, 8 and 1.
fn attention_cases() -> Vec<(usize, usize, usize, Vec<usize>, f32)> {
    vec![
        (32, 8, 128, vec![0, 17, 300, 1100], 0.0),
        (16, 2, 256, vec![5, 400], 1.0),
        (4, 4, 64, vec![129, 1, 700], 0.0),
    ]
}

impl AttnCase {
    fn new(
        seed: u64,
        (q_heads, kv_heads, hd, positions, weight_offset): (usize, usize, usize, Vec<usize>, f32),
    ) -> Self {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let rows = positions.len();
        let ld_bt = positions.iter().max().unwrap() / BLOCK_TOKENS + 2;
        let blocks = rows * ld_bt;
        let mut table: Vec<i32> = (0..blocks as i32).collect();
        for i in (1..table.len()).rev() {
            table.swap(i, rng.gen_range(0..=i));
        }
        let block = kv_heads * BLOCK_TOKENS * hd;
        let ld_qkv = (q_heads + 2 * kv_heads) * hd + 64;
        let max_pos = ld_bt * BLOCK_TOKENS;
        let mut fresh = |n: usize, scale: f32| random(n, rng.gen(), scale);
        AttnCase {
            q_heads,
            kv_heads,
            hd,
            weight_offset,
            slots: (0..rows as i32).rev().collect(),
            ld_bt,
            table,
            max_pos,
            qkv: fresh(rows * ld_qkv, 2.0),
            ld_qkv,
            // Zero-centred weights (offset 1) are small, the others near their scale of 1.
            q_norm: fresh(hd, if weight_offset == 0.0 { 1.2 } else { 0.2 }),
            k_norm: fresh(hd, if weight_offset == 0.0 { 1.2 } else { 0.2 }),
            cos_sin: cos_sin_cache(max_pos, hd, 1e6),
            kc: fresh(blocks * block, 1.0),
            vc: fresh(blocks * block, 1.0),
            positions,
        }
    }

    fn rows(&self) -> usize {
        self.positions.len()
    }

    /// Where position `p` of row `r`'s sequence lives in a cache, at KV head `kv`.
    fn at(&self, r: usize, p: usize, kv: usize) -> usize {
        let blk = self.table[self.slots[r] as usize * self.ld_bt + p / BLOCK_TOKENS] as usize;
        ((blk * self.kv_heads + kv) * BLOCK_TOKENS + p % BLOCK_TOKENS) * self.hd
    }

    fn workspace_bytes(&self, rows: usize) -> usize {
        let mut bytes = 0;
        // SAFETY: one writable size_t.
        let status = unsafe {
            aot_attention_decode_workspace_bytes(
                rows,
                self.q_heads,
                self.kv_heads,
                self.hd,
                &mut bytes,
            )
        };
        assert_eq!(status, AotStatus::Ok, "{}", last_error());
        bytes
    }
}

/// A case's rows `rows` on the device, with their own caches (the whole table's) and output.
struct AttnBuffers {
    m: usize,
    qkv: CudaSlice<bf16>,
    q_norm: CudaSlice<bf16>,
    k_norm: CudaSlice<bf16>,
    cos_sin: CudaSlice<f32>,
    table: CudaSlice<i32>,
    slots: CudaSlice<i32>,
    positions: CudaSlice<i32>,
    kc: CudaSlice<bf16>,
    vc: CudaSlice<bf16>,
    out: CudaSlice<bf16>,
}

impl AttnBuffers {
    fn new(stream: &Arc<CudaStream>, case: &AttnCase, rows: &[usize]) -> Self {
        let qkv: Vec<bf16> = rows
            .iter()
            .flat_map(|&r| case.qkv[r * case.ld_qkv..(r + 1) * case.ld_qkv].to_vec())
            .collect();
        let slots: Vec<i32> = rows.iter().map(|&r| case.slots[r]).collect();
        let positions: Vec<i32> = rows.iter().map(|&r| case.positions[r] as i32).collect();
        AttnBuffers {
            m: rows.len(),
            qkv: stream.clone_htod(&qkv).unwrap(),
            q_norm: stream.clone_htod(&case.q_norm).unwrap(),
            k_norm: stream.clone_htod(&case.k_norm).unwrap(),
            cos_sin: stream.clone_htod(&case.cos_sin).unwrap(),
            table: stream.clone_htod(&case.table).unwrap(),
            slots: stream.clone_htod(&slots).unwrap(),
            positions: stream.clone_htod(&positions).unwrap(),
            kc: stream.clone_htod(&case.kc).unwrap(),
            vc: stream.clone_htod(&case.vc).unwrap(),
            out: stream
                .alloc_zeros::<bf16>(rows.len() * case.q_heads * case.hd)
                .unwrap(),
        }
    }

    /// The launch through the C ABI on `workspace`, every length the allocation's.
    fn launch_c(
        &self,
        backend: *mut AotBackend,
        stream: &CudaStream,
        case: &AttnCase,
        workspace: &CudaSlice<u8>,
    ) -> AotStatus {
        let args = AotAttentionDecode {
            qkv: addr(stream, &self.qkv),
            qkv_len: self.qkv.len(),
            ld_qkv: case.ld_qkv,
            q_norm: addr(stream, &self.q_norm),
            q_norm_len: self.q_norm.len(),
            k_norm: addr(stream, &self.k_norm),
            k_norm_len: self.k_norm.len(),
            cos_sin: addr(stream, &self.cos_sin),
            cos_sin_len: self.cos_sin.len(),
            max_pos: case.max_pos,
            k_cache: addr(stream, &self.kc),
            k_cache_len: self.kc.len(),
            v_cache: addr(stream, &self.vc),
            v_cache_len: self.vc.len(),
            block_table: addr(stream, &self.table),
            block_table_len: self.table.len(),
            ld_bt: case.ld_bt,
            slot_of_row: addr(stream, &self.slots),
            slot_of_row_len: self.slots.len(),
            positions: addr(stream, &self.positions),
            positions_len: self.positions.len(),
            out: addr(stream, &self.out),
            out_len: self.out.len(),
            workspace: addr(stream, workspace),
            workspace_bytes: workspace.len(),
            m: self.m,
            q_heads: case.q_heads,
            kv_heads: case.kv_heads,
            head_dim: case.hd,
            eps: 1e-6,
            weight_offset: case.weight_offset,
        };
        // SAFETY: every address is a live allocation of this context of its declared length.
        unsafe { aot_attention_decode_bf16(backend, stream.cu_stream().cast(), &args) }
    }

    /// The same launch through the Rust launcher, in the form the C ABI takes (every split's
    /// block in the grid, merged through its own zeroed workspace, not pipelined).
    fn launch_rust(&mut self, kernels: &LoadedKernels, case: &AttnCase) {
        let s = kernels.stream();
        let (ml, o, counters) = attn_scratch_needs(self.m, case.q_heads, case.kv_heads, case.hd);
        let (mut ws_ml, mut ws_o, mut counters) = (
            s.alloc_zeros::<f32>(ml).unwrap(),
            s.alloc_zeros::<f32>(o).unwrap(),
            s.alloc_zeros::<u32>(counters).unwrap(),
        );
        attention_decode(
            kernels,
            AttnDecode {
                qkv: dev(kernels, &self.qkv),
                ld_qkv: case.ld_qkv,
                q_norm: dev(kernels, &self.q_norm),
                k_norm: dev(kernels, &self.k_norm),
                eps: 1e-6,
                weight_offset: case.weight_offset,
                cos_sin: dev(kernels, &self.cos_sin),
                max_pos: case.max_pos,
                k_cache: dev_mut(kernels, &mut self.kc),
                v_cache: dev_mut(kernels, &mut self.vc),
                block_table: dev(kernels, &self.table),
                ld_bt: case.ld_bt,
                slot_of_row: dev(kernels, &self.slots),
                positions: dev(kernels, &self.positions),
                out: dev_mut(kernels, &mut self.out),
                m: self.m,
                q_heads: case.q_heads,
                kv_heads: case.kv_heads,
                head_dim: case.hd,
                grid_splits: MAX_SPLITS,
                pipelined: false,
                cluster: false,
                overlap_previous: false,
            },
            &mut AttnScratch {
                ws_ml: dev_mut(kernels, &mut ws_ml),
                ws_o: dev_mut(kernels, &mut ws_o),
                counters: dev_mut(kernels, &mut counters),
            },
        )
        .unwrap();
        s.synchronize().unwrap();
    }

    /// (out, k cache, v cache).
    fn results(&self, stream: &Arc<CudaStream>) -> (Vec<bf16>, Vec<bf16>, Vec<bf16>) {
        stream.synchronize().unwrap();
        (
            stream.clone_dtoh(&self.out).unwrap(),
            stream.clone_dtoh(&self.kc).unwrap(),
            stream.clone_dtoh(&self.vc).unwrap(),
        )
    }
}

/// The backend in a fresh context, and the Rust launchers' kernels loaded on the same context.
fn attention_setup() -> (*mut AotBackend, LoadedKernels) {
    let ctx = CudaContext::new(0).unwrap();
    // SAFETY: no buffer exists yet; the test orders its one stream itself.
    unsafe { ctx.disable_event_tracking() };
    let backend = backend_in(&ctx);
    let kernels = load_available(
        &open_context(ctx).unwrap(),
        Policy::Auto,
        &ModuleSource::registry(),
    )
    .unwrap();
    (backend, kernels)
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_attention_decode_through_the_c_abi_gives_the_rust_launchers_bits() {
    let (backend, kernels) = attention_setup();
    let stream = kernels.stream().clone();
    for (i, shape) in attention_cases().into_iter().enumerate() {
        let case = AttnCase::new(10 + i as u64, shape);
        let all: Vec<usize> = (0..case.rows()).collect();
        let workspace = stream
            .alloc_zeros::<u8>(case.workspace_bytes(case.rows()))
            .unwrap();
        let through_c = AttnBuffers::new(&stream, &case, &all);
        let status = through_c.launch_c(backend, &stream, &case, &workspace);
        assert_eq!(status, AotStatus::Ok, "{}", last_error());
        let mut rust = AttnBuffers::new(&stream, &case, &all);
        rust.launch_rust(&kernels, &case);
        let (c, r) = (through_c.results(&stream), rust.results(&stream));
        let name = format!("{}/{}x{}", case.q_heads, case.kv_heads, case.hd);
        assert_eq!(c.0, r.0, "{name}: out bits");
        assert_eq!(c.1, r.1, "{name}: k cache bits");
        assert_eq!(c.2, r.2, "{name}: v cache bits");
    }
    // SAFETY: the backend from above, no longer used.
    assert_eq!(unsafe { aot_backend_destroy(backend) }, AotStatus::Ok);
}

/// What the reference makes of row `r`: its new key and value per KV head, its output, and the
/// largest |v| of each KV head over its context.
struct RowReference {
    new_keys: Vec<Vec<bf16>>,
    new_values: Vec<Vec<bf16>>,
    out: Vec<bf16>,
    v_max: Vec<f32>,
}

/// Row `r` through the backend's references: the q/k heads normed and rotated
/// (`qkv_head_reference`), then float64 attention over the cache's earlier positions and the new
/// key and value (`attention_decode_reference`).
fn row_reference(case: &AttnCase, r: usize) -> RowReference {
    let (q_heads, kv_heads, hd, p) = (case.q_heads, case.kv_heads, case.hd, case.positions[r]);
    let shape = QkvShape {
        q_heads,
        kv_heads,
        head_dim: hd,
        eps: 1e-6,
        weight_offset: case.weight_offset,
    };
    let raw = |head: usize| -> Vec<f64> {
        case.qkv[r * case.ld_qkv + head * hd..][..hd]
            .iter()
            .map(|v| f64::from(v.to_f32()))
            .collect()
    };
    let cs = &case.cos_sin[p * hd..(p + 1) * hd];
    let new_keys: Vec<Vec<bf16>> = (0..kv_heads)
        .map(|kv| qkv_head_reference(&raw(q_heads + kv), Some(&case.k_norm), cs, &shape))
        .collect();
    let new_values: Vec<Vec<bf16>> = (0..kv_heads)
        .map(|kv| qkv_head_reference(&raw(q_heads + kv_heads + kv), None, cs, &shape))
        .collect();
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    for t in 0..=p {
        for kv in 0..kv_heads {
            if t == p {
                keys.extend_from_slice(&new_keys[kv]);
                values.extend_from_slice(&new_values[kv]);
            } else {
                let at = case.at(r, t, kv);
                keys.extend_from_slice(&case.kc[at..at + hd]);
                values.extend_from_slice(&case.vc[at..at + hd]);
            }
        }
    }
    let q: Vec<bf16> = (0..q_heads)
        .flat_map(|h| qkv_head_reference(&raw(h), Some(&case.q_norm), cs, &shape))
        .collect();
    let out = attention_decode_reference(&q, &keys, &values, p + 1, q_heads, kv_heads, hd);
    let v_max = (0..kv_heads)
        .map(|kv| {
            (0..=p)
                .flat_map(|t| &values[(t * kv_heads + kv) * hd..][..hd])
                .map(|v| v.to_f32().abs())
                .fold(0.0f32, f32::max)
        })
        .collect();
    RowReference {
        new_keys,
        new_values,
        out,
        v_max,
    }
}

/// `got` within 2 bf16 ulps of `want`, or within `abs(i)` of it (where rounding an operand
/// before a cancelling sum moves a small result by many of its ulps).
fn assert_close(what: &str, got: &[bf16], want: &[bf16], abs: impl Fn(usize) -> f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ulps = ulp_distance(g, w);
        assert!(
            ulps <= 2 || (g.to_f32() - w.to_f32()).abs() <= abs(i),
            "{what}[{i}]: got {g}, reference {w} ({ulps} ulp, abs tolerance {})",
            abs(i)
        );
    }
}

/// The tolerances of tests/gpu_decode.rs: the new key within 2 ulps (or 2e-2 where the rotation
/// cancels), the value exact, the output within 2 ulps or 2e-3 plus 2^-8 of the largest |v| of its
/// KV head (the kernel multiplies V by probabilities rounded to bf16).
#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_attention_decode_through_the_c_abi_matches_the_reference() {
    let (backend, kernels) = attention_setup();
    let stream = kernels.stream().clone();
    for (i, shape) in attention_cases().into_iter().enumerate() {
        let case = AttnCase::new(20 + i as u64, shape);
        let all: Vec<usize> = (0..case.rows()).collect();
        let workspace = stream
            .alloc_zeros::<u8>(case.workspace_bytes(case.rows()))
            .unwrap();
        let d = AttnBuffers::new(&stream, &case, &all);
        let status = d.launch_c(backend, &stream, &case, &workspace);
        assert_eq!(status, AotStatus::Ok, "{}", last_error());
        let (out, kc, vc) = d.results(&stream);
        let (width, group) = (case.q_heads * case.hd, case.q_heads / case.kv_heads);
        for (r, &p) in case.positions.iter().enumerate() {
            let want = row_reference(&case, r);
            let label = format!(
                "{}/{}x{} pos {p} ({} splits)",
                case.q_heads,
                case.kv_heads,
                case.hd,
                attn_splits(p + 1).0
            );
            for kv in 0..case.kv_heads {
                let at = case.at(r, p, kv);
                assert_close(
                    &format!("{label} new key"),
                    &kc[at..at + case.hd],
                    &want.new_keys[kv],
                    |_| 2e-2,
                );
                assert_eq!(
                    &vc[at..at + case.hd],
                    &want.new_values[kv][..],
                    "{label}: new value"
                );
            }
            assert_close(&label, &out[r * width..(r + 1) * width], &want.out, |i| {
                2e-3 + want.v_max[i / case.hd / group] * 2f32.powi(-8)
            });
        }
    }
    // SAFETY: the backend from above, no longer used.
    assert_eq!(unsafe { aot_backend_destroy(backend) }, AotStatus::Ok);
}

/// A workspace sized for all the rows, declared at that size every time, serves a launch of them,
/// one of the last row alone, and them again: each leaves the counters (the workspace's last bytes)
/// zero, the row alone gets its bits in the batch, and the batch its bits again.
#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_attention_decode_workspace_serves_launches_of_fewer_rows_and_stays_zeroed() {
    let (backend, kernels) = attention_setup();
    let stream = kernels.stream().clone();
    let case = AttnCase::new(30, attention_cases().swap_remove(0));
    let all: Vec<usize> = (0..case.rows()).collect();
    let last = case.rows() - 1;
    assert!(
        attn_splits(case.positions[last] + 1).0 > 1,
        "the last row merges its splits through the workspace"
    );
    let bytes = case.workspace_bytes(case.rows());
    let (_, _, counters) = attn_scratch_needs(case.rows(), case.q_heads, case.kv_heads, case.hd);
    let workspace = stream.alloc_zeros::<u8>(bytes).unwrap();
    let (batch, alone) = (
        AttnBuffers::new(&stream, &case, &all),
        AttnBuffers::new(&stream, &case, &[last]),
    );
    let mut outs = Vec::new();
    for (step, buffers) in [
        ("all rows", &batch),
        ("the last row alone", &alone),
        ("all rows again", &batch),
    ] {
        let status = buffers.launch_c(backend, &stream, &case, &workspace);
        assert_eq!(status, AotStatus::Ok, "{step}: {}", last_error());
        stream.synchronize().unwrap();
        let ws = stream.clone_dtoh(&workspace).unwrap();
        assert!(
            ws[bytes - 4 * counters..].iter().all(|&b| b == 0),
            "{step}: counters left non-zero"
        );
        outs.push(buffers.results(&stream).0);
    }
    let width = case.q_heads * case.hd;
    assert_eq!(
        outs[1],
        outs[0][last * width..],
        "the row alone differs from the batch"
    );
    assert_eq!(outs[2], outs[0], "the batch again differs");
    // SAFETY: the backend from above, no longer used.
    assert_eq!(unsafe { aot_backend_destroy(backend) }, AotStatus::Ok);
}

/// One output-gate case: its name, C's result, the launcher's, the reference's.
type GateRun = (String, Vec<bf16>, Vec<bf16>, Vec<bf16>);

/// The output gate of the A3B attention (32 heads of 128 gated, the gates a column range of rows
/// of 9216 after `[q | k | v]`) and an odd width, through the C ABI and the Rust launcher: (name,
/// C's result, the launcher's, the reference's).
fn sigmoid_gate_runs() -> Vec<GateRun> {
    let (backend, kernels) = attention_setup();
    let stream = kernels.stream().clone();
    let mut runs = Vec::new();
    for (i, (rows, width, ld_x, ld_gate, gate_at)) in
        [(8, 4096, 4096 + 64, 9216, 5120), (3, 300, 301, 700, 33)]
            .into_iter()
            .enumerate()
    {
        let x = random(rows * ld_x, 40 + i as u64, 4.0);
        let g = random(rows * ld_gate, 50 + i as u64, 8.0);
        let (x_c, mut x_rust, dg) = (
            stream.clone_htod(&x).unwrap(),
            stream.clone_htod(&x).unwrap(),
            stream.clone_htod(&g).unwrap(),
        );
        // SAFETY: live allocations of this context of the declared lengths (the gate from
        // `gate_at` on).
        let status = unsafe {
            aot_sigmoid_gate_mul_bf16(
                backend,
                stream.cu_stream().cast(),
                addr(&stream, &x_c),
                x_c.len(),
                ld_x,
                addr(&stream, &dg) + 2 * gate_at as u64,
                dg.len() - gate_at,
                ld_gate,
                rows,
                width,
            )
        };
        assert_eq!(status, AotStatus::Ok, "{}", last_error());
        sigmoid_gate_mul(
            &kernels,
            dev_mut(&kernels, &mut x_rust),
            ld_x,
            dev(&kernels, &dg).skip(gate_at).unwrap(),
            ld_gate,
            rows,
            width,
        )
        .unwrap();
        let mut want = x.clone();
        sigmoid_gate_reference(&mut want, ld_x, &g[gate_at..], ld_gate, rows, width);
        stream.synchronize().unwrap();
        runs.push((
            format!("sigmoid_gate_mul {rows}x{width}"),
            stream.clone_dtoh(&x_c).unwrap(),
            stream.clone_dtoh(&x_rust).unwrap(),
            want,
        ));
    }
    // SAFETY: the backend from above, no longer used.
    assert_eq!(unsafe { aot_backend_destroy(backend) }, AotStatus::Ok);
    runs
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_sigmoid_gate_through_the_c_abi_gives_the_rust_launchers_bits() {
    for (name, c, rust, _) in sigmoid_gate_runs() {
        assert_eq!(c, rust, "{name}: bits");
    }
}

/// The tolerance of tests/gpu_kernels.rs: within 2 ulps of the reference; the stride gap untouched.
#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_sigmoid_gate_through_the_c_abi_matches_the_reference() {
    for (name, c, _, want) in sigmoid_gate_runs() {
        let r = compare(&c, &want);
        eprintln!("{name}: vs CPU reference: {r}");
        assert!(
            c.iter().any(|v| v.to_f32() != 0.0),
            "{name}: nothing written"
        );
        assert!(r.max_ulps <= 2, "{name}: {r}");
    }
}

/// State slots of the GDN tests (the fixture's decode batch uses slots up to 11).
const GDN_SLOTS: usize = 12;

/// One GDN batch on the device from the given states, with its output.
struct GdnBuffers {
    n_seqs: usize,
    n_tokens: usize,
    conv_weight: CudaSlice<bf16>,
    a_log: CudaSlice<f32>,
    dt_bias: CudaSlice<f32>,
    norm_weight: CudaSlice<bf16>,
    conv_state: CudaSlice<bf16>,
    recurrent_state: CudaSlice<f32>,
    cu_seqlens: CudaSlice<i32>,
    slots: CudaSlice<i32>,
    has_state: CudaSlice<i32>,
    qkv: CudaSlice<bf16>,
    a: CudaSlice<bf16>,
    b: CudaSlice<bf16>,
    z: CudaSlice<bf16>,
    out: CudaSlice<bf16>,
}

/// A GDN run's output, conv state and recurrent state.
type GdnOut = (Vec<bf16>, Vec<bf16>, Vec<f32>);

impl GdnBuffers {
    fn new(
        st: &Arc<CudaStream>,
        p: &GdnParamsHost,
        batch: &GdnBatchHost,
        conv0: &[bf16],
        rec0: &[f32],
    ) -> Self {
        let n_tokens: usize = batch.seqs.iter().map(|s| s.len).sum();
        let slots: Vec<i32> = batch.seqs.iter().map(|s| s.slot as i32).collect();
        let has: Vec<i32> = batch.seqs.iter().map(|s| i32::from(s.has_state)).collect();
        GdnBuffers {
            n_seqs: batch.seqs.len(),
            n_tokens,
            conv_weight: st.clone_htod(&p.conv_weight).unwrap(),
            a_log: st.clone_htod(&p.a_log).unwrap(),
            dt_bias: st.clone_htod(&p.dt_bias).unwrap(),
            norm_weight: st.clone_htod(&p.norm_weight).unwrap(),
            conv_state: st.clone_htod(conv0).unwrap(),
            recurrent_state: st.clone_htod(rec0).unwrap(),
            cu_seqlens: st
                .clone_htod(&triton_common::cu_seqlens(&batch.seqs))
                .unwrap(),
            slots: st.clone_htod(&slots).unwrap(),
            has_state: st.clone_htod(&has).unwrap(),
            qkv: st.clone_htod(&batch.qkv).unwrap(),
            a: st.clone_htod(&batch.a).unwrap(),
            b: st.clone_htod(&batch.b).unwrap(),
            z: st.clone_htod(&batch.z).unwrap(),
            out: st.alloc_zeros(n_tokens * GDN.value_width()).unwrap(),
        }
    }

    fn launch_c(&self, backend: *mut AotBackend, st: &Arc<CudaStream>, eps: f32) {
        let mut bytes = 0;
        // SAFETY: one writable size_t.
        let status = unsafe {
            aot_gdn_recurrent_workspace_bytes(
                self.n_tokens,
                GDN.key_heads,
                GDN.value_heads,
                GDN.key_dim,
                GDN.value_dim,
                GDN.conv_width,
                &mut bytes,
            )
        };
        assert_eq!(status, AotStatus::Ok, "{}", last_error());
        let workspace = st.alloc_zeros::<u8>(bytes).unwrap();
        let args = AotGdn {
            qkv: addr(st, &self.qkv),
            qkv_len: self.qkv.len(),
            a: addr(st, &self.a),
            a_len: self.a.len(),
            b: addr(st, &self.b),
            b_len: self.b.len(),
            z: addr(st, &self.z),
            z_len: self.z.len(),
            conv_weight: addr(st, &self.conv_weight),
            conv_weight_len: self.conv_weight.len(),
            a_log: addr(st, &self.a_log),
            a_log_len: self.a_log.len(),
            dt_bias: addr(st, &self.dt_bias),
            dt_bias_len: self.dt_bias.len(),
            norm_weight: addr(st, &self.norm_weight),
            norm_weight_len: self.norm_weight.len(),
            conv_state: addr(st, &self.conv_state),
            conv_state_len: self.conv_state.len(),
            recurrent_state: addr(st, &self.recurrent_state),
            recurrent_state_len: self.recurrent_state.len(),
            state_slots: GDN_SLOTS,
            cu_seqlens: addr(st, &self.cu_seqlens),
            cu_seqlens_len: self.cu_seqlens.len(),
            slot_of_seq: addr(st, &self.slots),
            slot_of_seq_len: self.slots.len(),
            has_state: addr(st, &self.has_state),
            has_state_len: self.has_state.len(),
            out: addr(st, &self.out),
            out_len: self.out.len(),
            workspace: addr(st, &workspace),
            workspace_bytes: workspace.len(),
            n_seqs: self.n_seqs,
            n_tokens: self.n_tokens,
            key_heads: GDN.key_heads,
            value_heads: GDN.value_heads,
            key_dim: GDN.key_dim,
            value_dim: GDN.value_dim,
            conv_width: GDN.conv_width,
            eps,
        };
        // SAFETY: every address is a live allocation of this context of its declared length.
        let status = unsafe { aot_gdn_recurrent_bf16(backend, st.cu_stream().cast(), &args) };
        assert_eq!(status, AotStatus::Ok, "{}", last_error());
        st.synchronize().unwrap();
    }

    fn launch_rust(&mut self, kernels: &LoadedKernels, eps: f32) {
        let st = kernels.stream();
        let mut scratch = GdnScratch::new(st, &GDN, self.n_tokens).unwrap();
        let layer = GdnLayer {
            conv_weight: &self.conv_weight,
            a_log: &self.a_log,
            dt_bias: &self.dt_bias,
            norm_weight: &self.norm_weight,
            eps,
        };
        let mut state = GdnState {
            conv: &mut self.conv_state,
            recurrent: &mut self.recurrent_state,
            slots: GDN_SLOTS,
        };
        let seqs = GdnSequences {
            n_seqs: self.n_seqs,
            n_tokens: self.n_tokens,
            cu_seqlens: &self.cu_seqlens,
            slots: &self.slots,
            has_state: &self.has_state,
        };
        let inputs = GdnInputs {
            qkv: &self.qkv,
            a: &self.a,
            b: &self.b,
            z: &self.z,
        };
        gdn_recurrent(
            kernels,
            &GDN,
            &layer,
            &mut state,
            &seqs,
            &inputs,
            &mut scratch,
            &mut self.out,
        )
        .unwrap();
        st.synchronize().unwrap();
    }

    fn results(&self, st: &Arc<CudaStream>) -> GdnOut {
        st.synchronize().unwrap();
        (
            st.clone_dtoh(&self.out).unwrap(),
            st.clone_dtoh(&self.conv_state).unwrap(),
            st.clone_dtoh(&self.recurrent_state).unwrap(),
        )
    }
}

/// Each GDN batch (8 sequences of one token in scattered slots; 3, 1 and 5 tokens, the 1 a new
/// request over a stale slot) through the C ABI, the Rust launcher and `gdn_reference`: (name,
/// C's, the launcher's, the reference's).
fn gdn_runs() -> Vec<(&'static str, GdnOut, GdnOut, GdnOut)> {
    let (backend, kernels) = attention_setup();
    let st = kernels.stream().clone();
    let mut rng = triton_common::rng(60);
    let fixture = gdn_fixture(&mut rng, GDN_SLOTS);
    let varlen = gdn_batch(&mut rng, &[3, 1, 5], &[4, 6, 8], &[true, false, true]);
    let (p, conv0, rec0) = (&fixture.params, &fixture.conv0, &fixture.rec0);
    let runs = [("decode", &fixture.decode), ("varlen", &varlen)]
        .into_iter()
        .map(|(name, batch)| {
            let through_c = GdnBuffers::new(&st, p, batch, conv0, rec0);
            through_c.launch_c(backend, &st, p.eps);
            let mut rust = GdnBuffers::new(&st, p, batch, conv0, rec0);
            rust.launch_rust(&kernels, p.eps);
            let (mut conv, mut rec) = (conv0.clone(), rec0.clone());
            let out = gdn_reference(
                &GDN,
                p,
                &mut conv,
                &mut rec,
                &batch.seqs,
                &batch.qkv,
                &batch.a,
                &batch.b,
                &batch.z,
            );
            (
                name,
                through_c.results(&st),
                rust.results(&st),
                (out, conv, rec),
            )
        })
        .collect();
    // SAFETY: the backend from above, no longer used.
    assert_eq!(unsafe { aot_backend_destroy(backend) }, AotStatus::Ok);
    runs
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_gdn_recurrent_through_the_c_abi_gives_the_rust_launchers_bits() {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (name, c, rust, _) in gdn_runs() {
        assert_eq!(c.0, rust.0, "{name}: out bits");
        assert_eq!(c.1, rust.1, "{name}: conv state bits");
        assert!(bits(&c.2) == bits(&rust.2), "{name}: recurrent state bits");
    }
}

/// The tolerances of tests/gpu_triton_kernels.rs: the output within 2% of its largest value and
/// 98% within 2 ulps, the conv state equal, the fp32 state within 1% and 99.9% within 1e-4.
#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_gdn_recurrent_through_the_c_abi_matches_the_reference() {
    for (name, c, _, want) in gdn_runs() {
        let (rel, near) = bf16_error(&c.0, &want.0);
        eprintln!("gdn {name} out: max |diff| {rel:.2e} of max, {near:.4} within 2 ulp");
        assert!(c.0.iter().all(|v| v.is_finite()), "{name}: non-finite out");
        assert!(
            c.0.iter().any(|v| v.to_f32() != 0.0),
            "{name}: nothing written"
        );
        assert!(
            rel <= BF16_MAX_REL && near >= BF16_NEAR_SHARE,
            "{name} out: rel {rel}, near {near}"
        );
        assert_eq!(c.1, want.1, "{name}: conv state");
        let (rel, near) = f32_error(&c.2, &want.2);
        eprintln!("gdn {name} state: max |diff| {rel:.2e} of max, {near:.5} near");
        assert!(
            rel <= F32_MAX_REL && near >= F32_NEAR_SHARE,
            "{name} state: rel {rel}, near {near}"
        );
    }
}

/// An MoE block at the A3B shape whose experts no input chooses are NaN (reading one shows), and
/// inputs of 1 and 5 tokens whose top-8 router logits lead the next by at least 2 ulps (the choice
/// of experts then cannot depend on the summation order).
struct MoeCase {
    weights: MoeWeightsHost,
    inputs: Vec<Vec<bf16>>,
}

fn moe_case(seed: u64) -> MoeCase {
    let mut rng = triton_common::rng(seed);
    let (h, e, i) = (MOE.hidden, MOE.experts, MOE.inter);
    let mut w = MoeWeightsHost {
        router: bf(&mut rng, e * h, 0.05),
        shared_gate: bf(&mut rng, h, 0.05),
        gate_up: vec![bf16::NAN; e * 2 * i * h],
        down: vec![bf16::NAN; e * h * i],
        shared_gate_up: bf(&mut rng, 2 * i * h, 0.0625),
        shared_down: bf(&mut rng, h * i, 0.0625),
    };
    let inputs: Vec<Vec<bf16>> = [1, 5]
        .into_iter()
        .map(|tokens| loop {
            let x = bf(&mut rng, tokens * h, 2.0);
            if routing_margin_ulps(&MOE, &moe_router_logits_reference(&MOE, &w, &x)) >= 2 {
                break x;
            }
        })
        .collect();
    let mut chosen = std::collections::BTreeSet::new();
    for x in &inputs {
        let logits = moe_router_logits_reference(&MOE, &w, x);
        for row in logits.chunks(e + 1) {
            chosen.extend(route(&row[..e], MOE.top_k).0);
        }
    }
    for j in chosen {
        let gu = bf(&mut rng, 2 * i * h, 0.0625);
        w.gate_up[j * 2 * i * h..(j + 1) * 2 * i * h].copy_from_slice(&gu);
        let d = bf(&mut rng, h * i, 0.0625);
        w.down[j * h * i..(j + 1) * h * i].copy_from_slice(&d);
    }
    MoeCase { weights: w, inputs }
}

/// One MoE input through the C ABI and the Rust launcher: C's output, the launcher's, and the
/// launcher's routing (ids) and router logits.
struct MoeRun {
    x: Vec<bf16>,
    c: Vec<bf16>,
    rust: Vec<bf16>,
    ids: Vec<i32>,
    logits: Vec<bf16>,
}

fn moe_runs(case: &MoeCase) -> Vec<MoeRun> {
    let (backend, kernels) = attention_setup();
    let st = kernels.stream().clone();
    let w = &case.weights;
    let up = |v: &[bf16]| st.clone_htod(v).unwrap();
    let (router, shared_gate, gate_up, down, shared_gate_up, shared_down) = (
        up(&w.router),
        up(&w.shared_gate),
        up(&w.gate_up),
        up(&w.down),
        up(&w.shared_gate_up),
        up(&w.shared_down),
    );
    // One workspace for 16 tokens serves every launch.
    let mut bytes = 0;
    // SAFETY: one writable size_t.
    let status = unsafe {
        aot_moe_forward_workspace_bytes(
            16,
            MOE.hidden,
            MOE.experts,
            MOE.top_k,
            MOE.inter,
            &mut bytes,
        )
    };
    assert_eq!(status, AotStatus::Ok, "{}", last_error());
    let workspace = st.alloc_zeros::<u8>(bytes).unwrap();
    let mut scratch = MoeScratch::new(&st, &MOE, 16).unwrap();
    let runs = case
        .inputs
        .iter()
        .map(|x| {
            let tokens = x.len() / MOE.hidden;
            let dx = up(x);
            let (out_c, mut out_rust) = (
                st.alloc_zeros::<bf16>(x.len()).unwrap(),
                st.alloc_zeros::<bf16>(x.len()).unwrap(),
            );
            let args = AotMoe {
                x: addr(&st, &dx),
                x_len: dx.len(),
                router: addr(&st, &router),
                router_len: router.len(),
                shared_gate: addr(&st, &shared_gate),
                shared_gate_len: shared_gate.len(),
                gate_up: addr(&st, &gate_up),
                gate_up_len: gate_up.len(),
                down: addr(&st, &down),
                down_len: down.len(),
                shared_gate_up: addr(&st, &shared_gate_up),
                shared_gate_up_len: shared_gate_up.len(),
                shared_down: addr(&st, &shared_down),
                shared_down_len: shared_down.len(),
                out: addr(&st, &out_c),
                out_len: out_c.len(),
                workspace: addr(&st, &workspace),
                workspace_bytes: workspace.len(),
                n_tokens: tokens,
                hidden: MOE.hidden,
                experts: MOE.experts,
                top_k: MOE.top_k,
                inter: MOE.inter,
            };
            // SAFETY: every address is a live allocation of this context of its declared length.
            let status = unsafe { aot_moe_forward_bf16(backend, st.cu_stream().cast(), &args) };
            assert_eq!(status, AotStatus::Ok, "{}", last_error());
            let layer = MoeLayer {
                router: &router,
                shared_gate: &shared_gate,
                gate_up: &gate_up,
                down: &down,
                shared_gate_up: &shared_gate_up,
                shared_down: &shared_down,
            };
            moe_forward(
                &kernels,
                &MOE,
                &layer,
                &dx,
                tokens,
                &mut scratch,
                &mut out_rust,
            )
            .unwrap();
            st.synchronize().unwrap();
            MoeRun {
                x: x.clone(),
                c: st.clone_dtoh(&out_c).unwrap(),
                rust: st.clone_dtoh(&out_rust).unwrap(),
                ids: st.clone_dtoh(&scratch.topk_ids).unwrap()[..tokens * MOE.top_k].to_vec(),
                logits: st.clone_dtoh(&scratch.logits).unwrap()[..tokens * (MOE.experts + 1)]
                    .to_vec(),
            }
        })
        .collect();
    // SAFETY: the backend from above, no longer used.
    assert_eq!(unsafe { aot_backend_destroy(backend) }, AotStatus::Ok);
    runs
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_moe_forward_through_the_c_abi_gives_the_rust_launchers_bits() {
    for run in moe_runs(&moe_case(70)) {
        let tokens = run.x.len() / MOE.hidden;
        assert_eq!(run.c, run.rust, "moe {tokens} tokens: out bits");
    }
}

/// The tolerances of tests/gpu_triton_kernels.rs: the routing equal to the reference's; the output
/// against the reference fed the kernel's own router logits within 2% of its largest value and 98%
/// within 2 ulps at the scale of each element's bf16 rounding chain, and end to end within 2%.
#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on the GPU machine"]
fn gpu_moe_forward_through_the_c_abi_matches_the_reference() {
    let case = moe_case(80);
    for run in moe_runs(&case) {
        let tokens = run.x.len() / MOE.hidden;
        let want: MoeReference = moe_reference(&MOE, &case.weights, &run.x);
        assert_eq!(run.ids, want.topk_ids, "moe {tokens} tokens: routing");
        let own = moe_reference_from_logits(&MOE, &case.weights, &run.x, &run.logits);
        let (rel, _) = bf16_error(&run.c, &own.out);
        let chain_near = bf16_chain_near(&run.c, &own.out, &own.out_chain);
        eprintln!(
            "moe {tokens} tokens out: max |diff| {rel:.2e} of max, {chain_near:.4} within 2 ulp of its chain"
        );
        assert!(
            run.c.iter().all(|v| v.is_finite()),
            "moe {tokens} tokens: non-finite out"
        );
        assert!(
            run.c.iter().any(|v| v.to_f32() != 0.0),
            "moe {tokens} tokens: nothing written"
        );
        assert!(
            rel <= BF16_MAX_REL && chain_near >= BF16_NEAR_SHARE,
            "moe {tokens} tokens out: rel {rel}, near its chain {chain_near}"
        );
        let (end_to_end, _) = bf16_error(&run.c, &want.out);
        assert!(
            end_to_end <= BF16_MAX_REL,
            "moe {tokens} tokens end to end: rel {end_to_end}"
        );
    }
}
