//! The Triton kernels (Gated DeltaNet decode and chunked prefill, MoE) on a real GPU at the real
//! Qwen3.6-35B-A3B shapes, under both dispatch paths (exact SASS, and the sm_80 PTX JIT), against
//! the Rust CPU references and, through scripts/triton_oracle.py, against transformers' own
//! pure-torch functions on the same GPU.
//!
//! `#[ignore]`d: a machine without a GPU lists it as ignored. On the GPU machine (the bundle's
//! run.sh passes --include-ignored) a missing device, a missing python3 with torch and
//! transformers, or any failed comparison fails the test. `AOT_ORACLE_PYTHON` picks the python.
//! One claim a test: the kernels run once per binary, and each test checks one thing of those
//! runs.

mod triton_common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use aot_kernels::device::CudaSlice;
use aot_kernels::dispatch::{load_available, open_device, LoadedKernels, ModuleSource, Policy};
use aot_kernels::ops::compare::ulp_distance;
use aot_kernels::ops::gated_delta_net::{
    conv1d_reference, gdn_decode, gdn_decode_convolved, gdn_prefill, gdn_recurrent, gdn_reference,
    GdnInputs, GdnParamsHost, GdnScratch, GdnState, SeqSpec,
};
use aot_kernels::ops::gemv::{gemv, GemvInput, GemvOutput, GemvPart, PartsConv};
use aot_kernels::ops::moe::{
    moe_forward, moe_forward_add_norm, moe_reference, moe_reference_from_logits,
    moe_router_logits_reference, routing_margin_ulps, MoeAddNorm, MoeLayer, MoeReference,
    MoeScratch, MoeWeightsHost,
};
use aot_kernels::ops::rmsnorm::{fused_add_rmsnorm, fused_add_rmsnorm_reference, RmsNormParams};
use aot_kernels::ops::{dev as view, dev_mut};
use half::bf16;
use rand::Rng;
use triton_common::*;

const ORACLE: &str = include_str!("../scripts/triton_oracle.py");
const SLOTS: usize = 12;
/// The MoE output's shares within 2 ulps at the scale of each element's bf16 rounding chain and
/// at the result's own (see `MoeReference::out_chain`).
const MOE_CHAIN_NEAR_SHARE: f64 = 0.99;
const MOE_RESULT_NEAR_SHARE: f64 = 0.95;

fn check_bf16(what: &str, got: &[bf16], want: &[bf16]) {
    let (rel, near) = bf16_error(got, want);
    eprintln!("{what}: max |diff| {rel:.2e} of max, {near:.4} within 2 ulp");
    check_bf16_error(what, got, rel, near);
}

/// `got` finite and not all zero; `rel` (largest |difference| over the largest reference value)
/// and `near` (the share within 2 ulps) within the bf16 tolerances.
fn check_bf16_error(what: &str, got: &[bf16], rel: f64, near: f64) {
    assert!(
        got.iter().all(|v| v.is_finite()),
        "{what}: non-finite output"
    );
    assert!(
        got.iter().any(|v| v.to_f32() != 0.0),
        "{what}: the kernel wrote nothing"
    );
    assert!(
        rel <= BF16_MAX_REL && near >= BF16_NEAR_SHARE,
        "{what}: rel {rel}, near {near}"
    );
}

fn check_f32(what: &str, got: &[f32], want: &[f32]) {
    let (rel, near) = f32_error(got, want);
    eprintln!("{what}: max |diff| {rel:.2e} of max, {near:.5} within {F32_NEAR_REL:e}");
    assert!(
        rel <= F32_MAX_REL && near >= F32_NEAR_SHARE,
        "{what}: rel {rel}, near {near}"
    );
}

/// Which GDN launcher a run calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GdnPath {
    Decode,
    /// Token by token over sequences of any lengths.
    Recurrent,
    /// The chunked prefill.
    Prefill,
}

/// One GDN run on the GPU from the given states; returns out and states.
fn run_gdn(
    kernels: &LoadedKernels,
    p: &GdnParamsHost,
    batch: &GdnBatchHost,
    conv0: &[bf16],
    rec0: &[f32],
    path: GdnPath,
) -> (Vec<bf16>, Vec<bf16>, Vec<f32>) {
    let st = kernels.stream();
    let dev = GdnDevice::new(st, p, batch);
    let (mut conv, mut rec) = (upload(st, conv0), upload(st, rec0));
    let mut state = GdnState {
        conv: &mut conv,
        recurrent: &mut rec,
        slots: SLOTS,
    };
    let mut scratch = GdnScratch::new(st, &GDN, dev.n_tokens).unwrap();
    let mut out = st
        .alloc_zeros::<bf16>(dev.n_tokens * GDN.value_width())
        .unwrap();
    let (layer, seqs, inputs) = (dev.layer(), dev.seqs(), dev.inputs());
    let run = match path {
        GdnPath::Decode => gdn_decode,
        GdnPath::Recurrent => gdn_recurrent,
        GdnPath::Prefill => gdn_prefill,
    };
    run(
        kernels,
        &GDN,
        &layer,
        &mut state,
        &seqs,
        &inputs,
        &mut scratch,
        &mut out,
    )
    .unwrap();
    st.synchronize().unwrap();
    (download(st, &out), download(st, &conv), download(st, &rec))
}

fn write_gdn_case(
    dir: &Path,
    name: &str,
    p: &GdnParamsHost,
    batch: &GdnBatchHost,
    conv0: &[bf16],
    rec0: &[f32],
    got: &(Vec<bf16>, Vec<bf16>, Vec<f32>),
) -> serde_json::Value {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    write_bf16(&d, "conv_weight", &p.conv_weight);
    write_f32(&d, "a_log", &p.a_log);
    write_f32(&d, "dt_bias", &p.dt_bias);
    write_bf16(&d, "norm_weight", &p.norm_weight);
    write_bf16(&d, "qkv", &batch.qkv);
    write_bf16(&d, "a", &batch.a);
    write_bf16(&d, "b", &batch.b);
    write_bf16(&d, "z", &batch.z);
    write_bf16(&d, "conv_state_in", conv0);
    write_f32(&d, "state_in", rec0);
    write_bf16(&d, "out", &got.0);
    write_bf16(&d, "conv_state_out", &got.1);
    write_f32(&d, "state_out", &got.2);
    serde_json::json!({
        "kind": "gdn",
        "dir": name,
        "slots": SLOTS,
        "eps": p.eps,
        "seqs": batch.seqs.iter().map(|s| serde_json::json!({"start": s.start, "len": s.len, "slot": s.slot, "has_state": s.has_state})).collect::<Vec<_>>(),
    })
}

