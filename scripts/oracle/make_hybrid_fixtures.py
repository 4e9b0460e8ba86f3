#!/usr/bin/env python3
"""Correctness oracle for the hybrid Qwen3.5/3.6-MoE family: tiny random models and what transformers
computes on them.

For each model this builds a small `Qwen3_5MoeForCausalLM` (Gated DeltaNet `linear_attention` layers,
gated `full_attention` layers with partial RoPE, a routed MoE with a shared expert in every layer)
with seeded random weights scaled so that logits have real margins, and writes it in one or more
layouts, each its own folder (config.json, bf16 model.safetensors, expected.json):

- config `text`: the text-only class (`model_type` `qwen3_5_moe_text`, architectures
  `Qwen3_5MoeForCausalLM`, tensors `model.layers.N...`, `model.embed_tokens`, `model.norm`);
- config `conditional`: the released checkpoint (`model_type` `qwen3_5_moe`, architectures
  `Qwen3_5MoeForConditionalGeneration`, the text config under `text_config`, tensors
  `model.language_model.layers.N...`, plus a tiny vision tower `model.visual.*` and one MTP layer
  `mtp.*` (without its routed experts, to keep it small), both of which a text engine must skip);
- experts `fused` (`mlp.experts.gate_up_proj` [E, 2I, H] with gate the first I rows,
  `mlp.experts.down_proj` [E, H, I], as transformers' state_dict holds them) or `per_expert`
  (`mlp.experts.E.{gate,up}_proj.weight` [I, H], `mlp.experts.E.down_proj.weight` [H, I], as
  transformers' save_pretrained writes them).

Every layout folder is loaded back with transformers in float32 (the class its config names) and
must hold exactly the same text-model values; the first layout's load is the reference: for each prompt
of token ids (one short, one not a multiple of 16, one longer than 512) the greedy continuation of 32
tokens with each step's top-5 (ids, logits), the chosen token's logit and the top-1/top-2 margin, and
transformers' own bf16 run on the same tokens. The layouts of one model share these numbers; their
expected.json differ in name, layout and files_sha256.

The reference runs on the CPU or GPU in float32 with eager attention, the eager expert loop and
transformers' pure-torch Gated DeltaNet paths (`torch_chunk_gated_delta_rule`, chunk 64, for
prefill; `torch_recurrent_gated_delta_rule` for decode; torch causal conv1d): the script refuses to
run if the flash-linear-attention or causal-conv1d packages would be used instead, and counts the
calls of each path.

    python3 scripts/oracle/make_hybrid_fixtures.py --out qwen-engine/tests/fixtures-hybrid --device cpu
    python3 scripts/oracle/compare_fixtures.py qwen-engine/tests/fixtures-hybrid /tmp/other-run
    python3 scripts/oracle/make_hybrid_fixtures.py --a3b-shapes --out /tmp/hybrid-a3b --device cuda  # GPU tests
"""

import argparse
import importlib.util
import json
import shutil
import tempfile
from pathlib import Path

from oracle_common import (
    add_common_args,
    assert_bf16_exact_float32,
    bf16_teacher_forced,
    draw_parameters,
    expected_record,
    run_prompts,
    setup,
    summary,
    teacher_forced_logits,
    to_bf16_exact,
    write_expected,
)
import numpy as np  # noqa: E402
import torch  # noqa: E402  (after oracle_common, which sets the environment first)
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import (  # noqa: E402
    Qwen3_5MoeConfig,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeForConditionalGeneration,
    Qwen3_5MoeTextConfig,
)
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as modeling  # noqa: E402

SCRIPT_VERSION = 1
SCRIPT = "scripts/oracle/make_hybrid_fixtures.py"
LIN, FULL = "linear_attention", "full_attention"
ROUTER_GAIN = 2.0
CHUNK = 64  # transformers' torch_chunk_gated_delta_rule default
GDN_PATHS = (
    "torch_chunk_gated_delta_rule",
    "torch_recurrent_gated_delta_rule",
    "causal_conv1d_fn",
    "causal_conv1d_update",
)
# A tiny vision tower, so that the `conditional` layout holds real `model.visual.*` tensors.
VISION = dict(
    depth=1,
    hidden_size=16,
    intermediate_size=32,
    num_heads=2,
    patch_size=2,
    temporal_patch_size=2,
    spatial_merge_size=2,
    num_position_embeddings=16,
)

