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
use aot_kernels::dispatch::{Policy, ToolchainChoice};
use aot_kernels::ops::random::random_bits;
use aot_kernels::ops::sampling::SamplingParams;
use aot_kernels::ops::stream_read::{stream_read, xor_reference, Reader};
use aot_kernels::ops::{dev, dev_mut};
use qwen_engine::bench::report::{
    now_utc, Bandwidth, BenchReport, BuildInfo, Cell, CellTiming, Clocks, ColdStart, DeviceInfo,
    ModelInfo, Peers, Prefill, ReaderRuns,
};
use qwen_engine::bench::traffic::{decode_step_bytes, min_step_weight_bytes, prefill_flops};
use qwen_engine::engine::{Engine, EngineOptions};
use qwen_engine::gpu::prefill::PREFILL_TOKENS;
use qwen_engine::gpu::{self, CudaRunner, DecodeStep, GpuOptions};
use qwen_engine::model::ModelConfig;
use qwen_engine::scheduler::{Event, RequestId, RequestSpec};
use qwen_engine::source::{open_model, ModelSource};

use crate::run::parse_bytes;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// A model folder, or `qwen3-4b` (synthetic weights of the real shapes) or `tiny`.
    #[arg(long, default_value = "qwen3-4b")]
    model: String,
    /// Keep only the first N layers of a built-in synthetic model (every layer its real shapes,
    /// the hybrid's layer pattern as it starts): for profilers whose kernel replay saves and
    /// restores device memory, which the whole 35B-A3B makes slow. The bundle names the cut
    /// (`model.name`, `model.layers`), and its limit counts the layers kept.
    #[arg(long, value_name = "N")]
    layers: Option<usize>,
    /// Prompt lengths.
    #[arg(long, value_delimiter = ',', default_value = "16,1024")]
    inputs: Vec<usize>,
    /// Requests decoded together.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8")]
    concurrency: Vec<usize>,
    /// Timed decode steps per cell.
    #[arg(long, default_value_t = 128)]
    new_tokens: usize,
    /// Decode steps before the timed ones (at least 1).
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
    /// Wait for each decode pass before queueing the next, instead of queueing the likely next
    /// pass while the host reads this one's tokens (to measure what that gives; the same tokens
    /// either way). `--profile-window` implies it.
    #[arg(long)]
    no_decode_ahead: bool,
    /// Modules to load from their PTX whatever the policy (comma-separated): one module's
    /// fallback path beside the others' SASS (which module's PTX moves the bits or the time).
    #[arg(long, value_delimiter = ',')]
    ptx_modules: Vec<String>,
    /// The decode step kinds to run, each over the whole matrix (comma-separated): `launches`
    /// (one launch per op) and `persistent` (the persistent step, issue 32; where it cannot run
    /// here the runner falls back to the launches and the record says so).
    #[arg(long, value_delimiter = ',', default_value = "launches,persistent")]
    step: Vec<DecodeStep>,
    /// Blocks of each persistent launch (default: one an SM); Thor has 20 SMs.
    #[arg(long)]
    persistent_blocks: Option<usize>,
    /// After the matrix, run the persistent step once more with every task run stamped, at the
    /// smallest cell (first input, concurrency 1) and the largest (last input, largest
    /// concurrency), and put each pass's timeline (SVG) and time table (Markdown) in the bundle.
    #[arg(long)]
    persistent_trace: bool,
    /// Merge decode attention's splits through the workspace everywhere, never inside
    /// thread-block clusters (to measure what the clusters give; the same tokens either way).
    #[arg(long)]
    no_attention_cluster: bool,
    /// Rows of a packed prefill pass on the GPU (the prompt chunks of a step share passes).
    #[arg(long, default_value_t = PREFILL_TOKENS)]
    prefill_tokens: usize,
    #[arg(long, default_value = "16GiB")]
    kv_budget: String,
    /// Bytes the streaming-read kernel reads per run.
    #[arg(long, default_value = "4GiB")]
    bandwidth_bytes: String,
    /// Peer results (JSON from scripts/bench/peers.py) to put beside ours.
    #[arg(long)]
    peers: Option<PathBuf>,
    /// Where the evidence bundle goes: a new folder `<UTC time>-<device>-<model>/` under this one
    /// (written once, never overwritten).
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Also print the bundle's JSON to stdout.
    #[arg(long)]
    json: bool,
    /// The source commit, recorded in the bundle.
    #[arg(long)]
    git_commit: Option<String>,
    #[arg(long, default_value_t = 0)]
    weights_seed: u64,
}

