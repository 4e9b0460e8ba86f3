//! `qwen-decode bench`: the decode matrix (inputs x concurrency) on the GPU, each cell against
//! the read-bandwidth limit measured in the same run, with digests of the generated ids.
//!
//! Per cell: submit `concurrency` requests of `input` random prompt tokens, prefill them, warm up
//! `--warmup` decode steps at that concurrency, then time `--new-tokens` decode steps with CUDA
//! events (one pair around the whole window for throughput, one pair per step for the time per
//! output token). With `--profile-window`, a primer of `--primer` steps runs first and
//! `cuProfilerStart`/`cuProfilerStop` bracket exactly the timed steps, so
//! `ncu --profile-from-start off` captures them and nothing else.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use aot_kernels::device::{timing_event, CudaContext, CudaStream};
use aot_kernels::dispatch::Policy;
use aot_kernels::ops::bench::{stream_read, stream_read_blocks};
use aot_kernels::ops::random::random_bits;
use aot_kernels::ops::sampling::SamplingParams;
use aot_kernels::ops::{dev, dev_mut};
use qwen_engine::config::Qwen3Config;
use qwen_engine::engine::{Engine, EngineOptions};
use qwen_engine::gpu::{GpuOptions, GpuRunner};
use qwen_engine::scheduler::{Event, RequestId, RequestSpec};
use qwen_engine::source::{open_model, ModelSource};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::run::parse_bytes;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// A model folder, or `qwen3-4b` (synthetic weights of the real shapes) or `tiny`.
    #[arg(long, default_value = "qwen3-4b")]
    model: String,
    /// Prompt lengths.
    #[arg(long, value_delimiter = ',', default_value = "16,1024")]
    inputs: Vec<usize>,
    /// Requests decoded together.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8")]
    concurrency: Vec<usize>,
    /// Timed decode steps per cell.
    #[arg(long, default_value_t = 128)]
    new_tokens: usize,
    /// Decode steps before the timed ones.
    #[arg(long, default_value_t = 16)]
    warmup: usize,
    /// Dispatch policies to run the matrix under (auto, ptx-only).
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    policy: Vec<Policy>,
    /// Bracket the timed steps with cuProfilerStart/Stop after a primer.
    #[arg(long)]
    profile_window: bool,
    /// Decode steps of the primer before a profiled window.
    #[arg(long, default_value_t = 256)]
    primer: usize,
    /// Launch eagerly instead of replaying CUDA graphs.
    #[arg(long)]
    no_graphs: bool,
    #[arg(long, default_value = "16GiB")]
    kv_budget: String,
    /// Bytes the streaming-read kernel reads per run.
    #[arg(long, default_value = "4GiB")]
    bandwidth_bytes: String,
    /// Peer results (JSON from scripts/bench/peers.py) to put beside ours.
    #[arg(long)]
    peers: Option<PathBuf>,
    /// Write the JSON here (the evidence bundle).
    #[arg(long)]
    out: Option<PathBuf>,
    #[arg(long, default_value_t = 0)]
    weights_seed: u64,
}

/// One measured cell.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub input: usize,
    pub concurrency: usize,
    pub policy: Policy,
    pub new_tokens: usize,
    pub decode_tok_s: f64,
    pub per_request_tok_s: f64,
    pub tpot_ms_median: f64,
    pub tpot_ms_p90: f64,
    pub prefill_ms: f64,
    pub prefill_tflops: f64,
    pub bytes_per_step: f64,
    pub limit_tok_s: f64,
    pub limit_share: f64,
    pub digest: String,
    pub first_matches_single: bool,
    pub graph_replays: usize,
    pub eager_passes: usize,
}

fn nvidia_smi_clocks() -> Option<serde_json::Value> {
    let out = std::process::Command::new("nvidia-smi")
        .args([
            "--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw",
            "--format=csv,noheader,nounits",
        ])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let f: Vec<&str> = text.lines().next()?.split(',').map(str::trim).collect();
    Some(
        serde_json::json!({"sm_mhz": f.first()?.parse::<f64>().ok(), "mem_mhz": f.get(1)?.parse::<f64>().ok(),
        "temperature_c": f.get(2).and_then(|v| v.parse::<f64>().ok()), "power_w": f.get(3).and_then(|v| v.parse::<f64>().ok())}),
    )
}

fn median_and_p90(mut v: Vec<f64>) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.9))
}