# Layer patterns with at least one attention layer each (the released models: i % 4 == 3 is
# attention); 8 to 32 experts, top 2 to 8; GDN value heads per key head 2 or 1, key and value head
# dims equal or not; attention head_dim 32 or 64 with RoPE on the first quarter; GQA 2:1 and 4:1.
# Prompt lengths: a short one, one that is not a multiple of the KV block (16) nor of GDN's chunk
# (64), and one longer than 512 tokens (several GDN chunks, the last one partial).
FIXTURES = [
    dict(
        name="l3f1-e8k2",
        seed=4004,
        layer_types=[LIN, LIN, LIN, FULL],
        vocab_size=320,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        rope_theta=10_000_000.0,
        mrope_section=[2, 1, 1],
        prompt_lengths=[5, 37, 530],
        layouts=[("text", "fused"), ("text", "per_expert"), ("conditional", "fused"), ("conditional", "per_expert")],
    ),
    dict(
        name="f1l1-e32k8",
        seed=5005,
        layer_types=[FULL, LIN],
        vocab_size=512,
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        num_experts=32,
        num_experts_per_tok=8,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        rope_theta=1_000_000.0,
        mrope_section=[4, 2, 2],
        prompt_lengths=[8, 45, 600],
        layouts=[("text", "per_expert"), ("conditional", "fused")],
    ),
    dict(
        name="lflf-e16k4",
        seed=6006,
        layer_types=[LIN, FULL, LIN, FULL],
        vocab_size=256,
        hidden_size=96,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=32,
        num_experts=16,
        num_experts_per_tok=4,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        rope_theta=10_000_000.0,
        mrope_section=[2, 1, 1],
        prompt_lengths=[3, 29, 515],
        layouts=[("conditional", "per_expert")],
    ),
]


# The shapes the GPU's Gated DeltaNet and MoE kernels are compiled for (Qwen3.5/3.6-35B-A3B's:
# hidden 2048, 256 experts of 512, top 8, DeltaNet 16 key / 32 value heads of 128, attention 16 / 2
# heads of 256), with four layers and a small vocabulary. About 6.5 GB of bf16 weights: made on the
# GPU machine for qwen-engine/tests/gpu_hybrid.rs (`--a3b-shapes`), never committed.
A3B_SHAPES = [
    dict(
        name="a3b-l3f1",
        seed=7007,
        layer_types=[LIN, LIN, LIN, FULL],
        vocab_size=2048,
        hidden_size=2048,
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        num_experts=256,
        num_experts_per_tok=8,
        moe_intermediate_size=512,
        shared_expert_intermediate_size=512,
        rope_theta=10_000_000.0,
        mrope_section=[11, 11, 10],
        prompt_lengths=[5, 37, 530],
        layouts=[("text", "fused")],
        router_gain=6.0,
        expert_down_gain=0.5,
    ),
]


def folder_name(f, layout):
    config, experts = layout
    return f"hybrid-{f['name']}-{'cond' if config == 'conditional' else config}-{experts.replace('_', '-')}"


def make_config(f):
    return Qwen3_5MoeTextConfig(
        vocab_size=f["vocab_size"],
        hidden_size=f["hidden_size"],
        num_hidden_layers=len(f["layer_types"]),
        layer_types=list(f["layer_types"]),
        num_attention_heads=f["num_attention_heads"],
        num_key_value_heads=f["num_key_value_heads"],
        head_dim=f["head_dim"],
        linear_conv_kernel_dim=4,
        linear_num_key_heads=f["linear_num_key_heads"],
        linear_num_value_heads=f["linear_num_value_heads"],
        linear_key_head_dim=f["linear_key_head_dim"],
        linear_value_head_dim=f["linear_value_head_dim"],
        num_experts=f["num_experts"],
        num_experts_per_tok=f["num_experts_per_tok"],
        moe_intermediate_size=f["moe_intermediate_size"],
        shared_expert_intermediate_size=f["shared_expert_intermediate_size"],
        hidden_act="silu",
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": f["rope_theta"],
            "partial_rotary_factor": 0.25,
            "mrope_section": list(f["mrope_section"]),
            "mrope_interleaved": True,
        },
        attention_bias=False,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )


def random_weight(name, shape, f, gen):
    """Values for one parameter, drawn from `gen` (CPU), rounded to bf16 and widened back.

    As the dense fixtures: projections have unit gain (std 1/sqrt(fan_in)); those that write into
    the residual stream (attention o_proj, DeltaNet out_proj, every down_proj) gain 2; the untied
    embedding has std 1 and lm_head gives logits a spread of a few units. This family's RMSNorms are
    zero-centred (`x * (1 + w)`): layer and final norms have w near 0, q/k norms near 1 (a gain
    near 2, attention sharp enough to depend on positions); DeltaNet's gated norm is plain (`w`,
    near 1). DeltaNet decays `exp(-exp(A_log) * softplus(a + dt_bias))` range from about 0.3 to
    0.99 per token, so some heads remember the whole prompt. The router has gain 2 (clear choices).
    A fixture may set `router_gain` and `expert_down_gain` (the routed experts' down_proj): with
    256 experts, top 8, near ties in the routing are common, and each flip moves a token's output
    by a whole expert's share, so the A3B-shaped fixture concentrates the routing weights and
    lowers the routed experts' gain: with the defaults its bf16 run was 7.5% off float32 and half
    its greedy margins under the noise; with router 6 and experts 0.5, 2.2% (H200, 2026-12-03).
    Vision and MTP tensors (skipped by a text engine) get the same kind of values.
    """
    h = f["hidden_size"]
    u = lambda: 2.0 * torch.rand(shape, generator=gen) - 1.0  # noqa: E731  uniform in [-1, 1)
    if name.endswith("linear_attn.norm.weight"):
        w = 1.0 + 0.2 * u()
    elif "q_norm" in name or "k_norm" in name:
        w = 1.0 + 0.5 * u()
    elif "model.visual." in name and len(shape) == 1:
        w = (1.0 + 0.2 * u()) if name.endswith(".weight") and "norm" in name else 0.1 * u()
    elif "norm" in name:
        w = 0.2 * u()
    elif name.endswith("A_log"):
        w = torch.log(0.02 + 0.98 * torch.rand(shape, generator=gen))
    elif name.endswith("dt_bias"):
        w = u()
    elif name.endswith("embed_tokens.weight"):
        w = torch.randn(shape, generator=gen)
    elif name == "lm_head.weight":
        w = (4.0 / h**0.5) * torch.randn(shape, generator=gen)
    else:
        fan_in = shape[-1] if name.endswith(("experts.gate_up_proj", "experts.down_proj")) else int(np.prod(shape[1:]))
        if name.endswith("mlp.gate.weight"):
            gain = f.get("router_gain", ROUTER_GAIN)
        elif "mlp.experts." in name and "down_proj" in name:
            gain = f.get("expert_down_gain", 2.0)
        else:
            gain = 2.0 if ("o_proj" in name or "out_proj" in name or "down_proj" in name) else 1.0
        w = gain * torch.randn(shape, generator=gen) / fan_in**0.5
    return to_bf16_exact(w)


def build_text_model(f):
    torch.manual_seed(f["seed"])  # transformers' own init, overwritten below
    model = Qwen3_5MoeForCausalLM(make_config(f)).to(torch.float32).eval()
    draw_parameters(model, f["seed"], lambda name, shape, gen: random_weight(name, shape, f, gen))
    return model


def text_tensors(model):
    """The text model's tensors in bf16 as transformers names them (experts fused)."""
    return {n: t.detach().to(torch.bfloat16).contiguous() for n, t in model.state_dict().items()}


def split_experts(tensors):
    """Fused experts -> one gate_proj / up_proj / down_proj weight per expert."""
    out = {}
    for name, t in tensors.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :inter].clone()
                out[f"{base}{e}.up_proj.weight"] = t[e, inter:].clone()
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].clone()
        else:
            out[name] = t
    return out


