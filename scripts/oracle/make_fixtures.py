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
import json
import shutil

from oracle_common import (
    add_common_args,
    assert_bf16_exact_float32,
    bf16_teacher_forced,
    draw_parameters,
    expected_record,
    run_prompts,
    setup,
    summary,
    to_bf16_exact,
    write_expected,
)
import torch  # noqa: E402  (after oracle_common, which sets the environment first)
from safetensors import safe_open  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

SCRIPT_VERSION = 2  # 2: transformers bf16 teacher-forced logits per step

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
    return to_bf16_exact(w)


def build_model(f):
    config = make_config(f)
    torch.manual_seed(f["seed"])  # transformers' own init, overwritten below
    model = Qwen3ForCausalLM(config).to(torch.float32).eval()
    draw_parameters(model, f["seed"], lambda name, shape, gen: random_weight(name, shape, f, gen))
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
    assert_bf16_exact_float32(model)
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap)
    args = ap.parse_args()
    device = setup(args, FIXTURES)

    for f in FIXTURES:
        if args.only and f["name"] not in args.only:
            continue
        folder = args.out / f["name"]
        write_fixture_folder(f, folder)
        model = load_reference(folder, f, device)
        prompts = run_prompts(model, f, device)
        bf16 = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation="eager")
        bf16_noise = bf16_teacher_forced(bf16.to(device).eval(), prompts, device)
        specific = {"config_style": f["config_style"]}
        expected = expected_record(
            "scripts/oracle/make_fixtures.py", SCRIPT_VERSION, f, specific, device, bf16_noise, folder, prompts
        )
        write_expected(folder, expected)
        print(summary(folder, prompts, bf16_noise))


if __name__ == "__main__":
    main()
