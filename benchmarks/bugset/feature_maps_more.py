"""More real bugs of feature-map, normalised linear, QK-norm and softmax attention implementations (fla's
normalised linear attention, x-transformers' QK norm, MaxText, FlagGems, tutorial-repo softmax scales,
llm-foundry's RMSNorm as TransNormer's output norm, mlx-lm's q/k l2 norm eps), each re-implemented in plain
torch as a ``buggy`` target and its upstream-fixed ``fixed`` twin that differ only by the bug
(benchmarks/bugset/cases.py). Complements benchmarks/bugset/feature_maps.py (other sources).

Every target follows gramcheck's convention ``fn(q, k, v, *, causal, **extras)`` on (B, H, N, d) tensors and
works in any float dtype on CPU (float64 for the gradient checks); the shared, bug-free parts are written once
below (those other modules use too in benchmarks/bugset/common.py) and used by both twins.
"""

from __future__ import annotations

import math

import torch

from benchmarks.bugset.cases import Case
from benchmarks.bugset.common import acc_dtype, causal_softmax, l2norm

# --------------------------------------------------------------------------------------------------
# shared helpers (identical in both twins of every case)
# --------------------------------------------------------------------------------------------------


def _tril(n, device):
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def _elu1(x):
    """elu(x) + 1 evaluated branch by branch: x + 1 (x > 0), exp(x) (x <= 0); no cancellation."""
    return torch.where(x > 0, x + 1.0, torch.exp(torch.clamp(x, max=0.0)))


def _causal_numerator(fq, fk, v):
    """sum_{j <= i} (fq_i . fk_j) v_j (the causal product), by the masked quadratic form."""
    a = (fq @ fk.transpose(-1, -2)).masked_fill(~_tril(fq.shape[-2], fq.device), 0.0)
    return a @ v


# --------------------------------------------------------------------------------------------------
# 1. fla PR #594: normalize_output's key cumsum ran over the heads axis, not over time
# --------------------------------------------------------------------------------------------------

_FLA_EPS = 1e-10  # fla's normalize_output: o / ((q * k_cum).sum(-1) + 1e-10)


def _fla_normalised(q, k, v, *, heads_cumsum, detach_k_cum=False):
    """fla ``chunk_linear_attn(..., scale=1.0, normalize=True)`` on elu+1 features: the causal numerator
    (q k^T masked) v, then ``normalize_output``: o / ((q * k.cumsum(T)).sum(-1) + 1e-10). fla's layout is
    (B, T, H, K): its cumsum(-2) is over the heads H, here dim 1 of (B, H, N, d)."""
    dtype = q.dtype
    fq, fk, va = _elu1(q.to(acc_dtype(q))), _elu1(k.to(acc_dtype(k))), v.to(acc_dtype(v))
    o = _causal_numerator(fq, fk, va)
    k_cum = fk.cumsum(dim=1) if heads_cumsum else fk.cumsum(dim=-2)
    if detach_k_cum:
        k_cum = k_cum.detach()
    return (o / ((fq * k_cum).sum(-1, keepdim=True) + _FLA_EPS)).to(dtype)


def fla594_cumsum_over_heads_buggy(q, k, v, *, causal):
    """fla before PR #594: ``normalize_output`` did k = k.cumsum(-2), which on fla's (B, T, H, K) tensors sums
    over heads: token t's denominator is q_t . sum_{h' <= h} k_{t, h'}, not q_t . sum_{s <= t} k_s."""
    return _fla_normalised(q, k, v, heads_cumsum=True)


def fla594_cumsum_over_heads_fixed(q, k, v, *, causal):
    """PR #594: k = k.cumsum(1), the running key sum over time."""
    return _fla_normalised(q, k, v, heads_cumsum=False)


# --------------------------------------------------------------------------------------------------
# 2. fla PR #875: the normalised linear attention's denominator had no gradient to k
# --------------------------------------------------------------------------------------------------


def fla875_normalize_dk_buggy(q, k, v, *, causal):
    """fla before PR #875: ``normalize_with_z_state`` computed k_cum = chunk_global_cumsum(k) from plain Python
    (a Triton kernel with no autograd graph), so the chain k -> k_cum -> denominator was severed: forward, dq
    and dv right, dk missing the denominator's term. Re-implemented as a detached k_cum."""
    return _fla_normalised(q, k, v, heads_cumsum=False, detach_k_cum=True)


