"""Torch computational forms of the (gated) delta rule.

With queries q (already scaled), keys k (B, H, N, d_k), values v (B, H, N, d_v), write strengths
beta (B, H, N) and optional scalar log-decays g (B, H, N), g <= 0, alpha_t = exp(g_t):

    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T q_t,
    S_t in R^{d_k x d_v}, S_0 = initial_state (zero by default).

Two forms compute it:

* ``recurrent``: the recurrence one token at a time, in the rank-one form
  S_t = alpha_t S_{t-1} + beta_t k_t (v_t - alpha_t S_{t-1}^T k_t)^T.
* ``chunked``: the WY / UT representation of the product of a chunk's transitions (Yang et al. 2024,
  "Parallelizing Linear Transformers with the Delta Rule over Sequence Length"; with gates, Yang, Kautz,
  Hatamizadeh 2025). Inside a chunk of c tokens with incoming state S_0 and cumulative log-decays
  b_t = sum_{r<=t} g_r (from the chunk's start, so b_t <= 0), the recurrence is the scalar-gated linear
  recurrence S_t = alpha_t S_{t-1} + k_t delta_t^T over the "new values"
  delta_t = beta_t (v_t - alpha_t S_{t-1}^T k_t), and these solve the unit lower-triangular system

      (I + A) Delta = diag(beta) (V - diag(e^b) K S_0),
      A = strictly_lower(diag(beta) (K K^T * Gamma)),  Gamma_ts = exp(b_t - b_s)  (t > s),

  i.e. with T = (I + A)^{-1} diag(beta) (one triangular solve per chunk, all chunks at once):
  U = T V, W = T (e^b * K), Delta = U - W S_0. Then

      O = (e^b * Q) S_0 + ((Q K^T) * Gamma * causal) Delta,
      S_c = e^{b_c} S_0 + (e^{b_c - b} * K)^T Delta.

  Only the last two lines depend on the incoming state: they run chunk by chunk, everything else is
  batched over chunks. Every decay is exp of a non-positive number (b_t - b_s with t >= s, b_t, b_c - b_s),
  so nothing overflows however strong the decay or long the sequence. Any chunk size >= 1; the last
  chunk is padded with beta = 0, g = 0 tokens, which leave the state unchanged.

Precision: cumulative log-decays in float64 (as gramcheck.forms: float32 loses |b| 2^-24 of b_t - b_s);
everything else (the triangular solve included) in at least float32, for float16/bfloat16 inputs too,
as fla's kernels do; the output is cast back to the input dtype, the final state is returned in the
accumulation dtype.
"""

from __future__ import annotations

from typing import Any

from .forms import accumulation_dtype
from .validation import check_choice, check_positive_int

FORMS = ("chunked", "recurrent")


def _torch() -> Any:
    import torch

    return torch


def _gate_dtype(x: Any) -> Any:
    """Cumulative log-decays in float64 (float32 on MPS, which has no float64)."""
    torch = _torch()
    return torch.float32 if x.device.type == "mps" else torch.float64


def _initial(q: Any, v: Any, initial_state: Any, acc: Any) -> Any:
    B, H, _, dk = q.shape
    dv = v.shape[-1]
    if initial_state is None:
        return q.new_zeros(B, H, dk, dv, dtype=acc)
    if tuple(initial_state.shape) != (B, H, dk, dv):
        raise ValueError(
            f"initial_state: got shape {tuple(initial_state.shape)}; expected (B, H, d_k, d_v) = ({B}, {H}, {dk}, {dv})"
        )
    return initial_state.to(acc)


def _check_scalars(q: Any, beta: Any, g: Any) -> None:
    B, H, N, _ = q.shape
    for name, x in (("beta", beta), ("g", g)):
        if x is not None and tuple(x.shape) != (B, H, N):
            raise ValueError(f"{name}: got shape {tuple(x.shape)}; expected (B, H, N) = ({B}, {H}, {N})")


def delta_rule(
    q: Any,
    k: Any,
    v: Any,
    beta: Any,
    g: Any = None,
    *,
    form: str = "chunked",
    chunk_size: int = 64,
    initial_state: Any = None,
    output_final_state: bool = False,
) -> Any:
    """Dispatch to one form; see the module docstring. Returns o (B, H, N, d_v) in q's dtype, or
    (o, S_N) with S_N (B, H, d_k, d_v) when ``output_final_state``."""
    check_choice("form", form, FORMS)
    _check_scalars(q, beta, g)
    if form == "recurrent":
        out, state = recurrent(q, k, v, beta, g, initial_state=initial_state)
    else:
        out, state = chunked(q, k, v, beta, g, chunk_size=chunk_size, initial_state=initial_state)
    return (out, state) if output_final_state else out


