#!/usr/bin/env python3
"""Correctness oracle for qwen-engine: tiny random Qwen3 models and what transformers computes on them.

For each fixture this builds a small `Qwen3ForCausalLM` with seeded random weights (scaled so that
logits have real margins), stores the weights in bf16 safetensors with its config.json (one fixture's
config rewritten the way transformers 4.x writes it, with a top-level `rope_theta`), loads that folder
back with transformers in float32 (so the reference runs on exactly the stored bf16 values, widened),
and records, for a few prompts of token ids (one longer than 512 tokens), the greedy continuation of
32 tokens with each step's top-5 (ids, logits), the chosen token's logit and the top-1/top-2 margin.

    python3 scripts/oracle/make_fixtures.py --out qwen-engine/tests/fixtures --device cpu
    python3 scripts/oracle/make_fixtures.py --out /tmp/fixtures-h200 --device cuda

Weights and prompts are drawn on the CPU from each fixture's seed, so config.json and
model.safetensors are byte-identical whatever --device; only expected.json's float32 logits move
(by float32 rounding). `compare_fixtures.py A B` says by how much.
"""

import argparse
import hashlib
import json
import os
import platform
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# Deterministic cuBLAS (torch.use_deterministic_algorithms needs this before CUDA starts).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM  # noqa: E402

SCRIPT_VERSION = 2  # 2: transformers bf16 teacher-forced logits per step
STEPS = 32
TOP = 5

# Shapes cover head_dim 64 and 128, GQA 1:1, 2:1 and 4:1, tied and untied embeddings, hidden and
# MLP sizes that are multiples of 8 but not powers of two, 2 and 3 layers. The GQA fixtures have two
# KV heads, so that query head i reading KV head i // group (transformers' repeat_kv) differs from
# any other mapping. Prompt lengths: a short one, one that is not a multiple of the KV block (16),
# and one longer than 512 tokens.
FIXTURES = [
    dict(
        name="hd64-mha-tied-v4config",
        seed=1001,
        vocab_size=320,
        hidden_size=120,
        intermediate_size=184,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        tie_word_embeddings=True,
        rope_theta=10_000.0,
        config_style="4.x",
        prompt_lengths=[5, 37, 530],
    ),
    dict(
        name="hd128-gqa2-untied",
        seed=2002,
        vocab_size=512,
        hidden_size=136,
        intermediate_size=200,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
        tie_word_embeddings=False,
        rope_theta=1_000_000.0,
        config_style="5.x",
        prompt_lengths=[8, 45, 600],
    ),
    dict(
        name="hd64-gqa4-tied",
        seed=3003,
        vocab_size=768,
        hidden_size=152,
        intermediate_size=200,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        tie_word_embeddings=True,
        rope_theta=5_000_000.0,
        config_style="5.x",
        prompt_lengths=[3, 29, 515],
    ),
]


