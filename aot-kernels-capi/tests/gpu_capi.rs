//! The C ABI on a real GPU: launches through it give the Rust launchers' bits (decode attention
//! also the reference's values), the caller's context stays current and alive, the pointer check
//! names a short allocation.
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
use aot_kernels::ops::compare::ulp_distance;
use aot_kernels::ops::gemv::{gemv, GemvInput, GemvOutput};
use aot_kernels::ops::rmsnorm::{rmsnorm, RmsNormParams};
use aot_kernels::ops::rotary::cos_sin_cache;
use aot_kernels::ops::{dev, dev_mut};
use aot_kernels_capi::backend::{aot_backend_create_in_context, aot_backend_destroy};
use aot_kernels_capi::last_error::aot_last_error_message;
use aot_kernels_capi::ops::{
    aot_attention_decode_bf16, aot_attention_decode_workspace_bytes, aot_gemv_bf16_f32,
    aot_rmsnorm_bf16,
};
use aot_kernels_capi::{AotAttentionDecode, AotBackend, AotStatus};
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
