"""The transformers oracle for the Triton kernels' GPU test (tests/gpu_triton_kernels.rs embeds
this file and runs it): reads the cases the Rust test wrote (inputs and our kernels' outputs),
recomputes them with transformers' own pure-torch functions on the GPU in bf16, as the model runs,
and compares with the tolerances the Rust test states. Exit 0 only if every case passes.

  python3 triton_oracle.py CASES_DIR

Needs torch and transformers (5.17 on the test machine); refuses to run the fused hub/FLA kernels
in place of the pure-torch functions.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as M
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig

import os

# AOT_ORACLE_DEVICE=cpu checks the Rust CPU references without a GPU (cpu_references_match_transformers).
DEV = os.environ.get("AOT_ORACLE_DEVICE", "cuda")
if DEV == "cuda" and not torch.cuda.is_available():
    sys.exit("oracle: torch sees no CUDA device; set AOT_ORACLE_DEVICE=cpu to run on the CPU")


def pure(fn, name):
    """The pure-torch function transformers falls back to, never a kernel library's."""
    f = getattr(fn, "__wrapped__", fn)
    if f.__name__ != name or not f.__code__.co_filename.endswith("modeling_qwen3_5_moe.py"):
        sys.exit(f"oracle: {name} resolves to {f.__module__}.{f.__name__}, not transformers' pure-torch code; "
                 "uninstall flash-linear-attention / causal-conv1d for this check")
    return f


causal_conv1d_update = pure(M.causal_conv1d_update, "causal_conv1d_update")
recurrent_rule = pure(M.torch_recurrent_gated_delta_rule, "torch_recurrent_gated_delta_rule")
chunk_rule = pure(M.torch_chunk_gated_delta_rule, "torch_chunk_gated_delta_rule")


def load(d, name, dtype, shape):
    raw = np.fromfile(d / f"{name}.{ {torch.bfloat16: 'bf16', torch.float32: 'f32', torch.int32: 'i32'}[dtype] }",
                      dtype={torch.bfloat16: np.int16, torch.float32: np.float32, torch.int32: np.int32}[dtype])
    t = torch.from_numpy(raw.copy())
    if dtype == torch.bfloat16:
        t = t.view(torch.bfloat16)
    return t.reshape(shape).to(DEV)


FAILED = []


def compare(what, got, want, tol, kind="bf16"):
    got, want = got.float(), want.float()
    scale = want.abs().max().clamp_min(1e-30)
    rel = ((got - want).abs().max() / scale).item()
    if kind == "bf16":
        a = got.to(torch.bfloat16).view(torch.int16).int()
        b = want.to(torch.bfloat16).view(torch.int16).int()
        ordered = lambda x: torch.where(x < 0, -(x & 0x7FFF), x)
        near = ((ordered(a) - ordered(b)).abs() <= 2).float().mean().item()
        ok = rel <= tol["bf16_max_rel"] and near >= tol["bf16_near_share"] and torch.isfinite(got).all().item()
        print(f"  {what}: max |diff| {rel:.2e} of max, {near:.4f} within 2 ulp: {'ok' if ok else 'FAIL'}")
    else:
        near = (((got - want).abs() / scale) <= tol["f32_near_rel"]).float().mean().item()
        ok = rel <= tol["f32_max_rel"] and near >= tol["f32_near_share"]
        print(f"  {what}: max |diff| {rel:.2e} of max, {near:.5f} within {tol['f32_near_rel']:g}: {'ok' if ok else 'FAIL'}")
    if not ok:
        FAILED.append(what)


