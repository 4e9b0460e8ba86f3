#!/usr/bin/env python3
"""Peers for `qwen-decode bench`: Hugging Face transformers on the same GPU and the same cells.

For each cell (prompt length x concurrency) this decodes greedily with random bf16 weights of the
Qwen3-4B config (transformers' own seeded init, made on the GPU), in two implementations:

- `eager`: the model's forward with a DynamicCache, step by step (what `model.generate` runs,
  without its per-step bookkeeping and stop checks).
- `static-compiled`: a StaticCache, the prefill uncompiled, the decode step compiled with
  `torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)` (inductor + CUDA graphs).
  transformers 5.x's `generate(cache_implementation="static")` does the same: uncompiled prefill,
  compiled decode step, `dynamic=None`.

Each cell runs its prefill and `--warmup-steps` decode steps untimed (compilation and CUDA-graph
recording happen there), then times `--new-tokens` decode steps with CUDA events, one per step, so
the per-step times give the TPOT median and p90 (same quantile definition as `qwen-decode bench`).
Every request of a cell has its own random prompt of the cell's length: no padding, no early stop.
Before the cells: torch's bf16 matmul (8192^3, median of 10 timed after 3 untimed). Eager runs
first, every cell, then static-compiled.

    python3 scripts/bench/peers.py --json-out peers.json        # the full matrix on the GPU
    python3 scripts/bench/peers.py --quick                       # smoke run: 16x1 and 1024x8, 8 tokens
    python3 scripts/bench/peers.py --device cpu --tiny --dtype float32 --require-match \
        --cells 16x4 --new-tokens 4 --compile-backend aot_eager  # self-test without a GPU, 10-20 s

Where the time goes on the GPU: eager is bound by Python (tens of ms a step: about 5 s a cell);
the compiled implementation pays inductor's compile of the 36-layer step three times with the
default `--dynamic auto` (batch 1; batch 1 with the cache length symbolic; both symbolic), each
likely 30-90 s, and a CUDA-graph recording per cell. `--dynamic true` compiles twice.
The stderr log and the JSON's `timings` and `cells[].untimed_s` say what each part took.

Prints one JSON object (the `peers` part of the bench bundle) on stdout; progress goes to stderr.
`--json-out FILE` is rewritten after every cell (`"complete": false` until the end), so a run cut
short keeps the cells it finished.
"""

import argparse
import hashlib
import json
import math
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# torch and transformers are imported by import_torch() once the arguments are checked (the import
# takes seconds); these names are bound there.
torch = transformers = DynamicCache = Qwen3Config = Qwen3ForCausalLM = StaticCache = None

SCRIPT_VERSION = 1
VLLM_STATUS = "not installable on the GPU machine (no network)"
IMPLEMENTATIONS = ("eager", "static-compiled")
DEFAULT_INPUTS = (16, 1024)
DEFAULT_CONCURRENCY = (1, 4, 8)

# Qwen3-4B (docs/models.md; the engine's `Qwen3Config::qwen3_4b`), and the engine's built-in tiny model.
MODELS = {
    "qwen3-4b": dict(
        vocab_size=151_936,
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rope_theta=1_000_000.0,
        max_position_embeddings=40_960,
        tie_word_embeddings=True,
    ),
    "tiny": dict(
        vocab_size=384,
        hidden_size=320,
        intermediate_size=864,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        rope_theta=1_000_000.0,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    ),
}


def import_torch():
    global torch, transformers, DynamicCache, Qwen3Config, Qwen3ForCausalLM, StaticCache
    import torch
    import transformers
    from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM, StaticCache


def log(message):
    print(f"[peers] {message}", file=sys.stderr, flush=True)


def parse_cells(text):
    """`16x1,1024x8` -> [(16, 1), (1024, 8)]."""
    cells = []
    for part in text.split(","):
        part = part.strip()
        try:
            n, c = part.lower().split("x")
            cell = (int(n), int(c))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"`{part}` is not a cell: write INPUTxCONCURRENCY, e.g. 16x1,1024x8"
            ) from None
        if cell[0] < 1 or cell[1] < 1:
            raise argparse.ArgumentTypeError(f"`{part}`: input length and concurrency must be at least 1")
        cells.append(cell)
    return cells


def parse_implementations(text):
    names = [s.strip() for s in text.split(",") if s.strip()]
    for n in names:
        if n not in IMPLEMENTATIONS:
            raise argparse.ArgumentTypeError(f"`{n}` is not an implementation: use {', '.join(IMPLEMENTATIONS)}")
    return names