/// Read bandwidth of our streaming kernel: the median of `runs` reads of `bytes`.
fn measure_bandwidth(
    runner: &GpuRunner,
    bytes: usize,
    runs: usize,
) -> Result<(f64, Vec<f64>), String> {
    let k = runner.kernels();
    let s = k.stream();
    let words = (bytes / 16) * 4;
    let mut data = s
        .alloc_zeros::<u32>(words)
        .map_err(|e| format!("bandwidth buffer: {e}"))?;
    // A pattern, so the fold is not trivially zero: word i of every 16-byte group gets i + 1.
    let pattern: Vec<u32> = (0..(1 << 20)).map(|i| (i % 4 + 1) as u32).collect();
    let mut at = 0;
    while at < words {
        let n = pattern.len().min(words - at);
        s.memcpy_htod(&pattern[..n], &mut data.slice_mut(at..at + n))
            .map_err(|e| format!("{e}"))?;
        at += n;
    }
    let blocks = stream_read_blocks(k.sm_count());
    let mut xor = s.alloc_zeros::<u32>(blocks).map_err(|e| format!("{e}"))?;
    // Each 16-byte group folds to 1 ^ 2 ^ 3 ^ 4 = 4; an even number of groups to 0.
    let want: u32 = if (words / 4).is_multiple_of(2) { 0 } else { 4 };
    let mut gbs = Vec::new();
    for i in 0..runs + 1 {
        let (a, b) = (
            timing_event(k.context()).map_err(|e| e.to_string())?,
            timing_event(k.context()).map_err(|e| e.to_string())?,
        );
        a.record(s).map_err(|e| e.to_string())?;
        stream_read(k, dev(k, &data), dev_mut(k, &mut xor)).map_err(|e| e.to_string())?;
        b.record(s).map_err(|e| e.to_string())?;
        b.synchronize().map_err(|e| e.to_string())?;
        let ms = a.elapsed_ms(&b).map_err(|e| e.to_string())?;
        let folded = s
            .clone_dtoh(&xor)
            .map_err(|e| e.to_string())?
            .iter()
            .fold(0, |x, &y| x ^ y);
        if folded != want {
            return Err(format!(
                "the streaming read folded to {folded:#x}, expected {want:#x}: a read went wrong"
            ));
        }
        if i > 0 {
            gbs.push((words * 4) as f64 / (f64::from(ms) * 1e-3) / 1e9);
        }
    }
    Ok((median_and_p90(gbs.clone()).0, gbs))
}

fn prompt(input: usize, vocab: usize, seed: u64, request: u64) -> Vec<u32> {
    (0..input as u64)
        .map(|i| (random_bits(seed, request, i) % vocab as u64) as u32)
        .collect()
}

fn digest(ids: &[Vec<u32>]) -> String {
    let mut h = Sha256::new();
    for r in ids {
        h.update((r.len() as u64).to_le_bytes());
        for t in r {
            h.update(t.to_le_bytes());
        }
    }
    fatbin_verify::sha256_hex(&h.finalize().into())
}

/// FLOPs of a prefill of `tokens` tokens (per sequence `per_seq`): the projections plus attention.
fn prefill_flops(c: &Qwen3Config, tokens: usize, per_seq: usize) -> f64 {
    let linear = (c.parameter_count() - (c.vocab_size * c.hidden_size) as u64) as f64;
    let attn = 4.0 * (per_seq as f64).powi(2) / 2.0
        * (c.num_attention_heads * c.head_dim) as f64
        * c.num_hidden_layers as f64;
    2.0 * linear * tokens as f64 + attn * (tokens / per_seq.max(1)) as f64
}

struct Timer {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
}

impl Timer {
    fn event(&self) -> Result<aot_kernels::device::CudaEvent, String> {
        timing_event(&self.ctx).map_err(|e| e.to_string())
    }
}

