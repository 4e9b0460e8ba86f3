"""Gated DeltaNet kernels for the linear-attention layers of Qwen3.5 / Qwen3.6-35B-A3B, in Triton.

Compiled ahead of time (scripts/triton-gen.sh), never at run time: the PTX and its metadata are
committed under kernels/triton/generated/ and build.rs assembles them for every target.

Math and rounding follow transformers' Qwen3_5MoeGatedDeltaNet in bf16 (the math
is in docs/models.md): the conv output and its SiLU are stored as bf16, beta = bf16(sigmoid(b)),
g = -exp(A_log) * softplus(a + dt_bias) in fp32, the delta rule in fp32, the core output rounded to
bf16, then the gated RMSNorm `bf16(bf16(w * bf16(x * rsqrt(mean(x^2) + eps))) * silu(z))`.

Layouts (row-major, one row per token):
  qkv       [tokens, CONV_DIM] bf16: [q (HK x DK) | k (HK x DK) | v (HV x DV)], the in_proj_qkv output
  conv_w    [CONV_DIM, WIDTH] bf16   conv1d.weight squeezed
  conv_state[slots, WIDTH - 1, CONV_DIM] bf16, oldest input first (time-major, for coalesced access)
  a, b      [tokens, HV] bf16         in_proj_a / in_proj_b outputs
  z         [tokens, HV * DV] bf16    in_proj_z output
  A_log, dt_bias [HV] fp32 (exact copies of the model's parameters)
  norm_w    [DV] bf16
  state     [slots, HV, DK, DV] fp32  the recurrent state, S[k][v] as transformers keeps it
  out       [tokens, HV * DV] bf16    the gated-normed output, the input of out_proj
Sequences are given as cu_seqlens [n_seq + 1] (token offsets), slots [n_seq] (state slot of each
sequence) and has_state [n_seq] (0: a new request, its old slot content is ignored and it starts
from zero state).

Grid dependency control: a kernel with a `PDL` constexpr (scripts/triton_gen.py sets it: 1 in the
kernel's sm_90+ images) lets the next kernel launch once all its programs have started
(`gdc_launch_dependents`), and reads nothing an earlier kernel of the pass wrote before `gdc_wait`
returns (the kernel before complete, its writes visible). Before that wait it reads only what no
kernel of the pass writes: weights, the pass inputs the host copied, and the recurrent state
(written only by the same layer's launch in an earlier pass). Launched without the programmatic
attribute, both are no-ops.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def gdn_causal_conv1d(
    qkv_ptr, conv_w_ptr, conv_state_ptr, out_ptr, cu_seqlens_ptr, slots_ptr, has_state_ptr,
    CONV_DIM: tl.constexpr, WIDTH: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """Causal depthwise conv over each sequence's new tokens, then SiLU; shifts the conv state.

    One program per (sequence, block of channels): it reads the old state, walks the sequence in
    tiles of BLOCK_T tokens, and writes the new state last, so no other program races on it.
    Decode is the case of one token per sequence.
    """
    seq = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    start = tl.load(cu_seqlens_ptr + seq)
    length = tl.load(cu_seqlens_ptr + seq + 1) - start
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    has_state = tl.load(has_state_ptr + seq) != 0
    state_base = conv_state_ptr + slot * (WIDTH - 1) * CONV_DIM
    x_base = qkv_ptr + start.to(tl.int64) * CONV_DIM
    o_base = out_ptr + start.to(tl.int64) * CONV_DIM

    # The new state (the last WIDTH - 1 = 3 inputs) is read before any write.
    tl.static_assert(WIDTH == 4, "the conv state update is written for a window of 4")
    cm = c < CONV_DIM
    q0 = length - 3
    n0 = tl.where(q0 >= 0, tl.load(x_base + q0 * CONV_DIM + c, mask=(q0 >= 0) & cm, other=0.0),
                  tl.load(state_base + (q0 + 3) * CONV_DIM + c, mask=(q0 < 0) & has_state & cm, other=0.0))
    q1 = length - 2
    n1 = tl.where(q1 >= 0, tl.load(x_base + q1 * CONV_DIM + c, mask=(q1 >= 0) & cm, other=0.0),
                  tl.load(state_base + (q1 + 3) * CONV_DIM + c, mask=(q1 < 0) & has_state & cm, other=0.0))
    q2 = length - 1
    n2 = tl.where(q2 >= 0, tl.load(x_base + q2 * CONV_DIM + c, mask=(q2 >= 0) & cm, other=0.0),
                  tl.load(state_base + (q2 + 3) * CONV_DIM + c, mask=(q2 < 0) & has_state & cm, other=0.0))

    t_off = tl.arange(0, BLOCK_T)
    for t0 in range(0, length, BLOCK_T):
        p = t0 + t_off  # positions in the sequence
        acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
        for j in tl.static_range(WIDTH):
            w = tl.load(conv_w_ptr + c * WIDTH + j, mask=cm, other=0.0).to(tl.float32)
            q = p - (WIDTH - 1) + j  # input position feeding tap j
            from_x = tl.load(x_base + q[:, None] * CONV_DIM + c[None, :],
                             mask=((q >= 0) & (p < length))[:, None] & cm[None, :], other=0.0)
            from_state = tl.load(state_base + (q + WIDTH - 1)[:, None] * CONV_DIM + c[None, :],
                                 mask=((q < 0) & (p < length) & has_state)[:, None] & cm[None, :], other=0.0)
            acc += w[None, :] * tl.where((q >= 0)[:, None], from_x, from_state).to(tl.float32)
        conv = acc.to(tl.bfloat16).to(tl.float32)
        act = conv / (1.0 + tl.exp(-conv))
        tl.store(o_base + p[:, None] * CONV_DIM + c[None, :], act.to(tl.bfloat16),
                 mask=(p < length)[:, None] & (c < CONV_DIM)[None, :])

    # Every thread's reads of the old state are done before any thread writes the new one.
    tl.debug_barrier()
    tl.store(state_base + c, n0, mask=cm)
    tl.store(state_base + CONV_DIM + c, n1, mask=cm)
    tl.store(state_base + 2 * CONV_DIM + c, n2, mask=cm)


@triton.jit
def _gated_rmsnorm_rows(o, z, norm_w, eps, DV: tl.constexpr):
    """transformers' Qwen3_5MoeRMSNormGated on rows [n, DV] of fp32 `o` (bf16 values) and `z`."""
    var = tl.sum(o * o, axis=1) / DV
    normed = (o * tl.rsqrt(var + eps)[:, None]).to(tl.bfloat16).to(tl.float32)
    weighted = (norm_w[None, :] * normed).to(tl.bfloat16).to(tl.float32)
    gate = z / (1.0 + tl.exp(-z))
    return (weighted * gate).to(tl.bfloat16)


