#!/usr/bin/env python3
"""Peers for `qwen-decode bench`: Hugging Face transformers on the same GPU and the same cells.

For each cell (prompt length x concurrency) this decodes greedily with random bf16 weights of the
Qwen3-4B config (or another `--model`'s: below; transformers' own seeded init, made on the GPU), in two
implementations:

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

`--model qwen3.6-35b-a3b` measures the hybrid MoE model instead: `Qwen3_5MoeForCausalLM`
(`qwen3_5_moe_text`; the engine's `Qwen35MoeConfig::qwen3_6_35b_a3b`): 40 layers, three Gated
DeltaNet `linear_attention` layers then one gated `full_attention` layer, repeated; 256 experts,
top 8, and a shared expert in every layer; 34.66 B parameters, 69.3 GB in bf16, written by
transformers' seeded init straight into GPU memory (`timings.model_init_s` says how long). Its
DynamicCache (transformers 5.x builds it from `layer_types`) holds a LinearAttentionLayer (conv and
recurrent state) for each DeltaNet layer and a DynamicLayer for each attention layer; its
StaticCache the same with a StaticLayer. Without the `fla` and `causal_conv1d` packages
transformers runs its pure-torch DeltaNet paths (the chunked rule for the prefill, the recurrent
rule and the conv update for decode): the JSON's `hybrid.gdn_paths` says what each function
resolved to, and each eager cell's `gdn_calls` counts the calls. The experts run as transformers
5.x's default `grouped_mm` (`hybrid.experts_implementation`). For this model `--implementations`
defaults to `eager`: `static-compiled` runs only when asked for; it compiles as one graph and
generates eager's ids on the CPU with aot_eager (the tiny model), but inductor and CUDA graphs on
the 40-layer step are untried, and its compiles (three with `--dynamic auto`, the 36-layer dense
step's took 56-119 s each) would take longer than one GPU command may run.

    python3 scripts/bench/peers.py --model qwen3.6-35b-a3b --cells 16x1,16x8 --new-tokens 8 \
        --warmup-steps 2 --json-out peers-35b.json                 # GPU: eager, two cells
    python3 scripts/bench/peers.py --model qwen3.6-35b-a3b --device cpu --tiny --dtype float32 \
        --require-match --cells 16x4 --new-tokens 4 --implementations eager,static-compiled \
        --compile-backend aot_eager   # self-test without a GPU: the family's tiny model, 20-30 s

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
import importlib.util
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

# 2: `--model`, the hybrid Qwen3.6-35B-A3B; `model_class`, `model_type`, `config`, `parameters`,
# `hybrid` (null for the dense models) and, for the hybrid model's eager cells, `gdn_calls`.
SCRIPT_VERSION = 2
VLLM_STATUS = "not installable on the GPU machine (no network)"
IMPLEMENTATIONS = ("eager", "static-compiled")
DEFAULT_INPUTS = (16, 1024)
DEFAULT_CONCURRENCY = (1, 4, 8)

LIN, FULL = "linear_attention", "full_attention"

# Qwen3-4B (docs/models.md; the engine's `Qwen3Config::qwen3_4b`), and the engine's built-in tiny model;
# Qwen3.6-35B-A3B (the engine's `Qwen35MoeConfig::qwen3_6_35b_a3b`), and the engine's tiny model of
# that family (`Qwen35MoeConfig::tiny`). `family` picks the transformers class.
MODELS = {
    "qwen3-4b": dict(
        family="qwen3",
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
        family="qwen3",
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
    "qwen3.6-35b-a3b": dict(
        family="qwen3_5_moe",
        vocab_size=248_320,
        hidden_size=2048,
        num_hidden_layers=40,
        layer_types=[LIN, LIN, LIN, FULL] * 10,
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=256,
        partial_rotary_factor=0.25,  # RoPE on the first 64 of 256 dims
        mrope_section=[11, 11, 10],  # the released config's; for text every section sees the same position
        rope_theta=10_000_000.0,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        num_experts=256,
        num_experts_per_tok=8,
        moe_intermediate_size=512,
        shared_expert_intermediate_size=512,
        rms_norm_eps=1e-6,
        max_position_embeddings=262_144,
        tie_word_embeddings=False,
    ),
    "tiny-hybrid": dict(
        family="qwen3_5_moe",
        vocab_size=384,
        hidden_size=128,
        num_hidden_layers=4,
        layer_types=[LIN, LIN, LIN, FULL],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        partial_rotary_factor=0.25,
        mrope_section=[3, 3, 2],  # sums to half the 16 rotary dims
        rope_theta=10_000_000.0,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        linear_conv_kernel_dim=4,
        num_experts=16,
        num_experts_per_tok=4,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    ),
}
# `--model` -> the model `--tiny` picks instead (same family, the engine's tiny shapes).
TINY_OF = {"qwen3-4b": "tiny", "qwen3.6-35b-a3b": "tiny-hybrid"}
CLASSES = {"qwen3": "Qwen3ForCausalLM", "qwen3_5_moe": "Qwen3_5MoeForCausalLM"}
# transformers' Gated DeltaNet functions (each resolves at import to the `fla` / `causal_conv1d`
# kernel when that package imports, else to its own pure-torch reference).
GDN_PATHS = (
    "torch_chunk_gated_delta_rule",
    "torch_recurrent_gated_delta_rule",
    "causal_conv1d_fn",
    "causal_conv1d_update",
)


def import_torch():
    global torch, transformers, DynamicCache, Qwen3Config, Qwen3ForCausalLM, StaticCache
    import torch
    import transformers
    from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM, StaticCache


def hybrid_modules():
    """transformers' Qwen3.5-MoE classes (5.x; imported only for the hybrid model, so the dense runs
    keep working on a transformers without them): (config class, model class, modeling module)."""
    try:
        from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
        from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe
    except ImportError as e:
        sys.exit(f"error: transformers {transformers.__version__} has no Qwen3.5-MoE classes ({e}); 5.17 has them")
    return Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM, modeling_qwen3_5_moe


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
    if m["family"] == "qwen3_5_moe":
        return make_hybrid_config(m)
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


def make_hybrid_config(m):
    """Qwen3_5MoeTextConfig as scripts/oracle/make_hybrid_fixtures.py builds it (transformers 5.x:
    partial RoPE and the multimodal sections in `rope_parameters`)."""
    Qwen3_5MoeTextConfig, _, _ = hybrid_modules()
    assert len(m["layer_types"]) == m["num_hidden_layers"]
    return Qwen3_5MoeTextConfig(
        vocab_size=m["vocab_size"],
        hidden_size=m["hidden_size"],
        num_hidden_layers=m["num_hidden_layers"],
        layer_types=list(m["layer_types"]),
        num_attention_heads=m["num_attention_heads"],
        num_key_value_heads=m["num_key_value_heads"],
        head_dim=m["head_dim"],
        linear_conv_kernel_dim=m["linear_conv_kernel_dim"],
        linear_num_key_heads=m["linear_num_key_heads"],
        linear_num_value_heads=m["linear_num_value_heads"],
        linear_key_head_dim=m["linear_key_head_dim"],
        linear_value_head_dim=m["linear_value_head_dim"],
        num_experts=m["num_experts"],
        num_experts_per_tok=m["num_experts_per_tok"],
        moe_intermediate_size=m["moe_intermediate_size"],
        shared_expert_intermediate_size=m["shared_expert_intermediate_size"],
        hidden_act="silu",
        max_position_embeddings=m["max_position_embeddings"],
        rms_norm_eps=m["rms_norm_eps"],
        tie_word_embeddings=m["tie_word_embeddings"],
        rope_parameters={
            "rope_type": "default",
            "rope_theta": m["rope_theta"],
            "partial_rotary_factor": m["partial_rotary_factor"],
            "mrope_section": list(m["mrope_section"]),
            "mrope_interleaved": True,
        },
        attention_bias=False,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )


def model_class(name):
    if MODELS[name]["family"] == "qwen3_5_moe":
        return hybrid_modules()[1]
    return Qwen3ForCausalLM


def build_model(name, config, dtype, device, seed):
    """Random weights (transformers' own init, seeded), created directly on the device in `dtype`:
    the same as `Qwen3ForCausalLM(config).to(dtype).to(device)` for timing, without 16 GB of fp32 on the
    host (for Qwen3.6-35B-A3B, 69 GB of bf16 written by the init kernels on the GPU, never on the host)."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_class(name)._from_config(config, dtype=dtype)
    return model.eval()


def gdn_paths(modeling):
    """Which implementation each of transformers' Gated DeltaNet functions resolved to: its own
    pure-torch reference (`transformers.models...`), or the `fla` / `causal_conv1d` kernel. Read from
    the closure of transformers' fallback wrapper (`use_kernel_func_from_hub_with_fallback`); "unknown"
    where this transformers wraps them otherwise."""
    out = {}
    for name in GDN_PATHS:
        fn, chosen = getattr(modeling, name, None), None
        while fn is not None and chosen is None and hasattr(fn, "__code__"):
            cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
            chosen = cells.get("implementation")
            fn = getattr(fn, "__wrapped__", None)
        out[name] = f"{chosen.__module__}.{chosen.__qualname__}" if callable(chosen) else "unknown"
    return out


class CountCalls:
    """Counts the calls of transformers' Gated DeltaNet functions while it is entered (the forward
    looks them up in the modeling module at call time). Used around eager cells only: one Python
    call more per linear layer and step (microseconds against a step of milliseconds)."""

    def __init__(self, modeling):
        self.modeling, self.saved = modeling, {}
        self.calls = dict.fromkeys(GDN_PATHS, 0)

    def __enter__(self):
        for name in GDN_PATHS:
            original = self.saved[name] = getattr(self.modeling, name)

            def counted(*args, _name=name, _fn=original, **kwargs):
                self.calls[_name] += 1
                return _fn(*args, **kwargs)

            setattr(self.modeling, name, counted)
        return self

    def __exit__(self, *exc):
        for name, fn in self.saved.items():
            setattr(self.modeling, name, fn)


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
        # transformers 5.x builds each layer's cache from `config.layer_types`: for the hybrid model
        # a LinearAttentionLayer (conv + recurrent state) per DeltaNet layer, a DynamicLayer per
        # attention layer (what its forward and generate make when given no cache).
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
    ap.add_argument(
        "--model",
        default="qwen3-4b",
        choices=list(TINY_OF),
        help="qwen3-4b (default; Qwen3ForCausalLM) or qwen3.6-35b-a3b (Qwen3_5MoeForCausalLM, the hybrid MoE)",
    )
    ap.add_argument(
        "--tiny",
        action="store_true",
        help="the engine's tiny model of --model's family instead of the full-size one (self-tests): "
        + ", ".join(f"{k} -> {v}" for k, v in TINY_OF.items()),
    )
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
        default=None,
        help="eager,static-compiled (default both; for qwen3.6-35b-a3b only eager: see the header)",
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
    args.model_name = TINY_OF[args.model] if args.tiny else args.model
    args.hybrid = MODELS[args.model_name]["family"] == "qwen3_5_moe"
    if args.implementations is None:
        args.implementations = ["eager"] if args.model == "qwen3.6-35b-a3b" else list(IMPLEMENTATIONS)
    if not args.implementations:
        ap.error("--implementations names none")
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
    model_name = args.model_name
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
    model = build_model(model_name, config, dtype, device, args.seed)
    sync(device)
    timings["model_init_s"] = time.perf_counter() - t
    params = sum(p.numel() for p in model.parameters())
    log(
        f"{model_name} ({type(model).__name__}): {params / 1e9:.3f} B parameters in {args.dtype} on "
        f"{device_name(device)} ({timings['model_init_s']:.1f} s)"
        + (f"; {torch.cuda.memory_allocated(device) / 2**30:.1f} GiB allocated" if device.type == "cuda" else "")
    )
    hybrid = None
    if args.hybrid:
        modeling = hybrid_modules()[2]
        hybrid = {
            "experts_implementation": getattr(model.config, "_experts_implementation", None),
            "gdn_paths": gdn_paths(modeling),
            "fla_importable": importlib.util.find_spec("fla") is not None,
            "causal_conv1d_importable": importlib.util.find_spec("causal_conv1d") is not None,
            "layer_types": {t: config.layer_types.count(t) for t in sorted(set(config.layer_types))},
        }
        log(
            f"hybrid: experts {hybrid['experts_implementation']}, attention {model.config._attn_implementation}; "
            "DeltaNet paths: " + ", ".join(f"{k} -> {v}" for k, v in hybrid["gdn_paths"].items())
        )
        if "static-compiled" in args.implementations:
            log(
                "warning: static-compiled on the hybrid model is checked on the CPU with aot_eager only; "
                "inductor and CUDA graphs on it are untried, and compiling its step may take minutes (three "
                "compiles with --dynamic auto)"
            )
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
            "model_class": type(model).__name__,
            "model_type": config.model_type,
            # The shapes that ran (MODELS' entry: the config's fields this script sets).
            "config": {k: v for k, v in MODELS[model_name].items() if k != "family"},
            "parameters": params,
            # null for the dense models; for the hybrid one: the experts implementation, which
            # DeltaNet implementation each of transformers' functions resolved to, and more.
            "hybrid": hybrid,
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
            gdn_calls = None
            with torch.no_grad():
                if impl == "eager" and args.hybrid:
                    with CountCalls(modeling) as counter:
                        step_ms, ids, untimed_s = decode_cell(*cell_args, None)
                    gdn_calls = counter.calls
                elif impl == "eager":
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
            if gdn_calls is not None:
                # Prefill + warm-up + timed steps: the chunked rule once per linear layer (prefill),
                # the recurrent rule once per linear layer and decode step.
                cell["gdn_calls"] = gdn_calls
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
