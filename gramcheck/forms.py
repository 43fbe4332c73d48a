"""Torch computational forms of the (gated) linear recurrence that every linear variant reduces to.

With feature-mapped queries and keys q, k (B, H, N, d_k), values v (B, H, N, d_v), optional
log-decays g (B, H, N, d_k) or (B, H, N, 1), g <= 0, b_t = sum_{s<=t} g_s, and an optional initial
state S_0 (B, H, d_k, d_v) (zero when absent):

    causal:     o_t = (q_t * exp(b_t))^T S_0 + sum_{s<=t} (q_t * exp(b_t - b_s)) . k_s  v_s
                i.e.  S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,  o_t = S_t^T q_t
    non-causal: o_t = q_t^T (S_0 + K^T V)                        (no decay)

and, on request, the final state S_N (non-causal: S_0 + K^T V). Three forms compute it:
* ``parallel``: non-causal q (K^T V) in O(N d_k d_v) (cumsum-free); causal only for the gated variants,
  as the quadratic masked form ((Q K^T) * D) V with the decay matrix D, which materialises N x N.
* ``recurrent``: the state recurrence, one token at a time.
* ``chunked``: exact inter-chunk states plus the masked product inside each chunk of ``chunk_size``
  tokens (any size >= 1; the last chunk may be short). Decays enter only as exp(b_t - b_s) with
  t >= s inside a chunk and as the decay from a chunk's start or to its end, all with non-positive
  exponents: nothing overflows however long the sequence or strong the decay. Per-channel decays inside
  a chunk use secondary chunking (``_channel_decayed_intra``): sub-blocks of SUB_BLOCK tokens, the
  factored q_t exp(b_t - b_r) . k_s exp(b_r - b_s) with the sub-block's first token as the reference r,
  the exact per-pair form only in the rows past a decay too strong to factor; memory O(N d) for
  chunk_size >= d_k (the (C, C, d_k) decay tensor is never built).

Every form is bit-exactly causal: the output of token t depends on no later token, not even in its
rounding. So no quantity for row t may be computed from later tokens: a factorisation's reference is
a token <= t (a middle reference token, as the sub-blocks once used, rounded row t differently when
later gates changed), and the choice between factored and per-pair arithmetic is made per row from
tokens <= t, never per chunk or sub-block. Where a row is computed per pair, the factored entries that
torch.where discards have their exponents clamped to the factoring limit before exp, so they stay
finite: where's backward gives them a zero gradient, and 0 * inf would be NaN (a gate of -91 once
made the chunked gradients NaN with a finite forward).

Gate cumulative sums are accumulated in float64 and the states S (sums over up to N tokens) in at least
float32 (fla's kernels use float32 for both; float32 cumulative gates lost accuracy in our tests, see
``_gate_dtype``); products inside a chunk run in the data dtype (per-channel decays: in the state's
dtype), and the output is cast back to it.
(Accumulating the state in bfloat16 made the chunked form three times less accurate than the naive
definition in bfloat16: the low-precision rule, proofs/low-precision-rule.md, caught it.)
"""

from __future__ import annotations

import functools
import math
from typing import Any

from .validation import check_choice, check_positive_int

FORMS = ("parallel", "recurrent", "chunked")

# The chunk sizes of production chunked forms: gramcheck's builtin forms (16) and fla's kernels (BT = 64). The
# properties aim at their boundaries, and FAVOR+'s linear form is a yardstick at each (the delta rule's chunked
# algorithm, whose ball evaluation costs more, at 64 only).
CHUNK_SIZES = (16, 64)


def _torch() -> Any:
    import torch

    return torch


@functools.lru_cache(maxsize=64)
def _causal_mask(n: int, device: Any) -> Any:
    """The (n, n) lower-triangular boolean mask, cached per size and device (a fresh ``tril`` costs a
    parallel region per call; callers never write to it)."""
    torch = _torch()
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def accumulation_dtype(x: Any) -> Any:
    """The dtype a kernel accumulates a tensor (or dtype) ``x`` in: at least float32 (states, dot
    products, norms and features of float16 / bfloat16 inputs)."""
    torch = _torch()
    return torch.promote_types(getattr(x, "dtype", x), torch.float32)