def extra_tensors(f, config, text):
    """The `conditional` layout's tensors that a text engine skips: a tiny vision tower
    (`model.visual.*`, from transformers' own module) and one MTP layer (`mtp.*`: as in the released
    checkpoints, a decoder layer with attention, router and shared expert, its norms and `fc`; its
    routed experts are left out to keep the files small)."""
    cond = Qwen3_5MoeForConditionalGeneration(
        Qwen3_5MoeConfig(text_config=config.to_dict(), vision_config=dict(VISION, out_hidden_size=f["hidden_size"]))
    )
    draw_parameters(cond.model.visual, f["seed"] + 2, lambda n, s, g: random_weight("model.visual." + n, s, f, g))
    extras = {"model.visual." + n: t.to(torch.bfloat16).contiguous() for n, t in cond.model.visual.state_dict().items()}
    mtp = torch.nn.ModuleDict(
        {
            "layer": modeling.Qwen3_5MoeDecoderLayer(config, config.layer_types.index(FULL)),
            "fc": torch.nn.Linear(2 * f["hidden_size"], f["hidden_size"], bias=False),
            "norm": modeling.Qwen3_5MoeRMSNorm(f["hidden_size"]),
            "pre_fc_norm_embedding": modeling.Qwen3_5MoeRMSNorm(f["hidden_size"]),
            "pre_fc_norm_hidden": modeling.Qwen3_5MoeRMSNorm(f["hidden_size"]),
        }
    )
    rename = lambda n: "mtp." + n.replace("layer.", "layers.0.", 1) if n.startswith("layer.") else "mtp." + n  # noqa: E731
    del mtp["layer"].mlp.experts  # kept small: the MTP layer without its routed experts
    draw_parameters(mtp, f["seed"] + 3, lambda n, s, g: random_weight(rename(n), s, f, g))
    extras.update({rename(n): t.to(torch.bfloat16).contiguous() for n, t in mtp.state_dict().items()})
    # The released checkpoints' tensor names, text part under model.language_model.
    lm = {("model.language_model." + n[len("model.") :] if n.startswith("model.") else n): t for n, t in text.items()}
    return cond, lm, extras


def write_json(path, cfg):
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def write_layout(f, layout, text_model, folder):
    """config.json as transformers' save_pretrained writes it for the layout's class, and the
    layout's tensors in bf16. Returns the prefixes of tensors a text engine must skip."""
    config_layout, experts = layout
    text = text_tensors(text_model)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if config_layout == "text":
            text_model.to(torch.bfloat16).save_pretrained(tmp)
            text_model.to(torch.float32)
            tensors, skipped = text, []
        else:
            cond, tensors, extras = extra_tensors(f, text_model.config, text)
            cond.to(torch.bfloat16).save_pretrained(tmp)
            cfg = json.loads((tmp / "config.json").read_text())
            # As the released checkpoints: one MTP layer, sharing the embeddings.
            cfg["text_config"]["mtp_num_hidden_layers"] = 1
            cfg["text_config"]["mtp_use_dedicated_embeddings"] = False
            write_json(tmp / "config.json", cfg)
            tensors = dict(tensors, **extras)
            skipped = ["model.visual.", "mtp."]
        if experts == "per_expert":
            tensors = split_experts(tensors)
            if config_layout == "text":
                # What transformers' save_pretrained writes is this layout.
                with safe_open(tmp / "model.safetensors", framework="pt") as st:
                    assert set(st.keys()) == set(tensors), sorted(set(st.keys()) ^ set(tensors))
                    for n in st.keys():
                        assert torch.equal(st.get_tensor(n), tensors[n]), n
        shutil.copy(tmp / "config.json", folder / "config.json")
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with safe_open(folder / "model.safetensors", framework="pt") as st:
        names = set(st.keys())
        assert all(st.get_slice(n).get_dtype() == "BF16" for n in names)
    fused = any(n.endswith("experts.gate_up_proj") for n in names)
    assert fused == (experts == "fused"), sorted(names)
    return skipped