/// GPU clocks, temperature and power as nvidia-smi reports them now.
fn nvidia_smi_clocks() -> Result<Clocks, String> {
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw", "--format=csv,noheader,nounits"])
        .output()
        .map_err(|e| format!("nvidia-smi: {e} (the bundle records the GPU clocks; run where nvidia-smi is on PATH)"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let f: Vec<&str> = text
        .lines()
        .next()
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    match (num(0), num(1)) {
        (Some(sm_mhz), Some(mem_mhz)) => Ok(Clocks {
            sm_mhz,
            mem_mhz,
            temperature_c: num(2),
            power_w: num(3),
        }),
        _ => Err(format!("nvidia-smi printed no clocks: `{}`", text.trim())),
    }
}

/// Read bandwidth of our streaming kernels over one buffer of `bytes`: each reader's median of
/// `runs` reads (the readers alternate, so both see the same clocks), the fastest sets the limit.
fn measure_bandwidth(
    runner: &dyn CudaRunner,
    bytes: usize,
    runs: usize,
) -> Result<Bandwidth, String> {
    let kernels = runner.kernels();
    let s = kernels.stream();
    let words = (bytes / 16) * 4;
    let mut data = s
        .alloc_zeros::<u32>(words)
        .map_err(|e| format!("bandwidth buffer: {e}"))?;
    // Pseudo-random words repeating every 4 MiB (256 bulk chunks of 16 KiB), so that every chunk
    // folds to its own value: a chunk skipped, read twice or read from a stale slot changes the
    // fold. `want` is the fold of what was uploaded.
    let pattern: Vec<u32> = (0..(1u64 << 20))
        .map(|i| {
            let x = (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            (x >> 32) as u32 ^ x as u32
        })
        .collect();
    let pattern_fold = xor_reference(&pattern);
    let (mut at, mut want) = (0, 0u32);
    while at < words {
        let n = pattern.len().min(words - at);
        s.memcpy_htod(&pattern[..n], &mut data.slice_mut(at..at + n))
            .map_err(|e| format!("{e}"))?;
        want ^= if n == pattern.len() {
            pattern_fold
        } else {
            xor_reference(&pattern[..n])
        };
        at += n;
    }
    let mut gbs: Vec<Vec<f64>> = vec![Vec::new(); Reader::ALL.len()];
    let mut xors = Reader::ALL
        .iter()
        .map(|r| s.alloc_zeros::<u32>(r.blocks(kernels.sm_count())))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{e}"))?;
    for i in 0..runs + 1 {
        for (r, (&reader, xor)) in Reader::ALL.iter().zip(&mut xors).enumerate() {
            let (a, b) = (
                timing_event(kernels.context()).map_err(|e| e.to_string())?,
                timing_event(kernels.context()).map_err(|e| e.to_string())?,
            );
            a.record(s).map_err(|e| e.to_string())?;
            stream_read(kernels, reader, dev(kernels, &data), dev_mut(kernels, xor))
                .map_err(|e| e.to_string())?;
            b.record(s).map_err(|e| e.to_string())?;
            b.synchronize().map_err(|e| e.to_string())?;
            let ms = a.elapsed_ms(&b).map_err(|e| e.to_string())?;
            let folded = xor_reference(&s.clone_dtoh(xor).map_err(|e| e.to_string())?);
            if folded != want {
                return Err(format!(
                    "the streaming read ({}) folded to {folded:#x}, expected {want:#x}: a read went wrong",
                    reader.entry()
                ));
            }
            if i > 0 {
                gbs[r].push((words * 4) as f64 / (f64::from(ms) * 1e-3) / 1e9);
            }
        }
    }
    let readers = Reader::ALL
        .iter()
        .zip(gbs)
        .map(|(reader, runs)| ReaderRuns {
            entry: reader.entry().to_string(),
            read_gbs: qwen_engine::bench::report::median_and_p90(&runs).map_or(0.0, |m| m.0),
            runs,
        })
        .collect();
    Bandwidth::fastest(bytes as u64, readers).ok_or_else(|| "no streaming reader ran".to_string())
}

fn prompt(input: usize, vocab: usize, seed: u64, request: u64) -> Vec<u32> {
    (0..input as u64)
        .map(|i| (random_bits(seed, request, i) % vocab as u64) as u32)
        .collect()
}

/// The mean distinct experts per MoE call between two reports' `moe_routing` (the hybrid runner's
/// log of its decode passes); `None` for a runner that logs none (a dense model).
fn routing_delta(before: &serde_json::Value, after: &serde_json::Value) -> Option<f64> {
    let get = |v: &serde_json::Value, k: &str| v.get(k).and_then(serde_json::Value::as_i64);
    let calls = get(after, "decode_moe_calls")? - get(before, "decode_moe_calls")?;
    let experts = get(after, "distinct_experts")? - get(before, "distinct_experts")?;
    (calls > 0).then(|| experts as f64 / calls as f64)
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

/// An engine over `runner` for `max_context` tokens, and the timer on its stream.
fn engine_on(
    runner: Box<dyn CudaRunner>,
    model: &qwen_engine::model::ModelDesc,
    max_context: usize,
) -> (Engine, Timer) {
    let timer = Timer {
        ctx: runner.kernels().context().clone(),
        stream: runner.kernels().stream().clone(),
    };
    let mut opts = EngineOptions::for_model(model);
    opts.max_context = max_context;
    (Engine::new(runner, model, opts), timer)
}

/// Runs one cell on `engine`; returns the cell and every request's generated ids.
#[allow(clippy::too_many_arguments)]
fn run_cell(
    engine: &mut Engine,
    timer: &Timer,
    config: &ModelConfig,
    args: &BenchArgs,
    policy: Policy,
    step: &str,
    input: usize,
    concurrency: usize,
    bandwidth_gbs: f64,
    profile: bool,
) -> Result<(Cell, Vec<Vec<u32>>), String> {
    let warmup = args.warmup + if profile { args.primer } else { 0 };
    // One token after the window: its last step then goes on, and with decode ahead (the runner
    // queues the next pass before a step's tokens are read) queues the pass after it, so that the
    // window holds exactly `new_tokens` passes in either mode (the first timed pass was queued by
    // the last warm-up step, before the window opens). And one more for the prefill's token.
    let vocab = config.describe().vocab_size;
    let total_new = warmup + args.new_tokens + 2;
    let mut ids: Vec<RequestId> = Vec::new();
    for r in 0..concurrency {
        let spec = RequestSpec {
            prompt: prompt(input, vocab, 1234 + input as u64, r as u64),
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
    let before = engine.runner().report();
    let (stats_before, routing_before) = (before["stats"].clone(), before["moe_routing"].clone());
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
    let routing_after = engine.runner().report()["moe_routing"].clone();
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
            .saturating_sub(stats_before[k].as_u64().unwrap_or(0))
    };

    // Bytes a timed step moves (bench::traffic): every weight it uses once (a MoE block's experts
    // as the window's routing chose them), each request's cache up to its position and the one
    // position each writes, each request's recurrent state read and written.
    let mean_ctx = (input + warmup + 1) as f64 + args.new_tokens as f64 / 2.0;
    let distinct = routing_delta(&routing_before, &routing_after);
    let bytes_per_step = decode_step_bytes(config, concurrency, mean_ctx, distinct)
        .map_err(|e| format!("cell i{input} c{concurrency}: {e}"))?;

    // Request 0 alone must give the same tokens.
    let first_matches_single = if concurrency == 1 {
        true
    } else {
        let spec = RequestSpec {
            prompt: prompt(input, vocab, 1234 + input as u64, 0),
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
    let mut cell = Cell::from_timing(&CellTiming {
        input,
        concurrency,
        policy,
        step,
        step_ms: &steps_ms,
        window_ms,
        prefill_ms,
        bytes_per_step,
        read_gbs: bandwidth_gbs,
        generated: &generated,
        first_matches_single,
    });
    cell.prefill_tflops =
        Some(prefill_flops(config, input * concurrency, input) / (prefill_ms * 1e-3) / 1e12);
    cell.graph_replays = Some(delta("graph_replays"));
    cell.eager_passes = Some(delta("eager_passes"));
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
    // Before the model loads: a cell that cannot run would otherwise end the matrix after the
    // cells before it, and lose them.
    for (flag, values) in [
        ("--inputs", &args.inputs),
        ("--concurrency", &args.concurrency),
    ] {
        if values.is_empty() || values.contains(&0) {
            return Err(format!(
                "{flag} {values:?}: give one or more positive numbers, comma-separated"
            ));
        }
    }
    if args.new_tokens == 0 {
        return Err("--new-tokens 0: a cell times one or more decode steps; give 1 or more".into());
    }
    if args.warmup == 0 {
        return Err("--warmup 0: a cell needs at least one warm-up step (it queues the first timed \
                    pass, so that the window holds exactly --new-tokens passes); give --warmup 1 or more"
            .into());
    }
    let mut src: ModelSource =
        open_model(&args.model, args.weights_seed).map_err(|e| e.to_string())?;
    if let Some(layers) = args.layers {
        src = src.first_layers(layers)?;
    }
    let model = src.config.describe();
    let kv_budget = parse_bytes(&args.kv_budget).map_err(|e| format!("--kv-budget: {e}"))?;
    let bw_bytes =
        parse_bytes(&args.bandwidth_bytes).map_err(|e| format!("--bandwidth-bytes: {e}"))?;
    let max_c = args.concurrency.iter().copied().max().unwrap_or(1);
    let max_input = args.inputs.iter().copied().max().unwrap_or(16);
    let peers = args
        .peers
        .as_deref()
        .map(Peers::read)
        .transpose()
        .map_err(|e| e.to_string())?;
    let clocks_before = nvidia_smi_clocks()?;
    let mut cells: Vec<Cell> = Vec::new();
    let mut device: Option<(String, String, String, u32, u64)> = None;
    let mut bandwidth: Option<Bandwidth> = None;
    let mut cold = std::collections::BTreeMap::new();
    let mut dispatch = serde_json::Map::new();
    // The runner's options for a policy and step kind; `stamps`: a stamped diagnostic run.
    let gpu_options =
        |policy: Policy, step: DecodeStep, stamps: bool| -> Result<GpuOptions, String> {
            Ok(GpuOptions {
                policy,
                slots: max_c.max(1),
                kv_budget: Some(kv_budget),
                graphs: !args.no_graphs,
                max_context: (max_input + args.warmup + args.primer + args.new_tokens + 64)
                    .next_power_of_two(),
                toolchain: ToolchainChoice::from_env().map_err(|e| e.to_string())?,
                prefill_tokens: args.prefill_tokens,
                attention_pipelined: None,
                attention_cluster: !args.no_attention_cluster,
                // A profiled window waits for each pass: a pass queued ahead of the window would
                // run partly before cuProfilerStart, and the capture's kernel count would vary; a
                // stamped run too, so that its last pass is the one the trace reads.
                decode_ahead: !args.no_decode_ahead && !args.profile_window && !stamps,
                ptx_modules: args.ptx_modules.clone(),
                step,
                persistent_stamps: stamps,
            })
        };
    for (&policy, &asked) in args
        .policy
        .iter()
        .flat_map(|p| args.step.iter().map(move |s| (p, s)))
    {
        let asked = match asked {
            DecodeStep::Persistent { .. } => DecodeStep::Persistent {
                blocks: args.persistent_blocks,
            },
            other => other,
        };
        let options = gpu_options(policy, asked, false)?;
        let setup = Instant::now();
        let runner = gpu::open_runner(&src.config, &src.weights, &options, &mut |_| {})
            .map_err(|e| e.to_string())?;
        // The step that runs (a persistent step that cannot run here falls back to launches).
        let chosen = runner.report()["step"].clone();
        let step = match chosen["step"].as_str() {
            Some("launches") | None => "launches",
            Some(_) => "persistent",
        };
        if step == "launches" && asked != DecodeStep::Launches {
            eprintln!(
                "[{policy}] the persistent step does not run here, skipped: {}",
                chosen["fallback"]
                    .as_str()
                    .unwrap_or("this model family has no persistent step")
            );
            continue;
        }
        let key = if step == "launches" {
            policy.to_string()
        } else {
            format!("{policy} {step}")
        };
        eprintln!(
            "[{key}] runner ready in {:.2} s",
            setup.elapsed().as_secs_f64()
        );
        let report = runner.kernels().report();
        cold.insert(
            key.clone(),
            ColdStart {
                load_ms: report.total_load_us() as f64 / 1e3,
                jit: report.modules.iter().any(|m| m.jit),
            },
        );
        dispatch.insert(
            key.clone(),
            serde_json::to_value(report).map_err(|e| e.to_string())?,
        );
        if bandwidth.is_none() {
            let b = measure_bandwidth(runner.as_ref(), bw_bytes, 5)?;
            eprintln!(
                "streaming read: {} (medians of {} runs over {} bytes)",
                b.describe(),
                b.runs.len(),
                bw_bytes
            );
            bandwidth = Some(b);
            let memory = runner
                .kernels()
                .context()
                .total_mem()
                .map_err(|e| e.to_string())? as u64;
            device = Some((
                report.device_name.clone(),
                report.device.capability.to_string(),
                report.device.driver.to_string(),
                runner.kernels().sm_count() as u32,
                memory,
            ));
        }
        let read_gbs = bandwidth.as_ref().map_or(0.0, |b| b.read_gbs);
        let (mut engine, timer) = engine_on(runner, &model, options.max_context);
        for &input in &args.inputs {
            for &c in &args.concurrency {
                let (cell, _) = run_cell(
                    &mut engine,
                    &timer,
                    &src.config,
                    args,
                    policy,
                    step,
                    input,
                    c,
                    read_gbs,
                    args.profile_window,
                )?;
                eprintln!(
                    "[{key}] i{input:<5} c{c}: {:>8.1} tok/s ({:>6.1} per request), TPOT {:.3} ms median / {:.3} p90, {:.1}% of the {:.0} tok/s limit, prefill {:.1} ms ({:.0} TFLOP/s), single-request match {}",
                    cell.decode_tok_s, cell.per_request_tok_s, cell.tpot_ms_median, cell.tpot_ms_p90,
                    100.0 * cell.limit_share, cell.limit_tok_s, cell.prefill_ms, cell.prefill_tflops.unwrap_or(0.0), cell.first_matches_single
                );
                cells.push(cell);
            }
        }
    }
    let mut traces: Vec<(String, String)> = Vec::new();
    if args.persistent_trace {
        let first = *args.inputs.first().ok_or("no inputs")?;
        let last = *args.inputs.last().ok_or("no inputs")?;
        let widest = args.concurrency.iter().copied().max().unwrap_or(1);
        let options = gpu_options(
            args.policy[0],
            DecodeStep::Persistent {
                blocks: args.persistent_blocks,
            },
            true,
        )?;
        let runner = gpu::open_runner(&src.config, &src.weights, &options, &mut |_| {})
            .map_err(|e| e.to_string())?;
        let (mut engine, _) = engine_on(runner, &model, options.max_context);
        for (input, c) in [(first, 1), (last, widest)] {
            // `c` requests of `input` tokens decoding together to the end: the last pass holds
            // all `c` rows.
            let vocab = src.config.describe().vocab_size;
            for r in 0..c {
                engine
                    .submit(RequestSpec {
                        prompt: prompt(input, vocab, 1234 + input as u64, r as u64),
                        max_new_tokens: 8,
                        sampling: SamplingParams::GREEDY,
                        seed: r as u64,
                        stop_at_eos: false,
                    })
                    .map_err(|e| e.to_string())?;
            }
            engine.run(|_| {}).map_err(|e| e.to_string())?;
            match engine.runner().pass_trace() {
                Some(Ok(t)) => {
                    let stem = format!("persistent-trace-i{input}-c{c}");
                    eprintln!("[persistent trace] i{input} c{c}:\n{}", t.table);
                    traces.push((format!("{stem}.md"), t.table));
                    traces.push((format!("{stem}.svg"), t.svg));
                }
                Some(Err(e)) => return Err(format!("persistent trace: {e}")),
                None => {
                    eprintln!("[persistent trace] the persistent step does not run here: no trace")
                }
            }
        }
    }
    let (name, capability, driver, sm_count, memory_bytes) = device.ok_or("no policy was run")?;
    // The largest prefill of the matrix (8 x 1024 tokens by default) stands for prefill speed.
    let prefill = cells
        .iter()
        .filter(|c| c.policy == args.policy[0] && c.step == "launches")
        .max_by_key(|c| c.input * c.concurrency)
        .map(|c| Prefill {
            tokens: (c.input * c.concurrency) as u64,
            ms: c.prefill_ms,
            tflops: c.prefill_tflops.unwrap_or(0.0),
            torch_matmul_tflops: peers.as_ref().map(|p| p.torch_matmul_tflops),
        });
    let mut report = BenchReport {
        schema: "aot-kernels-bench/1".into(),
        sample: false,
        created: now_utc(),
        command: std::env::args().collect(),
        device: DeviceInfo {
            name,
            capability,
            driver,
            sm_count,
            memory_bytes,
            clocks_before,
            clocks_after: nvidia_smi_clocks()?,
        },
        build: BuildInfo::current(args.git_commit.clone()),
        dispatch: serde_json::Value::Object(dispatch),
        model: ModelInfo {
            min_step_weight_bytes: min_step_weight_bytes(&src.config),
            ..ModelInfo::from_model(&src.name, &model)
        },
        bandwidth: bandwidth.ok_or("no bandwidth was measured")?,
        cells,
        peers: None,
        prefill,
        cold_start: cold,
        profile: None,
        notes: None,
    };
    if let Some(p) = peers {
        report.attach_peers(p);
    }
    println!("{}", report.markdown_table());
    let failures = report.correctness_failures();
    let dir = report.write_bundle(&args.out).map_err(|e| e.to_string())?;
    for (file, text) in &traces {
        let path = dir.join(file);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    eprintln!("bundle written: {}", dir.display());
    if args.json {
        println!("{}", report.to_json());
    }
    if !failures.is_empty() {
        return Err(format!("correctness: {}", failures.join("; ")));
    }
    Ok(())
}