def _gate_dtype(x: Any) -> Any:
    """Dtype of the cumulative log-decays b_t = sum_{s<=t} g_s: float64 (float32 on MPS, which has no
    float64). exp(b_t - b_s) needs b_t - b_s to relative precision, but b itself can be large (a strong
    decay followed by weak ones: b ~ -4000, b_t - b_s ~ -0.01); float32 keeps only |b| 2^-24 of it
    (proofs/fp-forward-error.md)."""
    torch = _torch()
    return torch.float32 if x.device.type == "mps" else torch.float64


SUB_BLOCK = 16  # secondary chunk of the per-channel decayed form (fla's chunk_gla uses 16 too)


def _factor_limit(dtype: Any) -> float:
    """Largest exponent a factored decay may carry: exp(+-limit) times an input stays far inside the
    format's range (float32: 22.2, float64: 177)."""
    torch = _torch()
    return math.log(torch.finfo(dtype).max) / 4


def _check_state(s0: Any, q: Any, v: Any) -> Any:
    """initial_state validated and cast to the accumulation dtype (None stays None)."""
    if s0 is None:
        return None
    torch = _torch()
    expected = (*q.shape[:2], q.shape[-1], v.shape[-1])
    if not isinstance(s0, torch.Tensor) or not s0.is_floating_point():
        raise TypeError(
            f"initial_state: got {type(s0).__name__} {getattr(s0, 'dtype', '')}; expected a floating-point "
            f"torch.Tensor of shape {expected} (B, H, d_k, d_v)"
        )
    if tuple(s0.shape) != expected:
        raise ValueError(f"initial_state: got shape {tuple(s0.shape)}; expected {expected} (B, H, d_k, d_v)")
    return s0.to(device=q.device, dtype=accumulation_dtype(q))


def linear_recurrence(
    q: Any,
    k: Any,
    v: Any,
    g: Any = None,
    *,
    causal: bool,
    form: str = "chunked",
    chunk_size: int = 64,
    initial_state: Any = None,
    output_final_state: bool = False,
    wide_output: bool = False,
) -> Any:
    """Dispatch to one form; see the module docstring for the formula and shapes.

    ``initial_state`` (B, H, d_k, d_v) is S_0 (zero when None); with ``output_final_state`` the result
    is ``(out, S_N)``, S_N in the accumulation dtype (at least float32), so that running two segments
    with the first's final state as the second's initial state equals one pass over both.
    ``wide_output``: the output in the accumulation dtype too, for a caller that normalises it before
    storing (a float16 numerator overflows at 65504 where the quotient does not)."""
    check_choice("form", form, FORMS)
    if g is not None and not causal:
        raise ValueError("causal: got False with decays g; expected causal=True (decayed recurrences are causal)")
    s0 = _check_state(initial_state, q, v)
    od = accumulation_dtype(q) if wide_output else q.dtype
    # each input cast once to the accumulation dtype (the decays to the gate dtype), as a kernel loads it: every
    # further cast of a float16 tensor is another backward path whose gradient is rounded to float16 on its own,
    # and two such parts of 7e4 and -1e4 overflow where their sum, the gradient, does not
    acc = accumulation_dtype(q)
    q, k, v = q.to(acc), k.to(acc), v.to(acc)
    g = None if g is None else g.to(_gate_dtype(g))
    if form == "parallel":
        out, state = _parallel(q, k, v, g, causal, s0, output_final_state, od)
    elif form == "recurrent":
        out, state = _recurrent(q, k, v, g, causal, s0, od)
    else:
        out, state = _chunked(q, k, v, g, causal, check_positive_int("chunk_size", chunk_size), s0, od)
    return (out, state) if output_final_state else out


def _decay_matrix(bt: Any, bs: Any, mask: Any) -> Any:
    """exp(b_t - b_s) for t >= s (mask), 0 above; shapes (..., T, c) and (..., S, c) -> (..., T, S, c)."""
    diff = bt.unsqueeze(-2) - bs.unsqueeze(-3)
    diff = diff.masked_fill(~mask.unsqueeze(-1), -float("inf"))
    return diff.exp()


def _decayed_scores(q: Any, k: Any, bq: Any, bk: Any, mask: Any) -> Any:
    """A_ts = sum_c q_tc k_sc exp(b_tc - b_sc) on the mask (scalar decay when b has one channel), 0 above
    it by selection: a future key that is not finite, times a decay of 0, is NaN."""
    torch = _torch()
    if bq.shape[-1] == 1:
        scores = (q @ k.transpose(-1, -2)) * _scalar_decay(bq, bk, mask).to(q.dtype)
    else:
        scores = torch.einsum("...tc,...sc,...tsc->...ts", q, k, _decay_matrix(bq, bk, mask).to(q.dtype))
    return torch.where(mask, scores, 0.0)


