//! `qwen-decode run`: load a model, put it on a device, decode a prompt, stream the tokens.

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Instant;

use aot_kernels::dispatch::{self, Policy, ToolchainChoice};
use aot_kernels::ops::kv_cache::KV_BLOCK_TOKENS;
use aot_kernels::ops::sampling::SamplingParams;
use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressStyle};
use qwen_engine::cpu::{CpuRunner, CpuRunnerOptions};
use qwen_engine::engine::{Engine, EngineOptions};
use qwen_engine::gpu::prefill::PREFILL_TOKENS;
use qwen_engine::gpu::{self, DecodeStep, GpuOptions};
use qwen_engine::memory;
use qwen_engine::runner::{DeviceKind, Runner};
use qwen_engine::scheduler::{Event, FinishReason, RequestId, RequestSpec};
use qwen_engine::source::{open_model, ModelSource};
use qwen_engine::tokenizer::TextStream;
use serde_json::json;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    Cuda,
    Cpu,
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// A Hugging Face model folder, `tiny-en` (a small byte-level model trained on Shakespeare,
    /// models/tiny-en), `tiny` (small shapes, seeded random weights: for tests and benches) or
    /// `qwen3-4b` (Qwen3-4B shapes, synthetic weights).
    #[arg(long, default_value = "tiny-en")]
    model: String,
    /// Prompt text (through the model's tokenizer.json; `tiny` uses bytes).
    #[arg(long, conflicts_with = "prompt_ids")]
    prompt: Option<String>,
    /// Prompt as token ids, comma-separated (needs no tokenizer).
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    prompt_ids: Option<Vec<u32>>,
    #[arg(long, default_value_t = 32)]
    max_new_tokens: usize,
    /// Greedy decoding (the default when no sampling option is given).
    #[arg(long, conflicts_with_all = ["temperature", "top_k", "top_p"])]
    greedy: bool,
    #[arg(long)]
    temperature: Option<f32>,
    #[arg(long)]
    top_k: Option<u32>,
    #[arg(long)]
    top_p: Option<f32>,
    /// Sampling seed (request i of --concurrency uses seed + i).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// cuda or cpu; default cuda when a GPU is present.
    #[arg(long, value_enum)]
    device: Option<DeviceArg>,
    /// Kernel dispatch: auto, sass-only or ptx-only (default AOT_KERNELS_POLICY, else auto).
    #[arg(long)]
    policy: Option<Policy>,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
    /// Decode this many copies of the prompt at once (one request each).
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Request slots (default: the concurrency, at least 8).
    #[arg(long)]
    slots: Option<usize>,
    /// Launch every kernel eagerly instead of replaying CUDA graphs.
    #[arg(long)]
    no_graphs: bool,
    /// Wait for each decode pass before queueing the next, instead of queueing the likely next
    /// pass while the host reads this one's tokens (to measure what that gives; the same tokens
    /// either way).
    #[arg(long)]
    no_decode_ahead: bool,
    /// How decode passes run on the GPU: `launches` (one launch per op) or `persistent` (the
    /// persistent step, issue 32; where it cannot run here, the launches, with a warning).
    #[arg(long, default_value = "launches")]
    step: DecodeStep,
    /// Blocks of each persistent launch (default: one an SM); Thor has 20 SMs.
    #[arg(long)]
    persistent_blocks: Option<usize>,
    /// Modules to load from their PTX whatever the policy (comma-separated): one module's
    /// fallback path beside the others' SASS (which module's PTX moves the bits or the time).
    #[arg(long, value_delimiter = ',')]
    ptx_modules: Vec<String>,
    /// KV cache size, e.g. 4GiB or 512MiB (default: most of the free GPU memory; 256MiB on CPU).
    #[arg(long)]
    kv_budget: Option<String>,
    /// Longest sequence served (default: the model's max_position_embeddings, capped at 32768 on GPU
    /// and 4096 on CPU).
    #[arg(long)]
    max_context: Option<usize>,
    /// Prompt tokens per prefill step.
    #[arg(long, default_value_t = 512)]
    prefill_chunk: usize,
    /// Rows of a packed prefill pass on the GPU (the prompt chunks of a step share passes).
    #[arg(long, default_value_t = PREFILL_TOKENS)]
    prefill_tokens: usize,
    /// Seed of the synthetic weights (tiny, qwen3-4b).
    #[arg(long, default_value_t = 0)]
    weights_seed: u64,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
}

/// `4GiB`, `512MiB`, `1000000` -> bytes.
pub fn parse_bytes(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| {
        format!("`{text}` is not a size: write e.g. 4GiB, 512MiB or a number of bytes")
    })?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "`{other}` is not a size unit: use B, KiB, MiB, GiB (or kB, MB, GB)"
            ))
        }
    };
    Ok((value * scale) as usize)
}

