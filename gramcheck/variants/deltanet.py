"""The delta rule: DeltaNet (Schlag et al. 2021; Yang et al. 2024, "Parallelizing Linear Transformers
with the Delta Rule over Sequence Length") and Gated DeltaNet (Yang, Kautz, Hatamizadeh 2025).

    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T (s q_t),
    S_t in R^{d_k x d_v},  S_0 = initial_state (zero by default),

with write strengths beta (B, H, N) in [0, 2] and, for ``gated-deltanet``, scalar log-decays
g = log alpha (B, H, N) <= 0 (one per head and token); ``deltanet`` is alpha = 1. beta outside [0, 2]
is accepted (the definition holds, the contractive bounds do not); g > 0 is rejected. Parameters:
s = ``scale`` (None: d_k^-1/2); ``l2norm`` (True): q and k are replaced by
x / sqrt(sum x^2 + l2norm_eps) inside the variant, as fla's ``use_qk_l2norm_in_kernel``.

With |k_t| <= 1 and beta_t in [0, 2] every transition I - beta_t k_t k_t^T has spectral norm <= 1, so
|S_t|_F <= sum_{s<=t} (prod_{s<r<=t} alpha_r) beta_s |k_s| |v_s|; beta > 2 or |k| > 1 make it expansive
with rate |1 - beta |k|^2| per token; the chunked form's triangular system has an entrywise bounded
inverse in the same regime (proofs/delta-rule.md, gramcheck.bounds_delta).

Against flash-linear-attention (fla-core 0.6.0):
* layout: fla's kernels and ``naive_*_gated_delta_rule`` take (B, T, H, D) and beta, g (B, T, H);
  ``delta_rule/naive.py`` takes (B, H, T, D). gramcheck uses (B, H, N, D) and (B, H, N).
* l2norm: fla computes x * rsqrt(sum x^2 + 1e-6) in float32 (``fla.modules.l2norm``); gramcheck uses
  the same formula and epsilon (``l2norm_eps``, default 1e-6) in the reference arithmetic, and in at
  least float32 in the torch forms. With eps > 0 a zero key stays zero (|k| < 1 slightly otherwise).
  fla's naive references do not normalise at all (they expect normalised inputs): compare with
  l2norm=False there.
* scale: fla's kernels default to d_k^-1/2 as here; ``delta_rule_recurrence`` and
  ``delta_rule_chunkwise`` hard-code d_k^-1/2 (no scale argument).
* precision: ``delta_rule_recurrence`` and the gated naive functions cast to float32 whatever the input
  dtype; ``delta_rule_chunkwise`` computes in the input dtype (float64 stays float64), requires N
  divisible by the chunk size and takes no initial state.
* order: fla applies the decay first and then the delta update, h <- alpha h; h <- h + k (beta (v - h^T k))^T,
  which is exactly alpha (I - beta k k^T) h + beta k v^T as here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..delta_enclosure import enclosure
from ..delta_forms import delta_rule
from ..forms import accumulation_dtype
from ..hyperparams import scale_value
from ..inputs import InputSpec, scalar_log_decay
from .common import chunk_decays, to_chunks
from .spec import Variant

BETA_REGIMES = ("uniform", "sigmoid", "edge", "weak")


def l2_normalise(ar: Any, x: Any, eps: float) -> Any:
    """x / sqrt(sum_i x_i^2 + eps) over the last axis (fla's l2norm)."""
    return x / ar.sqrt(ar.sum(x * x, axis=-1, keepdims=True) + eps)


def queries_and_keys(ar: Any, q: Any, k: Any, scale: Any, l2norm: bool, l2norm_eps: float) -> tuple[Any, Any]:
    """(s q, k), both l2-normalised first when ``l2norm``: what the recurrence reads."""
    if l2norm:
        q, k = l2_normalise(ar, q, l2norm_eps), l2_normalise(ar, k, l2norm_eps)
    return q * scale_value(ar, scale, q.shape[-1]), k


def written_keys(ar: Any, k: Any, *, l2norm: bool, l2norm_eps: float, **_: Any) -> Any:
    """The keys the recurrence writes, k_t in beta_t k_t v_t^T: l2-normalised when ``l2norm``."""
    return l2_normalise(ar, k, l2norm_eps) if l2norm else k


def reference(
    ar: Any,
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    beta: Any,
    g: Any = None,
    scale: Any,
    l2norm: bool,
    l2norm_eps: float,
    initial_state: Any = None,
    output_final_state: bool = False,
) -> Any:
    """The definition, token by token: S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,
    written as S_t = alpha_t S_{t-1} + beta_t k_t (v_t - alpha_t S_{t-1}^T k_t)^T (the same expression,
    without the d_k x d_k matrix), o_t = S_t^T (s q_t). q, k (B, H, N, d_k), v (B, H, N, d_v),
    beta, g (B, H, N); returns o (B, H, N, d_v), or (o, S_N) when ``output_final_state``."""
    B, H, N, dk = q.shape
    q, k = queries_and_keys(ar, q, k, scale, l2norm, l2norm_eps)
    state = ar.held(ar.zeros((B, H, dk, v.shape[-1])) if initial_state is None else initial_state)
    alpha = None if g is None else ar.exp(ar.held(g))
    outs = []
    for t in range(N):
        if alpha is not None:
            state = alpha[:, :, t, None, None] * state
        kt = k[:, :, t]
        delta = beta[:, :, t, None] * (v[:, :, t] - ar.matmul(kt[:, :, None, :], state)[:, :, 0, :])
        state = state + kt[:, :, :, None] * delta[:, :, None, :]
        outs.append(ar.matmul(q[:, :, t, None, :], state)[:, :, 0, :])
    out = ar.stack(outs, axis=2)
    return (out, state) if output_final_state else out


YARDSTICK_CHUNK = 64  # fla's BT and the builtin chunked form's default


def chunked_reference(
    ar: Any,
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    beta: Any,
    g: Any = None,
    scale: Any,
    l2norm: bool,
    l2norm_eps: float,
    initial_state: Any = None,
    output_final_state: bool = False,
    inverse: bool = False,
) -> Any:
    """The same output by the chunked WY / UT algorithm (gramcheck.delta_forms, chunks of 64 tokens): per
    chunk, Delta solves (I + A) Delta = diag(beta) (V - diag(P) K S_0) by forward substitution, with
    A = strictly_lower(diag(beta) (K K^T * Gamma)), Gamma_ts = prod_{s<r<=t} alpha_r and P_t = prod_{r<=t}
    alpha_r (products of the decays, as accurate as the recurrence's), then
    O = (P * Q) S_0 + ((Q K^T) * Gamma) Delta and S_c = P_c S_0 + (Gamma_c * K)^T Delta.
    Equal to ``reference`` in exact arithmetic; in a low precision it errs more where the chunk's
    triangular system is ill-conditioned (d_k <= 2: keys +-1), so the low-precision rules take the larger
    of the two errors as their yardstick (proofs/low-precision-rule.md). ``inverse``: T = (I + A)^{-1} formed
    first, by the same substitution on the identity, and Delta = T rhs (``chunked_inverse_reference``)."""
    B, H, N, dk = q.shape
    dv = v.shape[-1]
    q, k = queries_and_keys(ar, q, k, scale, l2norm, l2norm_eps)
    c = YARDSTICK_CHUNK
    qc, kc, vc = (to_chunks(ar, x, c) for x in (q, k, v))
    bc = to_chunks(ar, beta, c)  # padding tokens have beta = 0 and alpha = 1: they leave the state unchanged
    nc = qc.shape[2]
    incl = np.tril(np.ones((c, c), dtype=bool))
    strict = np.tril(np.ones((c, c), dtype=bool), -1)
    if g is None:
        gamma, p_in, k_out, carry = None, None, kc, None
    else:
        gamma, p_in = chunk_decays(ar, to_chunks(ar, ar.exp(ar.held(g)), c, fill=1.0))
        k_out = kc * gamma[..., c - 1, :, None]  # decay from s to the chunk's end
        carry = p_in[..., c - 1]
    kk = ar.matmul(ar.held(kc), ar.mT(kc))  # the chunk's system is formed and solved in float32
    lower = ar.fill(bc[..., None] * (kk if gamma is None else kk * gamma), strict, 0.0)
    kd = kc if p_in is None else kc * p_in[..., None]
    rhs = ar.held(bc[..., None]) * ar.concat([vc, kd], axis=-1)  # diag(beta) [V, P K]
    if inverse:
        rhs_sub = ar.held(ar.fill(ar.zeros(lower.shape) + 1.0, np.eye(c, dtype=bool), 0.0))  # T = (I + A)^{-1}
    else:
        rhs_sub = rhs
    sol = [rhs_sub[..., 0, :]]
    for i in range(1, c):  # forward substitution, row by row
        done = ar.stack(sol, axis=-2)
        sol.append(rhs_sub[..., i, :] - ar.matmul(lower[..., i : i + 1, :i], done)[..., 0, :])
    uw = ar.matmul(ar.stack(sol, axis=-2), rhs) if inverse else ar.stack(sol, axis=-2)
    u, w = uw[..., :dv], uw[..., dv:]
    qk = ar.matmul(qc, ar.mT(kc))
    scores = ar.fill(qk if gamma is None else qk * gamma, incl, 0.0)
    q_in = qc if p_in is None else qc * p_in[..., None]
    state = ar.held(ar.zeros((B, H, dk, dv)) if initial_state is None else initial_state)
    outs = []
    for i in range(nc):
        delta = u[:, :, i] - ar.matmul(w[:, :, i], state)
        outs.append(ar.matmul(q_in[:, :, i], state) + ar.matmul(scores[:, :, i], delta))
        if carry is not None:
            state = carry[:, :, i, None, None] * state
        state = state + ar.matmul(ar.mT(k_out[:, :, i]), delta)
    out = ar.stack(outs, axis=2).reshape(B, H, nc * c, dv)[:, :, :N]
    return (out, state) if output_final_state else out


def chunked_inverse_reference(ar: Any, q: Any, k: Any, v: Any, **kw: Any) -> Any:
    """The chunked algorithm with the chunk's inverse T = (I + A)^{-1} formed explicitly and applied as a
    product (``chunked_reference`` with ``inverse``): what fla's kernels (``solve_tril``) and transformers'
    torch_chunk_gated_delta_rule compute. Its rounding differs from the substitution's most where the triangular
    system is ill-conditioned (d_k = 1: keys +-1): transformers' form erred 3 times the substitution's there
    (float32, N = 160), within what this yardstick errs (up to 1.9 times the substitution's, 1.3 at d_k = 4)."""
    return chunked_reference(ar, q, k, v, inverse=True, **kw)


def torch_forward(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    form: str,
    chunk_size: int,
    beta: Any,
    g: Any = None,
    scale: Any,
    l2norm: bool,
    l2norm_eps: float,
    initial_state: Any = None,
    output_final_state: bool = False,
) -> Any:
    """The torch forms of gramcheck.delta_forms (``chunked``: WY / UT representation; ``recurrent``),
    after the l2 normalisation (in at least float32) and the scale."""
    from ..torch_arith import TORCH

    dtype = q.dtype
    acc = accumulation_dtype(dtype)
    qa, ka = queries_and_keys(TORCH, q.to(acc), k.to(acc), scale, l2norm, l2norm_eps)
    res = delta_rule(
        qa,
        ka,
        v,
        beta,
        g,
        form=form,
        chunk_size=chunk_size,
        initial_state=initial_state,
        output_final_state=output_final_state,
    )
    if output_final_state:
        return res[0].to(dtype), res[1]
    return res.to(dtype)


# --------------------------------------------------------------------------------------------------
# input draws (for the strategies): write strengths, and inputs outside the contractive regime
# --------------------------------------------------------------------------------------------------
def draw_beta(rng: np.random.Generator, shape: tuple[int, ...], regime: str = "uniform") -> np.ndarray:
    """Write strengths: ``uniform`` on [0, 2]; ``sigmoid`` in (0, 1) (fla's usual beta = sigmoid(x));
    ``edge``: each entry 0, 1 or 2 exactly (erase-nothing, overwrite, reflect); ``weak``: in [0, 0.05], writes
    that barely touch a long-lived state (sigmoid(x) for x < -3; a carried state's own rounding is then not erased
    by the writes, as in a decode loop); ``expansive`` (drawn
    only when a domain asks for it): in (2, 3], where the transition along k_t has |1 - beta| > 1."""
    if regime == "expansive":
        return 3.0 - rng.uniform(0.0, 0.95, shape)
    if regime == "uniform":
        return rng.uniform(0.0, 2.0, shape)
    if regime == "sigmoid":
        return 1.0 / (1.0 + np.exp(-rng.standard_normal(shape)))
    if regime == "edge":
        return rng.choice(np.array([0.0, 1.0, 2.0]), size=shape)
    if regime == "weak":
        return rng.uniform(0.0, 0.05, shape)
    raise ValueError(f"regime: got {regime!r}; expected one of {BETA_REGIMES}")


def expansive_inputs(
    rng: np.random.Generator, B: int, H: int, N: int, d: int, *, mode: str = "beta", gated: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray], dict[str, Any]]:
    """(q, k, v, extras, params) outside the contractive regime, where the state grows geometrically:
    one repeated key per head and values of alternating sign, so every update adds to the state.

    ``mode="beta"``: unit keys (l2norm=True) and beta = 2.5: the transition's eigenvalue along k is
    1 - 2.5 = -1.5 (growth 1.5 per token). ``mode="norm"``: keys of norm 1.5 with l2norm=False and
    beta = 1: eigenvalue 1 - 2.25 = -1.25. ``gated`` adds g = log(0.999) (still expansive)."""
    if mode not in ("beta", "norm"):
        raise ValueError(f"mode: got {mode!r}; expected 'beta' or 'norm'")
    key = rng.standard_normal((B, H, 1, d))
    key /= np.linalg.norm(key, axis=-1, keepdims=True)
    k = np.repeat(key, N, axis=2)
    sign = np.where(np.arange(N) % 2 == 0, 1.0, -1.0)[None, None, :, None]
    v = sign * np.abs(rng.standard_normal((B, H, 1, d)))
    q = k.copy()
    if mode == "beta":
        extras = {"beta": np.full((B, H, N), 2.5)}
        params: dict[str, Any] = {"l2norm": True}
    else:
        k = 1.5 * k
        extras = {"beta": np.ones((B, H, N))}
        params = {"l2norm": False}
    if gated:
        extras["g"] = np.full((B, H, N), math.log(0.999))
    return q, k, v, extras, params