def _scalar_decay(bt: Any, bs: Any, mask: Any) -> Any:
    """exp(b_t - b_s) on the causal mask, 0 above, for one decay channel: shapes (..., N, 1) for the
    same N tokens (bt = bs = b) -> (..., N, N). Factored as exp(b_t) exp(-b_s) in float64 (2 N
    exponentials instead of N^2; two roundings of 2^-53) in the rows t whose exponents b_t and -b_s
    (s <= t) stay within _factor_limit(float64) = 177 of zero; the other rows (a decay of more than 177
    nats) exactly per pair. The choice is per row, from b_0..b_t alone, so that row t does not depend
    on later tokens (bit-exact causality); the factored exponents are clamped to the limit so that the
    unused factored entries stay finite (their backward would otherwise be 0 * inf = NaN)."""
    torch = _torch()
    bt, bs = bt[..., 0], bs[..., 0]
    limit = _factor_limit(torch.float64)
    if bt.dtype != torch.float64:
        return (bt.unsqueeze(-1) - bs.unsqueeze(-2)).masked_fill(~mask, -float("inf")).exp()
    factored = bt.clamp(-limit, limit).exp().unsqueeze(-1) * (-bs).clamp(-limit, limit).exp().unsqueeze(-2)
    row_ok = (bt.abs() <= limit) & (bs.abs().cummax(-1).values <= limit)
    if not bool(row_ok.all()):
        pairs = (bt.unsqueeze(-1) - bs.unsqueeze(-2)).masked_fill(~mask, -float("inf")).exp()
        factored = torch.where(row_ok.unsqueeze(-1), factored, pairs)
    return factored.masked_fill(~mask, 0.0)


def parallel(q: Any, k: Any, v: Any, g: Any = None, *, causal: bool) -> Any:
    """The parallel form (see the module docstring)."""
    return linear_recurrence(q, k, v, g, causal=causal, form="parallel")


def recurrent(q: Any, k: Any, v: Any, g: Any = None, *, causal: bool) -> Any:
    """The recurrent form (see the module docstring)."""
    return linear_recurrence(q, k, v, g, causal=causal, form="recurrent")


def chunked(q: Any, k: Any, v: Any, g: Any = None, *, causal: bool, chunk_size: int = 64) -> Any:
    """The chunked form (see the module docstring)."""
    return linear_recurrence(q, k, v, g, causal=causal, form="chunked", chunk_size=chunk_size)


def _parallel(q: Any, k: Any, v: Any, g: Any, causal: bool, s0: Any, want_state: bool, od: Any) -> tuple[Any, Any]:
    acc = accumulation_dtype(q)
    if not causal:
        state = k.to(acc).transpose(-1, -2) @ v.to(acc)
        state = state if s0 is None else s0 + state
        return (q.to(acc) @ state).to(od), state
    if g is None:
        raise ValueError("form: 'parallel' is non-causal for ungated linear attention; use 'chunked' or 'recurrent'")
    b = g.to(_gate_dtype(g)).cumsum(-2)
    # scores and their products in the accumulation dtype, as a kernel's dot products accumulate: a float16
    # score past 65504 overflows where the output, or its sum with the state's term, need not
    out = _decayed_scores(q.to(acc), k.to(acc), b, b, _causal_mask(q.shape[-2], q.device)) @ v.to(acc)
    if s0 is None and not want_state:
        return out.to(od), None
    last = b[..., -1:, :]
    if s0 is not None:
        out = out + (q.to(acc) * b.exp().to(acc)) @ s0
    state = (k.to(acc) * (last - b).exp().to(acc)).transpose(-1, -2) @ v.to(acc)
    if s0 is not None:
        state = state + last[..., 0, :, None].exp().to(acc) * s0
    return out.to(od), state