def set_float32_everywhere():
    """float32 math with no reduced-precision shortcuts (no TF32, no fp16/bf16 reductions)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.set_float32_matmul_precision("highest")
    torch.use_deterministic_algorithms(True, warn_only=True)


def make_config(f):
    return Qwen3Config(
        vocab_size=f["vocab_size"],
        hidden_size=f["hidden_size"],
        intermediate_size=f["intermediate_size"],
        num_hidden_layers=f["num_hidden_layers"],
        num_attention_heads=f["num_attention_heads"],
        num_key_value_heads=f["num_key_value_heads"],
        head_dim=f["head_dim"],
        hidden_act="silu",
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=f["tie_word_embeddings"],
        rope_parameters={"rope_type": "default", "rope_theta": f["rope_theta"]},
        attention_bias=False,
        use_sliding_window=False,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )


def random_weight(name, shape, f, gen):
    """Values for one parameter, drawn from `gen` (CPU), rounded to bf16 and widened back.

    Projections have unit gain (std 1/sqrt(fan_in)); the two that write into the residual stream
    (o_proj, down_proj) have gain 2, so that the layers rather than the last token's own embedding
    decide the next token (with unit gain the tied models mostly repeat their last token). Norm
    weights are near 1, q/k norms near 2 (attention sharp enough to depend on positions). The
    output projection (lm_head, or the tied embedding) gives logits a spread of a few units, so the
    top-1/top-2 margins are well above bf16 noise on most steps.
    """
    h = f["hidden_size"]
    if name.endswith("norm.weight"):
        centre, spread = (2.0, 0.5) if ("q_norm" in name or "k_norm" in name) else (1.0, 0.2)
        w = centre + spread * (2.0 * torch.rand(shape, generator=gen) - 1.0)
    elif name == "model.embed_tokens.weight":
        std = 4.0 / h**0.5 if f["tie_word_embeddings"] else 1.0
        w = std * torch.randn(shape, generator=gen)
    elif name == "lm_head.weight":
        w = (4.0 / h**0.5) * torch.randn(shape, generator=gen)
    else:
        fan_in = shape[1]
        gain = 2.0 if ("o_proj" in name or "down_proj" in name) else 1.0
        w = gain * torch.randn(shape, generator=gen) / fan_in**0.5
    return w.to(torch.bfloat16).to(torch.float32)


def build_model(f):
    config = make_config(f)
    torch.manual_seed(f["seed"])  # transformers' own init, overwritten below
    model = Qwen3ForCausalLM(config).to(torch.float32).eval()
    gen = torch.Generator(device="cpu").manual_seed(f["seed"])
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            p.copy_(random_weight(name, tuple(p.shape), f, gen))
    if f["tie_word_embeddings"]:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def rewrite_config_as_4x(path, theta):
    """As transformers 4.51 wrote Qwen3 configs: top-level `rope_theta` and `rope_scaling`,
    `torch_dtype`, no `rope_parameters` or `layer_types`."""
    cfg = json.loads(path.read_text())
    cfg.pop("rope_parameters", None)
    cfg.pop("layer_types", None)
    cfg["transformers_version"] = "4.51.0"
    cfg["rope_theta"] = theta
    cfg["rope_scaling"] = None
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg.pop("dtype")
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def write_fixture_folder(f, folder):
    model = build_model(f)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    model.to(torch.bfloat16).save_pretrained(folder)
    for extra in folder.iterdir():
        if extra.name not in ("config.json", "model.safetensors"):
            extra.unlink()
    if f["config_style"] == "4.x":
        rewrite_config_as_4x(folder / "config.json", f["rope_theta"])
    with safe_open(folder / "model.safetensors", framework="pt") as st:
        names = set(st.keys())
        assert all(st.get_slice(n).get_dtype() == "BF16" for n in names)
    assert ("lm_head.weight" in names) != f["tie_word_embeddings"], sorted(names)


def load_reference(folder, f, device):
    """The stored folder, read back by transformers in float32: exactly the bf16 values, widened."""
    model = Qwen3ForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    )
    model = model.to(device).eval()
    c = model.config
    assert c.rope_parameters["rope_theta"] == f["rope_theta"], c.rope_parameters
    assert c.tie_word_embeddings == f["tie_word_embeddings"]
    if f["tie_word_embeddings"]:
        assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32, name
        assert torch.equal(p, p.to(torch.bfloat16).to(torch.float32)), f"{name} is not bf16-exact"
    return model


def make_prompts(f):
    gen = torch.Generator(device="cpu").manual_seed(f["seed"] + 1)
    prompts = []
    for n in f["prompt_lengths"]:
        ids = torch.randint(0, f["vocab_size"], (n,), generator=gen).tolist()
        prompts.append({"name": f"len{n}", "ids": ids})
    return prompts


def ranked(logits):
    """Token ids by logit descending, id ascending on ties (the engine's greedy rule)."""
    values = logits.astype(np.float32)
    order = np.lexsort((np.arange(values.size), -values))
    return order, values


@torch.no_grad()
def greedy_with_top5(model, ids, device):
    cache = DynamicCache(config=model.config)
    out = model(input_ids=torch.tensor([ids], device=device), past_key_values=cache, use_cache=True)
    steps = []
    for _ in range(STEPS):
        logits = out.logits[0, -1].to(torch.float32).cpu().numpy()
        order, values = ranked(logits)
        token = int(order[0])
        steps.append(
            {
                "token": token,
                "logit": float(values[token]),
                "margin": float(values[order[0]]) - float(values[order[1]]),
                "top5_ids": [int(i) for i in order[:TOP]],
                "top5_logits": [float(values[i]) for i in order[:TOP]],
            }
        )
        out = model(
            input_ids=torch.tensor([[token]], device=device),
            past_key_values=cache,
            use_cache=True,
        )
    return steps


@torch.no_grad()
def bf16_teacher_forced(folder, prompts, device):
    """transformers' own bf16 noise: the same model run in bfloat16 (eager attention) on the float32
    greedy tokens in one forward pass; for each step the bf16 logits of the float32 top-5 ids.
    GPU tests compare their bf16 engine's distance from float32 with this one."""
    model = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation="eager")
    model = model.to(device).eval()
    worst = 0.0
    for p in prompts:
        ids = p["ids"] + p["generated"][:-1]
        logits = model(input_ids=torch.tensor([ids], device=device)).logits[0].to(torch.float32).cpu().numpy()
        start = len(p["ids"]) - 1
        for i, step in enumerate(p["steps"]):
            row = logits[start + i]
            step["bf16_top5_logits"] = [float(row[t]) for t in step["top5_ids"]]
            for t, want in zip(step["top5_ids"], step["top5_logits"]):
                worst = max(worst, abs(float(row[t]) - want) / max(abs(want), 1.0))
    return worst