def fla875_normalize_dk_fixed(q, k, v, *, causal):
    """PR #875: the divide step is a torch.autograd.Function whose backward returns dk through k_cum's
    reverse cumsum (here plain autograd through the cumsum)."""
    return _fla_normalised(q, k, v, heads_cumsum=False, detach_k_cum=False)


# --------------------------------------------------------------------------------------------------
# 3. fla #1261: elu feature map F.elu(x) + 1 cancels to 0 in bfloat16
# --------------------------------------------------------------------------------------------------


def _fla_elu_layer(q, k, v, phi):
    """fla LinearAttention with feature_map='elu' (features in the input dtype, as the layer computes them),
    then the normalised causal kernel with float32 accumulation and the 1e-10 denominator eps, output cast
    back to the input dtype."""
    dtype = q.dtype
    fq, fk = phi(q).to(acc_dtype(q)), phi(k).to(acc_dtype(k))
    va = v.to(acc_dtype(v))
    ones = torch.ones_like(va[..., :1])
    out = _causal_numerator(fq, fk, torch.cat([va, ones], dim=-1))
    return (out[..., :-1] / (out[..., -1:] + _FLA_EPS)).to(dtype)


def _elu1_cancelling(x):
    return torch.nn.functional.elu(x) + 1.0


def fla1261_elu_bf16_cancellation_buggy(q, k, v, *, causal):
    """fla's LinearAttention 'elu' feature map: F.elu(x) + 1 -- in bfloat16 elu(x) = e^x - 1 rounds to -1 for
    x <~ -5.5, so the feature is exactly 0 (at x = -6 already 58% off), a denominator can sink to the eps."""
    return _fla_elu_layer(q, k, v, _elu1_cancelling)


def fla1261_elu_bf16_cancellation_fixed(q, k, v, *, causal):
    """Fix proposed in PR #1265: where(x >= 0, x + 1, exp(clamp_max(x, 0))), each branch evaluated directly
    (here x > 0 / x <= 0, identical values)."""
    return _fla_elu_layer(q, k, v, _elu1)


# --------------------------------------------------------------------------------------------------
# 4. x-transformers #190: QK-norm temperature inverted on the flash path
# --------------------------------------------------------------------------------------------------

_XT_TAU = 10.0  # x-transformers' qk_norm_scale default
_XT_EPS = 1e-6


def _xt_l2(x):
    return l2norm(x.to(acc_dtype(x)), _XT_EPS).to(x.dtype)


