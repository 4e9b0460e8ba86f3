"""What the oracle fixture scripts share (make_fixtures.py for dense Qwen3, make_hybrid_fixtures.py for
the hybrid Qwen3.5/3.6-MoE family): float32 settings, seeded weights and prompts, the greedy run with
each step's top-5, transformers' own bf16 noise, and the expected.json record.

Weights and prompts are drawn on the CPU from each fixture's seed, so the model files are
byte-identical whatever the device; only expected.json's float32 logits move (by float32 rounding).
"""

import hashlib
import json
import os
import platform
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# Deterministic cuBLAS (torch.use_deterministic_algorithms needs this before CUDA starts).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import DynamicCache  # noqa: E402

STEPS = 32
TOP = 5


def set_float32_everywhere():
    """float32 math with no reduced-precision shortcuts (no TF32, no fp16/bf16 reductions)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.set_float32_matmul_precision("highest")
    torch.use_deterministic_algorithms(True, warn_only=True)


def setup(args, fixtures):
    """The device of --device, float32 everywhere, --only checked against the fixture names."""
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no CUDA device; run on the GPU machine or use --device cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)  # one summation order, whatever the machine
    set_float32_everywhere()
    names = {f["name"] for f in fixtures}
    for wanted in args.only or []:
        if wanted not in names:
            sys.exit(f"--only {wanted}: no such fixture; known: {', '.join(sorted(names))}")
    return device


def add_common_args(ap):
    ap.add_argument("--out", required=True, type=Path, help="folder to write <fixture>/ folders into")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (float32 either way)")
    ap.add_argument("--only", action="append", help="make only this fixture (repeatable)")


def draw_parameters(model, seed, value):
    """Overwrite every parameter of `model`, by name in sorted order, with `value(name, shape, gen)`
    drawn from one CPU generator seeded with `seed` (rounded to bf16 by `value`)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            p.copy_(value(name, tuple(p.shape), gen))


def to_bf16_exact(w):
    return w.to(torch.bfloat16).to(torch.float32)


def assert_bf16_exact_float32(model):
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32, name
        assert torch.equal(p, p.to(torch.bfloat16).to(torch.float32)), f"{name} is not bf16-exact"


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


def run_prompts(model, f, device):
    """The fixture's prompts, each with its greedy continuation (`generated`) and `steps`."""
    prompts = make_prompts(f)
    for p in prompts:
        steps = greedy_with_top5(model, p["ids"], device)
        p["generated"] = [s["token"] for s in steps]
        p["steps"] = steps
    return prompts


@torch.no_grad()
def teacher_forced_logits(model, p, device):
    """One forward pass (no cache) over the prompt and the greedy tokens but the last: row i is the
    logits of step i."""
    ids = p["ids"] + p["generated"][:-1]
    logits = model(input_ids=torch.tensor([ids], device=device)).logits[0].to(torch.float32).cpu().numpy()
    return logits[len(p["ids"]) - 1 :]


def bf16_teacher_forced(model, prompts, device):
    """transformers' own bf16 noise: `model` (loaded in bfloat16, eager attention) run on the float32
    greedy tokens in one forward pass; for each step the bf16 logits of the float32 top-5 ids.
    GPU tests compare their bf16 engine's distance from float32 with this one."""
    worst = 0.0
    for p in prompts:
        rows = teacher_forced_logits(model, p, device)
        for row, step in zip(rows, p["steps"]):
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


def expected_record(script, version, f, specific, device, bf16_noise, folder, prompts):
    """expected.json's content: the run's provenance, `specific` (the family's own fields),
    the model files' sha256 and the prompts."""
    return {
        "script": script,
        "script_version": version,
        "name": folder.name,
        "seed": f["seed"],
        "prompt_seed": f["seed"] + 1,
        **specific,
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


def write_expected(folder, expected):
    (folder / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


def summary(folder, prompts, bf16_noise):
    margins = [s["margin"] for p in prompts for s in p["steps"]]
    size = sum(x.stat().st_size for x in folder.iterdir())
    return (
        f"{folder.name}: {size / 1e6:.2f} MB, prompts {[len(p['ids']) for p in prompts]}, "
        f"min margin {min(margins):.4f}, median margin {float(np.median(margins)):.4f}, "
        f"distinct generated {[len(set(p['generated'])) for p in prompts]}, "
        f"transformers bf16 vs float32: max relative {bf16_noise:.4f}"
    )