fn oracle_python() -> String {
    std::env::var("AOT_ORACLE_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn run_oracle(dir: &Path) {
    let script = dir.join("triton_oracle.py");
    std::fs::write(&script, ORACLE).unwrap();
    let python = oracle_python();
    eprintln!(
        "running the transformers oracle: {python} {}",
        script.display()
    );
    let status = std::process::Command::new(&python)
        .arg(&script)
        .arg(dir)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {python} (set AOT_ORACLE_PYTHON): {e}"));
    assert!(
        status.success(),
        "the transformers oracle reported a failure ({status}); see its output above"
    );
}

fn cases_dir() -> PathBuf {
    let base = std::env::var_os("AOT_TRITON_CASES")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("aot-triton-cases-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The input seed: `AOT_SEED=N` repeats a run, else a fresh one.
fn triton_seed() -> u64 {
    std::env::var("AOT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random)
}

/// A GDN run's output, conv state and recurrent state.
type GdnOut = (Vec<bf16>, Vec<bf16>, Vec<f32>);

/// One GDN batch (decode or prefill) from the fixture's states: the CPU reference's result and
/// each path's (SASS, then PTX).
struct GdnRun {
    name: &'static str,
    want: GdnOut,
    per_path: [(&'static str, GdnOut); 2],
}

/// One MoE batch on one path: the routing, router logits, routing weights and output the kernels
/// left, and the reference fed the kernel's own logits.
struct MoeRun {
    tokens: usize,
    ids: Vec<i32>,
    logits: Vec<bf16>,
    weights: Vec<bf16>,
    out: Vec<bf16>,
    own: MoeReference,
    /// `moe_forward_add_norm` on the same input: (the residual after, the normed rows).
    add_norm: (Vec<bf16>, Vec<bf16>),
    /// `moe_forward`'s output through the CUDA `fused_add_rmsnorm`: (normed, residual after).
    unfused: (Vec<bf16>, Vec<bf16>),
}

/// The residual stream and the next norm's weight that `moe_forward_add_norm` is run with.
struct AddNormInputs {
    residuals: Vec<Vec<bf16>>,
    weight: Vec<bf16>,
}

const ADD_NORM_EPS: f32 = 1e-6;

/// Every Triton kernel run once per binary on both paths, with the inputs and references the
/// tests compare them to.
struct TritonRuns {
    moe_seed: u64,
    /// Each Triton module `auto` loaded, and whether it was JIT-compiled.
    sass_jit: Vec<(String, bool)>,
    gdn: GdnFixture,
    gdn_runs: Vec<GdnRun>,
    /// One prompt of 200 tokens in one prefill call, and in pieces of 37, 64 and 99 with the state
    /// carried (SASS).
    whole: GdnBatchHost,
    one: GdnOut,
    pieces: GdnOut,
    /// The same prompt token by token (`gdn_recurrent`): in one call, and in pieces of 1, 16, 64
    /// and 119.
    one_recurrent: GdnOut,
    pieces_recurrent: GdnOut,
    moe: MoeWeightsHost,
    moe_inputs: Vec<Vec<bf16>>,
    moe_refs: Vec<MoeReference>,
    moe_runs: Vec<(&'static str, Vec<MoeRun>)>,
    add_norm_in: AddNormInputs,
}

/// The one-sequence batch `whole` run in consecutive pieces of `lens` tokens, each from the
/// states the last left; the pieces' outputs concatenated and the final states.
fn run_in_pieces(
    kernels: &LoadedKernels,
    p: &GdnParamsHost,
    whole: &GdnBatchHost,
    conv0: &[bf16],
    rec0: &[f32],
    path: GdnPath,
    lens: &[usize],
) -> GdnOut {
    assert_eq!(lens.iter().sum::<usize>(), whole.seqs[0].len);
    let (mut conv, mut rec, mut out) = (conv0.to_vec(), rec0.to_vec(), Vec::new());
    let mut start = 0;
    for &len in lens {
        let rows = |v: &[bf16], width: usize| v[start * width..(start + len) * width].to_vec();
        let piece = GdnBatchHost {
            seqs: vec![SeqSpec {
                start: 0,
                len,
                ..whole.seqs[0]
            }],
            qkv: rows(&whole.qkv, GDN.conv_dim()),
            a: rows(&whole.a, GDN.value_heads),
            b: rows(&whole.b, GDN.value_heads),
            z: rows(&whole.z, GDN.value_width()),
        };
        let r = run_gdn(kernels, p, &piece, &conv, &rec, path);
        out.extend(r.0);
        (conv, rec) = (r.1, r.2);
        start += len;
    }
    (out, conv, rec)
}

fn triton_runs() -> &'static TritonRuns {
    static RUNS: OnceLock<TritonRuns> = OnceLock::new();
    RUNS.get_or_init(|| {
        let d = open_device(0).unwrap_or_else(|e| panic!("this GPU test needs a CUDA device: {e}"));
        let seed = triton_seed();
        eprintln!(
            "device \"{}\": {}; seed {seed} (AOT_SEED={seed} repeats this run)",
            d.name, d.spec
        );
        let sass = load_available(&d, Policy::Auto, &ModuleSource::registry()).unwrap();
        let ptx = load_available(&d, Policy::PtxOnly, &ModuleSource::registry()).unwrap();
        eprintln!("{}", sass.report().to_table());
        let sass_jit = sass
            .report()
            .modules
            .iter()
            .filter(|m| aot_kernels::ops::triton::record(&m.module).is_some())
            .map(|m| (m.module.clone(), m.jit))
            .collect();
        let mut rng = rng(seed);
        let gdn = gdn_fixture(&mut rng, SLOTS);
        let (p, conv0, rec0) = (&gdn.params, &gdn.conv0, &gdn.rec0);
        let gdn_runs = [
            ("gdn_decode", &gdn.decode, GdnPath::Decode),
            ("gdn_prefill", &gdn.prefill, GdnPath::Prefill),
            ("gdn_recurrent", &gdn.prefill, GdnPath::Recurrent),
        ]
        .into_iter()
        .map(|(name, batch, path)| {
            let (mut conv_w, mut rec_w) = (conv0.clone(), rec0.clone());
            let want = gdn_reference(
                &GDN,
                p,
                &mut conv_w,
                &mut rec_w,
                &batch.seqs,
                &batch.qkv,
                &batch.a,
                &batch.b,
                &batch.z,
            );
            let got = run_gdn(&sass, p, batch, conv0, rec0, path);
            let got_ptx = run_gdn(&ptx, p, batch, conv0, rec0, path);
            let (rel, _) = bf16_error(&got_ptx.0, &got.0);
            eprintln!("{name}: SASS vs PTX JIT outputs differ by {rel:.2e} of max");
            GdnRun {
                name,
                want: (want, conv_w, rec_w),
                per_path: [("sass", got), ("ptx", got_ptx)],
            }
        })
        .collect();

        // One prompt in one call, and in pieces with the state carried.
        let whole = gdn_batch(&mut rng, &[200], &[10], &[true]);
        let one = run_gdn(&sass, p, &whole, conv0, rec0, GdnPath::Prefill);
        let pieces = run_in_pieces(
            &sass,
            p,
            &whole,
            conv0,
            rec0,
            GdnPath::Prefill,
            &[37, 64, 99],
        );
        let one_recurrent = run_gdn(&sass, p, &whole, conv0, rec0, GdnPath::Recurrent);
        let pieces_recurrent = run_in_pieces(
            &sass,
            p,
            &whole,
            conv0,
            rec0,
            GdnPath::Recurrent,
            &[1, 16, 64, 119],
        );

        // MoE for 1..8 tokens; every expert no token chooses is NaN on the GPU, so reading one
        // shows.
        let moe_seed = seed ^ 0x5EED;
        let w = moe_weights(&mut rng, moe_seed);
        let moe_inputs = moe_inputs(&mut rng, &w);
        let moe_refs: Vec<_> = moe_inputs
            .iter()
            .map(|x| moe_reference(&MOE, &w, x))
            .collect();
        let chosen: std::collections::BTreeSet<i32> = moe_refs
            .iter()
            .flat_map(|r| r.topk_ids.iter().copied())
            .collect();
        eprintln!(
            "MoE: {} distinct experts chosen over 1..8 tokens; the other {} are NaN",
            chosen.len(),
            MOE.experts - chosen.len()
        );
        let (h, i) = (MOE.hidden, MOE.inter);
        let (mut gate_up, mut down) = (w.gate_up.clone(), w.down.clone());
        for e in 0..MOE.experts {
            if !chosen.contains(&(e as i32)) {
                gate_up[e * 2 * i * h..(e + 1) * 2 * i * h].fill(bf16::NAN);
                down[e * h * i..(e + 1) * h * i].fill(bf16::NAN);
            }
        }
        // A residual stream for each input and a zero-centred norm weight (the model's `1 + w`).
        let add_norm_in = AddNormInputs {
            residuals: moe_inputs
                .iter()
                .map(|x| bf(&mut rng, x.len(), 4.0))
                .collect(),
            weight: bf(&mut rng, h, 0.5),
        };
        let moe_runs = [("sass", &sass), ("ptx", &ptx)]
            .into_iter()
            .map(|(path, kernels)| {
                let st = kernels.stream();
                let dev = MoeDevice::new(st, &w, &gate_up, &down);
                let layer = dev.layer();
                let mut scratch = MoeScratch::new(st, &MOE, 8).unwrap();
                let norm_w = upload(st, &add_norm_in.weight);
                let runs: Vec<MoeRun> = moe_inputs
                    .iter()
                    .zip(&add_norm_in.residuals)
                    .map(|(x, residual)| {
                        let tokens = x.len() / h;
                        let dx = upload(st, x);
                        let mut fused_res = upload(st, residual);
                        let mut normed = st.alloc_zeros::<bf16>(tokens * h).unwrap();
                        moe_forward_add_norm(
                            kernels,
                            &MOE,
                            &layer,
                            &dx,
                            tokens,
                            &mut scratch,
                            MoeAddNorm {
                                residual: dev_mut(kernels, &mut fused_res),
                                weight: view(kernels, &norm_w),
                                eps: ADD_NORM_EPS,
                                weight_offset: 1.0,
                                normed: dev_mut(kernels, &mut normed),
                            },
                            None,
                        )
                        .unwrap();
                        st.synchronize().unwrap();
                        let add_norm = (download(st, &fused_res), download(st, &normed));
                        let mut out = st.alloc_zeros::<bf16>(tokens * h).unwrap();
                        moe_forward(kernels, &MOE, &layer, &dx, tokens, &mut scratch, &mut out)
                            .unwrap();
                        st.synchronize().unwrap();
                        let mut res = upload(st, residual);
                        let mut pair_x = st.alloc_zeros::<bf16>(tokens * h).unwrap();
                        st.memcpy_dtod(&out, &mut pair_x).unwrap();
                        fused_add_rmsnorm(
                            kernels,
                            &mut pair_x,
                            &mut res,
                            &norm_w,
                            &add_norm_params(tokens),
                        )
                        .unwrap();
                        st.synchronize().unwrap();
                        let unfused = (download(st, &pair_x), download(st, &res));
                        // Each routing launch finds these zero and must leave them so: the next
                        // counts its programs from zero and lists only its own marks.
                        let (chosen, arrived) = (
                            download(st, &scratch.chosen),
                            download(st, &scratch.arrived),
                        );
                        assert!(
                            chosen.iter().chain(&arrived).all(|&v| v == 0),
                            "{path}, {tokens} tokens: moe_route left its marks or count set: \
                             chosen {:?}, arrived {arrived:?}",
                            chosen
                                .iter()
                                .enumerate()
                                .filter(|(_, &v)| v != 0)
                                .collect::<Vec<_>>()
                        );
                        let ids = download(st, &scratch.topk_ids)[..tokens * MOE.top_k].to_vec();
                        // The list gate/up and down walk: the distinct experts of the routing,
                        // ascending (one token's ranks its own picks, more tokens' goes through
                        // the marks).
                        let distinct: Vec<i32> = ids
                            .iter()
                            .copied()
                            .collect::<std::collections::BTreeSet<_>>()
                            .into_iter()
                            .collect();
                        let n_listed = download(st, &scratch.n_experts)[0] as usize;
                        assert_eq!(
                            (
                                n_listed,
                                &download(st, &scratch.experts)[..n_listed.min(tokens * MOE.top_k)]
                            ),
                            (distinct.len(), &distinct[..]),
                            "{path}, {tokens} tokens: the listed experts"
                        );
                        let logits =
                            download(st, &scratch.logits)[..tokens * (MOE.experts + 1)].to_vec();
                        let weights =
                            download(st, &scratch.topk_weights)[..tokens * MOE.top_k].to_vec();
                        // The reference fed the kernel's own logits: a logit one bf16 ulp off
                        // (another summation order, within the logits' check) moves the
                        // weights and the output by several ulps. Against the reference's
                        // logits, seed 13172502825071228932 put one routing weight of 48 past 2
                        // ulps, and seed 14398937561076549503 3.3% of 6 tokens' outputs.
                        let own = moe_reference_from_logits(&MOE, &w, x, &logits);
                        MoeRun {
                            tokens,
                            ids,
                            logits,
                            weights,
                            out: download(st, &out),
                            own,
                            add_norm,
                            unfused,
                        }
                    })
                    .collect();
                (path, runs)
            })
            .collect();
        TritonRuns {
            moe_seed,
            sass_jit,
            gdn,
            gdn_runs,
            whole,
            one,
            pieces,
            one_recurrent,
            pieces_recurrent,
            moe: w,
            moe_inputs,
            moe_refs,
            moe_runs,
            add_norm_in,
        }
    })
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_triton_modules_load_as_sass_under_auto() {
    for (module, jit) in &triton_runs().sass_jit {
        assert!(!jit, "{module}: auto must load SASS on this GPU");
    }
}

/// The GDN batch `name`'s run.
fn gdn_run(name: &str) -> &'static GdnRun {
    let runs = triton_runs();
    runs.gdn_runs.iter().find(|r| r.name == name).unwrap()
}

fn check_gdn_out(name: &str) {
    let run = gdn_run(name);
    for (path, g) in &run.per_path {
        check_bf16(&format!("[{path}] {name} out vs CPU"), &g.0, &run.want.0);
    }
}

fn check_gdn_conv_state(name: &str) {
    let run = gdn_run(name);
    for (path, g) in &run.per_path {
        assert_eq!(g.1, run.want.1, "[{path}] {name}: conv state");
    }
}

fn check_gdn_state(name: &str) {
    let run = gdn_run(name);
    for (path, g) in &run.per_path {
        check_f32(&format!("[{path}] {name} state vs CPU"), &g.2, &run.want.2);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gdn_decode_output_matches_the_cpu_reference() {
    check_gdn_out("gdn_decode");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gdn_decode_conv_state_equals_the_cpu_reference() {
    check_gdn_conv_state("gdn_decode");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gdn_decode_recurrent_state_matches_the_cpu_reference() {
    check_gdn_state("gdn_decode");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gdn_prefill_output_matches_the_cpu_reference() {
    check_gdn_out("gdn_prefill");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gdn_prefill_conv_state_equals_the_cpu_reference() {
    check_gdn_conv_state("gdn_prefill");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gdn_prefill_recurrent_state_matches_the_cpu_reference() {
    check_gdn_state("gdn_prefill");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gdn_prefill_in_pieces_output_matches_one_call() {
    let runs = triton_runs();
    check_bf16(
        "prefill in pieces 37+64+99 vs one call",
        &runs.pieces.0,
        &runs.one.0,
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gdn_prefill_in_pieces_conv_state_equals_one_call() {
    let runs = triton_runs();
    assert_eq!(runs.pieces.1, runs.one.1, "conv state after pieces");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gdn_prefill_in_pieces_recurrent_state_matches_one_call() {
    let runs = triton_runs();
    check_f32(
        "state after pieces vs one call",
        &runs.pieces.2,
        &runs.one.2,
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gdn_recurrent_output_matches_the_cpu_reference() {
    check_gdn_out("gdn_recurrent");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gdn_recurrent_states_match_the_cpu_reference() {
    check_gdn_conv_state("gdn_recurrent");
    check_gdn_state("gdn_recurrent");
}

/// Token by token, where a prompt is cut must not move a bit: outputs and both states.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gdn_recurrent_in_pieces_gives_the_bits_of_one_call() {
    let runs = triton_runs();
    let (pieces, one) = (&runs.pieces_recurrent, &runs.one_recurrent);
    let differ = pieces
        .0
        .iter()
        .zip(&one.0)
        .filter(|(a, b)| a.to_bits() != b.to_bits());
    assert_eq!(
        differ.count(),
        0,
        "outputs of pieces 1+16+64+119 vs one call"
    );
    assert_eq!(pieces.1, one.1, "conv state after pieces");
    let state_bits = |s: &[f32]| s.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert!(
        state_bits(&pieces.2) == state_bits(&one.2),
        "recurrent state after pieces differs from one call's"
    );
}

/// Every MoE run on both paths, with the reference's result for its input: `check(path, run,
/// reference)`.
fn each_moe_run(mut check: impl FnMut(&str, &MoeRun, &MoeReference)) {
    let runs = triton_runs();
    for (path, moe) in &runs.moe_runs {
        for (run, want) in moe.iter().zip(&runs.moe_refs) {
            check(path, run, want);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_moe_routing_equals_the_cpu_reference() {
    each_moe_run(|path, run, want| {
        assert_eq!(
            run.ids, want.topk_ids,
            "[{path}] {} tokens: routing",
            run.tokens
        );
    });
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_moe_router_logits_match_the_cpu_reference() {
    each_moe_run(|path, run, want| {
        check_bf16(
            &format!("[{path}] moe {} tokens router logits vs CPU", run.tokens),
            &run.logits,
            &want.logits,
        );
    });
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_moe_routing_equals_the_routing_of_its_logits() {
    each_moe_run(|path, run, _| {
        assert_eq!(
            run.ids, run.own.topk_ids,
            "[{path}] {} tokens: routing of its logits",
            run.tokens
        );
    });
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_moe_routing_weights_are_within_one_ulp_of_those_of_its_logits() {
    each_moe_run(|path, run, _| {
        let tokens = run.tokens;
        // From the same logits only the fp32 softmax differs from the float64 one: at most a
        // rounding flip, for every weight.
        let worst = run
            .weights
            .iter()
            .zip(&run.own.topk_weights)
            .map(|(g, w)| ulp_distance(*g, *w))
            .max()
            .unwrap_or(0);
        eprintln!("[{path}] moe {tokens} tokens routing weights vs CPU from its logits: at most {worst} ulp apart");
        assert!(
            worst <= 1,
            "[{path}] moe {tokens} tokens routing weights: {worst} ulps from the routing of its logits \
             (got {:?}, want {:?})",
            run.weights,
            run.own.topk_weights
        );
    });
}

/// The output against the reference fed its logits: (what, max |diff| over the largest value,
/// share within 2 ulps of the result, share within 2 ulps of each element's rounding chain).
fn moe_out_error(path: &str, run: &MoeRun) -> (String, f64, f64, f64) {
    let what = format!(
        "[{path}] moe {} tokens out vs CPU from its logits",
        run.tokens
    );
    let (rel, near) = bf16_error(&run.out, &run.own.out);
    let chain_near = bf16_chain_near(&run.out, &run.own.out, &run.own.out_chain);
    eprintln!(
        "{what}: max |diff| {rel:.2e} of max, {near:.4} within 2 ulp, {chain_near:.4} within 2 ulp of its chain"
    );
    (what, rel, near, chain_near)
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_moe_output_matches_the_cpu_reference_from_its_logits() {
    // Within 2 ulps of each element's rounding chain (the weighted experts summed in bf16, then
    // the shared expert): seed 3313329556806431867 put 2.5% of one token's outputs past 2 ulps
    // of the result, where a partial sum was larger than the result.
    each_moe_run(|path, run, _| {
        let (what, rel, _, chain_near) = moe_out_error(path, run);
        check_bf16_error(&what, &run.out, rel, chain_near);
    });
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_moe_output_is_near_its_chain_and_its_result_in_the_stated_shares() {
    // Tighter than the shared bound at the chain's scale (every case on the H200 had all
    // elements there), and a looser one at the result's own (0.9746 at worst, above).
    each_moe_run(|path, run, _| {
        let (what, _, near, chain_near) = moe_out_error(path, run);
        assert!(
            chain_near >= MOE_CHAIN_NEAR_SHARE && near >= MOE_RESULT_NEAR_SHARE,
            "{what}: {chain_near} within 2 ulps of its chain (need {MOE_CHAIN_NEAR_SHARE}), {near} of the result (need {MOE_RESULT_NEAR_SHARE})"
        );
    });
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_moe_output_end_to_end_is_within_the_bf16_bound() {
    // Against the reference's own logits, on the largest error only: a logit error that the
    // logits' check lets through (the shared gate's column is 1 value in 257 of it) cannot move
    // the output far unnoticed, on either path.
    each_moe_run(|path, run, want| {
        let (rel, _) = bf16_error(&run.out, &want.out);
        assert!(
            rel <= BF16_MAX_REL,
            "[{path}] moe {} tokens out vs CPU end to end: max |diff| {rel:.2e} of max",
            run.tokens
        );
    });
}

#[test]
#[ignore = "needs a CUDA GPU, python3 with torch and transformers: run with --include-ignored on the GPU machine"]
fn gpu_triton_outputs_match_transformers() {
    // The SASS path's outputs, through scripts/triton_oracle.py.
    let runs = triton_runs();
    let dir = cases_dir();
    let mut cases = Vec::new();
    let (p, conv0, rec0) = (&runs.gdn.params, &runs.gdn.conv0, &runs.gdn.rec0);
    for (run, batch) in
        runs.gdn_runs
            .iter()
            .zip([&runs.gdn.decode, &runs.gdn.prefill, &runs.gdn.prefill])
    {
        let (_, got) = &run.per_path[0];
        cases.push(write_gdn_case(&dir, run.name, p, batch, conv0, rec0, got));
    }
    cases.push(write_gdn_case(
        &dir,
        "gdn_prefill_whole",
        p,
        &runs.whole,
        conv0,
        rec0,
        &runs.one,
    ));
    let (_, sass) = &runs.moe_runs[0];
    for (x, run) in runs.moe_inputs.iter().zip(sass) {
        cases.push(write_moe_case(&dir, x, &run.out, &run.ids));
    }
    write_index(&dir, runs.moe_seed, &runs.moe, cases);
    run_oracle(&dir);
    let _ = std::fs::remove_dir_all(&dir);
}

fn add_norm_params(tokens: usize) -> RmsNormParams {
    RmsNormParams {
        rows: tokens,
        hidden: MOE.hidden,
        eps: ADD_NORM_EPS,
        weight_offset: 1.0,
    }
}

/// Each MoE run's add-norm tail against its CPU reference: the reference of
/// `fused_add_rmsnorm` fed the kernel's own block output (the block itself is checked above).
fn each_add_norm_run(mut check: impl FnMut(&str, &MoeRun, &[bf16], &[bf16])) {
    let runs = triton_runs();
    for (path, moe) in &runs.moe_runs {
        for (run, residual) in moe.iter().zip(&runs.add_norm_in.residuals) {
            let (normed, res) = fused_add_rmsnorm_reference(
                &run.out,
                residual,
                &runs.add_norm_in.weight,
                &add_norm_params(run.tokens),
            );
            check(path, run, &res, &normed);
        }
    }
}

/// The largest distance between `got` and `want` in ulps of `want`'s bf16 scale, and how many
/// elements differ at all.
fn normed_distance(got: &[bf16], want: &[bf16]) -> (u32, usize) {
    let far = got
        .iter()
        .zip(want)
        .map(|(a, b)| ulp_distance(*a, *b))
        .max()
        .unwrap_or(0);
    let differ = got.iter().zip(want).filter(|(a, b)| a != b).count();
    (far, differ)
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_moe_add_norm_residual_is_the_bf16_sum_of_the_block_and_the_stream() {
    each_add_norm_run(|path, run, want_res, _| {
        assert_eq!(
            run.add_norm.0, want_res,
            "[{path}] {} tokens: residual after moe_forward_add_norm",
            run.tokens
        );
        assert_eq!(
            run.add_norm.0, run.unfused.1,
            "[{path}] {} tokens: residual against moe_forward + fused_add_rmsnorm",
            run.tokens
        );
    });
}

/// The normed rows against the CPU reference and the CUDA `fused_add_rmsnorm`: only the sum of
/// squares' order differs, so where it rounds apart the inner `bf16(r * scale)` can land an ulp
/// the other way, which the product with `1 + w` (up to 1.5 here) carries as up to 2 ulps of the
/// result, 3 with its own rounding. Such elements must be rare (under 1%).
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_moe_add_norm_normed_rows_match_the_reference_and_the_cuda_norm() {
    each_add_norm_run(|path, run, _, want_normed| {
        assert!(
            run.add_norm.1.iter().any(|v| v.to_f32() != 0.0),
            "[{path}] {} tokens: the kernel wrote no normed rows",
            run.tokens
        );
        let (far, differ) = normed_distance(&run.add_norm.1, want_normed);
        let (far_cuda, differ_cuda) = normed_distance(&run.add_norm.1, &run.unfused.0);
        eprintln!(
            "[{path}] {} tokens: normed rows {differ} of {} differ from the CPU reference \
             (at most {far} ulp), {differ_cuda} from fused_add_rmsnorm (at most {far_cuda})",
            run.tokens,
            want_normed.len()
        );
        let rare = want_normed.len() / 100;
        assert!(
            far <= 3 && far_cuda <= 3 && differ <= rare && differ_cuda <= rare,
            "[{path}] {} tokens: normed rows {far} ulps from the reference ({differ} differ), \
             {far_cuda} from the CUDA norm ({differ_cuda} differ)",
            run.tokens
        );
    });
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_moe_add_norm_sass_and_ptx_give_the_same_bits() {
    let runs = &triton_runs().moe_runs;
    let (sass, ptx) = (&runs[0], &runs[1]);
    assert_eq!((sass.0, ptx.0), ("sass", "ptx"));
    for (a, b) in sass.1.iter().zip(&ptx.1) {
        assert_eq!(
            a.add_norm, b.add_norm,
            "{} tokens: SASS against PTX",
            a.tokens
        );
    }
}

/// For 1..8 tokens, inputs whose top-8 is clear: the 8th and 9th router logits at least 2 bf16
/// ulps apart, so a different summation order cannot change which experts are chosen.
fn moe_inputs(rng: &mut impl Rng, w: &MoeWeightsHost) -> Vec<Vec<bf16>> {
    (1..=8usize)
        .map(|tokens| {
            (0..50)
                .map(|_| bf(rng, tokens * MOE.hidden, 2.0))
                .find(|x| routing_margin_ulps(&MOE, &moe_router_logits_reference(&MOE, w, x)) >= 2)
                .expect("no input with a clear top-8 in 50 draws")
        })
        .collect()
}

fn write_moe_case(dir: &Path, x: &[bf16], out: &[bf16], ids: &[i32]) -> serde_json::Value {
    let tokens = x.len() / MOE.hidden;
    let name = format!("moe_{tokens}");
    let d = dir.join(&name);
    std::fs::create_dir_all(&d).unwrap();
    write_bf16(&d, "x", x);
    write_bf16(&d, "out", out);
    write_i32(&d, "topk_ids", ids);
    serde_json::json!({"kind": "moe", "dir": name, "tokens": tokens})
}

/// The shared MoE weights (the experts' come from the hashed generator) and the case index.
fn write_index(dir: &Path, moe_seed: u64, w: &MoeWeightsHost, cases: Vec<serde_json::Value>) {
    let d = dir.join("moe_weights");
    std::fs::create_dir_all(&d).unwrap();
    write_bf16(&d, "router", &w.router);
    write_bf16(&d, "shared_gate", &w.shared_gate);
    write_bf16(&d, "shared_gate_up", &w.shared_gate_up);
    write_bf16(&d, "shared_down", &w.shared_down);
    let index = serde_json::json!({
        "moe_seed": moe_seed,
        "expert_scale": 0.0625,
        "tolerance": {"bf16_max_rel": BF16_MAX_REL, "bf16_near_share": BF16_NEAR_SHARE, "f32_max_rel": F32_MAX_REL, "f32_near_rel": F32_NEAR_REL, "f32_near_share": F32_NEAR_SHARE},
        "gdn": {"key_heads": GDN.key_heads, "value_heads": GDN.value_heads, "key_dim": GDN.key_dim, "value_dim": GDN.value_dim, "conv_width": GDN.conv_width},
        "moe": {"hidden": MOE.hidden, "experts": MOE.experts, "top_k": MOE.top_k, "inter": MOE.inter},
        "cases": cases,
    });
    std::fs::write(
        dir.join("cases.json"),
        serde_json::to_string_pretty(&index).unwrap(),
    )
    .unwrap();
}

/// The CPU references themselves against transformers, through the same oracle: the cases'
/// outputs are the references' (`AOT_ORACLE_DEVICE=cpu` runs transformers on the CPU, so this
/// needs no GPU; the GPU bundle runs it on the GPU).
#[test]
#[ignore = "needs python3 with torch and transformers (AOT_ORACLE_PYTHON); AOT_ORACLE_DEVICE=cpu runs it without a GPU"]
fn cpu_references_match_transformers() {
    let seed = triton_seed();
    eprintln!("seed {seed}");
    let dir = cases_dir();
    let mut cases = Vec::new();
    let mut rng = rng(seed);
    let GdnFixture {
        params: p,
        conv0,
        rec0,
        decode,
        prefill,
    } = gdn_fixture(&mut rng, SLOTS);
    for (name, batch) in [("gdn_decode", &decode), ("gdn_prefill", &prefill)] {
        let (mut conv, mut rec) = (conv0.clone(), rec0.clone());
        let out = gdn_reference(
            &GDN,
            &p,
            &mut conv,
            &mut rec,
            &batch.seqs,
            &batch.qkv,
            &batch.a,
            &batch.b,
            &batch.z,
        );
        cases.push(write_gdn_case(
            &dir,
            name,
            &p,
            batch,
            &conv0,
            &rec0,
            &(out, conv, rec),
        ));
    }
    let moe_seed = seed ^ 0x5EED;
    let w = moe_weights(&mut rng, moe_seed);
    for x in moe_inputs(&mut rng, &w).iter().take(4) {
        let r = moe_reference(&MOE, &w, x);
        cases.push(write_moe_case(&dir, x, &r.out, &r.topk_ids));
    }
    write_index(&dir, moe_seed, &w, cases);
    run_oracle(&dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The MoE layer of 16-element weights, 9 tokens of input and output, and the error of
/// `moe_forward` under `shape` for `tokens` tokens on them.
fn moe_refusal(shape: &aot_kernels::ops::moe::MoeShape, tokens: usize) -> String {
    let d = open_device(0).unwrap_or_else(|e| panic!("this GPU test needs a CUDA device: {e}"));
    let kernels = load_available(&d, Policy::Auto, &ModuleSource::registry()).unwrap();
    let st = kernels.stream();
    let x = st.alloc_zeros::<bf16>(9 * MOE.hidden).unwrap();
    let small = st.alloc_zeros::<bf16>(16).unwrap();
    let layer = MoeLayer {
        router: &small,
        shared_gate: &small,
        gate_up: &small,
        down: &small,
        shared_gate_up: &small,
        shared_down: &small,
    };
    let mut scratch = MoeScratch::new(st, &MOE, 8).unwrap();
    let mut out = st.alloc_zeros::<bf16>(9 * MOE.hidden).unwrap();
    moe_forward(&kernels, shape, &layer, &x, tokens, &mut scratch, &mut out)
        .unwrap_err()
        .to_string()
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_moe_refuses_more_than_16_tokens() {
    let err = moe_refusal(&MOE, 17);
    assert!(err.contains("17 tokens: the kernels take 1..=16"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_moe_refuses_a_router_shorter_than_its_shape() {
    let err = moe_refusal(&MOE, 2);
    assert!(err.contains("`router` holds 16 elements"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_moe_refuses_a_shape_other_than_it_was_compiled_for() {
    let other = aot_kernels::ops::moe::MoeShape {
        experts: 128,
        ..MOE
    };
    let err = moe_refusal(&other, 2);
    assert!(
        err.contains("compiled for E = 256") && err.contains("make triton"),
        "{err}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gdn_decode_refuses_more_tokens_than_sequences() {
    let d = open_device(0).unwrap_or_else(|e| panic!("this GPU test needs a CUDA device: {e}"));
    let kernels = load_available(&d, Policy::Auto, &ModuleSource::registry()).unwrap();
    let st = kernels.stream();
    // A decode step with more tokens than sequences is a prefill: refused, naming the fix.
    let mut rng = rng(1);
    let fx = gdn_fixture(&mut rng, SLOTS);
    let dev = GdnDevice::new(st, &fx.params, &fx.prefill);
    let (mut conv, mut rec) = (upload(st, &fx.conv0), upload(st, &fx.rec0));
    let mut state = GdnState {
        conv: &mut conv,
        recurrent: &mut rec,
        slots: SLOTS,
    };
    let mut scratch_g = GdnScratch::new(st, &GDN, dev.n_tokens).unwrap();
    let mut out_g = st
        .alloc_zeros::<bf16>(dev.n_tokens * GDN.value_width())
        .unwrap();
    let err = gdn_decode(
        &kernels,
        &GDN,
        &dev.layer(),
        &mut state,
        &dev.seqs(),
        &dev.inputs(),
        &mut scratch_g,
        &mut out_g,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("a decode step takes one token per sequence: 188 tokens for 3 sequences"),
        "{err}"
    );
}

/// One decode step of a DeltaNet layer both ways from the same states: the in-projection GEMV
/// storing its parts, then `gdn_decode` (conv launch + delta rule); and the GEMV whose epilogue
/// runs the conv (`Bf16PartsConv`), then `gdn_decode_convolved`. Returns, per way, the conv
/// output, the z / b / a parts, the conv states, the recurrent states and the layer's output.
struct ConvFoldRun {
    raw_qkv: Vec<bf16>,
    ways: [ConvFoldWay; 2],
}

/// Conv output, z / b / a, conv states, recurrent states, the layer's output.
type ConvFoldWay = (Vec<bf16>, Vec<bf16>, Vec<bf16>, Vec<f32>, Vec<bf16>);

fn run_conv_fold(
    kernels: &LoadedKernels,
    rng: &mut impl Rng,
    fixture: &GdnFixture,
    lens_slots_has: (&[usize], &[bool]),
) -> ConvFoldRun {
    let st = kernels.stream();
    let (slots, has) = lens_slots_has;
    let m = slots.len();
    let batch = gdn_batch(rng, &vec![1; m], slots, has);
    let dev = GdnDevice::new(st, &fixture.params, &batch);
    let k = 512;
    let widths = [
        GDN.conv_dim(),
        GDN.value_width(),
        GDN.value_heads,
        GDN.value_heads,
    ];
    let n: usize = widths.iter().sum();
    let w = upload(st, &bf(rng, n * k, 0.08));
    let x = upload(st, &bf(rng, m * k, 1.0));
    let mut raw_qkv = Vec::new();
    let ways = [false, true].map(|fold| {
        let mut outs: Vec<CudaSlice<bf16>> = widths
            .iter()
            .map(|&wd| st.alloc_zeros::<bf16>(m * wd).unwrap())
            .collect();
        let (mut conv, mut rec) = (upload(st, &fixture.conv0), upload(st, &fixture.rec0));
        {
            let parts = outs
                .iter_mut()
                .zip(widths)
                .map(|(o, width)| GemvPart {
                    out: dev_mut(kernels, o),
                    width,
                })
                .collect();
            let input = GemvInput::Plain {
                x: view(kernels, &x),
                ld_x: k,
            };
            let output = if fold {
                GemvOutput::Bf16PartsConv {
                    parts,
                    conv: PartsConv {
                        weight: view(kernels, dev.layer().conv_weight),
                        state: dev_mut(kernels, &mut conv),
                        slots: view(kernels, dev.seqs().slots),
                        has_state: view(kernels, dev.seqs().has_state),
                    },
                }
            } else {
                GemvOutput::Bf16Parts { parts }
            };
            gemv(kernels, view(kernels, &w), n, k, m, &input, output).unwrap();
        }
        let mut state = GdnState {
            conv: &mut conv,
            recurrent: &mut rec,
            slots: SLOTS,
        };
        let mut scratch = GdnScratch::new(st, &GDN, m).unwrap();
        let mut out = st.alloc_zeros::<bf16>(m * GDN.value_width()).unwrap();
        let inputs = GdnInputs {
            qkv: &outs[0],
            z: &outs[1],
            b: &outs[2],
            a: &outs[3],
        };
        let (layer, seqs) = (dev.layer(), dev.seqs());
        if fold {
            gdn_decode_convolved(kernels, &GDN, &layer, &mut state, &seqs, &inputs, &mut out)
        } else {
            gdn_decode(
                kernels,
                &GDN,
                &layer,
                &mut state,
                &seqs,
                &inputs,
                &mut scratch,
                &mut out,
            )
        }
        .unwrap();
        st.synchronize().unwrap();
        let conv_out = if fold {
            download(st, &outs[0])
        } else {
            raw_qkv = download(st, &outs[0]);
            download(st, &scratch.conv_out)
        };
        let mut zba = download(st, &outs[1]);
        zba.extend(download(st, &outs[2]));
        zba.extend(download(st, &outs[3]));
        (
            conv_out,
            zba,
            download(st, &conv),
            download(st, &rec),
            download(st, &out),
        )
    });
    ConvFoldRun { raw_qkv, ways }
}

/// The in-projection GEMV's conv epilogue gives the bits of the conv launch it replaces, under
/// SASS and the PTX JIT: the conv output, the shifted conv states (new sequences starting from
/// zero over stale slots), and so the delta rule's state and the layer's output; and its conv
/// states equal the CPU reference's.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn gpu_gdn_in_proj_conv_epilogue_gives_the_bits_of_the_conv_launch() {
    let d = open_device(0).unwrap_or_else(|e| panic!("this GPU test needs a CUDA device: {e}"));
    let seed = triton_seed() ^ 0xc0u64;
    let mut rng = rng(seed);
    let fixture = gdn_fixture(&mut rng, SLOTS);
    let batches: [(&[usize], &[bool]); 3] = [
        (
            &[3, 0, 7, 11, 5, 1, 9, 2],
            &[true, true, false, true, true, true, false, true],
        ),
        (&[6, 10, 4], &[false, true, true]),
        (&[8], &[true]),
    ];
    for policy in [Policy::Auto, Policy::PtxOnly] {
        let kernels = load_available(&d, policy, &ModuleSource::registry()).unwrap();
        for (slots, has) in batches {
            let run = run_conv_fold(&kernels, &mut rng, &fixture, (slots, has));
            let what = format!("[{policy:?}] {} rows", slots.len());
            let [(conv_a, zba_a, cs_a, rec_a, out_a), (conv_b, zba_b, cs_b, rec_b, out_b)] =
                &run.ways;
            assert!(
                conv_b.iter().filter(|v| v.to_f32() != 0.0).count() > conv_b.len() / 2,
                "{what}: the conv output is mostly zero"
            );
            let differ = |a: &[bf16], b: &[bf16]| {
                a.iter()
                    .zip(b)
                    .filter(|(x, y)| x.to_bits() != y.to_bits())
                    .count()
            };
            assert_eq!(differ(conv_a, conv_b), 0, "{what}: conv outputs differ");
            assert_eq!(differ(zba_a, zba_b), 0, "{what}: z, b, a parts differ");
            assert_eq!(differ(cs_a, cs_b), 0, "{what}: conv states differ");
            assert!(
                rec_a
                    .iter()
                    .zip(rec_b)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{what}: recurrent states differ"
            );
            assert_eq!(differ(out_a, out_b), 0, "{what}: outputs differ");
            // The conv states against the CPU reference (exact: the state holds copies).
            let seqs: Vec<SeqSpec> = slots
                .iter()
                .zip(has)
                .enumerate()
                .map(|(i, (&slot, &has_state))| SeqSpec {
                    start: i,
                    len: 1,
                    slot,
                    has_state,
                })
                .collect();
            let mut cs_ref = fixture.conv0.clone();
            let conv_ref = conv1d_reference(
                &GDN,
                &run.raw_qkv,
                &fixture.params.conv_weight,
                &mut cs_ref,
                &seqs,
            );
            assert_eq!(
                differ(cs_b, &cs_ref),
                0,
                "{what}: conv states vs the CPU reference"
            );
            check_bf16(&format!("{what} conv output vs CPU"), conv_b, &conv_ref);
            eprintln!("{what}: conv epilogue equal to the conv launch in every bit");
        }
    }
}
