"""RWKV-6 "Finch" time mixing (Peng et al. 2024, "Eagle and Finch").

    o_t = (s r_t)^T (S_{t-1} + diag(u) k_t v_t^T),   S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,   S_0 = 0

with per-channel data-dependent log-decays g (B, H, N, d_k) <= 0 (fla's ``w``; the paper's w_t =
exp(-exp(x))), the bonus u (H, d_k) for the current token, receptance r (= q, (B, H, N, d_k)) and
s = ``scale`` (default d_k^-1/2, fla's default; RWKV-6 layers call the kernel with scale 1.0). The state
enters exclusively: o_t sees the decays of the tokens before t, the current token only through u:
o_t = sum_{s<t} (s r_t * exp(b_{t-1} - b_s)) . k_s v_s + (s r_t * u . k_t) v_t, b_t = sum_{r<=t} g_r.

Torch forms without dividing by a decay: S_{t-1} is the state at t of the same gated recurrence run on the
inputs shifted by one token, k'_t = k_{t-1}, v'_t = v_{t-1}, g'_t = g_{t-1} (k'_1 = v'_1 = g'_1 = 0):
S'_t = exp(g_{t-1}) S_{t-2} + k_{t-1} v_{t-1}^T = S_{t-1}. So o_t = gramcheck.forms.linear_recurrence(
s r, k', v', g') + (s r_t * u . k_t) v_t, and every form (parallel, recurrent, chunked) keeps its decays as
exp(b'_t - b'_s) with t >= s: no exponent is positive. A form that gets the exclusive decay by dividing the
inclusive one, exp(b_t) / exp(g_t), or that factors exp(b_{t-1} - b_s) as exp(b_{t-1}) exp(-b_s), overflows
once a cumulative decay passes -88 in float32 (the bug fla's chunked RWKV-6 had at a chunk's first
position); tests/test_new_variants.py shows such a form failing where these pass. State passing:
``initial_state`` S_0 enters o_t as (s r_t * exp(b_{t-1}))^T S_0, the final state is S_N
(gramcheck.state). |S_t| <= max_s |k_s||v_s|^T / (1 - alpha_max) with alpha_max = max exp(g)
(proofs/gated-state-bound.md), but o_t reads S_{t-1} plus the bonus, so the catalogue's state-bound
property (which reads S_t through unit queries) does not apply: ``bounded-state`` is not declared and the
bound is tested on the final state.

Where fla differs (fla/ops/rwkv6/recurrent_naive.py ``naive_recurrent_rwkv6``, chunk_naive.py
``naive_chunk_rwkv6``): same formula and layout (B, H, T, K), u (H, K); both compute in float32 whatever
the input dtype. naive_chunk_rwkv6 needs T to be a multiple of its chunk size, takes no scale (none is
applied) and forms the intra-chunk scores as exp(b_{t-1} - b_s) for every pair, masking afterwards: above
the diagonal the exponent is positive and can overflow to inf before the mask replaces it (harmless there
because masked_fill overwrites; a multiply-by-mask would give NaN).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..forms import accumulation_dtype, linear_recurrence
from ..hyperparams import scale_value
from ..inputs import channel_log_decay, head_channel
from ..state import torch_gate_dtype, torch_with_state
from ..torch_arith import TORCH
from .spec import Variant


def _check_extras(g: Any, u: Any, B: int, H: int, N: int, dk: int) -> None:
    if tuple(g.shape) != (B, H, N, dk):
        raise ValueError(
            f"g: got shape {tuple(g.shape)}; expected per-channel log-decays (B, H, N, d_k) = ({B}, {H}, {N}, {dk})"
        )
    if tuple(u.shape) != (H, dk):
        raise ValueError(
            f"u: got shape {tuple(u.shape)}; expected the bonus per head and channel (H, d_k) = ({H}, {dk})"
        )


def decay_bound(params: Mapping[str, Any], extras: Mapping[str, Any], n_heads: int) -> float:
    """alpha_max = max exp(g): the largest one-step decay of the state S_t (not of the readout)."""
    return float(np.exp(np.max(np.asarray(extras["g"], dtype=np.float64))))


def reference(
    ar: Any,
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    g: Any,
    u: Any,
    scale: float | None,
    initial_state: Any = None,
    output_final_state: bool = False,
) -> Any:
    """The definition, one token at a time from S_0 (arithmetic-generic)."""
    B, H, N, dk = q.shape
    _check_extras(g, u, B, H, N, dk)
    s = scale_value(ar, scale, dk)
    r = q * s
    alpha = ar.exp(ar.held(g))
    bonus = u[None, :, :, None]  # (1, H, d_k, 1)
    state = ar.held(ar.zeros((B, H, dk, v.shape[-1])) if initial_state is None else initial_state)
    outs = []
    for t in range(N):
        kv = k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append(ar.matmul(r[:, :, t, None, :], state + bonus * kv)[:, :, 0, :])
        state = alpha[:, :, t, :, None] * state + kv
    out = ar.stack(outs, axis=2)
    return (out, state) if output_final_state else out


def shift_one(x: Any) -> Any:
    """x_{t-1} along the token axis (-2), zero at t = 1: (B, H, N, e) -> (B, H, N, e)."""
    import torch

    return torch.cat([x.new_zeros(*x.shape[:-2], 1, x.shape[-1]), x[..., :-1, :]], dim=-2)


def torch_forward(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    form: str,
    chunk_size: int,
    g: Any,
    u: Any,
    scale: float | None,
    initial_state: Any = None,
    output_final_state: bool = False,
) -> Any:
    B, H, N, dk = q.shape
    _check_extras(g, u, B, H, N, dk)
    # every input cast once, as a kernel loads it (two casts of a float16 tensor round their gradients' parts to
    # float16 apart, and the parts overflow where the gradient does not); the past tokens' and the bonus term's
    # sum taken in the float32 accumulators and stored once, as the kernels do: each overflows float16 where
    # their sum need not
    acc = accumulation_dtype(q)
    r, ka, va, ua = q.to(acc) * scale_value(TORCH, scale, dk), k.to(acc), v.to(acc), u.to(acc)
    gg = g.to(torch_gate_dtype(g))
    g_prev = shift_one(gg)
    out = linear_recurrence(
        r, shift_one(ka), shift_one(va), g_prev, causal=True, form=form, chunk_size=chunk_size, wide_output=True
    )
    current = (r * ua[None, :, None, :] * ka).sum(-1, keepdim=True) * va
    out = out + current  # stored once, after the state's term is added
    if initial_state is None and not output_final_state:
        return out.to(q.dtype)
    b_in, b = g_prev.cumsum(-2), gg.cumsum(-2)
    return torch_with_state(out, r, ka, va, b_in, b, initial_state, output_final_state, q.dtype)


VARIANTS = [
    Variant(
        name="rwkv6",
        family="rwkv",
        summary="RWKV-6: per-channel data-dependent decay, exclusive state, bonus u for the current token",
        source="Peng et al. 2024, Eagle and Finch: RWKV with Matrix-Valued States and Dynamic Recurrence",
        params={"scale": None},
        forms=("chunked", "recurrent", "parallel"),
        declares=frozenset({"causal", "causal-only", "gated", "linear-in-v", "state-passing"}),
        reference_fn=reference,
        torch_fn=torch_forward,
        inputs=(channel_log_decay("g"), head_channel("u")),
        recurrence="diagonal",
        decay_fn=decay_bound,
    )
]