_PARAMS = {"scale": None, "l2norm": True, "l2norm_eps": 1e-6}
# beta beyond 2 is accepted (the expansive regime is evaluated, not refused); draws stay in [0, 2] unless
# a domain asks for the "expansive" regime
BETA = InputSpec(
    "beta", ("B", "H", "N"), draw_beta, BETA_REGIMES, "uniform", low=0.0, summary="write strengths >= 0",
    on_request=("expansive",),
)
_TAGS = frozenset({"causal", "causal-only", "linear-in-v", "state-passing", "contracting-transitions"})


def l2norm_tags(params: Mapping[str, Any]) -> frozenset[str]:
    """With q and k l2-normalised inside, positive row scalings of q or k change nothing (beyond eps)."""
    return frozenset({"qk-scale-invariant"}) if params["l2norm"] else frozenset()


VARIANTS = [
    Variant(
        name="deltanet",
        family="delta-rule",
        summary="delta rule S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, l2-normalised q, k",
        source="Yang et al. 2024, Parallelizing Linear Transformers with the Delta Rule over Sequence Length",
        params=dict(_PARAMS),
        forms=("chunked", "recurrent"),
        declares=_TAGS,
        reference_fn=reference,
        enclosure_fn=enclosure,
        algorithms_fn=(chunked_reference, chunked_inverse_reference),
        torch_fn=torch_forward,
        inputs=(BETA,),
        recurrence="delta",
        tags_fn=l2norm_tags,
        written_keys_fn=written_keys,
    ),
    Variant(
        name="gated-deltanet",
        family="delta-rule",
        summary="gated delta rule, scalar decay alpha_t = exp(g_t) per head and token",
        source="Yang, Kautz, Hatamizadeh 2025, Gated Delta Networks: Improving Mamba2 with Delta Rule",
        params=dict(_PARAMS),
        forms=("chunked", "recurrent"),
        declares=_TAGS | {"gated"},
        reference_fn=reference,
        enclosure_fn=enclosure,
        algorithms_fn=(chunked_reference, chunked_inverse_reference),
        torch_fn=torch_forward,
        inputs=(scalar_log_decay("g"), BETA),
        recurrence="delta",
        tags_fn=l2norm_tags,
        written_keys_fn=written_keys,
    ),
]