@triton.jit
def _softplus(x):
    # torch.nn.functional.softplus with beta 1 and threshold 20.
    return tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))


@triton.jit
def gdn_recurrent_step(
    qkv_ptr, a_ptr, b_ptr, z_ptr, a_log_ptr, dt_bias_ptr, norm_w_ptr, state_ptr, cu_seqlens_ptr, slots_ptr,
    has_state_ptr, out_ptr,
    eps,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, PDL: tl.constexpr,
):
    """The gated delta rule one token at a time over each sequence's new tokens (one in a decode
    step, a prompt chunk's in prefill), each followed by the gated norm.

    One program per (sequence, value head) holds the head's whole DK x DV fp32 state in registers
    from the first token to the last: per token decay, read (kv = S^T k), delta = beta (v - kv),
    write S += k delta^T, output o = S^T q. Every token runs the same instructions whichever call
    it is in, and the state crosses calls as exact fp32, so a sequence's outputs and final state do
    not depend on how its tokens are split into calls (decode steps, prompt chunks of any size).

    With PDL the state and the head's constants are read before the wait for the kernel before
    (the projections), so the 64 KB state load overlaps it.
    """
    if PDL:
        gdc_launch_dependents()
    seq = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // (HV // HK)
    CONV_DIM: tl.constexpr = 2 * HK * DK + HV * DV
    dk = tl.arange(0, DK)
    dv = tl.arange(0, DV)
    start = tl.load(cu_seqlens_ptr + seq)
    end = tl.load(cu_seqlens_ptr + seq + 1)
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    has_state = tl.load(has_state_ptr + seq) != 0
    s_ptrs = state_ptr + ((slot * HV + hv) * DK + dk[:, None]) * DV + dv[None, :]
    s = tl.load(s_ptrs, mask=has_state, other=0.0)
    neg_a = -tl.exp(tl.load(a_log_ptr + hv))
    dt_bias = tl.load(dt_bias_ptr + hv)
    w = tl.load(norm_w_ptr + dv).to(tl.float32)
    if PDL:
        gdc_wait()

    for t in range(start, end):
        row = qkv_ptr + t.to(tl.int64) * CONV_DIM
        q = tl.load(row + hk * DK + dk).to(tl.float32)
        k = tl.load(row + HK * DK + hk * DK + dk).to(tl.float32)
        v = tl.load(row + 2 * HK * DK + hv * DV + dv).to(tl.float32)
        q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6)
        k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
        q = q / (DK ** 0.5)

        b_in = tl.load(b_ptr + t * HV + hv).to(tl.float32)
        beta = (1.0 / (1.0 + tl.exp(-b_in))).to(tl.bfloat16).to(tl.float32)
        a_in = tl.load(a_ptr + t * HV + hv).to(tl.float32)
        g = neg_a * _softplus(a_in + dt_bias)

        s = s * tl.exp(g)
        kv = tl.sum(s * k[:, None], axis=0)
        delta = (v - kv) * beta
        s = s + k[:, None] * delta[None, :]
        o = tl.sum(s * q[:, None], axis=0)

        o = o.to(tl.bfloat16).to(tl.float32)[None, :]
        z = tl.load(z_ptr + (t * HV + hv) * DV + dv).to(tl.float32)[None, :]
        y = _gated_rmsnorm_rows(o, z, w, eps, DV)
        tl.store(out_ptr + (t * HV + hv) * DV + dv[None, :], y)

    tl.store(s_ptrs, s)