/// Positions a slot of the CPU runner's fp32 cache is sized for without `--max-context` (one
/// request may still use several slots' share).
const CPU_DEFAULT_CONTEXT: usize = 4096;

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(1)
}

fn usage(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(2)
}

fn sampling(args: &RunArgs) -> SamplingParams {
    if args.greedy || (args.temperature.is_none() && args.top_k.is_none() && args.top_p.is_none()) {
        return SamplingParams::GREEDY;
    }
    SamplingParams {
        temperature: args.temperature.unwrap_or(1.0),
        top_k: args.top_k.unwrap_or(0),
        top_p: args.top_p.unwrap_or(1.0),
    }
}

/// Whether a CUDA device can be opened here.
fn cuda_present() -> bool {
    dispatch::driver::driver_present() && dispatch::open_device(0).is_ok()
}

fn progress_bar(total: usize, what: &str) -> ProgressBar {
    // Only large models get a bar; indicatif hides it when stderr is not a terminal.
    if total < 256 << 20 {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

fn build_runner(
    args: &RunArgs,
    src: &ModelSource,
    device: DeviceKind,
) -> Result<Box<dyn Runner>, String> {
    let slots = args.slots.unwrap_or(args.concurrency.max(8));
    let budget = args
        .kv_budget
        .as_deref()
        .map(parse_bytes)
        .transpose()
        .map_err(|e| format!("--kv-budget: {e}"))?;
    let model = src.config.describe();
    match device {
        DeviceKind::Cuda => {
            let policy = match args.policy {
                Some(p) => p,
                None => Policy::from_env().map_err(|e| e.to_string())?,
            };
            let bytes = model.parameter_count as usize * 2;
            let bar = progress_bar(
                bytes,
                if matches!(src.weights, qwen_engine::weights::Weights::Synthetic { .. }) {
                    "generating weights on the GPU"
                } else {
                    "uploading weights"
                },
            );
            let options = GpuOptions {
                policy,
                slots,
                kv_budget: budget,
                graphs: !args.no_graphs,
                max_context: args.max_context.unwrap_or(model.max_context.min(32_768)),
                toolchain: ToolchainChoice::from_env().map_err(|e| e.to_string())?,
                prefill_tokens: args.prefill_tokens,
                attention_pipelined: None,
                attention_cluster: true,
                decode_ahead: !args.no_decode_ahead,
                ptx_modules: args.ptx_modules.clone(),
                step: match args.step {
                    DecodeStep::Persistent { .. } => DecodeStep::Persistent {
                        blocks: args.persistent_blocks,
                    },
                    other => other,
                },
                persistent_stamps: false,
            };
            let runner = gpu::open_runner(&src.config, &src.weights, &options, &mut |n| {
                bar.inc(n as u64)
            })
            .map_err(|e| e.to_string())?;
            bar.finish_and_clear();
            Ok(runner as Box<dyn Runner>)
        }
        DeviceKind::Cpu => {
            let budget = budget.unwrap_or(256 << 20);
            let per_slot = args
                .max_context
                .unwrap_or(model.max_context.min(CPU_DEFAULT_CONTEXT));
            let budget_blocks = memory::blocks_in_budget(&model, budget / 2);
            let slots_blocks = slots.saturating_mul(memory::blocks_for(per_slot));
            let kv_blocks = budget_blocks.min(slots_blocks);
            if kv_blocks == 0 {
                return Err(format!(
                    "the KV budget of {budget} bytes holds no block ({} bytes in fp32); raise --kv-budget",
                    2 * memory::block_bytes(&model)
                ));
            }
            let runner = CpuRunner::new(
                &src.config,
                &src.weights,
                CpuRunnerOptions {
                    max_slots: slots,
                    kv_blocks,
                },
            )
            .map_err(|e| e.to_string())?;
            // A cache cut to the slots' share of the default context, not to the budget: a
            // request longer than it all is refused as too long, naming --max-context (a larger
            // budget would not help), rather than as too big for the KV budget.
            let runner = if args.max_context.is_none() && slots_blocks <= budget_blocks {
                runner.with_max_context(kv_blocks * KV_BLOCK_TOKENS)
            } else {
                runner
            };
            Ok(Box::new(runner))
        }
    }
}

pub fn run(args: RunArgs) -> ExitCode {
    let started = Instant::now();
    if args.concurrency == 0 {
        return usage("--concurrency must be at least 1");
    }
    let src = match open_model(&args.model, args.weights_seed) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let prompt = match (&args.prompt, &args.prompt_ids) {
        (Some(text), None) => match src.tokenizer.encode(text) {
            Ok(ids) => ids,
            Err(e) => return fail(e),
        },
        (None, Some(ids)) => ids.clone(),
        _ => return usage("give the prompt with --prompt TEXT or --prompt-ids 1,2,3"),
    };
    let device = match args.device {
        Some(DeviceArg::Cuda) => DeviceKind::Cuda,
        Some(DeviceArg::Cpu) => DeviceKind::Cpu,
        None if cuda_present() => DeviceKind::Cuda,
        None => DeviceKind::Cpu,
    };
    let runner = match build_runner(&args, &src, device) {
        Ok(r) => r,
        Err(e) => return fail(format!("{device} runner: {e}")),
    };
    let load_s = started.elapsed().as_secs_f64();
    let model = src.config.describe();
    let mut options = EngineOptions::for_model(&model);
    options.prefill_chunk = args.prefill_chunk;
    // The runners report their own bounds (Runner::max_context); the engine takes the lower.
    if let Some(c) = args.max_context {
        options.max_context = c;
    }
    let mut engine = Engine::new(runner, &model, options);
    let params = sampling(&args);
    let mut ids: Vec<RequestId> = Vec::new();
    for i in 0..args.concurrency {
        let spec = RequestSpec {
            prompt: prompt.clone(),
            max_new_tokens: args.max_new_tokens,
            sampling: params,
            seed: args.seed.wrapping_add(i as u64),
            stop_at_eos: !args.ignore_eos,
        };
        match engine.submit(spec) {
            Ok(id) => ids.push(id),
            Err(e) => return fail(format!("request {i}: {e}")),
        }
    }

    let mut generated: Vec<Vec<u32>> = vec![Vec::new(); ids.len()];
    let mut finish: Vec<Option<FinishReason>> = vec![None; ids.len()];
    let mut shown = TextStream::default();
    let stream = !args.json;
    if stream {
        print!("{}", src.tokenizer.decode(&prompt));
        let _ = std::io::stdout().flush();
    }
    let result = engine.run(|e| match *e {
        Event::Token { id, token, .. } => {
            let i = ids.iter().position(|&x| x == id).unwrap_or(0);
            generated[i].push(token);
            if stream && i == 0 {
                // What the new token adds to the decoded text (tokens may join into one character).
                print!("{}", shown.next(&src.tokenizer.decode(&generated[0])));
                let _ = std::io::stdout().flush();
            }
        }
        Event::Finished { id, reason } => {
            if let Some(i) = ids.iter().position(|&x| x == id) {
                finish[i] = Some(reason);
            }
        }
    });
    if stream {
        // A character the last token left unfinished, as it decodes.
        print!("{}", shown.finish(&src.tokenizer.decode(&generated[0])));
    }
    let wall = match result {
        Ok(d) => d.as_secs_f64(),
        Err(e) => return fail(e),
    };
    let times = engine.times();
    let decode_tokens: usize = engine.times().decode_steps * ids.len();
    let report = engine.runner().report();
    if args.json {
        let out = json!({
            "model": src.name,
            "device": device,
            "prompt_ids": prompt,
            "generated": generated[0],
            "text": src.tokenizer.decode(&generated[0]),
            "finish_reason": finish[0],
            "requests": generated.iter().zip(&finish).map(|(g, f)| json!({"generated": g, "finish_reason": f})).collect::<Vec<_>>(),
            "sampling": params,
            "timings": {
                "load_s": load_s,
                "generate_s": wall,
                "prefill_s": times.prefill_s,
                "decode_s": times.decode_s,
                "decode_steps": times.decode_steps,
                "decode_tok_s": if times.decode_s > 0.0 { decode_tokens as f64 / times.decode_s } else { 0.0 },
            },
            "runner": report,
        });
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    } else {
        println!();
        let per_s = if times.decode_s > 0.0 {
            decode_tokens as f64 / times.decode_s
        } else {
            0.0
        };
        eprintln!(
            "[{} on {device}: {} request(s), {} new tokens each; load {load_s:.2} s, prefill {:.3} s, decode {:.3} s ({per_s:.1} tok/s)]",
            src.name,
            ids.len(),
            generated[0].len(),
            times.prefill_s,
            times.decode_s
        );
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_bytes("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("1000").unwrap(), 1000);
        assert_eq!(parse_bytes("1.5GB").unwrap(), 1_500_000_000);
        assert!(parse_bytes("lots").unwrap_err().contains("not a size"));
        assert!(parse_bytes("3 parsecs").unwrap_err().contains("unit"));
    }
}
