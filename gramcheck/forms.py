"""Torch computational forms of the (gated) linear recurrence that every linear variant reduces to.

With feature-mapped queries and keys q, k (B, H, N, d_k), values v (B, H, N, d_v) and optional
log-decays g (B, H, N, d_k) or (B, H, N, 1), g <= 0, b_t = sum_{s<=t} g_s:

    causal:     o_t = sum_{s<=t} (q_t * exp(b_t - b_s)) . k_s  v_s
                i.e.  S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,  o_t = S_t^T q_t
    non-causal: o_t = sum_s (q_t . k_s) v_s = q_t^T (K^T V)         (no decay)

Three forms compute it:
* ``parallel``: non-causal q (K^T V) in O(N d_k d_v) (cumsum-free); causal only for the gated variants,
  as the quadratic masked form ((Q K^T) * D) V with the decay matrix D, which materialises N x N.
* ``recurrent``: the state recurrence, one token at a time.
* ``chunked``: exact inter-chunk states plus the masked product inside each chunk of ``chunk_size``
  tokens (any size >= 1; the last chunk may be short). Decays enter only as exp(b_t - b_s) with
  t >= s inside a chunk and as the decay from a chunk's start or to its end, all with non-positive
  exponents: nothing overflows however long the sequence or strong the decay.

Gate cumulative sums are accumulated in float64 and the states S (sums over up to N tokens) in at least
float32 (fla's kernels use float32 for both; float32 cumulative gates lost accuracy in our tests, see
``_gate_dtype``); products inside a chunk run in the data dtype, and the output is cast back to it.
(Accumulating the state in bfloat16 made the chunked form three times less accurate than the naive
definition in bfloat16: the low-precision rule, proofs/low-precision-rule.md, caught it.)
"""

from __future__ import annotations

from typing import Any

from .validation import check_choice, check_positive_int

FORMS = ("parallel", "recurrent", "chunked")


def _torch() -> Any:
    import torch

    return torch


def _acc_dtype(x: Any) -> Any:
    """Accumulation dtype of the states: at least float32."""
    torch = _torch()
    return torch.promote_types(x.dtype, torch.float32)


def _gate_dtype(x: Any) -> Any:
    """Dtype of the cumulative log-decays b_t = sum_{s<=t} g_s: float64 (float32 on MPS, which has no
    float64). exp(b_t - b_s) needs b_t - b_s to relative precision, but b itself can be large (a strong
    decay followed by weak ones: b ~ -4000, b_t - b_s ~ -0.01); float32 keeps only |b| 2^-24 of it
    (proofs/fp-forward-error.md)."""
    torch = _torch()
    return torch.float32 if x.device.type == "mps" else torch.float64


def linear_recurrence(
    q: Any,
    k: Any,
    v: Any,
    g: Any = None,
    *,
    causal: bool,
    form: str = "chunked",
    chunk_size: int = 64,
) -> Any:
    """Dispatch to one form; see the module docstring for the formula and shapes."""
    check_choice("form", form, FORMS)
    if g is not None and not causal:
        raise ValueError("causal: got False with decays g; expected causal=True (decayed recurrences are causal)")
    if form == "parallel":
        return parallel(q, k, v, g, causal=causal)
    if form == "recurrent":
        return recurrent(q, k, v, g, causal=causal)
    return chunked(q, k, v, g, causal=causal, chunk_size=chunk_size)


def _decay_matrix(bt: Any, bs: Any, mask: Any) -> Any:
    """exp(b_t - b_s) for t >= s (mask), 0 above; shapes (..., T, c) and (..., S, c) -> (..., T, S, c)."""
    diff = bt.unsqueeze(-2) - bs.unsqueeze(-3)
    diff = diff.masked_fill(~mask.unsqueeze(-1), -float("inf"))
    return diff.exp()


def _decayed_scores(q: Any, k: Any, bq: Any, bk: Any, mask: Any) -> Any:
    """A_ts = sum_c q_tc k_sc exp(b_tc - b_sc) on the mask (scalar decay when b has one channel)."""
    torch = _torch()
    decay = _decay_matrix(bq, bk, mask).to(q.dtype)
    if bq.shape[-1] == 1:
        return (q @ k.transpose(-1, -2)) * decay[..., 0]
    return torch.einsum("...tc,...sc,...tsc->...ts", q, k, decay)


