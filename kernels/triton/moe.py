"""Mixture-of-experts kernels for the MoE block of Qwen3.5 / Qwen3.6-35B-A3B, in Triton, for
decode batches of 1..MAX_TOKENS tokens.

Compiled ahead of time (scripts/triton-gen.sh); see gated_delta_net.py.

Math and rounding follow transformers' Qwen3_5MoeSparseMoeBlock in bf16: router logits
bf16(x W_r^T); p = softmax(logits) in fp32; the top 8 divided by their sum, stored as bf16; each
chosen expert computes bf16(down(bf16(bf16(silu(bf16(gate))) * bf16(up)))); its output times its
weight is rounded to bf16 and added to the token's sum in bf16, in ascending expert order (as
transformers' index_add_ loop does); the shared expert's output times bf16(sigmoid(bf16(x w_g)))
is added last.

Five launches: router logits (all experts and the shared gate, all tokens) -> routing (top 8,
weights, and the sorted list of distinct experts the batch chose; for a single token the router
launch's last program routes it, `fold`, one launch fewer) -> gate/up of the chosen experts
and the shared expert -> their down projections, weighted -> the combination in expert order.
Each chosen expert's weights are read once per launch, whichever tokens chose it; unchosen
experts' weights are never read. An engine whose next step is the residual add and an RMSNorm
takes `moe_combine_norm` as the fifth launch instead: the combination, the add and the norm of a
token's row in one program (one launch fewer a layer).

Layouts:
  x            [tokens, H] bf16
  router_w     [E, H] bf16            gate.weight
  shared_gate_w[H] bf16               shared_expert_gate.weight
  logits       [tokens, E + 1] bf16   column E is the shared gate's logit
  topk_ids     [tokens, TOPK] i32, topk_w [tokens, TOPK] bf16 (descending probability)
  experts      [MAX_TOKENS * TOPK] i32: distinct chosen experts, ascending; n_experts [1] i32
  chosen [E] i32, arrived [1] i32: moe_route's marks and arrival count (at one token the router's
               count of its programs), zero between launches
  w13          [E, 2 I, H] bf16       experts.gate_up_proj (gate rows first)
  shared_w13   [2 I, H] bf16          shared_expert gate_proj rows then up_proj rows
  h            [tokens * TOPK + tokens, I] bf16: row t * TOPK + k for token t's k-th expert,
               row tokens * TOPK + t for its shared expert
  w2           [E, H, I] bf16         experts.down_proj
  shared_w2    [H, I] bf16            shared_expert.down_proj
  y            [tokens * TOPK + tokens, H] bf16: the weighted down outputs, rows as in h
  out          [tokens, H] bf16

Every kernel here takes a `PDL` constexpr (1 in its sm_90+ images; grid dependency control as in
gated_delta_net.py): it lets the next kernel launch once all its programs have started, and waits
for the kernel before it (`gdc_wait`) before reading anything that kernel or an earlier one of the
pass wrote; only weights are read before that wait.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def _router_rows(router_w_ptr, shared_gate_w_ptr, e, k, H: tl.constexpr, E: tl.constexpr):
    """Columns k of the router's rows e (row E: the shared expert's gate)."""
    w = tl.load(router_w_ptr + e[:, None] * H + k[None, :], mask=(e < E)[:, None], other=0.0)
    w += tl.load(shared_gate_w_ptr + (e * 0)[:, None] + k[None, :], mask=(e == E)[:, None], other=0.0)
    return w


@triton.jit
def moe_router_logits(
    x_ptr, router_w_ptr, shared_gate_w_ptr, logits_ptr, topk_ids_ptr, topk_w_ptr, experts_ptr, n_experts_ptr,
    arrived_ptr, n_tokens, fold,
    H: tl.constexpr, E: tl.constexpr, TOPK: tl.constexpr, MAX_TOKENS: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    """logits[t, e] = bf16(x[t] . router_w[e]) for e < E, and the shared gate's logit at e = E.

    Grid: ((E + 1) / BLOCK_E,), one warp a program: with a few rows a program the router's 1 MB
    streams from every SM at once. Each token's dot products are fp32 sums of the products, the
    same tree whatever the number of tokens (no tensor-core tile whose width follows the batch), so
    a token's logits do not depend on the others.

    With `fold` set (the engine sets it for a single token), the launch also does moe_route's work:
    each program, its logits stored, counts itself in `arrived` [1] (a release), and the last to
    arrive (its acquire sees every program's logits) routes token 0 with moe_route's code, so the
    same ids and weights, and sets `arrived` back to zero (it must hold zero before the launch).
    Without `fold` the routing pointers are not touched.

    With PDL the first BLOCK_K columns of the program's weights (all of them at BLOCK_K = H) are
    read before the wait for the kernel before, which wrote x.
    """
    if PDL:
        gdc_launch_dependents()
    e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    t = tl.arange(0, MAX_TOKENS)
    kk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_E, MAX_TOKENS], dtype=tl.float32)
    w = _router_rows(router_w_ptr, shared_gate_w_ptr, e, kk, H, E)
    if PDL:
        gdc_wait()
    for k0 in range(0, H, BLOCK_K):
        k = k0 + kk
        if k0 > 0:
            w = _router_rows(router_w_ptr, shared_gate_w_ptr, e, k, H, E)
        for j in range(0, n_tokens):
            x = tl.load(x_ptr + j * H + k).to(tl.float32)
            part = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
            acc = tl.where(t[None, :] == j, acc + part[:, None], acc)
    tl.store(logits_ptr + t[None, :] * (E + 1) + e[:, None], acc.to(tl.bfloat16),
             mask=(e <= E)[:, None] & (t < n_tokens)[None, :])
    if fold != 0:
        # Every lane's logits before the one release that counts this program.
        tl.debug_barrier()
        if tl.atomic_add(arrived_ptr, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
            ids = _route_token(logits_ptr, topk_ids_ptr, topk_w_ptr, 0, E, TOPK)
            _list_picks(experts_ptr, n_experts_ptr, ids, TOPK)
            tl.store(arrived_ptr, 0)


@triton.jit
def _route_token(logits_ptr, topk_ids_ptr, topk_w_ptr, t, E: tl.constexpr, TOPK: tl.constexpr):
    """Token t's top TOPK of softmax(logits), renormalised, stored; returns the ids. The logits are
    read through L2 (.cg): in the router's fold other SMs wrote them during the same launch. Every
    step is exact or elementwise (maxima over packed keys, the picks' sum in pick order), so the
    result does not depend on the launch's warp count."""
    col = tl.arange(0, E)
    kc = tl.arange(0, TOPK)
    logits = tl.load(logits_ptr + t * (E + 1) + col, cache_modifier=".cg").to(tl.float32)
    p = tl.exp(logits - tl.max(logits, axis=0))
    key = (p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (E - 1 - col).to(tl.int64)
    ids = tl.zeros([TOPK], dtype=tl.int32)
    best = tl.zeros([TOPK], dtype=tl.float32)
    total = 0.0
    for k in tl.static_range(TOPK):
        top = tl.max(key, axis=0)
        idx = (E - 1) - top.to(tl.int32)
        prob = (top >> 32).to(tl.int32).to(tl.float32, bitcast=True)
        key = tl.where(col == idx, -1, key)
        total += prob
        ids = tl.where(kc == k, idx, ids)
        best = tl.where(kc == k, prob, best)
    tl.store(topk_ids_ptr + t * TOPK + kc, ids)
    tl.store(topk_w_ptr + t * TOPK + kc, (best / total).to(tl.bfloat16))
    return ids


@triton.jit
def _list_picks(experts_ptr, n_experts_ptr, ids, TOPK: tl.constexpr):
    """One token: its TOPK picks (distinct: each is masked once taken) are the distinct experts,
    listed in ascending order by rank; no marks and no count, so no atomic round trip."""
    rank = tl.sum((ids[None, :] < ids[:, None]).to(tl.int32), axis=1)
    tl.store(experts_ptr + rank, ids)
    tl.store(n_experts_ptr, TOPK)


@triton.jit
def moe_route(
    logits_ptr, topk_ids_ptr, topk_w_ptr, experts_ptr, n_experts_ptr, chosen_ptr, arrived_ptr, n_tokens,
    E: tl.constexpr, TOPK: tl.constexpr, MAX_TOKENS: tl.constexpr, PDL: tl.constexpr,
):
    """Top TOPK of softmax(logits) per token, renormalised; and the distinct experts, sorted.

    Grid: (tokens,). One program of one warp a token, so every reduction stays within the warp (no
    barrier) and the tokens are routed side by side. Each pick is one max over keys that pack the
    probability's bits (non-negative floats order as their bits) above `E - 1 - expert`, so ties
    between equal probabilities go to the lower expert index. The softmax denominator cancels in
    the renormalisation, so weights are exp(l - max) over the sum of the chosen ones (summed in
    pick order).

    With several tokens, each program marks its experts in `chosen` [E] and then counts itself in
    `arrived` [1] (a release); the last to arrive (its acquire sees every mark) writes the marked
    experts in ascending order and their number, and zeroes `chosen` and `arrived` for the next
    launch. Both must hold zeros before the first launch. A single token's program lists its own
    picks, sorted, and leaves both untouched.
    """
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    t = tl.program_id(0)
    col = tl.arange(0, E)
    ids = _route_token(logits_ptr, topk_ids_ptr, topk_w_ptr, t, E, TOPK)
    if n_tokens == 1:
        _list_picks(experts_ptr, n_experts_ptr, ids, TOPK)
    else:
        tl.store(chosen_ptr + ids, tl.full([TOPK], 1, dtype=tl.int32))
        # Every lane's marks before the one release that counts this program.
        tl.debug_barrier()
        if tl.atomic_add(arrived_ptr, 1, sem="acq_rel", scope="gpu") == n_tokens - 1:
            present = tl.load(chosen_ptr + col, volatile=True)
            position = tl.cumsum(present, axis=0) - 1
            tl.store(experts_ptr + position, col, mask=present != 0)
            tl.store(n_experts_ptr, tl.sum(present, axis=0))
            tl.store(chosen_ptr + col, tl.zeros([E], dtype=tl.int32))
            tl.store(arrived_ptr, 0)


@triton.jit
def _tokens_choosing(topk_ids_ptr, expert, n_tokens, TOPK: tl.constexpr, MAX_TOKENS: tl.constexpr):
    """For one expert: which tokens chose it, and at which of their TOPK positions."""
    t = tl.arange(0, MAX_TOKENS)
    kc = tl.arange(0, TOPK)
    ids = tl.load(topk_ids_ptr + t[:, None] * TOPK + kc[None, :], mask=(t < n_tokens)[:, None], other=-1)
    match = ids == expert
    chose = tl.max(match.to(tl.int32), axis=1) != 0
    kpos = tl.sum(tl.where(match, kc[None, :], 0), axis=1)
    return chose, kpos


@triton.jit
def moe_gate_up(
    x_ptr, w13_ptr, shared_w13_ptr, topk_ids_ptr, experts_ptr, n_experts_ptr, h_ptr, n_tokens,
    H: tl.constexpr, I: tl.constexpr, TOPK: tl.constexpr, MAX_TOKENS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    """h = bf16(bf16(silu(bf16(x Wg^T))) * bf16(x Wu^T)) for every chosen (token, expert) pair.

    Grid: (slots, I / BLOCK_N). Slot s < n_experts is the s-th distinct chosen expert, serving
    every token that chose it; the last slot is the shared expert for all tokens; other slots
    do nothing.
    """
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    s = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    t = tl.arange(0, MAX_TOKENS)
    kk = tl.arange(0, BLOCK_K)
    is_shared = s == tl.num_programs(0) - 1
    count = tl.load(n_experts_ptr)
    active = is_shared | (s < count)
    expert = tl.load(experts_ptr + s, mask=active & (s < count), other=0)
    chose, kpos = _tokens_choosing(topk_ids_ptr, expert, n_tokens, TOPK, MAX_TOKENS)
    live = t < n_tokens
    chose = tl.where(is_shared, live, chose & live)
    out_row = tl.where(is_shared, n_tokens * TOPK + t, t * TOPK + kpos)
    if is_shared:
        w_base = shared_w13_ptr
    else:
        w_base = w13_ptr + expert.to(tl.int64) * (2 * I * H)

    acc_g = tl.zeros([BLOCK_N, MAX_TOKENS], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_N, MAX_TOKENS], dtype=tl.float32)
    k_end = tl.where(active, H, 0)
    for k0 in range(0, k_end, BLOCK_K):
        k = k0 + kk
        x = tl.load(x_ptr + t[:, None] * H + k[None, :], mask=chose[:, None], other=0.0)
        wg = tl.load(w_base + n[:, None] * H + k[None, :])
        wu = tl.load(w_base + (I + n)[:, None] * H + k[None, :])
        acc_g += tl.dot(wg, tl.trans(x))
        acc_u += tl.dot(wu, tl.trans(x))
    gate = acc_g.to(tl.bfloat16).to(tl.float32)
    up = acc_u.to(tl.bfloat16).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(tl.bfloat16).to(tl.float32)
    h = (act * up).to(tl.bfloat16)
    tl.store(h_ptr + out_row[None, :] * I + n[:, None], h, mask=(chose & active)[None, :])


@triton.jit
def moe_down(
    h_ptr, w2_ptr, shared_w2_ptr, topk_ids_ptr, topk_w_ptr, experts_ptr, n_experts_ptr, logits_ptr,
    y_ptr, n_tokens,
    H: tl.constexpr, I: tl.constexpr, E: tl.constexpr, TOPK: tl.constexpr, MAX_TOKENS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    """y[row] = bf16(bf16(down h[row]) * w) for every chosen (token, expert) pair (row
    t * TOPK + k, w its routing weight), and bf16(bf16(shared_down h) * bf16(sigmoid(gate logit)))
    for the shared expert (row tokens * TOPK + t).

    Work items are (expert slot, BLOCK_N outputs), the shared expert's slot last; the programs
    (a few per SM, however many experts were chosen) take them grid-stride, so the experts' down
    weights stream in parallel, each read once. moe_combine then adds the rows in order.
    """
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    NB: tl.constexpr = H // BLOCK_N
    t = tl.arange(0, MAX_TOKENS)
    kk = tl.arange(0, BLOCK_K)
    live = t < n_tokens
    count = tl.load(n_experts_ptr)
    for item in range(tl.program_id(0), (count + 1) * NB, tl.num_programs(0)):
        slot = item // NB
        n = (item % NB) * BLOCK_N + tl.arange(0, BLOCK_N)
        is_shared = slot == count
        expert = tl.load(experts_ptr + slot, mask=slot < count, other=0)
        chose, kpos = _tokens_choosing(topk_ids_ptr, expert, n_tokens, TOPK, MAX_TOKENS)
        chose = tl.where(is_shared, live, chose & live)
        row = tl.where(is_shared, n_tokens * TOPK + t, t * TOPK + kpos)
        if is_shared:
            w_base = shared_w2_ptr
        else:
            w_base = w2_ptr + expert.to(tl.int64) * (H * I)
        acc = tl.zeros([BLOCK_N, MAX_TOKENS], dtype=tl.float32)
        for k0 in range(0, I, BLOCK_K):
            k = k0 + kk
            h = tl.load(h_ptr + row[:, None] * I + k[None, :], mask=chose[:, None], other=0.0)
            w = tl.load(w_base + n[:, None] * I + k[None, :])
            acc += tl.dot(w, tl.trans(h))
        down = acc.to(tl.bfloat16).to(tl.float32)
        weight = tl.load(topk_w_ptr + t * TOPK + kpos, mask=chose & (slot < count), other=0.0).to(tl.float32)
        logit = tl.load(logits_ptr + t * (E + 1) + E, mask=live & is_shared, other=0.0).to(tl.float32)
        gate = (1.0 / (1.0 + tl.exp(-logit))).to(tl.bfloat16).to(tl.float32)
        scale = tl.where(is_shared, gate, weight)
        tl.store(y_ptr + row[None, :] * H + n[:, None], (down * scale[None, :]).to(tl.bfloat16),
                 mask=chose[None, :])


@triton.jit
def moe_combine(
    y_ptr, topk_ids_ptr, out_ptr, n_tokens,
    H: tl.constexpr, TOPK: tl.constexpr, MAX_TOKENS: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr,
):
    """out[t] = the token's expert rows of y summed in bf16 in ascending expert order (as
    transformers' index_add_ loop adds them), then its shared expert's row."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    t = tl.arange(0, MAX_TOKENS)
    kc = tl.arange(0, TOPK)
    live = t < n_tokens
    ids = tl.load(topk_ids_ptr + t[:, None] * TOPK + kc[None, :], mask=live[:, None], other=0)
    out = tl.zeros([MAX_TOKENS, BLOCK_C], dtype=tl.float32)
    for _ in tl.static_range(TOPK):
        lowest = tl.min(ids, axis=1)
        k = tl.min(tl.where(ids == lowest[:, None], kc[None, :], TOPK), axis=1)
        ids = tl.where(kc[None, :] == k[:, None], 2147483647, ids)
        y = tl.load(y_ptr + (t * TOPK + k)[:, None] * H + c[None, :], mask=live[:, None], other=0.0)
        out = (out + y.to(tl.float32)).to(tl.bfloat16).to(tl.float32)
    shared = tl.load(y_ptr + (n_tokens * TOPK + t)[:, None] * H + c[None, :], mask=live[:, None], other=0.0)
    tl.store(out_ptr + t[:, None] * H + c[None, :], (out + shared.to(tl.float32)).to(tl.bfloat16),
             mask=live[:, None])


@triton.jit
def moe_combine_norm(
    y_ptr, topk_ids_ptr, residual_ptr, norm_w_ptr, x_ptr, n_tokens, eps, weight_offset,
    H: tl.constexpr, TOPK: tl.constexpr, PDL: tl.constexpr,
):
    """moe_combine, then the residual add and the next RMSNorm of the same row, one program a
    token: r = bf16(residual + moe), residual <- r, x <- bf16((w + weight_offset) *
    bf16(r * rsqrt(mean(r^2) + eps))). The sum of squares is one tree over the row, so x can differ
    from the CUDA fused_add_rmsnorm's by an ulp where the two sums round apart; r is the same bits."""
    if PDL:
        gdc_launch_dependents()
    t = tl.program_id(0)
    c = tl.arange(0, H)
    kc = tl.arange(0, TOPK)
    w = tl.load(norm_w_ptr + c).to(tl.float32) + weight_offset
    if PDL:
        gdc_wait()
    ids = tl.load(topk_ids_ptr + t * TOPK + kc)
    out = tl.zeros([H], dtype=tl.float32)
    for _ in tl.static_range(TOPK):
        lowest = tl.min(ids, axis=0)
        k = tl.min(tl.where(ids == lowest, kc, TOPK), axis=0)
        ids = tl.where(kc == k, 2147483647, ids)
        y = tl.load(y_ptr + (t * TOPK + k) * H + c)
        out = (out + y.to(tl.float32)).to(tl.bfloat16).to(tl.float32)
    shared = tl.load(y_ptr + (n_tokens * TOPK + t) * H + c)
    moe = (out + shared.to(tl.float32)).to(tl.bfloat16).to(tl.float32)
    r = (tl.load(residual_ptr + t * H + c).to(tl.float32) + moe).to(tl.bfloat16)
    tl.store(residual_ptr + t * H + c, r)
    rf = r.to(tl.float32)
    scale = tl.rsqrt(tl.math.div_rn(tl.sum(rf * rf, axis=0), H * 1.0) + eps)
    normed = (rf * scale).to(tl.bfloat16).to(tl.float32)
    tl.store(x_ptr + t * H + c, (w * normed).to(tl.bfloat16))


# Qwen3.5 / Qwen3.6-35B-A3B MoE shapes; up to 16 tokens (the smallest tl.dot width).
QWEN35_A3B = dict(H=2048, E=256, TOPK=8, I=512, MAX_TOKENS=16)
_ptr = "*bf16"

SPECS = [
    dict(
        module="moe_router",
        kernel=moe_router_logits,
        signature={"x_ptr": _ptr, "router_w_ptr": _ptr, "shared_gate_w_ptr": _ptr, "logits_ptr": _ptr,
                   "topk_ids_ptr": "*i32", "topk_w_ptr": _ptr, "experts_ptr": "*i32", "n_experts_ptr": "*i32",
                   "arrived_ptr": "*i32", "n_tokens": "i32", "fold": "i32"},
        constexprs=dict(H=2048, E=256, TOPK=8, MAX_TOKENS=16, BLOCK_E=2, BLOCK_K=2048),
        num_warps=1,
        num_stages=1,
        pdl=True,
    ),
    dict(
        module="moe_route",
        kernel=moe_route,
        signature={"logits_ptr": _ptr, "topk_ids_ptr": "*i32", "topk_w_ptr": _ptr, "experts_ptr": "*i32",
                   "n_experts_ptr": "*i32", "chosen_ptr": "*i32", "arrived_ptr": "*i32", "n_tokens": "i32"},
        constexprs=dict(E=256, TOPK=8, MAX_TOKENS=16),
        num_warps=1,
        num_stages=1,
        pdl=True,
    ),
    dict(
        module="moe_gate_up",
        kernel=moe_gate_up,
        signature={"x_ptr": _ptr, "w13_ptr": _ptr, "shared_w13_ptr": _ptr, "topk_ids_ptr": "*i32",
                   "experts_ptr": "*i32", "n_experts_ptr": "*i32", "h_ptr": _ptr, "n_tokens": "i32"},
        constexprs=dict(H=2048, I=512, TOPK=8, MAX_TOKENS=16, BLOCK_N=64, BLOCK_K=128),
        num_warps=4,
        num_stages=5,
        # Two stages in flight where a block may use 99 KiB of shared memory, and in the PTX fallback
        # (sm_80's compile), which any of those GPUs may JIT.
        num_stages_by_cap={80: 3, 86: 3, 89: 3, 120: 3, 121: 3},
        pdl=True,
    ),
    dict(
        module="moe_down",
        kernel=moe_down,
        signature={"h_ptr": _ptr, "w2_ptr": _ptr, "shared_w2_ptr": _ptr, "topk_ids_ptr": "*i32",
                   "topk_w_ptr": _ptr, "experts_ptr": "*i32", "n_experts_ptr": "*i32", "logits_ptr": _ptr,
                   "y_ptr": _ptr, "n_tokens": "i32"},
        constexprs=dict(H=2048, I=512, E=256, TOPK=8, MAX_TOKENS=16, BLOCK_N=32, BLOCK_K=128),
        num_warps=4,
        num_stages=3,
        pdl=True,
    ),
    dict(
        module="moe_combine",
        kernel=moe_combine,
        signature={"y_ptr": _ptr, "topk_ids_ptr": "*i32", "out_ptr": _ptr, "n_tokens": "i32"},
        constexprs=dict(H=2048, TOPK=8, MAX_TOKENS=16, BLOCK_C=64),
        num_warps=4,
        num_stages=1,
        pdl=True,
    ),
    dict(
        module="moe_combine_norm",
        kernel=moe_combine_norm,
        signature={"y_ptr": _ptr, "topk_ids_ptr": "*i32", "residual_ptr": _ptr, "norm_w_ptr": _ptr,
                   "x_ptr": _ptr, "n_tokens": "i32", "eps": "fp32", "weight_offset": "fp32"},
        constexprs=dict(H=2048, TOPK=8),
        num_warps=8,
        num_stages=1,
        pdl=True,
    ),
]
