"""Packed variable-length sequences: ``cu_seqlens`` (int64 (S + 1,), 0 = c_0 < c_1 < ... < c_S = N) marks
S sequences [c_i, c_{i+1}) packed into one row (B = 1). A packed call equals S separate calls, one per
sequence, with their outputs concatenated along N and their final states stacked along the batch axis:

    out[:, :, c_i:c_{i+1}] = f(q[:, :, c_i:c_{i+1}], ..., initial_state=S0[i:i+1])
    final_state[i]         = the final state of sequence i                      (S, H, d_k, d_v)

``run_packed`` is that definition, used by ``Variant.reference`` and ``Variant.torch`` for every variant
(no variant needs code for it) and by the packing properties as the truth for a packed target.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np


def check_cu_seqlens(cu_seqlens: Any, n: int, batch: int) -> np.ndarray:
    """cu_seqlens as an int64 NumPy array, validated: 1-D, starts at 0, strictly increasing, ends at N, B = 1."""
    arr = np.asarray(cu_seqlens.detach().cpu() if hasattr(cu_seqlens, "detach") else cu_seqlens)
    if arr.ndim != 1 or arr.size < 2 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(
            f"cu_seqlens: got shape {tuple(arr.shape)} dtype {arr.dtype}; expected integer offsets of shape (S + 1,)"
        )
    if arr[0] != 0 or arr[-1] != n or not np.all(np.diff(arr) > 0):
        raise ValueError(
            f"cu_seqlens: got {arr.tolist()}; expected strictly increasing offsets from 0 to N = {n}"
        )
    if batch != 1:
        raise ValueError(f"q: got batch {batch} with cu_seqlens; expected B = 1 (sequences are packed along N)")
    return arr.astype(np.int64)


def per_token(x: Any, batch: int, heads: int, n: int) -> bool:
    """An extra input with one value per token (leading axes (B, H, N)): sliced with the sequences."""
    return getattr(x, "ndim", 0) >= 3 and tuple(x.shape[:3]) == (batch, heads, n)


def run_packed(
    fn: Callable[..., Any],
    q: Any,
    k: Any,
    v: Any,
    opts: Mapping[str, Any],
    kwargs: Mapping[str, Any],
    *,
    concat: Callable[[list[Any], int], Any] | None = None,
) -> Any:
    """fn on each packed sequence; returns out (1, H, N, d_v), or (out, final_state (S, H, d_k, d_v)) when
    ``opts['output_final_state']``. ``opts['initial_state']``, when given, is (S, H, d_k, d_v)."""
    B, H, N, _ = q.shape
    cu = check_cu_seqlens(opts["cu_seqlens"], N, B)
    S = cu.size - 1
    s0 = opts.get("initial_state")
    if s0 is not None and s0.shape[0] != S:
        raise ValueError(
            f"initial_state: got shape {tuple(s0.shape)} with {S} packed sequences; expected ({S}, H, d_k, d_v)"
        )
    want_state = bool(opts.get("output_final_state"))
    outs, states = [], []
    for i in range(S):
        a, b = int(cu[i]), int(cu[i + 1])
        kw = {n: (_own(x[:, :, a:b]) if per_token(x, B, H, N) else x) for n, x in kwargs.items()}
        if s0 is not None:
            kw["initial_state"] = s0[i : i + 1]
        if want_state:
            kw["output_final_state"] = True
        r = fn(_own(q[:, :, a:b]), _own(k[:, :, a:b]), _own(v[:, :, a:b]), **kw)
        if want_state:
            outs.append(r[0])
            states.append(r[1])
        else:
            outs.append(r)
    cat = concat or _default_concat(outs[0])
    out = cat(outs, 2)
    return (out, cat(states, 0)) if want_state else out


def _own(x: Any) -> Any:
    """A sequence's slice in memory of its own: a view starts wherever the sequence starts in the packed
    row, and BLAS kernels round differently at different alignments, so the bits of a sequence's output
    would depend on the sequences before it (packing-isolation is bit-exact)."""
    if hasattr(x, "clone"):
        return x.clone()
    if isinstance(x, np.ndarray):
        return x.copy()
    return x


def _default_concat(x: Any) -> Callable[[list[Any], int], Any]:
    if hasattr(x, "detach"):
        import torch

        return lambda xs, axis: torch.cat(xs, dim=axis)
    if isinstance(x, np.ndarray):
        return lambda xs, axis: np.concatenate(xs, axis=axis)
    raise TypeError(f"run_packed: got outputs of type {type(x).__name__}; expected concat= for this arithmetic")
