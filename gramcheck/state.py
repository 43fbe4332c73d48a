"""State passing for gated linear recurrences, written once against the arithmetic shim.

For S_t = diag(alpha_t) S_{t-1} + k_t v_t^T (S_t in R^{d_k x d_v}) with alpha_t = exp(g_t), g_t <= 0,
started from S_0 instead of 0, linearity in S_0 gives the exact identities

    S_t = diag(exp(b_t)) S_0 + sum_{s<=t} diag(exp(b_t - b_s)) k_s v_s^T,    b_t = sum_{r<=t} g_r,
    o_t = S_t^T q_t = (o_t with S_0 = 0) + (q_t * exp(b_t))^T S_0,

so a form that starts from zero needs only the correction ``initial_readout`` and, for the final state,
``final_state`` (the recurrent sum at t = N). Every exponent is <= 0: nothing overflows. Decays are given
already exponentiated (shape (..., N, c), c = d_k or 1 for a scalar decay) so that a torch caller can take
the exponentials of float64 cumulative sums and cast them to its accumulation dtype.

``gated_scan`` is the definition token by token from S_0 (what the references evaluate); the identities
are checked against it in mpmath by the tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def gated_scan(ar: Any, q: Any, k: Any, v: Any, log_alpha: Any, initial_state: Any = None) -> tuple[Any, Any]:
    """(o, S_N): S_t = diag(exp(log_alpha_t)) S_{t-1} + k_t v_t^T from S_0 = ``initial_state`` (or 0),
    o_t = S_t^T q_t. q, k (B, H, N, d_k), v (B, H, N, d_v), log_alpha (B, H, N, d_k) or (B, H, N, 1),
    initial_state (B, H, d_k, d_v) in ``ar``. Returns o (B, H, N, d_v) and S_N (B, H, d_k, d_v)."""
    from .variants.common import CHUNKED, linear_in_order, token_recurrence

    alpha = ar.exp(ar.held(log_alpha))
    ordered = linear_in_order(ar, q, k, v, alpha, initial_state, output_final_state=True, takes=CHUNKED)
    if ordered is not None:  # an evaluation order's algorithm (variants.common.evaluation_order)
        return ordered
    return token_recurrence(ar, q, k, v, alpha, initial_state)


def initial_readout(ar: Any, q: Any, decay_in: Any, initial_state: Any) -> Any:
    """(q_t * decay_in_t)^T S_0 for every t: the contribution of S_0 to o_t, with decay_in_t = exp(b_t)
    (B, H, N, c) the decay from the start through token t. Returns (B, H, N, d_v)."""
    return ar.matmul(q * decay_in, initial_state)


def final_state(ar: Any, k: Any, v: Any, decay_out: Any, total: Any, initial_state: Any = None) -> Any:
    """S_N = sum_s diag(decay_out_s) k_s v_s^T + diag(total) S_0 with decay_out_s = exp(b_N - b_s)
    (B, H, N, c) and total = exp(b_N) (B, H, 1, c). Returns (B, H, d_k, d_v)."""
    s = ar.matmul(ar.mT(k * decay_out), v)
    if initial_state is None:
        return s
    return s + ar.mT(total) * initial_state


# --------------------------------------------------------------------------------------------------
# checks shared by the references and the torch forms
# --------------------------------------------------------------------------------------------------
def check_initial_state(s0: Any, B: int, H: int, dk: int, dv: int) -> None:
    """initial_state must be (B, H, d_k, d_v), floating, finite."""
    if s0 is None:
        return
    shape = tuple(getattr(s0, "shape", ()))
    if not hasattr(s0, "shape") or not hasattr(s0, "dtype"):
        raise TypeError(f"initial_state: got {type(s0).__name__}; expected an array (B, H, d_k, d_v)")
    if shape != (B, H, dk, dv):
        raise ValueError(f"initial_state: got shape {shape}; expected (B, H, d_k, d_v) = ({B}, {H}, {dk}, {dv})")
    arr = s0.detach().cpu().double().numpy() if type(s0).__module__.startswith("torch") else np.asarray(s0, dtype=float)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"initial_state: contains NaN or Inf (shape {shape}); expected finite values")


# --------------------------------------------------------------------------------------------------
# torch side
# --------------------------------------------------------------------------------------------------
def torch_gate_dtype(x: Any) -> Any:
    """float64 for cumulative log-decays (float32 on MPS, which has no float64)."""
    import torch

    return torch.float32 if x.device.type == "mps" else torch.float64


def torch_with_state(
    out: Any,
    q: Any,
    k: Any,
    v: Any,
    b_in: Any,
    b: Any,
    initial_state: Any,
    output_final_state: bool,
    dtype: Any = None,
) -> Any:
    """Apply the state-passing identities to the output ``out`` of a form started from zero, and store it in
    ``dtype`` (default: its own). A caller in float16 or bfloat16 passes ``out`` in the accumulation dtype, so
    that the output is rounded once, after S_0's term is added: each part may overflow where their sum does not.

    q is the query as the recurrence reads it (scale applied), k, v the keys and values entering the
    state, b_in (B, H, N, c) the cumulative log-decay that S_0 has undergone when token t reads it, b
    (B, H, N, c) the inclusive cumulative log-decay of the state update (both float64). Sums run in at
    least float32; the output keeps its dtype, the final state is in the accumulation dtype (as fla)."""
    from .forms import accumulation_dtype
    from .torch_arith import TORCH as _T

    acc = accumulation_dtype(q)
    store = out.dtype if dtype is None else dtype
    if initial_state is not None:
        s0 = initial_state.to(acc)
        out = out.to(acc) + initial_readout(_T, q.to(acc), b_in.exp().to(acc), s0)
    out = out.to(store)
    if not output_final_state:
        return out
    last = b[..., -1:, :]
    s0 = None if initial_state is None else initial_state.to(acc)
    fs = final_state(_T, k.to(acc), v.to(acc), (last - b).exp().to(acc), last.exp().to(acc), s0)
    return out, fs