def gdn_case(case, root, cfg, tol):
    d = root / case["dir"]
    hk, hv, dk, dv, w = cfg["key_heads"], cfg["value_heads"], cfg["key_dim"], cfg["value_dim"], cfg["conv_width"]
    c = 2 * hk * dk + hv * dv
    slots = case["slots"]
    n = sum(s["len"] for s in case["seqs"])
    conv_w = load(d, "conv_weight", torch.bfloat16, (c, w))
    a_log = load(d, "a_log", torch.float32, (hv,))
    dt_bias = load(d, "dt_bias", torch.float32, (hv,))
    norm = M.Qwen3_5MoeRMSNormGated(dv, eps=case["eps"]).to(DEV)
    norm.weight.data = load(d, "norm_weight", torch.bfloat16, (dv,)).float()
    norm = norm.to(torch.bfloat16)
    qkv = load(d, "qkv", torch.bfloat16, (n, c))
    a = load(d, "a", torch.bfloat16, (n, hv))
    b = load(d, "b", torch.bfloat16, (n, hv))
    z = load(d, "z", torch.bfloat16, (n, hv * dv))
    conv_in = load(d, "conv_state_in", torch.bfloat16, (slots, w - 1, c))
    state_in = load(d, "state_in", torch.float32, (slots, hv, dk, dv))
    conv_want, state_want = conv_in.clone(), state_in.clone()
    outs = []
    for s in case["seqs"]:
        t0, L, slot = s["start"], s["len"], s["slot"]
        # transformers keeps the conv state as [batch, channels, width - 1].
        conv_state = conv_in[slot].t().contiguous()[None] if s["has_state"] else torch.zeros(1, c, w - 1, dtype=torch.bfloat16, device=DEV)
        x = qkv[t0:t0 + L].t()[None]
        mixed = causal_conv1d_update(x, conv_state, conv_w, None, "silu")[0].t()
        conv_want[slot] = conv_state[0].t()
        q, k, v = torch.split(mixed, [hk * dk, hk * dk, hv * dv], dim=-1)
        q = q.reshape(1, L, hk, dk).repeat_interleave(hv // hk, dim=2)
        k = k.reshape(1, L, hk, dk).repeat_interleave(hv // hk, dim=2)
        v = v.reshape(1, L, hv, dv)
        beta = b[t0:t0 + L].sigmoid()[None]
        g = (-a_log.exp() * F.softplus(a[t0:t0 + L].float() + dt_bias))[None]
        init = state_in[slot][None] if s["has_state"] else None
        if case["dir"] == "gdn_decode":
            core, final = recurrent_rule(q, k, v, g=g, beta=beta, initial_state=init, output_final_state=True,
                                         use_qk_l2norm_in_kernel=True)
        else:
            core, final = chunk_rule(q, k, v, g=g, beta=beta, initial_state=init, output_final_state=True,
                                     use_qk_l2norm_in_kernel=True)
        state_want[slot] = final[0]
        y = norm(core.reshape(-1, dv), z[t0:t0 + L].reshape(-1, dv)).reshape(L, hv * dv)
        outs.append(y)
    want = torch.cat(outs)
    compare(f"{case['dir']}: out vs transformers", load(d, "out", torch.bfloat16, (n, hv * dv)), want, tol)
    got_conv = load(d, "conv_state_out", torch.bfloat16, (slots, w - 1, c))
    if not torch.equal(got_conv, conv_want):
        FAILED.append(f"{case['dir']}: conv state")
        print(f"  {case['dir']}: conv state vs transformers: FAIL (not bitwise equal)")
    else:
        print(f"  {case['dir']}: conv state vs transformers: bitwise equal: ok")
    compare(f"{case['dir']}: state vs transformers", load(d, "state_out", torch.float32, state_in.shape), state_want,
            tol, kind="f32")


def splitmix(x):
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def hashed(seed, stream, start, n, scale):
    """tests/triton_common: element i of tensor `stream`, uniform in [-scale, scale), exact f32 -> bf16."""
    with np.errstate(over="ignore"):
        i = np.arange(start, start + n, dtype=np.uint64)
        u = (splitmix(np.uint64(seed) ^ (np.uint64(stream) << np.uint64(48)) ^ i) >> np.uint64(40)).astype(np.float32)
    u = u / np.float32(16777216.0)
    return torch.from_numpy((u * np.float32(2.0) - np.float32(1.0)) * np.float32(scale)).to(torch.bfloat16)


def moe_block(index, root):
    m = index["moe"]
    h, e, k, i = m["hidden"], m["experts"], m["top_k"], m["inter"]
    cfg = Qwen3_5MoeTextConfig(hidden_size=h, num_experts=e, num_experts_per_tok=k, moe_intermediate_size=i,
                               shared_expert_intermediate_size=i)
    cfg._experts_implementation = "eager"
    with torch.device("meta"):
        block = M.Qwen3_5MoeSparseMoeBlock(cfg)
    block = block.to_empty(device=DEV).to(torch.bfloat16)
    d = root / "moe_weights"
    seed, scale = index["moe_seed"], index["expert_scale"]
    chosen = set()
    for case in index["cases"]:
        if case["kind"] == "moe":
            chosen |= set(load(root / case["dir"], "topk_ids", torch.int32, (-1,)).tolist())
    with torch.no_grad():
        block.gate.weight.copy_(load(d, "router", torch.bfloat16, (e, h)))
        block.shared_expert_gate.weight.copy_(load(d, "shared_gate", torch.bfloat16, (1, h)))
        sgu = load(d, "shared_gate_up", torch.bfloat16, (2 * i, h))
        block.shared_expert.gate_proj.weight.copy_(sgu[:i])
        block.shared_expert.up_proj.weight.copy_(sgu[i:])
        block.shared_expert.down_proj.weight.copy_(load(d, "shared_down", torch.bfloat16, (h, i)))
        # Experts no token chose stay NaN here too: the eager loop must never touch them either.
        block.experts.gate_up_proj.fill_(float("nan"))
        block.experts.down_proj.fill_(float("nan"))
        for x in sorted(chosen):
            block.experts.gate_up_proj[x] = hashed(seed, 1, x * 2 * i * h, 2 * i * h, scale).reshape(2 * i, h).to(DEV)
            block.experts.down_proj[x] = hashed(seed, 2, x * h * i, h * i, scale).reshape(h, i).to(DEV)
    return block, len(chosen)


def main():
    root = Path(sys.argv[1])
    index = json.loads((root / "cases.json").read_text())
    tol = index["tolerance"]
    print(f"oracle: torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.cuda.get_device_name(0) if DEV == 'cuda' else 'cpu'}, cases in {root}")
    for case in index["cases"]:
        if case["kind"] == "gdn":
            gdn_case(case, root, index["gdn"], tol)
    block, n_chosen = moe_block(index, root)
    print(f"  moe: transformers Qwen3_5MoeSparseMoeBlock (eager experts), {n_chosen} experts set, the rest NaN")
    h = index["moe"]["hidden"]
    for case in index["cases"]:
        if case["kind"] != "moe":
            continue
        d = root / case["dir"]
        x = load(d, "x", torch.bfloat16, (1, case["tokens"], h))
        with torch.no_grad():
            _, _, ids = block.gate(x.reshape(-1, h))
            want = block(x).reshape(case["tokens"], h)
        ours = load(d, "topk_ids", torch.int32, (case["tokens"], -1)).long()
        if not torch.equal(ids.sort(dim=-1).values, ours.sort(dim=-1).values):
            FAILED.append(f"{case['dir']}: routing")
            print(f"  {case['dir']}: chosen experts vs transformers: FAIL")
        compare(f"{case['dir']}: out vs transformers", load(d, "out", torch.bfloat16, (case["tokens"], h)), want, tol)
    if FAILED:
        print(f"oracle: FAILED: {', '.join(FAILED)}")
        sys.exit(1)
    print("oracle: every case matches transformers")


if __name__ == "__main__":
    main()