def recurrent(q: Any, k: Any, v: Any, beta: Any, g: Any = None, *, initial_state: Any = None) -> tuple[Any, Any]:
    """(o, S_N): the recurrence token by token, state and products in the accumulation dtype."""
    torch = _torch()
    acc = accumulation_dtype(q)
    qa, ka, va, ba = q.to(acc), k.to(acc), v.to(acc), beta.to(acc)
    alpha = None if g is None else g.to(acc).exp()
    state = _initial(q, v, initial_state, acc)
    outs = []
    for t in range(q.shape[2]):
        if alpha is not None:
            state = alpha[:, :, t, None, None] * state
        kt = ka[:, :, t]
        delta = ba[:, :, t, None] * (va[:, :, t] - (kt.unsqueeze(-2) @ state).squeeze(-2))
        state = state + kt.unsqueeze(-1) * delta.unsqueeze(-2)
        outs.append((qa[:, :, t].unsqueeze(-2) @ state).squeeze(-2))
    return torch.stack(outs, dim=2).to(q.dtype), state


def _pad_chunks(x: Any, c: int) -> Any:
    """(B, H, N, ...) -> (B, H, n_chunks, c, ...), zero-padded at the end of the token axis."""
    torch = _torch()
    pad = (-x.shape[2]) % c
    if pad:
        x = torch.cat([x, x.new_zeros(*x.shape[:2], pad, *x.shape[3:])], dim=2)
    return x.reshape(*x.shape[:2], -1, c, *x.shape[3:])


def chunked(
    q: Any, k: Any, v: Any, beta: Any, g: Any = None, *, chunk_size: int = 64, initial_state: Any = None
) -> tuple[Any, Any]:
    """(o, S_N) by the WY / UT representation, chunks of ``chunk_size`` tokens."""
    torch = _torch()
    c = check_positive_int("chunk_size", chunk_size)
    B, H, N, dk = q.shape
    dv = v.shape[-1]
    acc = accumulation_dtype(q)
    qc, kc, vc = (_pad_chunks(x.to(acc), c) for x in (q, k, v))
    bc = _pad_chunks(beta.to(acc), c)  # (B, H, nc, c)
    nc = qc.shape[2]
    strict = torch.ones(c, c, dtype=torch.bool, device=q.device).tril(-1)
    incl = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    if g is None:
        gamma = incl.to(acc)  # (c, c): 1 on and below the diagonal
        dq = dk_end = None
        carry = None
    else:
        b = _pad_chunks(g.to(_gate_dtype(g)), c).cumsum(-1)  # (B, H, nc, c) log-decay from chunk start
        diff = (b.unsqueeze(-1) - b.unsqueeze(-2)).masked_fill(~incl, -float("inf"))
        gamma = diff.exp().to(acc)  # exp(b_t - b_s) for t >= s, 0 above
        dq = b.exp().to(acc)  # decay of the incoming state up to t
        dk_end = (b[..., -1:] - b).exp().to(acc)  # decay from s to the chunk's end
        carry = b[..., -1].exp().to(acc)  # (B, H, nc): decay across a whole chunk
    kk = kc @ kc.transpose(-1, -2)
    lower = (bc.unsqueeze(-1) * kk * gamma).masked_fill(~strict, 0.0)
    system = lower + torch.eye(c, dtype=acc, device=q.device)
    kd = kc if dq is None else kc * dq.unsqueeze(-1)
    rhs = bc.unsqueeze(-1) * torch.cat([vc, kd], dim=-1)  # diag(beta) [V, e^b K]
    uw = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    u, w = uw[..., :dv], uw[..., dv:]
    scores = (qc @ kc.transpose(-1, -2)) * gamma  # causal, diagonal included
    q_in = qc if dq is None else qc * dq.unsqueeze(-1)
    k_out = kc if dk_end is None else kc * dk_end.unsqueeze(-1)
    state = _initial(q, v, initial_state, acc)
    incoming, deltas = [], []
    for i in range(nc):
        incoming.append(state)
        delta = u[:, :, i] - w[:, :, i] @ state
        deltas.append(delta)
        if carry is not None:
            state = carry[:, :, i, None, None] * state
        state = state + k_out[:, :, i].transpose(-1, -2) @ delta
    s_in = torch.stack(incoming, dim=2)
    out = q_in @ s_in + scores @ torch.stack(deltas, dim=2)
    return out.reshape(B, H, nc * c, dv)[:, :, :N].to(q.dtype), state