def device_name(device):
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"cpu ({platform.processor() or platform.machine()})"


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="folder to write <fixture>/ folders into")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (float32 either way)")
    ap.add_argument("--only", action="append", help="make only this fixture (repeatable)")
    args = ap.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no CUDA device; run on the GPU machine or use --device cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)  # one summation order, whatever the machine
    set_float32_everywhere()

    names = {f["name"] for f in FIXTURES}
    for wanted in args.only or []:
        if wanted not in names:
            sys.exit(f"--only {wanted}: no such fixture; known: {', '.join(sorted(names))}")

    for f in FIXTURES:
        if args.only and f["name"] not in args.only:
            continue
        folder = args.out / f["name"]
        write_fixture_folder(f, folder)
        model = load_reference(folder, f, device)
        prompts = make_prompts(f)
        for p in prompts:
            steps = greedy_with_top5(model, p["ids"], device)
            p["generated"] = [s["token"] for s in steps]
            p["steps"] = steps
        bf16_noise = bf16_teacher_forced(folder, prompts, device)
        expected = {
            "script": "scripts/oracle/make_fixtures.py",
            "script_version": SCRIPT_VERSION,
            "name": f["name"],
            "seed": f["seed"],
            "prompt_seed": f["seed"] + 1,
            "config_style": f["config_style"],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "device": device_name(device),
            "compute_dtype": "float32",
            "weights_dtype": "bfloat16",
            "attn_implementation": "eager",
            "tf32": False,
            "steps_per_prompt": STEPS,
            "bf16_relative_noise": bf16_noise,
            "files_sha256": {
                "config.json": sha256(folder / "config.json"),
                "model.safetensors": sha256(folder / "model.safetensors"),
            },
            "prompts": prompts,
        }
        (folder / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
        margins = [s["margin"] for p in prompts for s in p["steps"]]
        size = sum(x.stat().st_size for x in folder.iterdir())
        print(
            f"{f['name']}: {size / 1e6:.2f} MB, prompts {[len(p['ids']) for p in prompts]}, "
            f"min margin {min(margins):.4f}, median margin {float(np.median(margins)):.4f}, "
            f"distinct generated {[len(set(p['generated'])) for p in prompts]}, "
            f"transformers bf16 vs float32: max relative {bf16_noise:.4f}"
        )


if __name__ == "__main__":
    main()
