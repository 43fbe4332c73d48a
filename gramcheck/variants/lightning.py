"""Lightning Attention-2 (Qin et al. 2024; the attention of TransNormerLLM): linear attention with a fixed
per-head decay, computed as intra-block masked products plus inter-block state passing.

    o_t = sum_{s<=t} lambda_h^{t-s} (s q_t . k_s) v_s,   i.e.  S_t = lambda_h S_{t-1} + k_t v_t^T, o_t = S_t^T (s q_t)

with s = ``scale`` (default d_k^-1/2) and fla's slope schedule log lambda_h = -(8 / H)(1 - l / L) h for
h = 0..H-1, l = ``layer_idx``, L = ``num_layers`` (computed in float64 here). Head 0 has lambda = 1 (no
decay) in every layer, and layer l = L has no decay in any head, so the state is unbounded in general:
the variant does not declare ``bounded-state``; for heads with lambda_h < 1 the bound of
proofs/gated-state-bound.md holds with alpha = lambda_h (``decay_bound`` gives the largest lambda).
The torch forms are gramcheck.forms with the constant scalar decay (the chunked form is the
intra-/inter-block algorithm). State passing: ``initial_state``, ``output_final_state`` (gramcheck.state).

Where fla differs (fla/ops/lightning_attn/{chunk,fused_recurrent}.py call simple_gla with g_gamma): fla
computes g_gamma in float32 (torch.float), so its decays are the float32 rounding of these (relative
error 2^-24 in log lambda, (t - s) |log lambda| 2^-24 in lambda^{t-s}); layout (B, T, H, K). fla has no
naive file for lightning attention: the naive reference is naive_recurrent_simple_gla with g = g_gamma.
The paper's TransNormerLLM code uses ALiBi-style slopes 2^{-8(h+1)/H} scaled by (1 - l/(L-1)); this
variant follows fla, as the conventions ask.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..forms import accumulation_dtype, linear_recurrence
from ..hyperparams import scale_value
from ..state import gated_scan, torch_gate_dtype, torch_with_state
from ..torch_arith import TORCH
from .spec import Variant


def log_decays(n_heads: int, layer_idx: int, num_layers: int) -> np.ndarray:
    """log lambda_h = -(8 / H)(1 - l / L) h, h = 0..H-1 (fla's schedule), float64, all <= 0."""
    if isinstance(num_layers, bool) or not isinstance(num_layers, (int, np.integer)) or num_layers < 1:
        raise ValueError(f"num_layers: got {num_layers!r}; expected a positive integer")
    if isinstance(layer_idx, bool) or not isinstance(layer_idx, (int, np.integer)) or not 0 <= layer_idx <= num_layers:
        raise ValueError(f"layer_idx: got {layer_idx!r}; expected an integer in [0, num_layers = {num_layers}]")
    return -(8.0 / n_heads * (1.0 - layer_idx / num_layers)) * np.arange(n_heads, dtype=np.float64)


def decay_bound(params: Mapping[str, Any], extras: Mapping[str, Any], n_heads: int) -> float:
    """alpha_max = max_h lambda_h (1.0 for head 0: no bound over all heads)."""
    return float(np.exp(log_decays(n_heads, params["layer_idx"], params["num_layers"]).max()))


def reference(
    ar: Any,
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    scale: float | None,
    layer_idx: int,
    num_layers: int,
    initial_state: Any = None,
    output_final_state: bool = False,
) -> Any:
    """The definition, one token at a time from S_0 (arithmetic-generic)."""
    B, H, N, dk = q.shape
    lg = np.broadcast_to(log_decays(H, layer_idx, num_layers)[:, None, None], (B, H, N, 1))
    s = scale_value(ar, scale, dk)
    out, state = gated_scan(ar, q * s, k, v, ar.const(lg), initial_state)
    return (out, state) if output_final_state else out


def torch_forward(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    form: str,
    chunk_size: int,
    scale: float | None,
    layer_idx: int,
    num_layers: int,
    initial_state: Any = None,
    output_final_state: bool = False,
) -> Any:
    import torch

    B, H, N, dk = q.shape
    lg = torch.as_tensor(log_decays(H, layer_idx, num_layers), dtype=torch_gate_dtype(q), device=q.device)
    g = lg.reshape(1, H, 1, 1).expand(B, H, N, 1)
    # every input cast once (``forms.linear_recurrence``), held in the float32 accumulators until the state's
    # term is added, and stored once
    acc = accumulation_dtype(q)
    qs, ka, va = q.to(acc) * scale_value(TORCH, scale, dk), k.to(acc), v.to(acc)
    out = linear_recurrence(qs, ka, va, g, causal=True, form=form, chunk_size=chunk_size, wide_output=True)
    if initial_state is None and not output_final_state:
        return out.to(q.dtype)
    b = g.cumsum(-2)
    return torch_with_state(out, qs, ka, va, b, b, initial_state, output_final_state, q.dtype)


VARIANTS = [
    Variant(
        name="lightning",
        family="ssm",
        summary="Lightning Attention-2: fixed per-head decay from fla's slope schedule",
        source="Qin et al. 2024, Lightning Attention-2 (TransNormerLLM)",
        params={"scale": None, "layer_idx": 0, "num_layers": 2},
        forms=("chunked", "recurrent", "parallel"),
        declares=frozenset({"causal", "causal-only", "linear-in-v", "state-passing"}),
        reference_fn=reference,
        torch_fn=torch_forward,
        recurrence="diagonal",
        decay_fn=decay_bound,
    )
]
