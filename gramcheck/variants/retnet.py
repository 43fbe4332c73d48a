"""RetNet retention (Sun et al. 2023, "Retentive Network").

Parallel (the definition used here): O = (((s Q) K^T) * D) V with D_nm = gamma_h^{n-m} for n >= m, else 0;
recurrent: S_n = gamma S_{n-1} + k_n v_n^T, o_n = S_n^T (s q_n); chunked as in gramcheck.forms.
Per-head decay gamma_h = 1 - 2^{-5-h}, h = 0..H-1 (or ``gamma``: one value, or one per head);
s = 1/sqrt(d_k) by default (as fla's naive_retention). ``group_norm`` applies the paper's GroupNorm
(one group per head, no affine) to each head's output, which makes it invariant to scaling V.
xPos rotation of q, k is left to the caller (it is an input transformation).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..forms import accumulation_dtype, linear_recurrence
from ..hyperparams import scale_value
from ..torch_arith import TORCH
from .common import CHUNKED, ORDERS, causal_keep, gated_recurrence, linear_in_order, standardise
from .spec import Variant


def head_gammas(n_heads: int, gamma: Any = None) -> np.ndarray:
    """gamma_h = 1 - 2^{-5-h} (exact in float64), or the given value(s), validated to lie in (0, 1]."""
    if gamma is None:
        out = 1.0 - np.exp2(-5.0 - np.arange(n_heads))
    else:
        values = np.asarray(gamma, dtype=np.float64).reshape(-1)
        if values.size not in (1, n_heads):
            raise ValueError(f"gamma: got {values.size} values; expected 1 or one per head ({n_heads})")
        out = np.broadcast_to(values, (n_heads,)).copy()
    if not np.all((out > 0) & (out <= 1)):
        raise ValueError(f"gamma: got {out.tolist()}; expected decays in (0, 1]")
    return out


def reference(
    ar: Any,
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    gamma: Any,
    scale: Any,
    group_norm: bool,
    norm_eps: float,
    initial_state: Any = None,
    output_final_state: bool = False,
) -> Any:
    """The parallel definition. From a state S_0, or returning the state: the recurrence S_t = gamma_h
    S_{t-1} + k_t v_t^T, o_t = s q_t^T S_t (so o_t gains s q_t^T gamma^{t+1} S_0 and S_N = gamma^N S_0 +
    sum_m gamma^{N-1-m} k_m v_m^T: the state before GroupNorm and without s), which the rounding model
    charges at the state's own size every token, as every form that carries a state rounds it
    (proofs/state-passing.md)."""
    B, H, N, dk = q.shape
    s = scale_value(ar, scale, dk)
    alpha = ar.const(np.broadcast_to(head_gammas(H, gamma)[None, :, None, None], (B, H, N, 1)))
    stateful = initial_state is not None or output_final_state  # then the definition is the recurrent order
    takes = CHUNKED if stateful else ORDERS
    ordered = linear_in_order(ar, q * s, k, v, alpha, initial_state, True, takes) if causal else None
    if ordered is not None:  # a production form's algorithm (common.evaluation_order)
        out, final = ordered
        if group_norm:
            out = standardise(ar, out, norm_eps)
        return (out, final) if output_final_state else out
    if causal and stateful:
        out, final = gated_recurrence(ar, q * s, k, v, alpha, initial_state, output_final_state=True)
        if group_norm:
            out = standardise(ar, out, norm_eps)
        return (out, final) if output_final_state else out
    lags = np.arange(N)[:, None] - np.arange(N)[None, :]
    keep = causal_keep(N)
    log_gamma = ar.log(ar.const(head_gammas(H, gamma)))[:, None, None]  # (H, 1, 1)
    decay = ar.fill(ar.exp(log_gamma * ar.const(np.where(keep, lags, 0))), keep, 0.0)
    qs = q * s  # scaled first, as the recurrent and chunked orders and fla's naive_retention scale
    out = ar.matmul(ar.matmul(qs, ar.mT(k)) * decay, v)
    if initial_state is not None:
        into = ar.exp(log_gamma * ar.const(np.arange(1.0, N + 1.0)[:, None]))  # (H, N, 1): gamma^{t+1}
        out = out + ar.matmul(qs * into, initial_state)
    if group_norm:
        out = standardise(ar, out, norm_eps)
    if not output_final_state:
        return out
    to_end = ar.exp(log_gamma * ar.const(np.arange(N - 1.0, -1.0, -1.0)[:, None]))  # gamma^{N-1-m}
    final = ar.matmul(ar.mT(k * to_end), v)
    if initial_state is not None:
        final = final + ar.exp(log_gamma * float(N)) * initial_state
    return out, final


def norm_tags(params: Mapping[str, Any]) -> frozenset[str]:
    """Without GroupNorm the output is linear in V and the state bound applies to what it reads out."""
    return frozenset() if params["group_norm"] else frozenset({"linear-in-v", "bounded-state"})


def largest_decay(params: Mapping[str, Any], extras: Mapping[str, Any], n_heads: int) -> float:
    """alpha_max = max_h gamma_h."""
    return float(head_gammas(n_heads, params["gamma"]).max())


def torch_forward(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    form: str,
    chunk_size: int,
    gamma: Any,
    scale: Any,
    group_norm: bool,
    norm_eps: float,
    initial_state: Any = None,
    output_final_state: bool = False,
) -> Any:
    import torch

    B, H, N, dk = q.shape
    s = scale_value(TORCH, scale, dk)
    lg = torch.as_tensor(np.log(head_gammas(H, gamma)), dtype=accumulation_dtype(q))
    g = lg.to(q.device).reshape(1, H, 1, 1).expand(B, H, N, 1)
    res = linear_recurrence(
        q * s,
        k,
        v,
        g,
        causal=True,
        form=form,
        chunk_size=chunk_size,
        initial_state=initial_state,
        output_final_state=output_final_state,
    )
    out, final = res if output_final_state else (res, None)
    out = standardise(TORCH, out, norm_eps) if group_norm else out
    return (out, final) if output_final_state else out


VARIANTS = [
    Variant(
        name="retnet",
        family="retnet",
        summary="retention with per-head decay gamma_h = 1 - 2^(-5-h), optional GroupNorm",
        source="Sun et al. 2023, Retentive Network",
        params={"gamma": None, "scale": None, "group_norm": False, "norm_eps": 1e-5},
        forms=("chunked", "recurrent", "parallel"),
        declares=frozenset({"causal", "causal-only", "state-passing"}),
        reference_fn=reference,
        torch_fn=torch_forward,
        recurrence="diagonal",
        tags_fn=norm_tags,
        decay_fn=largest_decay,
    )
]