def make_config(name):
    m = MODELS[name]
    return Qwen3Config(
        vocab_size=m["vocab_size"],
        hidden_size=m["hidden_size"],
        intermediate_size=m["intermediate_size"],
        num_hidden_layers=m["num_hidden_layers"],
        num_attention_heads=m["num_attention_heads"],
        num_key_value_heads=m["num_key_value_heads"],
        head_dim=m["head_dim"],
        hidden_act="silu",
        max_position_embeddings=m["max_position_embeddings"],
        rms_norm_eps=1e-6,
        tie_word_embeddings=m["tie_word_embeddings"],
        rope_parameters={"rope_type": "default", "rope_theta": m["rope_theta"]},
        attention_bias=False,
        use_sliding_window=False,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )


def build_model(config, dtype, device, seed):
    """Random weights (transformers' own init, seeded), created directly on the device in `dtype`:
    the same as `Qwen3ForCausalLM(config).to(dtype).to(device)` for timing, without 16 GB of fp32 on the host."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ForCausalLM._from_config(config, dtype=dtype)
    return model.eval()


class StepClock:
    """Per-step times: CUDA events on the GPU (what the device took, launch gaps included), the
    host clock on the CPU."""

    def __init__(self, device, steps):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
        else:
            self.times = [0.0] * (steps + 1)

    def mark(self, i):
        if self.cuda:
            self.events[i].record()
        else:
            self.times[i] = time.perf_counter()

    def step_ms(self):
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.events, self.events[1:])]
        return [(b - a) * 1e3 for a, b in zip(self.times, self.times[1:])]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def quantile(values, q):
    """The element at index round((n - 1) * q) of the sorted values (halves away from zero): the
    definition `qwen-decode bench` uses for its TPOT median (q = 0.5) and p90 (q = 0.9)."""
    ordered = sorted(values)
    return ordered[int(math.floor((len(ordered) - 1) * q + 0.5))]


def digest(ids):
    """sha256 of the generated ids as `qwen-decode bench` computes its digests: per request its
    length as a little-endian u64, then each id as a little-endian u32."""
    h = hashlib.sha256()
    for row in ids:
        h.update(len(row).to_bytes(8, "little"))
        for t in row:
            h.update(int(t).to_bytes(4, "little"))
    return h.hexdigest()


def make_prompts(vocab, length, concurrency, seed, device):
    gen = torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + length * 1009 + concurrency)
    return torch.randint(0, vocab, (concurrency, length), generator=gen).to(device)


def decode_cell(model, impl, prompts, new_tokens, warmup_steps, compiled_forward):
    """Prefill, `warmup_steps` untimed decode steps, then `new_tokens` timed ones. Returns the
    per-step times (ms), every request's generated ids, and the untimed seconds."""
    started = time.perf_counter()
    device, length = prompts.device, prompts.shape[1]
    if impl == "eager":
        cache = DynamicCache(config=model.config)
        forward = model
    else:
        cache = StaticCache(config=model.config, max_cache_len=length + 1 + warmup_steps + new_tokens)
        forward = compiled_forward

    def step(tokens):
        if impl == "static-compiled" and device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        out = forward(input_ids=tokens, past_key_values=cache, use_cache=True)
        return out.logits[:, -1].argmax(-1, keepdim=True)

    # The prefill is never compiled (as in transformers' generate); only its last logits are kept.
    out = model(input_ids=prompts, past_key_values=cache, use_cache=True, logits_to_keep=1)
    tokens = out.logits[:, -1].argmax(-1, keepdim=True)
    del out
    generated = [tokens]
    for _ in range(warmup_steps):
        tokens = step(tokens)
        generated.append(tokens)
    sync(device)
    untimed_s = time.perf_counter() - started

    clock = StepClock(device, new_tokens)
    clock.mark(0)
    for i in range(new_tokens):
        tokens = step(tokens)
        generated.append(tokens)
        clock.mark(i + 1)
    step_ms = clock.step_ms()
    ids = torch.cat(generated, dim=1).tolist()
    return step_ms, ids, untimed_s


def matmul_tflops(device, dtype, n, runs):
    """torch's matrix product n x n x n in `dtype`: median of `runs` timed products after warm-up."""
    gen = torch.Generator(device=device).manual_seed(7)
    a = torch.randn(n, n, generator=gen, device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen, device=device, dtype=dtype)
    for _ in range(3):
        torch.matmul(a, b)
    times_ms = []
    for _ in range(runs):
        clock = StepClock(device, 1)
        clock.mark(0)
        torch.matmul(a, b)
        clock.mark(1)
        times_ms.append(clock.step_ms()[0])
    median_ms = statistics.median(times_ms)
    return 2.0 * n**3 / (median_ms * 1e-3) / 1e12, times_ms


def device_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