def _sdpa(q, k, v, causal):
    """torch's F.scaled_dot_product_attention math: softmax(q k^T / sqrt(d)) v."""
    return causal_softmax((q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5, v, causal)


def xt190_qknorm_flash_scale_buggy(q, k, v, *, causal):
    """x-transformers Attend.flash_attn before the fix: with qk_norm, q = q * (default_scale / self.scale) before
    F.scaled_dot_product_attention, so the logits are n(q).n(k) / (10 d) instead of 10 n(q).n(k) (the
    non-flash path's dots * scale)."""
    qn, kn = _xt_l2(q), _xt_l2(k)
    default_scale = q.shape[-1] ** -0.5
    return _sdpa(qn * (default_scale / _XT_TAU), kn, v, causal)


def xt190_qknorm_flash_scale_fixed(q, k, v, *, causal):
    """Fixed: q = q * (self.scale / default_scale), so that SDPA's own 1/sqrt(d) leaves 10 n(q).n(k)."""
    qn, kn = _xt_l2(q), _xt_l2(k)
    default_scale = q.shape[-1] ** -0.5
    return _sdpa(qn * (_XT_TAU / default_scale), kn, v, causal)


# --------------------------------------------------------------------------------------------------
# 5. MaxText #1370: MLA softmax scale inverted (logits times sqrt(d))
# --------------------------------------------------------------------------------------------------


def maxtext1370_mla_scale_inverted_buggy(q, k, v, *, causal):
    """MaxText MLA before f1498e1: softmax_scale = qk_head_dim ** -0.5 and the attention divides the scores by
    it, i.e. multiplies them by sqrt(d) (training unstable). No rope scaling (mscale = 1)."""
    softmax_scale = q.shape[-1] ** -0.5
    return causal_softmax((q @ k.transpose(-1, -2)) / softmax_scale, v, causal)


def maxtext1370_mla_scale_inverted_fixed(q, k, v, *, causal):
    """f1498e1 (as DeepSeek-V3's reference): the scores are multiplied by qk_head_dim ** -0.5."""
    softmax_scale = q.shape[-1] ** -0.5
    return causal_softmax((q @ k.transpose(-1, -2)) * softmax_scale, v, causal)


# --------------------------------------------------------------------------------------------------
# 6. FlagGems PR #424: qk_scale *= log2(e) inside the key loop (scale compounds block after block)
# --------------------------------------------------------------------------------------------------

_LOG2E = 1.0 / math.log(2.0)  # FlagGems writes 1.44269504 (6e-10 off: visible in float64 checks)
_FG_BLOCK_M = 128
_FG_BLOCK_N = 32


def _flaggems_attn_fwd_inner(acc, l_i, m_i, q, k, v, offs_m, lo, hi, sm_scale, on_band, compounding):
    """FlagGems' _attn_fwd_inner (Triton tutorial layout) for one block of queries: online softmax in base 2
    over key blocks [lo, hi) of _FG_BLOCK_N. Off-band blocks take the ``else`` branch, where the buggy code did
    ``qk_scale *= 1.44269504; qk = qk * qk_scale - m_ij``: the multiplier grows by log2(e) every iteration.
    The running maximum is taken of the logits as scaled (so the shift stays consistent; it cancels)."""
    n = k.shape[-2]
    qk_scale = sm_scale
    for start_n in range(lo, hi, _FG_BLOCK_N):
        offs_n = torch.arange(start_n, start_n + _FG_BLOCK_N, device=q.device)
        valid = offs_n < n
        kb = k[..., offs_n.clamp(max=n - 1), :]
        vb = v[..., offs_n.clamp(max=n - 1), :]
        qk = q @ kb.transpose(-1, -2)
        qk = qk.masked_fill(~valid, float("-inf"))
        if on_band:  # STAGE 2: causal diagonal block, correct in both versions
            # FlagGems adds -1.0e6 to the masked logits (as the Triton tutorial): a future key then leaks in
            # once a row's logits exceed ~1e6 (gramcheck's heavy-tail inputs: causality fails on both twins);
            # both twins mask with -inf instead, so that the fixed twin is correct everywhere
            mask = offs_m[:, None] >= offs_n[None, :]
            qk = (qk * sm_scale * _LOG2E).masked_fill(~mask, float("-inf"))
        elif compounding:
            qk_scale = qk_scale * _LOG2E  # the bug: mutates the loop-carried scale
            qk = qk * qk_scale
        else:
            qk = qk * qk_scale * _LOG2E
        m_ij = torch.maximum(m_i, qk.amax(-1)).detach()
        p = torch.exp2(qk - m_ij[..., None])
        alpha = torch.exp2(m_i - m_ij)
        l_i = l_i * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + p @ vb
        m_i = m_ij
    return acc, l_i, m_i


def _flaggems_attention(q, k, v, causal, compounding):
    dtype = q.dtype
    acc_t = acc_dtype(q)
    q, k, v = q.to(acc_t), k.to(acc_t), v.to(acc_t)
    n = q.shape[-2]
    sm_scale = q.shape[-1] ** -0.5
    outs = []
    for start_m in range(0, n, _FG_BLOCK_M):
        offs_m = torch.arange(start_m, min(start_m + _FG_BLOCK_M, n), device=q.device)
        qb = q[..., offs_m, :]
        m_i = torch.full(qb.shape[:-1], float("-inf"), dtype=acc_t, device=q.device)
        l_i = torch.ones(qb.shape[:-1], dtype=acc_t, device=q.device)
        acc = torch.zeros(*qb.shape[:-1], v.shape[-1], dtype=acc_t, device=q.device)
        if causal:  # STAGE 3: off-band keys [0, start_m), then the diagonal block in its own call
            acc, l_i, m_i = _flaggems_attn_fwd_inner(
                acc, l_i, m_i, qb, k, v, offs_m, 0, start_m, sm_scale, False, compounding
            )
            acc, l_i, m_i = _flaggems_attn_fwd_inner(
                acc, l_i, m_i, qb, k, v, offs_m, start_m, start_m + _FG_BLOCK_M, sm_scale, True, compounding
            )
        else:  # STAGE 1: every key block in one call
            acc, l_i, m_i = _flaggems_attn_fwd_inner(
                acc, l_i, m_i, qb, k, v, offs_m, 0, n, sm_scale, False, compounding
            )
        outs.append(acc / l_i[..., None])
    return torch.cat(outs, dim=-2).to(dtype)


def flaggems424_qk_scale_compounded_buggy(q, k, v, *, causal):
    """FlagGems before PR #424: the off-band key block j (0-based, 32 keys each) of a query block gets logits
    scaled by d^-1/2 log2(e)^j instead of d^-1/2; causal: only queries past the first 128-token block have
    off-band keys, so N > 128 is needed."""
    return _flaggems_attention(q, k, v, causal, compounding=True)


def flaggems424_qk_scale_compounded_fixed(q, k, v, *, causal):
    """PR #424: qk = qk * qk_scale * 1.44269504 - m_ij, the loop-carried qk_scale left alone."""
    return _flaggems_attention(q, k, v, causal, compounding=False)


# --------------------------------------------------------------------------------------------------
# 6b. x-transformers PR #244: a custom attention scale was not passed to the flash path
# --------------------------------------------------------------------------------------------------

_XT_CUSTOM_SCALE = 0.25  # a user-given Attention(scale=...) (muP, log-length scaling, ...)


def xt244_custom_scale_dropped_buggy(q, k, v, *, causal):
    """x-transformers Attend.flash_attn before 045ec7c: the custom ``self.scale`` was never used on the flash
    path (only qk_norm rescaled q), so F.scaled_dot_product_attention applied its default 1/sqrt(d)."""
    return _sdpa(q, k, v, causal)


def xt244_custom_scale_dropped_fixed(q, k, v, *, causal):
    """045ec7c: q = q * (self.scale / default_scale) before SDPA, so the logits are scale * q.k."""
    return _sdpa(q * (_XT_CUSTOM_SCALE / q.shape[-1] ** -0.5), k, v, causal)


# --------------------------------------------------------------------------------------------------
# 7. train-llm-from-scratch PR #3: logits scaled by 1/sqrt(embedding size), not 1/sqrt(head size)
# --------------------------------------------------------------------------------------------------


def tllm3_scale_embedding_size_buggy(q, k, v, *, causal):
    """Before the PR: attention weights = q k^T / sqrt(n_embed) with n_embed = heads * head_size."""
    n_embed = q.shape[1] * q.shape[-1]
    return causal_softmax((q @ k.transpose(-1, -2)) * n_embed**-0.5, v, causal)


def tllm3_scale_embedding_size_fixed(q, k, v, *, causal):
    """The PR (as torch's SDPA and the paper): q k^T / sqrt(head_size)."""
    return causal_softmax((q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5, v, causal)


# --------------------------------------------------------------------------------------------------
# 8. FrancescoSaverioZuppichini/ViT #2: scaling applied after the softmax
# --------------------------------------------------------------------------------------------------


def vit2_scale_after_softmax_buggy(q, k, v, *, causal):
    """The ViT tutorial's MultiHeadAttention: att = softmax(energy) / scaling -- the weights are scaled after
    the softmax (rows sum to 1/sqrt(d)), the logits not at all. (The tutorial's scaling was sqrt of the
    embedding size; the head size is used here, as the fixed twin's softmax variant.)"""
    att = torch.softmax(q @ k.transpose(-1, -2), dim=-1) / q.shape[-1] ** 0.5
    return att @ v


def vit2_scale_after_softmax_fixed(q, k, v, *, causal):
    """Fixed: att = softmax(energy / scaling)."""
    return causal_softmax((q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5, v, False)


# --------------------------------------------------------------------------------------------------
# 9. llm-foundry PR #372: RMSNorm divided by rsqrt (as TransNormer NormAttention's output norm)
# --------------------------------------------------------------------------------------------------

_LF_EPS = 1e-5


def _norm_attention_numerator(q, k, v, causal):
    acc = acc_dtype(q)
    fq, fk, va = _elu1(q.to(acc)), _elu1(k.to(acc)), v.to(acc)
    if causal:
        return _causal_numerator(fq, fk, va)
    return fq @ (fk.transpose(-1, -2) @ va)


def lf372_rmsnorm_divides_by_rsqrt_buggy(q, k, v, *, causal):
    """llm-foundry RMSNorm before PR #372: x / torch.rsqrt(x.pow(2).mean(-1) + eps) -- multiplies by the RMS
    instead of dividing; here applied as NormAttention's output RMSNorm (unit gain) on phi(Q)(phi(K)^T V)."""
    u = _norm_attention_numerator(q, k, v, causal)
    return (u / torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + _LF_EPS)).to(q.dtype)


def lf372_rmsnorm_divides_by_rsqrt_fixed(q, k, v, *, causal):
    """PR #372: x * torch.rsqrt(x.pow(2).mean(-1) + eps)."""
    u = _norm_attention_numerator(q, k, v, causal)
    return (u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + _LF_EPS)).to(q.dtype)


# --------------------------------------------------------------------------------------------------
# 10. mlx-lm PR #1624: q/k l2 normalisation through rms_norm with eps on the mean, not on the sum
# --------------------------------------------------------------------------------------------------

_L2_EPS = 1e-6


def _rms_norm(x, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _delta_rule(q, k, v, beta):
    """DeltaNet recurrence S_t = S_{t-1} + k_t (beta_t (v_t - S_{t-1}^T k_t))^T, o_t = S_t^T (q_t / sqrt(d_k)),
    in at least float32, on already-normalised q, k."""
    dtype = q.dtype
    acc = acc_dtype(q)
    q, k, v, beta = q.to(acc), k.to(acc), v.to(acc), beta.to(acc)
    B, H, N, dk = q.shape
    scale = dk**-0.5
    state = q.new_zeros(B, H, dk, v.shape[-1])
    outs = []
    for t in range(N):
        kt = k[:, :, t]
        delta = beta[:, :, t, None] * (v[:, :, t] - torch.einsum("bhk,bhkv->bhv", kt, state))
        state = state + kt[..., None] * delta[..., None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t] * scale, state))
    return torch.stack(outs, dim=2).to(dtype)


