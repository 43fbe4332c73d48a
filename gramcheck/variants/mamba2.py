"""Mamba2's state-space duality (SSD) layer (Dao & Gu 2024, "Transformers are SSMs").

    S_t = exp(g_t) S_{t-1} + k_t v_t^T,   o_t = S_t^T (s q_t) + D_h v_t,   S_t in R^{d_k x d_v}

with one data-dependent log-decay g_t = dt_t A_h <= 0 per head and token (input ``g`` of shape (B, H, N)),
q = C, k = B, v = dt * x in the paper's names (the caller forms them), s = ``scale`` (1.0: SSD has no
query scaling) and the optional skip D (``D``: one scalar, or one value per head). Unrolled:
o_t = sum_{s<=t} exp(b_t - b_s) (s q_t . k_s) v_s + D_h v_t, b_t = sum_{r<=t} g_r: the "1-semiseparable"
masked matrix of SSD. The chunked torch form is the SSD algorithm: the quadratic masked product inside a
chunk, exact states passed between chunks (gramcheck.forms with a scalar decay), all decays as exp of
non-positive differences. State passing: ``initial_state`` S_0 (B, H, d_k, d_v), ``output_final_state``
(gramcheck.state). The state obeys |S_t| <= max_s |k_s||v_s|^T / (1 - alpha_max), alpha_max = max exp(g)
(proofs/gated-state-bound.md; ``decay_bound``); with D = 0 the variant declares ``bounded-state``
(the catalogue reads S_t through the output), with D != 0 it does not (proofs/ssm-state-bound.md).

Where fla differs (fla/ops/simple_gla/naive.py, the scalar-decay "simple GLA" that fla's Mamba2 path
uses): layout (B, T, H, K) and g (B, T, H); the default scale is K^-1/2 (here 1.0, as in SSD); no D term
(Mamba2 layers add D v outside the kernel); every naive function computes in float32 whatever the input
dtype, including the cumulative log-decays of ``naive_chunk_simple_gla`` (float32 cumsums lose
b_t - b_s when |b| is large: a strong decay followed by weak ones; gramcheck.forms sums them in float64).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..forms import accumulation_dtype, linear_recurrence
from ..inputs import scalar_log_decay
from ..state import gated_scan, torch_gate_dtype, torch_with_state
from .spec import Variant


def head_skip(n_heads: int, D: Any) -> np.ndarray:
    """D as one float64 value per head: a scalar broadcast, or exactly ``n_heads`` finite values."""
    values = np.asarray(D, dtype=np.float64).reshape(-1)
    if values.size not in (1, n_heads):
        raise ValueError(f"D: got {values.size} values; expected one scalar or one per head ({n_heads})")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"D: got {values.tolist()}; expected finite values")
    return np.broadcast_to(values, (n_heads,)).copy()


def _check_g(g: Any, B: int, H: int, N: int) -> None:
    if tuple(g.shape) != (B, H, N):
        raise ValueError(
            f"g: got shape {tuple(g.shape)}; expected one log-decay per head and token, (B, H, N) = ({B}, {H}, {N})"
        )


def state_tags(params: Mapping[str, Any]) -> frozenset[str]:
    """Without the skip (D = 0) the output reads the state, o_t = s S_t^T q_t, so the catalogue's state
    bound applies to what it reads out; with D != 0 it reads S_t plus D v_t."""
    return frozenset({"bounded-state"}) if np.all(np.asarray(params["D"], dtype=np.float64) == 0) else frozenset()


def decay_bound(params: Mapping[str, Any], extras: Mapping[str, Any], n_heads: int) -> float:
    """alpha_max = max exp(g): the largest one-step decay of the state."""
    return float(np.exp(np.max(np.asarray(extras["g"], dtype=np.float64))))


def reference(
    ar: Any,
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    g: Any,
    scale: float,
    D: Any,
    initial_state: Any = None,
    output_final_state: bool = False,
) -> Any:
    """The definition, one token at a time from S_0 (arithmetic-generic)."""
    B, H, N, dk = q.shape
    _check_g(g, B, H, N)
    out, state = gated_scan(ar, q * scale, k, v, g[..., None], initial_state)
    skip = head_skip(H, D)
    if np.any(skip != 0):
        out = out + ar.const(skip[:, None, None]) * v
    return (out, state) if output_final_state else out


def torch_forward(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    form: str,
    chunk_size: int,
    g: Any,
    scale: float,
    D: Any,
    initial_state: Any = None,
    output_final_state: bool = False,
) -> Any:
    import torch

    B, H, N, dk = q.shape
    _check_g(g, B, H, N)
    # every input cast once (``forms.linear_recurrence``), held in the float32 accumulators until the state's
    # term is added, and stored once
    acc = accumulation_dtype(q)
    qs, ka, va, gg = q.to(acc) * scale, k.to(acc), v.to(acc), g.to(torch_gate_dtype(g))[..., None]
    out = linear_recurrence(qs, ka, va, gg, causal=True, form=form, chunk_size=chunk_size, wide_output=True)
    skip = head_skip(H, D)
    if np.any(skip != 0):
        out = out + torch.as_tensor(skip, dtype=acc, device=q.device).reshape(1, H, 1, 1) * va
    if initial_state is None and not output_final_state:
        return out.to(q.dtype)
    b = gg.cumsum(-2)
    return torch_with_state(out, qs, ka, va, b, b, initial_state, output_final_state, q.dtype)


VARIANTS = [
    Variant(
        name="mamba2",
        family="ssm",
        summary="Mamba2 SSD: scalar data-dependent decay per head and token, optional D skip",
        source="Dao & Gu 2024, Transformers are SSMs (state space duality)",
        params={"scale": 1.0, "D": 0.0},
        forms=("chunked", "recurrent", "parallel"),
        declares=frozenset({"causal", "causal-only", "gated", "linear-in-v", "state-passing"}),
        reference_fn=reference,
        torch_fn=torch_forward,
        inputs=(scalar_log_decay("g"),),
        recurrence="diagonal",
        tags_fn=state_tags,
        decay_fn=decay_bound,
    )
]