class CompiledDecode:
    """The compiled decode step: `torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)`.
    Should the whole step not compile as one graph on this torch/transformers (a graph break), it
    says so, compiles again without fullgraph, and the JSON records that."""

    def __init__(self, model, backend, dynamic):
        self.model, self.backend, self.dynamic = model, backend, dynamic
        self.mode = "reduce-overhead" if backend == "inductor" else None
        self.fullgraph = True
        self.fullgraph_error = None
        self.forward = self._compile()

    def _compile(self):
        return torch.compile(
            self.model.forward, backend=self.backend, mode=self.mode, fullgraph=self.fullgraph, dynamic=self.dynamic
        )

    def run_cell(self, *args):
        try:
            return decode_cell(*args, self.forward)
        except Exception as e:  # a graph break under fullgraph=True surfaces as one of dynamo's errors
            if not self.fullgraph or "torch._dynamo" not in type(e).__module__:
                raise
            self.fullgraph_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            log(f"warning: the decode step does not compile as one graph ({self.fullgraph_error}); compiling again without fullgraph")
            torch._dynamo.reset()
            self.fullgraph = False
            self.forward = self._compile()
            return decode_cell(*args, self.forward)

    def describe(self):
        return {
            "backend": self.backend,
            "mode": self.mode,
            "fullgraph": self.fullgraph,
            "fullgraph_error": self.fullgraph_error,
            "dynamic": self.dynamic,
            "graphs_compiled": torch._dynamo.utils.counters["stats"].get("unique_graphs", 0),
            # Non-zero: inductor ran some graph without CUDA graphs (the log says why).
            "cudagraph_skips": torch._dynamo.utils.counters["inductor"].get("cudagraph_skips", 0),
        }


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="default cuda")
    ap.add_argument("--tiny", action="store_true", help="the engine's tiny model instead of Qwen3-4B (self-tests)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="weights and math")
    ap.add_argument("--new-tokens", type=int, default=None, help="timed decode steps per cell (default 64; --quick 8)")
    ap.add_argument(
        "--warmup-steps",
        type=int,
        default=4,
        help="untimed decode steps before the timed ones (default 4: compile, record, replays)",
    )
    ap.add_argument(
        "--cells", type=parse_cells, default=None, help="INPUTxCONCURRENCY list, e.g. 16x1,1024x8 (default: 16,1024 x 1,4,8)"
    )
    ap.add_argument(
        "--implementations",
        type=parse_implementations,
        default=list(IMPLEMENTATIONS),
        help="eager,static-compiled (default both)",
    )
    ap.add_argument("--quick", action="store_true", help="smoke run: cells 16x1,1024x8, 8 new tokens, 3 matmul runs")
    ap.add_argument(
        "--dynamic",
        default="auto",
        choices=["auto", "true", "false"],
        help="torch.compile's dynamic: auto (None, the default of torch and of transformers' generate: 3 compiles for "
        "the full matrix), true (2 compiles, every shape symbolic), false (a compile per cell)",
    )
    ap.add_argument(
        "--compile-backend",
        default="inductor",
        help="torch.compile backend (default inductor; aot_eager for a quick CPU self-test: it checks the graph "
        "capture and the cache handling, not the speed)",
    )
    ap.add_argument("--matmul-n", type=int, default=None, help="matmul size (default 8192; 256 with --tiny)")
    ap.add_argument("--matmul-runs", type=int, default=None, help="timed matmuls (default 10; --quick 3)")
    ap.add_argument("--seed", type=int, default=0, help="weights and prompts seed")
    ap.add_argument(
        "--require-match",
        action="store_true",
        help="exit 1 unless static-compiled generates the same ids as eager in every cell (meaningful in float32)",
    )
    ap.add_argument("--json-out", default=None, help="also write the JSON object to this file")
    args = ap.parse_args(argv)
    args.new_tokens = args.new_tokens if args.new_tokens is not None else (8 if args.quick else 64)
    if args.new_tokens < 1 or args.warmup_steps < 0:
        ap.error("--new-tokens must be at least 1 and --warmup-steps at least 0")
    # Concurrency 1 first: dynamo specialises a batch of 1, so this order compiles three times (batch 1
    # static, batch 1 with the cache length dynamic, then both dynamic) where input-major order compiles four.
    args.cells = args.cells or (
        [(16, 1), (1024, 8)] if args.quick else [(n, c) for c in DEFAULT_CONCURRENCY for n in DEFAULT_INPUTS]
    )
    args.dynamic = {"auto": None, "true": True, "false": False}[args.dynamic]
    args.matmul_n = args.matmul_n or (256 if args.tiny else 8192)
    args.matmul_runs = args.matmul_runs or (3 if args.quick else 10)
    return args


def write_atomically(path, text):
    tmp = f"{path}.partial"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv=None):
    args = parse_args(argv)
    import_torch()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda: torch sees no CUDA device; run on the GPU machine, or use --device cpu --tiny")
    model_name = "tiny" if args.tiny else "qwen3-4b"
    dtype = getattr(torch, args.dtype)
    timings = {}
    t_all = time.perf_counter()

    # The matmul first: seconds, and then every later line of the JSON has it.
    t = time.perf_counter()
    tflops, mm_ms = matmul_tflops(device, dtype, args.matmul_n, args.matmul_runs)
    timings["matmul_s"] = time.perf_counter() - t
    log(f"matmul {args.matmul_n}^3 {args.dtype}: {tflops:.1f} TFLOP/s (median of {args.matmul_runs})")

    t = time.perf_counter()
    config = make_config(model_name)
    model = build_model(config, dtype, device, args.seed)
    sync(device)
    timings["model_init_s"] = time.perf_counter() - t
    params = sum(p.numel() for p in model.parameters())
    log(f"{model_name}: {params / 1e9:.3f} B parameters in {args.dtype} on {device_name(device)} ({timings['model_init_s']:.1f} s)")
    compiled = CompiledDecode(model, args.compile_backend, args.dynamic)

    results = []

    def report(complete):
        return {
            "source": "scripts/bench/peers.py",
            "script_version": SCRIPT_VERSION,
            # false while cells are still running: --json-out is rewritten after every cell, so a
            # run cut short leaves the cells it finished.
            "complete": complete,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "triton": _version_of("triton"),
            "python": platform.python_version(),
            "device": device_name(device),
            "model": model_name,
            "dtype": args.dtype,
            "attn_implementation": model.config._attn_implementation,
            "seed": args.seed,
            "new_tokens": args.new_tokens,
            "warmup_steps": args.warmup_steps,
            "compile": compiled.describe() if "static-compiled" in args.implementations else None,
            "cells": results,
            "torch_matmul_tflops": tflops,
            "matmul": {"n": args.matmul_n, "dtype": args.dtype, "runs_ms": mm_ms},
            "timings": timings,
            "vllm": {"status": VLLM_STATUS, "published": []},
        }

    first_ids = {}
    # Eager first: it is quick, and its cells are kept if the compiled run is cut short.
    for impl in args.implementations:
        t = time.perf_counter()
        for length, concurrency in args.cells:
            prompts = make_prompts(config.vocab_size, length, concurrency, args.seed, device)
            cell_args = (model, impl, prompts, args.new_tokens, args.warmup_steps)
            with torch.no_grad():
                if impl == "eager":
                    step_ms, ids, untimed_s = decode_cell(*cell_args, None)
                else:
                    step_ms, ids, untimed_s = compiled.run_cell(*cell_args)
            total_s = sum(step_ms) / 1e3
            cell = {
                "input": length,
                "concurrency": concurrency,
                "implementation": impl,
                "decode_tok_s": concurrency * args.new_tokens / total_s,
                "tpot_ms_median": quantile(step_ms, 0.5),
                "tpot_ms_p90": quantile(step_ms, 0.9),
                "new_tokens": args.new_tokens,
                "untimed_s": untimed_s,
                "digest": digest(ids),
            }
            key = (length, concurrency)
            if impl == "eager":
                first_ids[key] = ids
            elif key in first_ids:
                cell["matches_eager"] = ids == first_ids[key]
            results.append(cell)
            log(
                f"{impl:>15} i{length} c{concurrency}: {cell['decode_tok_s']:9.1f} tok/s, TPOT median "
                f"{cell['tpot_ms_median']:.2f} ms, p90 {cell['tpot_ms_p90']:.2f} ms "
                f"(timed {total_s:.2f} s; prefill + warm-up {untimed_s:.1f} s)"
                + ("" if "matches_eager" not in cell else f"; ids equal eager's: {cell['matches_eager']}")
            )
            if args.json_out:
                write_atomically(args.json_out, json.dumps(report(False), indent=1) + "\n")
        timings[f"{impl}_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - t_all

    text = json.dumps(report(True), indent=1)
    print(text)
    if args.json_out:
        write_atomically(args.json_out, text + "\n")
    log(f"done in {timings['total_s']:.1f} s: " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))

    mismatched = [c for c in results if c.get("matches_eager") is False]
    if args.require_match and mismatched:
        names = ", ".join(f"i{c['input']} c{c['concurrency']}" for c in mismatched)
        log(f"error: static-compiled generated other ids than eager in {names}")
        return 1
    return 0


def _version_of(module):
    try:
        return __import__(module).__version__
    except ImportError:
        return None


if __name__ == "__main__":
    sys.exit(main())
