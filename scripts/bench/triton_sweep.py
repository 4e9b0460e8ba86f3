#!/usr/bin/env python3
"""Times the hybrid family's decode kernels (kernels/triton/moe.py, gated_delta_net.py) under other launch settings.

A screen for tuning on one GPU, not a result: each candidate (BLOCK sizes, warps, pipeline stages,
programs per SM) is compiled by Triton's JIT, launched on the Qwen3.5/3.6-35B-A3B shapes at 1 and
8 tokens with the weights cold (every call reads other experts, or another copy of the router, out
of tensors far larger than L2), captured as a CUDA graph of back-to-back calls, and timed as the
median of several replays. It prints microseconds a call, the bytes a call reads over that time,
and whether the outputs are the bits of the settings the AOT build uses today (the first row of
each kernel). That check is one call on random inputs: where a setting reorders a sum across
threads (a norm's sum of squares, the DeltaNet state's sums), roundings that differ only now and
then can pass it, so the engine's digests have the last word on bits. A setting that wins here
is then measured in the engine's step (`qwen-decode bench`) before it is kept: a kernel alone
shares neither SMs nor L2 with its neighbours.

    python3 scripts/bench/triton_sweep.py [--kernels router,gate_up,down,combine_norm,gdn_recurrent,gdn_conv1d]
                                       [--tokens 1,8]

Kernels that update state in place (the residual, the DeltaNet and conv states) get it restored
before the bit comparison, so every setting's check starts from the same bytes.
"""

import argparse
import itertools
import os
import re
import statistics
import sys

import torch
import triton

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "kernels", "triton"))
import gated_delta_net as gdn  # noqa: E402
import moe  # noqa: E402

S = moe.QWEN35_A3B
H, E, K, I, MT = S["H"], S["E"], S["TOPK"], S["I"], S["MAX_TOKENS"]
SETS = 48  # routings (or router copies) cycled through a graph, so the weights stay cold
CALLS = 48  # calls a graph replay
REPLAYS = 15


def spec(module):
    return next(s for s in moe.SPECS + gdn.SPECS if s["module"] == module)


def down_programs_per_sm():
    """The grid of `moe_down` is not in its spec: the launcher sizes it (src/ops/moe.rs, PROGRAMS_PER_SM)."""
    with open(os.path.join(ROOT, "src", "ops", "moe.rs")) as f:
        found = re.search(r"const PROGRAMS_PER_SM: usize = (\d+);", f.read())
    if not found:
        sys.exit("triton_sweep: PROGRAMS_PER_SM not found in src/ops/moe.rs (renamed? update down_programs_per_sm)")
    return int(found.group(1))


def routings(n_tokens, gen):
    """SETS random routings: each token's TOPK distinct experts and the batch's sorted distinct ones."""
    out = []
    for _ in range(SETS):
        ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(n_tokens)]).to(torch.int32)
        topk = torch.zeros(MT, K, dtype=torch.int32)
        topk[:n_tokens] = ids
        distinct = torch.unique(ids)
        experts = torch.zeros(MT * K, dtype=torch.int32)
        experts[: distinct.numel()] = distinct.to(torch.int32)
        out.append((topk.cuda(), experts.cuda(), torch.tensor([distinct.numel()], dtype=torch.int32).cuda()))
    return out


def time_graph(launch):
    """Median microseconds a call over REPLAYS replays of a graph of CALLS calls (call i uses set i)."""
    for i in range(SETS):  # compile and warm up outside the capture
        launch(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(CALLS):
            launch(i % SETS)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPLAYS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / CALLS)
    return statistics.median(times)


def candidates(base, grid):
    """base first, then every combination of grid's values (base's values kept where grid is silent)."""
    keys = list(grid)
    seen, out = set(), []
    for combo in [tuple(base[k] for k in keys)] + list(itertools.product(*(grid[k] for k in keys))):
        if combo not in seen:
            seen.add(combo)
            out.append(dict(base, **dict(zip(keys, combo))))
    return out