def mlxlm1624_l2norm_eps_on_mean_buggy(q, k, v, *, causal, beta):
    """mlx-lm kimi_linear before PR #1624: q, k normalised as mx.fast.rms_norm(x, None, 1e-6) / sqrt(D), i.e.
    x / sqrt(sum x^2 + D * 1e-6): the eps is D times the reference l2norm's (fla: x / sqrt(sum x^2 + 1e-6))."""
    d = q.shape[-1]
    acc = acc_dtype(q)
    qn = (_rms_norm(q.to(acc), _L2_EPS) / math.sqrt(d)).to(q.dtype)
    kn = (_rms_norm(k.to(acc), _L2_EPS) / math.sqrt(d)).to(k.dtype)
    return _delta_rule(qn, kn, v, beta)


def mlxlm1624_l2norm_eps_on_mean_fixed(q, k, v, *, causal, beta):
    """PR #1624: eps = 1e-6 / head_dim, so rms_norm(x) / sqrt(D) = x / sqrt(sum x^2 + 1e-6) exactly."""
    d = q.shape[-1]
    acc = acc_dtype(q)
    qn = (_rms_norm(q.to(acc), _L2_EPS / d) / math.sqrt(d)).to(q.dtype)
    kn = (_rms_norm(k.to(acc), _L2_EPS / d) / math.sqrt(d)).to(k.dtype)
    return _delta_rule(qn, kn, v, beta)