def _recurrent(q: Any, k: Any, v: Any, g: Any, causal: bool, s0: Any, od: Any) -> tuple[Any, Any]:
    torch = _torch()
    B, H, N, dk = q.shape
    acc = accumulation_dtype(q)
    qa, ka, va = q.to(acc), k.to(acc), v.to(acc)
    state = qa.new_zeros(B, H, dk, v.shape[-1]) if s0 is None else s0
    if not causal:
        for t in range(N):
            state = state + ka[:, :, t, :, None] * va[:, :, t, None, :]
        return (qa @ state).to(od), state
    alpha = None if g is None else g.to(acc).exp()
    outs = []
    for t in range(N):
        if alpha is not None:
            state = alpha[:, :, t, :, None] * state
        state = state + ka[:, :, t, :, None] * va[:, :, t, None, :]
        outs.append((qa[:, :, t, None, :] @ state)[:, :, 0, :])
    return torch.stack(outs, dim=2).to(od), state


def pad_chunks(x: Any, c: int) -> Any:
    """(B, H, N, e) -> (B, H, n_chunks, c, e), zero-padded at the end."""
    torch = _torch()
    B, H, N, e = x.shape
    pad = (-N) % c
    if pad:
        x = torch.cat([x, x.new_zeros(B, H, pad, e)], dim=2)
    return x.reshape(B, H, -1, c, e)


def _chunked(q: Any, k: Any, v: Any, g: Any, causal: bool, c: int, s0: Any, od: Any) -> tuple[Any, Any]:
    torch = _torch()
    B, H, N, dk = q.shape
    dv = v.shape[-1]
    acc = accumulation_dtype(q)
    state = q.new_zeros(B, H, dk, dv, dtype=acc) if s0 is None else s0
    if not causal:  # no chunk sees another's partial state: one product over all tokens is the same sum
        state = state + k.to(acc).transpose(-1, -2) @ v.to(acc)
        return (q.to(acc) @ state).to(od), state
    qc, kc, vc = pad_chunks(q, c), pad_chunks(k, c), pad_chunks(v, c)
    nc = qc.shape[2]
    mask = _causal_mask(c, q.device)
    if g is None:
        # in the accumulation dtype, as a kernel's dot products accumulate, and masked by selection, not by a
        # product: a float16 score q.k past 65504 overflows, and a future one times 0 is NaN
        qa, ka = qc.to(acc), kc.to(acc)
        intra = torch.where(mask, qa @ ka.transpose(-1, -2), 0.0) @ vc.to(acc)
        q_in, k_out, carry = qc, kc, None
    else:
        bl = pad_chunks(g.to(_gate_dtype(g)), c).cumsum(-2)  # log-decay from chunk start through t
        last = bl[..., -1:, :]
        q_in = qc.to(acc) * bl.exp().to(acc)  # decay of the incoming state up to t
        if bl.shape[-1] == 1:
            intra = _scalar_decayed_scores(qc, q_in, kc, bl, mask) @ vc.to(acc)
        else:
            intra = _channel_decayed_intra(qc, kc, vc, bl, mask)
        k_out = kc.to(acc) * (last - bl).exp().to(acc)  # decay from s to the chunk's end
        carry = last[..., 0, :].exp().to(acc)  # (B, H, nc, d_k): decay across a whole chunk
    # chunk by chunk, as the state passes, so that each chunk's (c, d) operands stay in cache (one batched
    # product over all chunks took 1.1-1.3x the time at N = 1024-16384: benchmarks/RESULTS.md)
    k_out, v_acc, q_in, intra = k_out.to(acc), vc.to(acc), q_in.to(acc), intra.to(acc)
    outs = []
    for i in range(nc):
        outs.append(intra[:, :, i] + q_in[:, :, i] @ state)
        update = k_out[:, :, i].transpose(-1, -2) @ v_acc[:, :, i]
        state = (state if carry is None else carry[:, :, i, :, None] * state) + update
    out = torch.stack(outs, dim=2)
    return out.to(od).reshape(B, H, nc * c, dv)[:, :, :N], state


def _scalar_decayed_scores(qc: Any, q_in: Any, kc: Any, bl: Any, mask: Any) -> Any:
    """Masked A_ts = q_t . k_s exp(b_t - b_s) inside every chunk for one decay channel, from
    q_in = q_t exp(b_t) (b from the chunk's start, <= 0): A = q_in (k exp(-b))^T, whose key factors in
    row t are at most exp(-b_t). Rows with -b_t > _factor_limit (a decay too strong to factor in this
    dtype) are computed per pair (``_decayed_scores``). The choice is per row (the rows past the first
    strong decay of a chunk), never per chunk, so that row t does not depend on later tokens; the key
    factor's exponent is clamped to the limit so that the unused factored entries stay finite (their
    backward would otherwise be 0 * inf = NaN)."""
    torch = _torch()
    acc = q_in.dtype
    limit = _factor_limit(acc)
    k_fac = kc.to(acc) * (-bl).clamp(max=limit).exp().to(acc)
    scores = torch.where(mask, q_in @ k_fac.transpose(-1, -2), 0.0)
    row_bad = -bl[..., 0] > limit  # (B, H, nc, C)
    bad = row_bad.any(-1).nonzero(as_tuple=True)
    if bad[0].numel():
        pairs = _decayed_scores(qc[bad].to(acc), kc[bad].to(acc), bl[bad], bl[bad], mask)
        scores[bad] = torch.where(row_bad[bad].unsqueeze(-1), pairs, scores[bad])
    return scores


