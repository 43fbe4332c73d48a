"""Real bugs of GLA's chunked intra-chunk decay, QK normalisation (l2 and LayerNorm) and TransNormer's output
RMSNorm (attention-gym's KDA kernel expressed on GLA, axlearn's L2Norm, TIM-VX's LayerNormalization, OLMo's
RMSNorm), each re-implemented in plain torch as a ``buggy`` target and its upstream-fixed ``fixed`` twin that
differ only by the bug (benchmarks/bugset/cases.py). Complements benchmarks/bugset/feature_maps.py and
feature_maps_more.py (other sources).

Every target follows gramcheck's convention ``fn(q, k, v, *, causal, **extras)`` on (B, H, N, d) tensors and
works in any float dtype on CPU (float64 for the gradient checks); the shared, bug-free parts are written once
below (those other modules use too in benchmarks/bugset/common.py) and used by both twins.

No Based (Taylor feature map) case: the two Based threads found (HazyResearch/based#11, fla#426, both on the
quadratic term x x^T versus (q.k)^2) were closed as the reporter's misreading, not bugs.
"""

from __future__ import annotations

import math

import torch

from benchmarks.bugset.cases import Case
from benchmarks.bugset.common import acc_dtype, as_output, causal_softmax

# --------------------------------------------------------------------------------------------------
# shared helpers (identical in both twins of every case)
# --------------------------------------------------------------------------------------------------


def _tril(n, device):
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def _elu1(x):
    """elu(x) + 1 evaluated branch by branch: x + 1 (x > 0), exp(x) (x <= 0); no cancellation."""
    return torch.where(x > 0, x + 1.0, torch.exp(torch.clamp(x, max=0.0)))


def _qknorm_softmax(q, k, v, causal, tau, norm):
    """softmax(tau n(q) . n(k)) V with ``norm`` applied to each q and k row in the accumulation dtype (the
    qknorm-softmax variant: q' = sqrt(tau) n(q), k' = sqrt(tau) n(k), unit logit scale)."""
    acc = acc_dtype(q)
    qn, kn = norm(q.to(acc)) * math.sqrt(tau), norm(k.to(acc)) * math.sqrt(tau)
    return causal_softmax(qn @ kn.transpose(-1, -2), v.to(acc), causal).to(q.dtype)


# --------------------------------------------------------------------------------------------------
# 1. attention-gym PR #337: chunked KDA's intra-chunk decay rebased on a future row (the sub-chunk midpoint)
# --------------------------------------------------------------------------------------------------

_BC = 16  # the sub-chunk of KDA's intra-chunk stage (fla's chunk_kda / attention-gym's KDA kernel)
_LOG2E = 1.0 / math.log(2.0)