def parallel(q: Any, k: Any, v: Any, g: Any = None, *, causal: bool) -> Any:
    torch = _torch()
    if not causal:
        return q @ (k.transpose(-1, -2) @ v)
    n = q.shape[-2]
    mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    if g is None:
        raise ValueError("form: 'parallel' is non-causal for ungated linear attention; use 'chunked' or 'recurrent'")
    b = g.to(_gate_dtype(g)).cumsum(-2)
    return _decayed_scores(q, k, b, b, mask) @ v


def recurrent(q: Any, k: Any, v: Any, g: Any = None, *, causal: bool) -> Any:
    torch = _torch()
    B, H, N, dk = q.shape
    acc = _acc_dtype(q)
    qa, ka, va = q.to(acc), k.to(acc), v.to(acc)
    state = qa.new_zeros(B, H, dk, v.shape[-1])
    if not causal:
        for t in range(N):
            state = state + ka[:, :, t, :, None] * va[:, :, t, None, :]
        return (qa @ state).to(q.dtype)
    alpha = None if g is None else g.to(acc).exp()
    outs = []
    for t in range(N):
        if alpha is not None:
            state = alpha[:, :, t, :, None] * state
        state = state + ka[:, :, t, :, None] * va[:, :, t, None, :]
        outs.append((qa[:, :, t, None, :] @ state)[:, :, 0, :])
    return torch.stack(outs, dim=2).to(q.dtype)


def pad_chunks(x: Any, c: int) -> Any:
    """(B, H, N, e) -> (B, H, n_chunks, c, e), zero-padded at the end."""
    torch = _torch()
    B, H, N, e = x.shape
    pad = (-N) % c
    if pad:
        x = torch.cat([x, x.new_zeros(B, H, pad, e)], dim=2)
    return x.reshape(B, H, -1, c, e)


def chunked(q: Any, k: Any, v: Any, g: Any = None, *, causal: bool, chunk_size: int = 64) -> Any:
    torch = _torch()
    c = check_positive_int("chunk_size", chunk_size)
    B, H, N, dk = q.shape
    dv = v.shape[-1]
    qc, kc, vc = pad_chunks(q, c), pad_chunks(k, c), pad_chunks(v, c)
    nc = qc.shape[2]
    acc = _acc_dtype(q)
    if not causal:
        state = q.new_zeros(B, H, dk, dv, dtype=acc)
        for i in range(nc):
            state = state + kc[:, :, i].transpose(-1, -2).to(acc) @ vc[:, :, i].to(acc)
        return (q.to(acc) @ state).to(q.dtype)
    mask = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    if g is None:
        scores = (qc @ kc.transpose(-1, -2)) * mask.to(q.dtype)
        q_in, k_out, carry = qc, kc, None
    else:
        bl = pad_chunks(g.to(_gate_dtype(g)), c).cumsum(-2)  # log-decay from chunk start through t
        last = bl[..., -1:, :]
        scores = _decayed_scores(qc, kc, bl, bl, mask)
        q_in = qc.to(acc) * bl.exp().to(acc)  # decay of the incoming state up to t
        k_out = kc.to(acc) * (last - bl).exp().to(acc)  # decay from s to the chunk's end
        carry = last[..., 0, :].exp().to(acc)  # (B, H, nc, d_k): decay across a whole chunk
    updates = k_out.to(acc).transpose(-1, -2) @ vc.to(acc)  # (B, H, nc, d_k, d_v), accumulated in acc
    states = []
    state = q.new_zeros(B, H, dk, dv, dtype=acc)
    for i in range(nc):
        states.append(state)
        state = (state if carry is None else carry[:, :, i, :, None] * state) + updates[:, :, i]
    incoming = torch.stack(states, dim=2)
    out = (scores @ vc).to(acc) + q_in.to(acc) @ incoming
    return out.to(q.dtype).reshape(B, H, nc * c, dv)[:, :, :N]