@triton.jit
def gdn_chunk_prefill(
    qkv_ptr, a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, state_ptr, cu_seqlens_ptr, slots_ptr, has_state_ptr,
    o_ptr,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, CHUNK: tl.constexpr,
    BV: tl.constexpr,
):
    """The gated delta rule over each sequence's tokens, CHUNK tokens at a time; writes the core
    output o (bf16, before the gated norm: gdn_gated_rmsnorm follows) and the final state.

    One program per (sequence, value head, BV columns of the state) carries its fp32 state slice
    from chunk to chunk (the delta rule is independent per value column). Within a chunk the
    updates are condensed with the UT transform, as transformers' torch_chunk_gated_delta_rule
    does: T = (I + strict_lower(beta k k^T * decay))^-1 by forward substitution, u = T (beta v),
    w = T (beta k exp(cum g)), v' = u - w S, o = (q exp(cum g)) S + (q k^T * decay) v',
    S = exp(g_total) S + (k exp(g_total - cum g))^T v'. Products run on tensor cores as 3xTF32
    (`tf32x3`, about fp32 accuracy; plain `ieee` FMA products spilled heavily).
    """
    seq = tl.program_id(0)
    hv = tl.program_id(1)
    v0 = tl.program_id(2) * BV
    hk = hv // (HV // HK)
    CONV_DIM: tl.constexpr = 2 * HK * DK + HV * DV
    start = tl.load(cu_seqlens_ptr + seq)
    end = tl.load(cu_seqlens_ptr + seq + 1)
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    has_state = tl.load(has_state_ptr + seq) != 0

    dk = tl.arange(0, DK)
    dv = v0 + tl.arange(0, BV)
    r = tl.arange(0, CHUNK)
    causal = r[:, None] >= r[None, :]
    strict = r[:, None] > r[None, :]
    eye = (r[:, None] == r[None, :]).to(tl.float32)

    s_ptrs = state_ptr + ((slot * HV + hv) * DK + dk[:, None]) * DV + dv[None, :]
    s = tl.load(s_ptrs, mask=has_state, other=0.0)
    a_log = tl.load(a_log_ptr + hv)
    dt_bias = tl.load(dt_bias_ptr + hv)

    for c0 in range(start, end, CHUNK):
        t = c0 + r
        valid = t < end
        rows = qkv_ptr + t.to(tl.int64)[:, None] * CONV_DIM
        q = tl.load(rows + hk * DK + dk[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        k = tl.load(rows + HK * DK + hk * DK + dk[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        v = tl.load(rows + 2 * HK * DK + hv * DV + dv[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        q = q * tl.rsqrt(tl.sum(q * q, axis=1) + 1e-6)[:, None]
        k = k * tl.rsqrt(tl.sum(k * k, axis=1) + 1e-6)[:, None]
        q = q / (DK ** 0.5)
        b_in = tl.load(b_ptr + t * HV + hv, mask=valid, other=0.0).to(tl.float32)
        beta = tl.where(valid, (1.0 / (1.0 + tl.exp(-b_in))).to(tl.bfloat16).to(tl.float32), 0.0)
        a_in = tl.load(a_ptr + t * HV + hv, mask=valid, other=0.0).to(tl.float32)
        g = tl.where(valid, -tl.exp(a_log) * _softplus(a_in + dt_bias), 0.0)

        cum = tl.cumsum(g, axis=0)
        total = tl.sum(g, axis=0)
        decay = tl.exp(tl.where(causal, cum[:, None] - cum[None, :], float("-inf")))
        kb = k * beta[:, None]
        lower = tl.where(strict, tl.dot(kb, tl.trans(k), input_precision="tf32x3") * decay, 0.0)
        # T = (I + lower)^-1, row by row: T[i] = e_i - lower[i] @ T (rows above i are final).
        inv = eye
        for i in range(1, CHUNK):
            l_i = tl.sum(tl.where(r[:, None] == i, lower, 0.0), axis=0)
            t_i = tl.sum(l_i[:, None] * inv, axis=0)
            inv = tl.where(r[:, None] == i, inv - t_i[None, :], inv)
        u = tl.dot(inv, v * beta[:, None], input_precision="tf32x3")
        w = tl.dot(inv, kb * tl.exp(cum)[:, None], input_precision="tf32x3")
        v_new = u - tl.dot(w, s, input_precision="tf32x3")
        attn = tl.where(causal, tl.dot(q, tl.trans(k), input_precision="tf32x3") * decay, 0.0)
        o = tl.dot(q * tl.exp(cum)[:, None], s, input_precision="tf32x3") + tl.dot(attn, v_new, input_precision="tf32x3")
        k_tail = k * tl.exp(total - cum)[:, None]
        s = s * tl.exp(total) + tl.dot(tl.trans(k_tail), v_new, input_precision="tf32x3")
        tl.store(o_ptr + (t[:, None] * HV + hv) * DV + dv[None, :], o.to(tl.bfloat16), mask=valid[:, None])

    tl.store(s_ptrs, s)


@triton.jit
def gdn_gated_rmsnorm(o_ptr, z_ptr, norm_w_ptr, out_ptr, n_rows, eps, DV: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    """out = transformers' Qwen3_5MoeRMSNormGated(o, z) over rows of DV (tokens x value heads)."""
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    dv = tl.arange(0, DV)
    m = (rows < n_rows)[:, None]
    offs = rows.to(tl.int64)[:, None] * DV + dv[None, :]
    o = tl.load(o_ptr + offs, mask=m, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + offs, mask=m, other=0.0).to(tl.float32)
    w = tl.load(norm_w_ptr + dv).to(tl.float32)
    tl.store(out_ptr + offs, _gated_rmsnorm_rows(o, z, w, eps, DV), mask=m)


# Qwen3.5 / Qwen3.6-35B-A3B linear-attention shapes.
QWEN35_A3B = dict(HK=16, HV=32, DK=128, DV=128)

SPECS = [
    dict(
        module="gdn_conv1d",
        kernel=gdn_causal_conv1d,
        signature={
            "qkv_ptr": "*bf16", "conv_w_ptr": "*bf16", "conv_state_ptr": "*bf16", "out_ptr": "*bf16",
            "cu_seqlens_ptr": "*i32", "slots_ptr": "*i32", "has_state_ptr": "*i32",
        },
        constexprs=dict(CONV_DIM=2 * 16 * 128 + 32 * 128, WIDTH=4, BLOCK_C=128, BLOCK_T=16),
        num_warps=4,
        num_stages=1,
    ),
    dict(
        module="gdn_recurrent",
        kernel=gdn_recurrent_step,
        signature={
            "qkv_ptr": "*bf16", "a_ptr": "*bf16", "b_ptr": "*bf16", "z_ptr": "*bf16",
            "a_log_ptr": "*fp32", "dt_bias_ptr": "*fp32", "norm_w_ptr": "*bf16", "state_ptr": "*fp32",
            "cu_seqlens_ptr": "*i32", "slots_ptr": "*i32", "has_state_ptr": "*i32", "out_ptr": "*bf16",
            "eps": "fp32",
        },
        constexprs=QWEN35_A3B,
        num_warps=4,
        num_stages=1,
        pdl=True,
    ),
    dict(
        module="gdn_prefill",
        kernel=gdn_chunk_prefill,
        signature={
            "qkv_ptr": "*bf16", "a_ptr": "*bf16", "b_ptr": "*bf16", "a_log_ptr": "*fp32", "dt_bias_ptr": "*fp32",
            "state_ptr": "*fp32", "cu_seqlens_ptr": "*i32", "slots_ptr": "*i32", "has_state_ptr": "*i32",
            "o_ptr": "*bf16",
        },
        constexprs=dict(QWEN35_A3B, CHUNK=32, BV=32),
        num_warps=4,
        num_stages=1,
    ),
    dict(
        module="gdn_gated_norm",
        kernel=gdn_gated_rmsnorm,
        signature={"o_ptr": "*bf16", "z_ptr": "*bf16", "norm_w_ptr": "*bf16", "out_ptr": "*bf16", "n_rows": "i32",
                   "eps": "fp32"},
        constexprs=dict(DV=128, BLOCK_ROWS=16),
        num_warps=4,
        num_stages=1,
    ),
]