def _gla_chunked(q, k, v, g, s0, *, causal_reference):
    """GLA (scale 1, gate_tau 1) by chunks of _BC tokens, in the accumulation dtype. Inside a chunk, with b the
    inclusive cumulative log2-decay from the chunk's start, the decay 2^(b_i - b_j) is rebased on a reference
    row r, 2^(b_i - b_r) 2^(b_r - b_j), so that the intra-chunk scores are one matmul (KDA's Aqk has this form:
    KDA is GLA's per-channel decay plus the delta rule). ``causal_reference``: r = the chunk's first row (in the
    past of every row it serves); else r = the midpoint min(_BC // 2, L - 1), a future row for the first half
    of the chunk. Equal in exact arithmetic; the causal mask is applied after the product. Between chunks the
    state S (d_k, d_v) carries the prefix: o_i += (q_i 2^(b_i)) S, S <- diag(2^(b_last)) S + sum_j
    (k_j 2^(b_last - b_j)) v_j^T."""
    B, H, N, dk = q.shape
    acc = acc_dtype(q)
    qa, ka, va, ga = q.to(acc), k.to(acc), v.to(acc), g.to(acc)
    state = q.new_zeros(B, H, dk, v.shape[-1], dtype=acc) if s0 is None else s0.to(acc)
    outs = []
    for s in range(0, N, _BC):
        e = min(s + _BC, N)
        n = e - s
        b = ga[:, :, s:e].cumsum(2) * _LOG2E
        row = 0 if causal_reference else min(_BC // 2, n - 1)
        r = b[:, :, row : row + 1]
        qs, ks, vs = qa[:, :, s:e], ka[:, :, s:e], va[:, :, s:e]
        scores = (qs * torch.exp2(b - r)) @ (ks * torch.exp2(r - b)).transpose(-1, -2)
        scores = scores.masked_fill(~_tril(n, q.device), 0.0)
        outs.append(scores @ vs + (qs * torch.exp2(b)) @ state)
        last = b[:, :, -1:]
        state = torch.exp2(last).transpose(-1, -2) * state + (ks * torch.exp2(last - b)).transpose(-1, -2) @ vs
    return torch.cat(outs, dim=2), state


def attngym337_gla_midpoint_reference_buggy(q, k, v, *, causal, g, initial_state=None, output_final_state=False):
    """attention-gym's KDA forward before PR #337: the diagonal stage was launched with CAUSAL_NORMREF=False,
    rebasing the intra-chunk decay on the sub-chunk's midpoint row; the reference cancels in exact arithmetic,
    not in floating point, so replacing a future token's gate changes past outputs' rounding."""
    out, state = _gla_chunked(q, k, v, g, initial_state, causal_reference=False)
    return as_output(out, state, q.dtype, output_final_state)


def attngym337_gla_midpoint_reference_fixed(q, k, v, *, causal, g, initial_state=None, output_final_state=False):
    """PR #337: CAUSAL_NORMREF=True, the reference is a row in the past of every row it serves (the first)."""
    out, state = _gla_chunked(q, k, v, g, initial_state, causal_reference=True)
    return as_output(out, state, q.dtype, output_final_state)


# --------------------------------------------------------------------------------------------------
# 2. axlearn PR #21: L2Norm with eps inside the square root (x / sqrt(sum x^2 + eps))
# --------------------------------------------------------------------------------------------------

_AX_EPS = 1e-8  # axlearn's L2Norm default
_AX_TAU = 1.0


def _l2_eps_in_sqrt(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + _AX_EPS)


def _l2_clamped(x):
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(_AX_EPS)


def axlearn21_l2norm_eps_in_sqrt_buggy(q, k, v, *, causal):
    """axlearn's L2Norm before PR #21: x / sqrt(sum x^2 + eps), eps = 1e-8; a row of norm ~1e-4 is shrunk by
    1/sqrt(2) (the PR's example: L2Norm([[3e-5]]) = 0.28, not 1). Here as the QK normalisation of QKNorm
    (Henry et al. 2020), whose logits are tau n(q).n(k)."""
    return _qknorm_softmax(q, k, v, causal, _AX_TAU, _l2_eps_in_sqrt)


def axlearn21_l2norm_eps_in_sqrt_fixed(q, k, v, *, causal):
    """PR #21: x / max(||x||, eps), as torch.nn.functional.normalize: exactly x / ||x|| for ||x|| >= 1e-8."""
    return _qknorm_softmax(q, k, v, causal, _AX_TAU, _l2_clamped)


# --------------------------------------------------------------------------------------------------
# 3. TIM-VX PR #589: LayerNormalization's eps never set (always 0): constant rows give 0 / 0 = NaN
# --------------------------------------------------------------------------------------------------

_LN_EPS = 1e-5  # the ONNX / torch LayerNorm default
_LN_TAU = 1.0


def _layernorm(x, eps):
    """(x - mean) / sqrt(var + eps) over the last axis (population variance), no affine."""
    c = x - x.mean(-1, keepdim=True)
    return c / torch.sqrt((c * c).mean(-1, keepdim=True) + eps)


def timvx589_layernorm_eps_dropped_buggy(q, k, v, *, causal):
    """TIM-VX before PR #589: the LayerNormalization's eps was read with the wrong type and parameters and was
    always 0, so a row with zero variance (all entries equal, or a zero row) normalises to 0 / 0 = NaN (the
    PR's test: a row of 2s gave -nan). Here as LayerNorm QK normalisation (q' = sqrt(tau / d) LN(q))."""
    d = q.shape[-1]
    return _qknorm_softmax(q, k, v, causal, _LN_TAU / d, lambda x: _layernorm(x, 0.0))


def timvx589_layernorm_eps_dropped_fixed(q, k, v, *, causal):
    """PR #589: the configured eps reaches the kernel: (x - mean) / sqrt(var + eps)."""
    d = q.shape[-1]
    return _qknorm_softmax(q, k, v, causal, _LN_TAU / d, lambda x: _layernorm(x, _LN_EPS))


# --------------------------------------------------------------------------------------------------
# 4. OLMo #281: RMSNorm as x / (rms(x) + eps), eps outside the square root (as TransNormer's output norm)
# --------------------------------------------------------------------------------------------------

_OLMO_EPS = 1e-5  # OLMo's RMSLayerNorm default


def _norm_attention_numerator(q, k, v, causal):
    """phi(Q) (phi(K)^T V) with phi = elu + 1, causal: masked (TransNormer's NormAttention, no denominator)."""
    acc = acc_dtype(q)
    fq, fk, va = _elu1(q.to(acc)), _elu1(k.to(acc)), v.to(acc)
    a = fq @ fk.transpose(-1, -2)
    if causal:
        a = a.masked_fill(~_tril(q.shape[-2], q.device), 0.0)
    return a @ va


def olmo281_rmsnorm_eps_outside_sqrt_buggy(q, k, v, *, causal):
    """OLMo's RMSLayerNorm as reported in #281: rms = ||x|| d^-1/2, x / (rms + eps), the eps added to the RMS,
    not to the mean square (x / sqrt(mean(x^2) + eps) as llama's). Applied as NormAttention's output
    RMSNorm (unit gain) on phi(Q)(phi(K)^T V)."""
    u = _norm_attention_numerator(q, k, v, causal)
    rms = torch.linalg.vector_norm(u, dim=-1, keepdim=True) * u.shape[-1] ** -0.5
    return (u / (rms + _OLMO_EPS)).to(q.dtype)


def olmo281_rmsnorm_eps_outside_sqrt_fixed(q, k, v, *, causal):
    """OLMo's later RMSLayerNorm: x * rsqrt(mean(x^2) + eps)."""
    u = _norm_attention_numerator(q, k, v, causal)
    return (u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + _OLMO_EPS)).to(q.dtype)