/// Runs one cell on `engine`; returns the cell and every request's generated ids.
#[allow(clippy::too_many_arguments)]
fn run_cell(
    engine: &mut Engine,
    timer: &Timer,
    cfg: &Qwen3Config,
    args: &BenchArgs,
    policy: Policy,
    input: usize,
    concurrency: usize,
    bandwidth_gbs: f64,
    profile: bool,
) -> Result<(Cell, Vec<Vec<u32>>), String> {
    let warmup = args.warmup + if profile { args.primer } else { 0 };
    let total_new = warmup + args.new_tokens + 1;
    let mut ids: Vec<RequestId> = Vec::new();
    for r in 0..concurrency {
        let spec = RequestSpec {
            prompt: prompt(input, cfg.vocab_size, 1234 + input as u64, r as u64),
            max_new_tokens: total_new,
            sampling: SamplingParams::GREEDY,
            seed: r as u64,
            stop_at_eos: false,
        };
        ids.push(
            engine
                .submit(spec)
                .map_err(|e| format!("cell i{input} c{concurrency}: {e}"))?,
        );
    }
    let mut generated: Vec<Vec<u32>> = vec![Vec::new(); concurrency];
    let collect = |events: Vec<Event>, generated: &mut Vec<Vec<u32>>| {
        for e in events {
            if let Event::Token { id, token, .. } = e {
                if let Some(i) = ids.iter().position(|&x| x == id) {
                    generated[i].push(token);
                }
            }
        }
    };
    // Prefill: until every request has its first token.
    let started = Instant::now();
    while generated.iter().any(Vec::is_empty) {
        let ev = engine.step().map_err(|e| e.to_string())?;
        collect(ev, &mut generated);
    }
    let prefill_ms = started.elapsed().as_secs_f64() * 1e3;
    for _ in 0..warmup {
        let ev = engine.step().map_err(|e| e.to_string())?;
        collect(ev, &mut generated);
    }
    let stats_before = engine.runner().report()["stats"].clone();
    let (start, stop) = (timer.event()?, timer.event()?);
    let mut step_events = Vec::with_capacity(args.new_tokens);
    let profiler = if profile {
        Some(aot_kernels::device::profiler_start().map_err(|e| format!("cuProfilerStart: {e}"))?)
    } else {
        None
    };
    start.record(&timer.stream).map_err(|e| e.to_string())?;
    for _ in 0..args.new_tokens {
        let (a, b) = (timer.event()?, timer.event()?);
        a.record(&timer.stream).map_err(|e| e.to_string())?;
        let ev = engine.step().map_err(|e| e.to_string())?;
        b.record(&timer.stream).map_err(|e| e.to_string())?;
        collect(ev, &mut generated);
        step_events.push((a, b));
    }
    stop.record(&timer.stream).map_err(|e| e.to_string())?;
    stop.synchronize().map_err(|e| e.to_string())?;
    drop(profiler);
    let window_ms = f64::from(start.elapsed_ms(&stop).map_err(|e| e.to_string())?);
    let steps_ms: Vec<f64> = step_events
        .iter()
        .map(|(a, b)| a.elapsed_ms(b).map(f64::from).unwrap_or(f64::NAN))
        .collect();
    // Finish the requests (their last token).
    while !engine.is_idle() {
        let ev = engine.step().map_err(|e| e.to_string())?;
        collect(ev, &mut generated);
    }
    let stats_after = engine.runner().report()["stats"].clone();
    let delta = |k: &str| {
        stats_after[k]
            .as_u64()
            .unwrap_or(0)
            .saturating_sub(stats_before[k].as_u64().unwrap_or(0)) as usize
    };

    // Bytes a timed step moves: every weight once, each request's cache up to its position, and
    // the one position each request writes.
    let kvpt = cfg.kv_bytes_per_token() as f64;
    let mean_ctx = (input + warmup + 1) as f64 + args.new_tokens as f64 / 2.0;
    let bytes_per_step =
        cfg.parameter_count() as f64 * 2.0 + concurrency as f64 * (mean_ctx + 1.0) * kvpt;
    let limit = bandwidth_gbs * 1e9 / bytes_per_step * concurrency as f64;
    let decode = (args.new_tokens * concurrency) as f64 / (window_ms * 1e-3);
    let (med, p90) = median_and_p90(steps_ms);

    // Request 0 alone must give the same tokens.
    let first_matches_single = if concurrency == 1 {
        true
    } else {
        let spec = RequestSpec {
            prompt: prompt(input, cfg.vocab_size, 1234 + input as u64, 0),
            max_new_tokens: total_new,
            sampling: SamplingParams::GREEDY,
            seed: 0,
            stop_at_eos: false,
        };
        let id = engine.submit(spec).map_err(|e| e.to_string())?;
        let mut alone = Vec::new();
        engine
            .run(|e| {
                if let Event::Token { id: i, token, .. } = e {
                    if *i == id {
                        alone.push(*token);
                    }
                }
            })
            .map_err(|e| e.to_string())?;
        alone == generated[0]
    };
    let cell = Cell {
        input,
        concurrency,
        policy,
        new_tokens: args.new_tokens,
        decode_tok_s: decode,
        per_request_tok_s: decode / concurrency as f64,
        tpot_ms_median: med,
        tpot_ms_p90: p90,
        prefill_ms,
        prefill_tflops: prefill_flops(cfg, input * concurrency, input) / (prefill_ms * 1e-3) / 1e12,
        bytes_per_step,
        limit_tok_s: limit,
        limit_share: decode / limit,
        digest: digest(&generated),
        first_matches_single,
        graph_replays: delta("graph_replays"),
        eager_passes: delta("eager_passes"),
    };
    Ok((cell, generated))
}