# --------------------------------------------------------------------------------------------------
# the cases
# --------------------------------------------------------------------------------------------------

CASES: list[Case] = [
    # trigger: causal, N >= 2 (the denominator misses the earlier tokens' keys) or H >= 2
    Case(
        id="fla-594-normalize-cumsum-over-heads",
        source="https://github.com/fla-org/flash-linear-attention/pull/594",
        summary=(
            "fla's normalize_output (normalised linear attention, normalize=True) computed the running key sum "
            "as k.cumsum(-2), which on its (B, T, H, K) tensors sums over heads instead of over time, so each "
            "token's denominator was q_t . sum of its own heads' keys; PR #594 changed it to k.cumsum(1)."
        ),
        kind="normaliser",
        variant="linear-elu",
        buggy=fla594_cumsum_over_heads_buggy,
        fixed=fla594_cumsum_over_heads_fixed,
        causal=True,
        params={"eps": _FLA_EPS},
    ),
    # trigger: any causal input with a gradient w.r.t. k (forward identical; dk lacks the denominator's term)
    Case(
        id="fla-875-normalized-linear-attn-dk",
        source="https://github.com/fla-org/flash-linear-attention/pull/875",
        summary=(
            "chunk_linear_attn(normalize=True) computed the key cumsum of the denominator with a Triton kernel "
            "called outside autograd, cutting the k -> k_cum -> denominator path: forward, dq and dv right, dk "
            "wrong (max error 1.73 in the report); PR #875 wraps the divide step in an autograd.Function with "
            "its own backward."
        ),
        kind="backward",
        variant="linear-elu",
        buggy=fla875_normalize_dk_buggy,
        fixed=fla875_normalize_dk_fixed,
        causal=True,
        params={"eps": _FLA_EPS},
    ),
    # trigger: bfloat16 with q or k entries below ~ -5.5 (elu rounds to -1, the feature to 0)
    Case(
        id="fla-1261-elu-feature-bf16-cancellation",
        source="https://github.com/fla-org/flash-linear-attention/issues/1261",
        summary=(
            "LinearAttention's 'elu' feature map computed F.elu(x) + 1; in bfloat16 elu(x) rounds to -1 for "
            "x <~ -5.5, so the positive feature e^x cancels to 0 (58% off at x = -6), denominators sink to the "
            "eps and gradients explode; the fix (PR #1265, open at the time) evaluates where(x >= 0, x + 1, "
            "exp(min(x, 0))) branch by branch."
        ),
        kind="precision",
        variant="linear-elu",
        buggy=fla1261_elu_bf16_cancellation_buggy,
        fixed=fla1261_elu_bf16_cancellation_fixed,
        causal=True,
        dtype="bfloat16",
        params={"eps": _FLA_EPS},
    ),
    # trigger: any input (the logits are divided by 10 d instead of multiplied by 10)
    Case(
        id="x-transformers-190-qknorm-flash-scale-inverted",
        source="https://github.com/lucidrains/x-transformers/issues/190",
        summary=(
            "With qk_norm (l2-normalised q, k, learned-free scale 10) the flash path pre-multiplied q by "
            "default_scale / scale before F.scaled_dot_product_attention, giving logits n(q).n(k) / (10 d) "
            "where the einsum path gives 10 n(q).n(k); fixed by multiplying q by scale / default_scale."
        ),
        kind="scale",
        variant="qknorm-softmax",
        buggy=xt190_qknorm_flash_scale_buggy,
        fixed=xt190_qknorm_flash_scale_fixed,
        causal=True,
        params={"norm": "l2", "tau": _XT_TAU, "norm_eps": _XT_EPS},
    ),
    # trigger: d >= 2, N >= 2 (at d = 1 sqrt(d) = 1/sqrt(d))
    Case(
        id="maxtext-1370-mla-softmax-scale-inverted",
        source="https://github.com/AI-Hypercomputer/maxtext/issues/1370",
        summary=(
            "MaxText's MLA attention set softmax_scale = qk_head_dim ** -0.5 and divided the scores by it, so "
            "the logits were multiplied by sqrt(d) instead of divided (MLA training unstable); fixed in "
            "f1498e1 by multiplying the scores by the scale, as DeepSeek's reference does."
        ),
        kind="scale",
        variant="softmax",
        buggy=maxtext1370_mla_scale_inverted_buggy,
        fixed=maxtext1370_mla_scale_inverted_fixed,
        causal=True,
    ),
    # trigger: causal with N >= 129: rows 128+ see off-band keys 0..127 in four 32-key blocks, of which blocks
    # 1-3 (keys 32..127) get the compounded scale (non-causal: any N >= 33); caught on gramcheck's 'long' N = 160
    Case(
        id="flaggems-424-qk-scale-compounded-per-block",
        source="https://github.com/flagos-ai/FlagGems/pull/424",
        summary=(
            "FlagGems' Triton flash attention did qk_scale *= 1.44269504 inside the key-block loop of "
            "_attn_fwd_inner, so each further off-band key block's logits were scaled by another factor "
            "log2(e) (attention blow-up, issue #409); PR #424 multiplies by the constant without mutating "
            "qk_scale."
        ),
        kind="chunk-boundary",
        variant="softmax",
        buggy=flaggems424_qk_scale_compounded_buggy,
        fixed=flaggems424_qk_scale_compounded_fixed,
        causal=True,
    ),
    # trigger: d != 16 (1/sqrt(d) = 0.25 only at d = 16), N >= 2
    Case(
        id="x-transformers-244-custom-scale-not-passed-to-flash",
        source="https://github.com/lucidrains/x-transformers/pull/244",
        summary=(
            "Attend's flash path ignored a custom attention scale: F.scaled_dot_product_attention was called "
            "without it and applied its default 1/sqrt(d) (the einsum path used the custom scale); fixed in "
            "045ec7c by rescaling q by scale / default_scale before SDPA."
        ),
        kind="scale",
        variant="softmax",
        buggy=xt244_custom_scale_dropped_buggy,
        fixed=xt244_custom_scale_dropped_fixed,
        causal=True,
        params={"scale": _XT_CUSTOM_SCALE},
    ),
    # trigger: H >= 2 (with one head embedding size = head size), N >= 2
    Case(
        id="train-llm-from-scratch-3-scale-by-embedding-size",
        source="https://github.com/FareedKhan-dev/train-llm-from-scratch/pull/3",
        summary=(
            "The multi-head attention scaled the logits by 1/sqrt(n_embed) (the model width, heads * "
            "head_size) instead of 1/sqrt(head_size) as the paper and torch's SDPA; the PR uses the head size."
        ),
        kind="scale",
        variant="softmax",
        buggy=tllm3_scale_embedding_size_buggy,
        fixed=tllm3_scale_embedding_size_fixed,
        causal=True,
    ),
    # trigger: d >= 2 (the output is scaled by 1/sqrt(d) and the logits are unscaled)
    Case(
        id="vit-tutorial-2-scale-after-softmax",
        source="https://github.com/FrancescoSaverioZuppichini/ViT/issues/2",
        summary=(
            "The ViT tutorial's attention computed softmax(energy) and then divided the weights by the scaling "
            "sqrt(size), instead of softmax(energy / scaling): rows no longer sum to one and the logits are "
            "unscaled; fixed by the author by moving the scaling inside the softmax."
        ),
        kind="scale",
        variant="softmax",
        buggy=vit2_scale_after_softmax_buggy,
        fixed=vit2_scale_after_softmax_fixed,
        causal=False,
    ),
    # trigger: any input (the output is u * rms(u) instead of u / rms(u))
    Case(
        id="llm-foundry-372-rmsnorm-divides-by-rsqrt",
        source="https://github.com/mosaicml/llm-foundry/pull/372",
        summary=(
            "llm-foundry's RMSNorm computed x / torch.rsqrt(mean(x^2) + eps), multiplying by the RMS instead of "
            "dividing (issue #371); PR #372 multiplies by the rsqrt. Transplanted here as the output RMSNorm "
            "of TransNormer's NormAttention (unit gain), the one attention variant whose output is RMS-normed."
        ),
        kind="normaliser",
        variant="transnormer-norm",
        buggy=lf372_rmsnorm_divides_by_rsqrt_buggy,
        fixed=lf372_rmsnorm_divides_by_rsqrt_fixed,
        causal=True,
        params={"norm": "rmsnorm", "gain": 1.0, "norm_eps": _LF_EPS},
    ),
    # trigger: small-magnitude q or k rows (|x| <~ 0.1 at d = 64: sum x^2 comparable with D * 1e-6)
    Case(
        id="mlx-lm-1624-qk-l2norm-eps-on-mean",
        source="https://github.com/ml-explore/mlx-lm/pull/1624",
        summary=(
            "mlx-lm's Kimi-Linear KDA normalised q and k with rms_norm(x, eps=1e-6) (eps added to mean(x^2)) "
            "where the reference l2norm adds 1e-6 to sum(x^2): the effective eps was head_dim times larger, "
            "up to 87% off for small-magnitude q, k; fixed with eps = 1e-6 / head_dim. Expressed on DeltaNet "
            "(KDA without its per-channel gate)."
        ),
        kind="normaliser",
        variant="deltanet",
        buggy=mlxlm1624_l2norm_eps_on_mean_buggy,
        fixed=mlxlm1624_l2norm_eps_on_mean_fixed,
        causal=True,
        params={"scale": None, "l2norm": True, "l2norm_eps": _L2_EPS},
    ),
]