def assert_torch_gdn_paths():
    """transformers picks flash-linear-attention / causal-conv1d when importable: refuse those."""
    for package in ("fla", "causal_conv1d"):
        assert importlib.util.find_spec(package) is None, f"{package} is installed: the reference must be the torch path"
    for name in GDN_PATHS:
        fn, chosen = getattr(modeling, name), None
        while fn is not None and chosen is None:
            cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
            chosen = (cells["implementation"], cells["torch_function"]) if "implementation" in cells else None
            fn = getattr(fn, "__wrapped__", None)
        assert chosen is not None, f"{name}: transformers' fallback wrapper not found"
        implementation, torch_function = chosen
        assert implementation is torch_function and implementation.__module__ == modeling.__name__, (name, implementation)


class CountCalls:
    """Counts the calls of transformers' GDN functions (the forward looks them up at call time)."""

    def __init__(self):
        self.calls = dict.fromkeys(GDN_PATHS, 0)
        self.saved = {}

    def __enter__(self):
        for name in GDN_PATHS:
            original = self.saved[name] = getattr(modeling, name)

            def counted(*args, _name=name, _fn=original, **kwargs):
                self.calls[_name] += 1
                return _fn(*args, **kwargs)

            setattr(modeling, name, counted)
        return self

    def __exit__(self, *exc):
        for name, fn in self.saved.items():
            setattr(modeling, name, fn)


def load(folder, layout, dtype, device):
    cls = Qwen3_5MoeForCausalLM if layout[0] == "text" else Qwen3_5MoeForConditionalGeneration
    model = cls.from_pretrained(folder, dtype=dtype, attn_implementation="eager", experts_implementation="eager")
    model = model.to(device).eval()
    assert model.config.get_text_config()._experts_implementation == "eager"
    assert model.config.get_text_config()._attn_implementation == "eager"
    return model


def text_parameters(model):
    """name -> tensor of the text model, named as in Qwen3_5MoeForCausalLM."""
    if isinstance(model, Qwen3_5MoeForConditionalGeneration):
        out = {"model." + n: p for n, p in model.model.language_model.named_parameters()}
        out["lm_head.weight"] = model.lm_head.weight
        return out
    return dict(model.named_parameters())


def check_loaded(model, text_model):
    assert_bf16_exact_float32(model)
    got, want = text_parameters(model), dict(text_model.named_parameters())
    assert set(got) == set(want), sorted(set(got) ^ set(want))
    for n, p in want.items():
        assert torch.equal(got[n].detach().cpu(), p.detach()), f"{n} differs after loading"


def run_reference(model, f, device):
    n_lin = f["layer_types"].count(LIN)
    with CountCalls() as counter:
        prompts = run_prompts(model, f, device)
    # Prefill: one chunked delta rule and one conv pass per DeltaNet layer; decode (31 more steps
    # per prompt, the 32nd token needs no forward, yet greedy_with_top5 runs it): the recurrent ones.
    decode_steps = sum(len(p["steps"]) for p in prompts)
    want = {
        "torch_chunk_gated_delta_rule": len(prompts) * n_lin,
        "causal_conv1d_fn": len(prompts) * n_lin,
        "torch_recurrent_gated_delta_rule": decode_steps * n_lin,
        "causal_conv1d_update": decode_steps * n_lin,
    }
    assert counter.calls == want, (counter.calls, want)
    return prompts, counter.calls


def teacher_forced_gap(model, prompts, device):
    """The cached greedy run (chunked prefill, then recurrent decode) against one pass over the
    whole sequence (chunked only): largest |difference| of the recorded top-5 logits."""
    worst = 0.0
    rows_by_prompt = []
    for p in prompts:
        rows = teacher_forced_logits(model, p, device)
        rows_by_prompt.append(rows)
        for row, step in zip(rows, p["steps"]):
            for t, want in zip(step["top5_ids"], step["top5_logits"]):
                worst = max(worst, abs(float(row[t]) - want))
    return worst, rows_by_prompt