def run(name, n_tokens, configs, launch, out_rows, bytes_per_call, reset=lambda: None):
    """out_rows: the output tensors every call writes (compared bit for bit with the first
    setting's); reset restores what the kernel updates in place before that comparison."""
    if not isinstance(out_rows, (list, tuple)):
        out_rows = [out_rows]
    ref = ref_vals = None
    for cfg in configs:
        try:
            us = time_graph(lambda i: launch(cfg, i))
            reset()
            launch(cfg, 0)
            torch.cuda.synchronize()
            bits = [t.clone().view(-1).view(torch.int16) for t in out_rows]
            same = "base" if ref is None else ("same bits" if all(torch.equal(a, b) for a, b in zip(bits, ref)) else "OTHER BITS")
            if same == "OTHER BITS":  # how far: the largest difference of the first output, in its units
                diff = (out_rows[0].float() - ref_vals).abs().max().item()
                same += f" (max |diff| {diff:.3g} of max |x| {ref_vals.abs().max().item():.3g})"
            if ref is None:
                ref, ref_vals = bits, out_rows[0].float().clone()
            gbs = bytes_per_call / (us * 1e-6) / 1e9
            print(f"{name:8s} t{n_tokens}  {us:7.2f} us  {gbs:7.0f} GB/s  {same:10s}  {cfg}", flush=True)
        except Exception as err:  # a setting that does not compile or fit is reported, not fatal
            print(f"{name:8s} t{n_tokens}  failed: {type(err).__name__}: {str(err)[:120]}  {cfg}", flush=True)
            torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", default="router,gate_up,down,combine_norm,gdn_recurrent,gdn_conv1d")
    ap.add_argument("--tokens", default="1,8")
    args = ap.parse_args()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name(0)}, {sm} SMs, triton {triton.__version__}", flush=True)
    bf = dict(dtype=torch.bfloat16, device="cuda")
    x = torch.randn(MT, H, **bf) * 0.5
    kernels = args.kernels.split(",")

    if "router" in kernels:
        router_w = torch.randn(SETS, E, H, **bf) * 0.02
        shared_gate = torch.randn(SETS, H, **bf) * 0.02
        logits = torch.empty(MT, E + 1, **bf)
        # The routing outputs of the one-token fold, which the sweep leaves off (fold 0).
        r_ids = torch.zeros(MT * K, dtype=torch.int32, device="cuda")
        r_w = torch.zeros(MT * K, **bf)
        r_experts = torch.zeros(MT * K, dtype=torch.int32, device="cuda")
        r_count = torch.zeros(2, dtype=torch.int32, device="cuda")
        s = spec("moe_router")
        base = dict(s["constexprs"], num_warps=s["num_warps"], num_stages=s["num_stages"])
        configs = candidates(base, dict(BLOCK_E=[1, 2, 4, 8], BLOCK_K=[512, 1024, 2048], num_warps=[1, 2, 4]))

        def launch_router(cfg, i, n):
            grid = (triton.cdiv(E + 1, cfg["BLOCK_E"]),)
            moe.moe_router_logits[grid](x, router_w[i], shared_gate[i], logits, r_ids, r_w, r_experts, r_count,
                                        r_count[1:], n, 0, **cfg)

        for n in map(int, args.tokens.split(",")):
            run("router", n, configs, lambda cfg, i: launch_router(cfg, i, n), logits[:n], (E + 1) * H * 2)

    moe_rows = any(k in kernels for k in ("gate_up", "down", "combine_norm"))
    if moe_rows:
        w13 = torch.randn(E, 2 * I, H, **bf) * 0.02
        shared_w13 = torch.randn(2 * I, H, **bf) * 0.02
        w2 = torch.randn(E, H, I, **bf) * 0.02
        shared_w2 = torch.randn(H, I, **bf) * 0.02
        rows = MT * K + MT
        h = torch.empty(rows, I, **bf)
        h_in = torch.randn(rows, I, **bf)
        y = torch.empty(rows, H, **bf)
        topk_w = torch.rand(MT, K, **bf)
        logits = torch.randn(MT, E + 1, **bf)

    for n in map(int, args.tokens.split(",")):
        if not moe_rows:
            break
        sets = routings(n, gen)
        distinct = statistics.mean(int(r[2].item()) for r in sets)
        if "gate_up" in kernels:
            s = spec("moe_gate_up")
            base = dict(s["constexprs"], num_warps=s["num_warps"], num_stages=s["num_stages"])
            configs = candidates(base, dict(BLOCK_N=[32, 64], BLOCK_K=[64, 128, 256], num_warps=[4, 8], num_stages=[3, 4, 5]))

            def launch_gate_up(cfg, i):
                topk, experts, count = sets[i]
                grid = (n * K + 1, triton.cdiv(I, cfg["BLOCK_N"]))
                moe.moe_gate_up[grid](x, w13, shared_w13, topk, experts, count, h, n, **cfg)

            run("gate_up", n, configs, launch_gate_up, h[: n * K + n], (distinct + 1) * 2 * I * H * 2)
        if "down" in kernels:
            s = spec("moe_down")
            base = dict(s["constexprs"], num_warps=s["num_warps"], num_stages=s["num_stages"],
                        PER_SM=down_programs_per_sm())
            configs = candidates(base, dict(BLOCK_N=[16, 32], BLOCK_K=[128, 256, 512], num_warps=[4, 8],
                                            num_stages=[3, 4], PER_SM=[4, 8, 16]))

            def launch_down(cfg, i):
                topk, experts, count = sets[i]
                c = dict(cfg)
                per_sm = c.pop("PER_SM")
                items = (n * K + 1) * (H // c["BLOCK_N"])
                moe.moe_down[(min(items, per_sm * sm),)](h_in, w2, shared_w2, topk, topk_w, experts, count, logits, y, n, **c)

            run("down", n, configs, launch_down, y[: n * K + n], (distinct + 1) * H * I * 2)
        if "combine_norm" in kernels:
            s = spec("moe_combine_norm")
            base = dict(s["constexprs"], num_warps=s["num_warps"], num_stages=s["num_stages"])
            configs = candidates(base, dict(num_warps=[2, 4, 8, 16]))
            residual0 = torch.randn(SETS, MT, H, **bf)
            residual = residual0.clone()
            norm_w = torch.randn(H, **bf) * 0.1
            normed = torch.empty(MT, H, **bf)

            def launch_combine_norm(cfg, i):
                topk = sets[i][0]
                moe.moe_combine_norm[(n,)](y, topk, residual[i], norm_w, normed, n, 1e-6, 1.0, **cfg)

            run("comb_nrm", n, configs, launch_combine_norm, [normed[:n], residual[0, :n]], (n * (K + 3)) * H * 2,
                reset=lambda: residual.copy_(residual0))

    gdn_kernels = [k for k in kernels if k.startswith("gdn_")]
    if gdn_kernels:
        hk, hv, dk, dv = (gdn.QWEN35_A3B[k] for k in ("HK", "HV", "DK", "DV"))
        conv_dim = 2 * hk * dk + hv * dv
        f32 = dict(dtype=torch.float32, device="cuda")
        i32 = dict(dtype=torch.int32, device="cuda")
        qkv = torch.randn(MT, conv_dim, **bf)
        a, b = torch.randn(MT, hv, **bf), torch.randn(MT, hv, **bf)
        z = torch.randn(MT, hv * dv, **bf)
        a_log, dt_bias = torch.rand(hv, **f32), torch.rand(hv, **f32)
        norm_w = torch.randn(dv, **bf) * 0.1 + 1.0
        conv_w = torch.randn(conv_dim, 4, **bf) * 0.3
        out = torch.empty(MT, hv * dv, **bf)
        conv_out = torch.empty(MT, conv_dim, **bf)
    for n in map(int, args.tokens.split(",")) if gdn_kernels else []:
        slots_total = SETS * n
        cu = torch.arange(n + 1, **i32)
        has_state = torch.ones(n, **i32)
        slot_sets = [torch.arange(i * n, (i + 1) * n, **i32) for i in range(SETS)]
        if "gdn_recurrent" in kernels:
            state0 = torch.randn(slots_total, hv, dk, dv, **f32) * 0.1
            state = state0.clone()
            s = spec("gdn_recurrent")
            base = dict(s["constexprs"], num_warps=s["num_warps"], num_stages=s["num_stages"])
            configs = candidates(base, dict(num_warps=[4, 8, 16]))

            def launch_recurrent(cfg, i):
                gdn.gdn_recurrent_step[(n, hv)](qkv, a, b, z, a_log, dt_bias, norm_w, state, cu, slot_sets[i],
                                                has_state, out, 1e-6, **cfg)

            run("gdn_rec", n, configs, launch_recurrent, [out[:n], state[:n]], n * hv * dk * dv * 4 * 2,
                reset=lambda: state.copy_(state0))
        if "gdn_conv1d" in kernels:
            conv_state0 = torch.randn(slots_total, 3, conv_dim, **bf)
            conv_state = conv_state0.clone()
            s = spec("gdn_conv1d")
            base = dict(s["constexprs"], num_warps=s["num_warps"], num_stages=s["num_stages"])
            configs = candidates(base, dict(BLOCK_C=[128, 256, 512, 1024], num_warps=[1, 2, 4, 8]))

            def launch_conv(cfg, i):
                grid = (n, triton.cdiv(conv_dim, cfg["BLOCK_C"]))
                gdn.gdn_causal_conv1d[grid](qkv, conv_w, conv_state, conv_out, cu, slot_sets[i], has_state, **cfg)

            run("gdn_conv", n, configs, launch_conv, [conv_out[:n], conv_state[:n]], n * conv_dim * 2 * 8,
                reset=lambda: conv_state.copy_(conv_state0))


if __name__ == "__main__":
    main()