# --------------------------------------------------------------------------------------------------
# the cases
# --------------------------------------------------------------------------------------------------

CASES: list[Case] = [
    # trigger: causal, a chunk whose midpoint row lies after the cut t (replacing tokens > t, gates included,
    # changes the rounding of rows <= t): bit-exact causality. Gates within KDA's safe_gate contract
    # (per-token log-decay >= lower_bound = -5; 'long-memory' only: 'short-memory' / 'extreme' decays overflow
    # 2^(b_r - b_j) in float32 in both twins, the kernel's stated precondition)
    Case(
        id="attention-gym-337-kda-intra-chunk-future-reference",
        source="https://github.com/meta-pytorch/attention-gym/pull/337",
        summary=(
            "The chunked KDA forward rebased the intra-chunk decay 2^(g_i - g_j) as 2^(g_i - ref) 2^(ref - g_j) to "
            "make it a matmul, with ref taken from the sub-chunk midpoint (the diagonal stage was launched with "
            "CAUSAL_NORMREF=False): a future row for half the sub-chunk, so perturbing only future tokens changed "
            "causal-prefix outputs through rounding (found by fuzzing); PR #337 launches it with "
            "CAUSAL_NORMREF=True, a reference in the past of every row. Expressed on GLA (KDA's Aqk without the "
            "delta rule), sub-chunks of 16."
        ),
        kind="chunk-boundary",
        variant="gla",
        buggy=attngym337_gla_midpoint_reference_buggy,
        fixed=attngym337_gla_midpoint_reference_fixed,
        causal=True,
        params={"scale": 1.0, "gate_tau": 1.0},
        domain={"gates": ("long-memory",)},
    ),
    # trigger: a q or k row of norm <~ 1e-3 (sum x^2 comparable with 1e-8): its normalised row is shrunk
    Case(
        id="axlearn-21-l2norm-eps-inside-sqrt",
        source="https://github.com/apple/axlearn/pull/21",
        summary=(
            "axlearn's L2Norm computed x / sqrt(sum x^2 + eps) (eps = 1e-8), which is not unit-norm for small "
            "inputs (L2Norm([[3e-5]]) = 0.28); PR #21 computes x / max(||x||, eps) as "
            "torch.nn.functional.normalize. Expressed as QKNorm's l2 normalisation of q and k (norm_eps 0)."
        ),
        kind="normaliser",
        variant="qknorm-softmax",
        buggy=axlearn21_l2norm_eps_in_sqrt_buggy,
        fixed=axlearn21_l2norm_eps_in_sqrt_fixed,
        causal=True,
        params={"norm": "l2", "tau": _AX_TAU, "norm_eps": 0.0},
    ),
    # trigger: a q or k row of zero variance (a zero row, d = 1, or equal entries): NaN
    Case(
        id="tim-vx-589-layernorm-eps-always-zero",
        source="https://github.com/VeriSilicon/TIM-VX/pull/589",
        summary=(
            "TIM-VX's LayerNormalization passed eps with the wrong data type and parameters, so the kernel always "
            "used eps = 0 and a constant row normalised to NaN; PR #589 passes the configured eps. Expressed as "
            "LayerNorm QK normalisation (no affine, eps 1e-5)."
        ),
        kind="normaliser",
        variant="qknorm-softmax",
        buggy=timvx589_layernorm_eps_dropped_buggy,
        fixed=timvx589_layernorm_eps_dropped_fixed,
        causal=True,
        params={"norm": "layernorm", "tau": _LN_TAU, "norm_eps": _LN_EPS},
    ),
    # trigger: an output row of phi(Q)(phi(K)^T V) with RMS <~ 0.1 (eps / rms against eps / (2 rms^2)), e.g.
    # small V (v-scale-invariance) or cancelling values
    Case(
        id="olmo-281-rmsnorm-eps-outside-sqrt",
        source="https://github.com/allenai/OLMo/issues/281",
        summary=(
            "OLMo's RMSNorm computed x / (||x|| d^-1/2 + eps), the eps outside the square root, unlike llama's "
            "x * rsqrt(mean(x^2) + eps) (issue #281, type/bug); OLMo's RMSLayerNorm later computes the latter. "
            "Expressed as TransNormer NormAttention's output RMSNorm (unit gain, eps 1e-5)."
        ),
        kind="normaliser",
        variant="transnormer-norm",
        buggy=olmo281_rmsnorm_eps_outside_sqrt_buggy,
        fixed=olmo281_rmsnorm_eps_outside_sqrt_fixed,
        causal=True,
        params={"feature": "elu1", "norm": "rmsnorm", "gain": 1.0, "norm_eps": _OLMO_EPS},
    ),
]