def make_model(f, out, device):
    text_model = build_text_model(f)
    folders = [out / folder_name(f, layout) for layout in f["layouts"]]
    skipped = [write_layout(f, layout, text_model, folder) for layout, folder in zip(f["layouts"], folders)]

    models = [load(folder, layout, torch.float32, device) for layout, folder in zip(f["layouts"], folders)]
    for m in models:
        check_loaded(m, text_model)
    reference = models[0]
    prompts, calls = run_reference(reference, f, device)
    gap, rows = teacher_forced_gap(reference, prompts, device)
    # Every other layout, loaded by its own class: the same logits over the same tokens.
    layout_gap = 0.0
    for m in models[1:]:
        for p, want in zip(prompts, rows):
            layout_gap = max(layout_gap, float(np.abs(teacher_forced_logits(m, p, device) - want).max()))
    bf16_noise = bf16_teacher_forced(load(folders[0], f["layouts"][0], torch.bfloat16, device), prompts, device)

    config = make_config(f)
    for layout, folder, skip in zip(f["layouts"], folders, skipped):
        specific = {
            "config_style": "5.x",
            "model_type": "qwen3_5_moe_text" if layout[0] == "text" else "qwen3_5_moe",
            "architectures": [
                "Qwen3_5MoeForCausalLM" if layout[0] == "text" else "Qwen3_5MoeForConditionalGeneration"
            ],
            "layout": {
                "config": layout[0],
                "experts": layout[1],
                "tensor_prefix": "model." if layout[0] == "text" else "model.language_model.",
                "skipped_prefixes": skip,
            },
            "same_model_as": [x.name for x in folders if x != folder],
            "layer_types": list(f["layer_types"]),
            "num_experts": f["num_experts"],
            "num_experts_per_tok": f["num_experts_per_tok"],
            "moe_intermediate_size": f["moe_intermediate_size"],
            "shared_expert_intermediate_size": f["shared_expert_intermediate_size"],
            "head_dim": f["head_dim"],
            "rotary_dim": int(f["head_dim"] * config.rope_parameters["partial_rotary_factor"]),
            "linear_key_head_dim": f["linear_key_head_dim"],
            "linear_value_head_dim": f["linear_value_head_dim"],
            "experts_implementation": "eager",
            "gdn_chunk_size": CHUNK,
            "gdn_calls": calls,
            "reference_layout": folders[0].name,
            "f32_teacher_forced_max_abs_diff": gap,
            "f32_other_layouts_max_abs_diff": layout_gap,
            # The A3B-shaped fixture's gains (random_weight), where it sets them.
            **{k: f[k] for k in ("router_gain", "expert_down_gain") if k in f},
        }
        expected = expected_record(SCRIPT, SCRIPT_VERSION, f, specific, device, bf16_noise, folder, prompts)
        write_expected(folder, expected)
        print(summary(folder, prompts, bf16_noise))
    print(
        f"  {f['name']}: cached greedy vs one pass max |diff| {gap:.2e}; "
        f"other layouts vs reference max |diff| {layout_gap:.2e}; GDN calls {calls}"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap)
    ap.add_argument(
        "--a3b-shapes",
        action="store_true",
        help="make the GPU tests' fixtures of the 35B-A3B shapes (four layers, ~6.5 GB) instead of the tiny ones",
    )
    ap.add_argument(
        "--gains",
        metavar="KEY=VALUE,...",
        help="override the fixtures' router_gain / expert_down_gain (e.g. router_gain=12,expert_down_gain=0.5): "
        "to compare how chaotic a fixture is, which the log's `transformers bf16 vs float32` line says",
    )
    args = ap.parse_args()
    fixtures = A3B_SHAPES if args.a3b_shapes else FIXTURES
    if args.gains:
        overrides = {}
        for part in args.gains.split(","):
            key, _, value = part.partition("=")
            if key not in ("router_gain", "expert_down_gain"):
                ap.error(f"--gains: `{key}` is not router_gain or expert_down_gain")
            try:
                overrides[key] = float(value)
            except ValueError:
                ap.error(f"--gains: `{part}` needs a number after `=`")
        fixtures = [dict(f, **overrides) for f in fixtures]
    device = setup(args, fixtures)
    assert_torch_gdn_paths()
    for f in fixtures:
        if args.only and f["name"] not in args.only:
            continue
        make_model(f, args.out, device)


if __name__ == "__main__":
    main()