def _channel_decayed_intra(qc: Any, kc: Any, vc: Any, bl: Any, mask: Any) -> Any:
    """sum_{s <= t in the chunk} sum_c q_tc k_sc exp(b_tc - b_sc) v_s for per-channel decays, in the
    accumulation dtype, without the (C, C, d_k) decay tensor: sub-blocks of SUB_BLOCK tokens. For query
    sub-block [a, e) against earlier keys s < a, with the reference b_a,

        q_tc exp(b_tc - b_ac) . k_sc exp(b_ac - b_sc),   both exponents <= 0 (b is non-increasing),

    so neither factor can overflow and their product is exp(b_tc - b_sc) to two roundings. Inside the
    sub-block (``_diagonal_scores``) the reference is its first token, exact per pair in the rows past a
    decay too strong to factor."""
    acc = accumulation_dtype(qc)
    C = qc.shape[-2]
    sb = min(SUB_BLOCK, C)
    qa, ka = qc.to(acc), kc.to(acc)
    scores = qa.new_zeros(*qa.shape[:-1], C)  # (B, H, nc, C, C)
    for a in range(0, C, sb):
        e = min(a + sb, C)
        if a:
            ref = bl[..., a : a + 1, :]
            qf = qa[..., a:e, :] * (bl[..., a:e, :] - ref).exp().to(acc)
            kf = ka[..., :a, :] * (ref - bl[..., :a, :]).exp().to(acc)
            scores[..., a:e, :a] = qf @ kf.transpose(-1, -2)
        scores[..., a:e, a:e] = _diagonal_scores(
            qa[..., a:e, :], ka[..., a:e, :], bl[..., a:e, :], mask[: e - a, : e - a]
        )
    return scores @ vc.to(acc)


_PAIR_BATCH = 1 << 22  # elements of the per-pair decay tensor built at once in the fallback


def _diagonal_scores(q: Any, k: Any, b: Any, mask: Any) -> Any:
    """Masked A_ts = sum_c q_tc k_sc exp(b_tc - b_sc) inside one sub-block of every chunk, shapes
    (..., s, d_k) -> (..., s, s). Factored about the sub-block's first token 0: q_t exp(b_t - b_0)
    (exponent <= 0) . k_u exp(b_0 - b_u), whose key factors in row t are at most exp(rise_t),
    rise_t = max_c (b_0c - b_tc). Rows with rise_t > ``_factor_limit`` (a decay too strong to factor)
    are computed per pair, exactly as the definition, in batches of at most _PAIR_BATCH decay entries.
    The reference and the choice depend only on tokens <= t, so row t does not depend on later tokens
    (bit-exact causality); the key factor's exponent is clamped to the limit so that the unused
    factored entries stay finite (their backward would otherwise be 0 * inf = NaN)."""
    torch = _torch()
    s = q.shape[-2]
    limit = _factor_limit(q.dtype)
    rise = b[..., :1, :] - b  # >= 0, non-decreasing along the sub-block
    qf = q * (-rise).exp().to(q.dtype)
    kf = k * rise.clamp(max=limit).exp().to(q.dtype)
    scores = torch.where(mask, qf @ kf.transpose(-1, -2), 0.0)
    row_bad = rise.amax(-1) > limit  # (..., s)
    bad = row_bad.any(-1).nonzero(as_tuple=True)
    if bad[0].numel():
        step = max(1, _PAIR_BATCH // (s * s * q.shape[-1]))
        for i in range(0, bad[0].numel(), step):
            idx = tuple(ix[i : i + step] for ix in bad)
            pairs = _decayed_scores(q[idx], k[idx], b[idx], b[idx], mask)
            scores[idx] = torch.where(row_bad[idx].unsqueeze(-1), pairs, scores[idx])
    return scores
