"""Gated Linear Attention (Yang et al., ICML 2024).

    S_t = diag(alpha_t) S_{t-1} + k_t v_t^T,   o_t = S_t^T (s q_t),   S_0 = 0 or initial_state,   S_t in R^{d_k x d_v}

with per-channel data-dependent decays alpha_t in (0, 1]^{d_k}, given as log-decays g_t = log alpha_t
<= 0 (input ``g`` of shape (B, H, N, d_k)). The paper's gate normaliser alpha = sigmoid(z)^{1/tau}
(tau = 16) is ``gate_tau``: the effective log-decay is g / gate_tau, with g = logsigmoid(z).
Unrolled: o_t = sum_{s<=t} (s q_t * exp(b_t - b_s)) . k_s v_s with b_t = sum_{r<=t} g_r.
State bound: |S_t| <= max_s |k_s| |v_s|^T / (1 - alpha_max) entrywise (proofs/gated-state-bound.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..forms import linear_recurrence
from ..hyperparams import scale_value
from ..inputs import channel_log_decay
from ..torch_arith import TORCH
from .common import gated_recurrence
from .spec import Variant


def reference(
    ar: Any,
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    g: Any,
    scale: Any,
    gate_tau: float,
    initial_state: Any = None,
    output_final_state: bool = False,
) -> Any:
    """The definition: the state recurrence, one token at a time (arithmetic-generic), from S_0."""
    s = scale_value(ar, scale, q.shape[-1])
    return gated_recurrence(ar, q * s, k, v, ar.exp(ar.held(g) / gate_tau), initial_state, output_final_state)


def largest_decay(params: Mapping[str, Any], extras: Mapping[str, Any], n_heads: int) -> float:
    """alpha_max = max exp(g / gate_tau) over the drawn log-decays."""
    return float(np.exp(np.asarray(extras["g"], dtype=np.float64) / float(params["gate_tau"])).max())


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
    gate_tau: float,
    initial_state: Any = None,
    output_final_state: bool = False,
) -> Any:
    return linear_recurrence(
        q * scale_value(TORCH, scale, q.shape[-1]),
        k,
        v,
        g / gate_tau,
        causal=True,
        form=form,
        chunk_size=chunk_size,
        initial_state=initial_state,
        output_final_state=output_final_state,
    )


VARIANTS = [
    Variant(
        name="gla",
        family="gla",
        summary="gated linear attention, per-channel data-dependent decay",
        source="Yang et al. 2024, Gated Linear Attention Transformers with Hardware-Efficient Training",
        params={"scale": 1.0, "gate_tau": 1.0},
        forms=("chunked", "recurrent", "parallel"),
        declares=frozenset({"causal", "causal-only", "bounded-state", "gated", "linear-in-v", "state-passing"}),
        reference_fn=reference,
        torch_fn=torch_forward,
        inputs=(channel_log_decay("g"),),
        recurrence="diagonal",
        decay_fn=largest_decay,
    )
]