pub fn bench(args: BenchArgs) -> ExitCode {
    match bench_inner(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn bench_inner(args: &BenchArgs) -> Result<(), String> {
    let src: ModelSource = open_model(&args.model, args.weights_seed).map_err(|e| e.to_string())?;
    let cfg = src.config.clone();
    let kv_budget = parse_bytes(&args.kv_budget)?;
    let bw_bytes = parse_bytes(&args.bandwidth_bytes)?;
    let max_c = args.concurrency.iter().copied().max().unwrap_or(1);
    let max_input = args.inputs.iter().copied().max().unwrap_or(16);
    let clocks_before = nvidia_smi_clocks();
    let mut cells = Vec::new();
    let mut device = serde_json::Value::Null;
    let mut bandwidth = serde_json::Value::Null;
    let mut cold = serde_json::Map::new();
    for &policy in &args.policy {
        let options = GpuOptions {
            policy,
            slots: max_c.max(1),
            kv_budget: Some(kv_budget),
            graphs: !args.no_graphs,
            max_context: (max_input + args.warmup + args.primer + args.new_tokens + 64)
                .next_power_of_two(),
        };
        let setup = Instant::now();
        let runner =
            GpuRunner::new(&cfg, &src.weights, &options, &mut |_| {}).map_err(|e| e.to_string())?;
        eprintln!(
            "[{policy}] runner ready in {:.2} s",
            setup.elapsed().as_secs_f64()
        );
        let report = runner.kernels().report();
        cold.insert(
            policy.to_string(),
            serde_json::json!({"load_ms": report.total_load_us() as f64 / 1e3, "jit": report.modules.iter().any(|m| m.jit)}),
        );
        if bandwidth.is_null() {
            let (gbs, runs) = measure_bandwidth(&runner, bw_bytes, 5)?;
            eprintln!(
                "streaming read: {gbs:.0} GB/s (median of {} runs over {} bytes)",
                runs.len(),
                bw_bytes
            );
            bandwidth = serde_json::json!({"read_gbs": gbs, "bytes": bw_bytes, "runs": runs});
            device = serde_json::json!({
                "name": report.device_name, "capability": report.device.capability.to_string(),
                "driver": report.device.driver.to_string(), "sm_count": runner.kernels().sm_count(),
            });
        }
        let read_gbs = bandwidth["read_gbs"].as_f64().unwrap_or(0.0);
        let timer = Timer {
            ctx: runner.kernels().context().clone(),
            stream: runner.kernels().stream().clone(),
        };
        let mut opts = EngineOptions::for_model(&cfg);
        opts.max_context = options.max_context;
        let mut engine = Engine::new(Box::new(runner), &cfg, opts);
        for &input in &args.inputs {
            for &c in &args.concurrency {
                let (cell, _) = run_cell(
                    &mut engine,
                    &timer,
                    &cfg,
                    args,
                    policy,
                    input,
                    c,
                    read_gbs,
                    args.profile_window,
                )?;
                eprintln!(
                    "[{policy}] i{input:<5} c{c}: {:>8.1} tok/s ({:>6.1} per request), TPOT {:.3} ms median / {:.3} p90, {:.1}% of the {:.0} tok/s limit, prefill {:.1} ms ({:.0} TFLOP/s), single-request match {}",
                    cell.decode_tok_s, cell.per_request_tok_s, cell.tpot_ms_median, cell.tpot_ms_p90,
                    100.0 * cell.limit_share, cell.limit_tok_s, cell.prefill_ms, cell.prefill_tflops, cell.first_matches_single
                );
                cells.push(cell);
            }
        }
    }
    // Digests must agree across policies.
    for a in &cells {
        for b in &cells {
            if (a.input, a.concurrency) == (b.input, b.concurrency) && a.digest != b.digest {
                return Err(format!(
                    "i{} c{}: the {} and {} digests differ",
                    a.input, a.concurrency, a.policy, b.policy
                ));
            }
        }
    }
    let peers = match &args.peers {
        Some(p) => serde_json::from_str::<serde_json::Value>(
            &std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?,
        )
        .map_err(|e| format!("{}: {e}", p.display()))?,
        None => serde_json::Value::Null,
    };
    let out = serde_json::json!({
        "schema": "aot-kernels-bench/1",
        "command": std::env::args().collect::<Vec<_>>(),
        "device": device,
        "clocks_before": clocks_before,
        "clocks_after": nvidia_smi_clocks(),
        "model": {"name": src.name, "parameters": cfg.parameter_count(), "weight_bytes": cfg.parameter_count() * 2,
                  "kv_bytes_per_token": cfg.kv_bytes_per_token(), "layers": cfg.num_hidden_layers},
        "bandwidth": bandwidth,
        "cold_start": cold,
        "cells": cells,
        "peers": peers,
    });
    let text = serde_json::to_string_pretty(&out).map_err(|e| e.to_string())?;
    match &args.out {
        Some(path) => {
            std::fs::write(path, &text).map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => println!("{text}"),
    }
    Ok(())
}
