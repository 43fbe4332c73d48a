"""Building blocks shared by several variants, each written once against the arithmetic shim (so the
same formula serves the reference arithmetics and, with ``TORCH``, the torch forms)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

import numpy as np

ORDERS = ("recurrent", "chunked", "chunked-factored")
CHUNKED = ("chunked", "chunked-factored")
ORDER_CHUNK = 64  # the chunk of the chunked order (fla's BT)
_ORDER: ContextVar[tuple[str, list[bool]] | None] = ContextVar("gramcheck_evaluation_order", default=None)


@contextlib.contextmanager
def evaluation_order(order: str) -> Iterator[list[bool]]:
    """Within the block the shared products of linear attention below (``kernel_product``,
    ``ref_normalised``, ``gated_recurrence``, ``linear_in_order``) evaluate the algorithm ``order`` of a
    production form instead of the definition's: 'recurrent' (the state S_t = diag(alpha_t) S_{t-1} +
    k_t v_t^T token by token; phi(Q) (phi(K)^T V) when not causal), 'chunked' (``chunked_gated_recurrence``
    with chunks of ORDER_CHUNK tokens) or 'chunked-factored' (the same with a scalar decay factored into
    the intra-chunk scores, (q_t P_t) . (k_s / P_s), as fla's chunked simple-GLA and the builtin chunked
    form compute them; no other decay takes it). Yields a one-element list that turns True when some product took
    the order: a definition that uses none of them, or whose own algorithm is the order, evaluates
    itself. For the underflow those algorithms' intermediates have and the definition's do not
    (``algorithm_underflow``)."""
    if order not in ORDERS:
        raise ValueError(f"order: got {order!r}; expected one of {ORDERS}")
    used = [False]
    token = _ORDER.set((order, used))
    try:
        yield used
    finally:
        _ORDER.reset(token)


def _order(takes: tuple[str, ...] = ORDERS, applies: bool = True) -> str | None:
    """The order in effect where it is one of ``takes`` and ``applies`` (marked as taken), else None."""
    current = _ORDER.get()
    if current is None or current[0] not in takes or not applies:
        return None
    current[1][0] = True
    return current[0]


def causal_keep(n: int) -> np.ndarray:
    """Boolean (N, N) mask of the pairs (i, j) with j <= i."""
    return np.tril(np.ones((n, n), dtype=bool))


def masked_softmax(ar: Any, logits: Any, keep: np.ndarray | None) -> Any:
    """Row softmax of ``logits`` (..., N, N) over the entries where ``keep``; the others get weight 0.
    The row maximum is subtracted first (it cancels exactly)."""
    if keep is None:
        w = ar.exp(logits - ar.stop_max(logits, -1))
    else:  # masked entries are set to 0 after the exp (finite arithmetic throughout)
        w = ar.fill(ar.exp(ar.fill(logits, keep, 0.0) - ar.stop_max(logits, -1, keep)), keep, 0.0)
    return w / ar.sum(w, axis=-1, keepdims=True)


def kernel_matrix(ar: Any, fq: Any, fk: Any, causal: bool) -> Any:
    """A = phi(Q) phi(K)^T (..., N, N), lower-triangular part only when causal (definitional; N x N)."""
    a = ar.matmul(fq, ar.mT(fk))
    return ar.fill(a, causal_keep(fq.shape[-2]), 0.0) if causal else a


def kernel_product(ar: Any, fq: Any, fk: Any, v: Any, causal: bool) -> Any:
    """A V with A = phi(Q) phi(K)^T (masked when causal), by way of A (definitional; N x N), or in the
    evaluation order in effect (``evaluation_order``)."""
    if causal:
        ordered = linear_in_order(ar, fq, fk, v, None)
        if ordered is not None:
            return ordered
    elif _order(("recurrent",)) is not None:  # not causal: both orders form phi(K)^T V once
        return ar.matmul(fq, ar.matmul(ar.mT(fk), v))
    return ar.matmul(kernel_matrix(ar, fq, fk, causal), v)


def linear_product(ar: Any, fq: Any, fk: Any, v: Any, causal: bool, chunk: int, alpha: Any = None) -> Any:
    """phi(Q) (phi(K)^T V) by the linear form, the production algorithm of linear attention: causal by chunks of
    ``chunk`` tokens with decays ``alpha`` (``chunked_gated_recurrence``), else phi(K)^T V formed once. Equal to
    ``kernel_product`` in exact arithmetic; its state holds each key's term among the others, so where the
    output cancels it rounds in another order than the quadratic form."""
    return chunked_gated_recurrence(ar, fq, fk, v, alpha, chunk) if causal else ar.matmul(fq, ar.matmul(ar.mT(fk), v))


def ref_normalised(ar: Any, fq: Any, fk: Any, v: Any, *, causal: bool, eps: float = 0.0) -> Any:
    """o_i = sum_j A_ij v_j / (sum_j A_ij + eps), A = phi(Q) phi(K)^T (masked when causal); in an
    evaluation order, numerator and denominator by one pass over [V, 1], as the forms compute them."""
    if _ORDER.get() is not None:
        dv = v.shape[-1]
        ones = ar.asarray(np.ones(v.shape[:-1] + (1,)))
        out = kernel_product(ar, fq, fk, ar.concat([v, ones], axis=-1), causal)
        return ar.div(out[..., :dv], out[..., dv:] + eps)
    a = kernel_matrix(ar, fq, fk, causal)
    return ar.div(ar.matmul(a, v), ar.sum(a, axis=-1, keepdims=True) + eps)


def linear_in_order(
    ar: Any,
    q: Any,
    k: Any,
    v: Any,
    alpha: Any,
    initial_state: Any = None,
    output_final_state: bool = False,
    takes: tuple[str, ...] = ORDERS,
) -> Any:
    """The causal gated recurrence (``gated_recurrence``'s output, or (o, S_N)) by the evaluation order in
    effect: token by token ('recurrent') or by chunks ('chunked', 'chunked-factored' for a scalar decay);
    None outside ``evaluation_order`` or where the order is not one of ``takes`` (a recurrence's own
    definition is the recurrent order) or does not apply."""
    current = _ORDER.get()
    scalar = alpha is not None and alpha.shape[-1] == 1
    order = _order(takes, applies=current is None or current[0] != "chunked-factored" or scalar)
    if order is None:
        return None
    if order in CHUNKED:
        factored = order == "chunked-factored"
        out, state = chunked_gated_recurrence(
            ar, q, k, v, alpha, ORDER_CHUNK, initial_state, with_state=True, factored=factored
        )
    else:
        out, state = token_recurrence(ar, q, k, v, alpha, initial_state)
    return (out, state) if output_final_state else out


def gated_recurrence(
    ar: Any, q: Any, k: Any, v: Any, alpha: Any, initial_state: Any = None, output_final_state: bool = False
) -> Any:
    """S_t = diag(alpha_t) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t, one token at a time (the definition of
    every gated linear recurrence), from S_0 = ``initial_state`` (B, H, d_k, d_v) or 0. alpha
    (B, H, N, d_k) or (B, H, N, 1), already exponentiated (None: no decay). Returns o (B, H, N, d_v), or
    (o, S_N) when ``output_final_state``."""
    ordered = linear_in_order(ar, q, k, v, alpha, initial_state, output_final_state, takes=CHUNKED)
    if ordered is not None:
        return ordered
    enclose = getattr(ar, "enclose_gated_recurrence", None)  # one radius rule for the whole recurrence
    if enclose is not None:
        out, state = enclose(q, k, v, alpha, initial_state)
    else:
        out, state = token_recurrence(ar, q, k, v, alpha, initial_state)
    return (out, state) if output_final_state else out


def token_recurrence(ar: Any, q: Any, k: Any, v: Any, alpha: Any, initial_state: Any) -> tuple[Any, Any]:
    """(o, S_N) of ``gated_recurrence``, one token at a time in ``ar``."""
    B, H, N, dk = q.shape
    state = ar.held(ar.zeros((B, H, dk, v.shape[-1])) if initial_state is None else initial_state)
    outs = []
    for t in range(N):
        update = k[:, :, t, :, None] * v[:, :, t, None, :]
        state = update + (state if alpha is None else alpha[:, :, t, :, None] * state)
        outs.append(ar.matmul(q[:, :, t, None, :], state)[:, :, 0, :])
    return ar.stack(outs, axis=2), state


def chunk_decays(ar: Any, alpha: Any) -> tuple[Any, Any]:
    """Decays alpha (..., c) along a chunk -> (Gamma, P): Gamma_ts = prod_{s<r<=t} alpha_r for s <= t
    and 0 above (..., c, c), P_t = prod_{r<=t} alpha_r (..., c). Products of the decays, row by row, so
    that they are as accurate as a recurrence's (no cumulative sum of logs)."""
    *lead, c = alpha.shape
    first = ar.asarray(np.eye(1, c)[0] * np.ones((*lead, 1)))  # [1, 0, ..., 0]
    rows = [first]
    for t in range(1, c):  # Gamma[t, s] = Gamma[t - 1, s] alpha_t for s < t, Gamma[t, t] = 1
        decayed = rows[-1][..., :t] * alpha[..., t : t + 1]
        rows.append(ar.concat([decayed, first[..., :1], first[..., t + 1 :]], axis=-1))
    gamma = ar.stack(rows, axis=-2)
    return gamma, gamma[..., :, 0] * alpha[..., :1]


def to_chunks(ar: Any, x: Any, c: int, fill: float = 0.0) -> Any:
    """(B, H, N, ...) -> (B, H, n_chunks, c, ...), the last chunk padded with ``fill``."""
    B, H, N = x.shape[:3]
    tail = tuple(x.shape[3:])
    pad = (-N) % c
    if pad:
        x = ar.concat([x, ar.asarray(np.full((B, H, pad, *tail), fill))], axis=2)
    return x.reshape(B, H, (N + pad) // c, c, *tail)


def chunked_gated_recurrence(
    ar: Any,
    q: Any,
    k: Any,
    v: Any,
    alpha: Any = None,
    chunk: int = 64,
    initial_state: Any = None,
    with_state: bool = False,
    factored: bool = False,
) -> Any:
    """The output of ``gated_recurrence`` with decays alpha (B, H, N, 1) or (B, H, N, d_k) or None, by
    chunks of ``chunk`` tokens (the production algorithm of linear attention): per chunk, with incoming
    state S (``initial_state`` or 0 at the start), O = (P * Q) S + A V and S <- diag(P_c) S +
    (Gamma_c * K)^T V, where the intra-chunk scores are A = (Q K^T) * Gamma for scalar decays and
    A_ts = sum_j q_tj k_sj Gamma_tsj per channel (``chunk_decays``, one Gamma per channel). ``with_state``:
    (o, S_N) (the padding of the last chunk has decay 1 and k = v = 0, so the last state is S_N).
    ``factored`` (scalar decays): A = (P * Q) (K / P)^T, the decay factored into queries and keys."""
    B, H, N, dk = q.shape
    dv = v.shape[-1]
    qc, kc, vc = (to_chunks(ar, x, chunk) for x in (q, k, v))
    incl = np.tril(np.ones((chunk, chunk), dtype=bool))
    if alpha is None:
        scores, q_in, k_out, carry = ar.fill(ar.matmul(qc, ar.mT(kc)), incl, 0.0), qc, kc, None
    elif alpha.shape[-1] == 1:
        gamma, p_in = chunk_decays(ar, to_chunks(ar, alpha[..., 0], chunk, fill=1.0))
        q_in, k_out, carry = qc * p_in[..., None], kc * gamma[..., chunk - 1, :, None], p_in[..., chunk - 1, None]
        if factored:
            scores = ar.fill(ar.matmul(q_in, ar.mT(ar.div(kc, p_in[..., None]))), incl, 0.0)
        else:
            scores = ar.fill(ar.matmul(qc, ar.mT(kc)) * gamma, incl, 0.0)
    else:  # channel j's decays: Gamma (B, H, n_chunks, d_k, c, c), P (B, H, n_chunks, d_k, c)
        gamma, p_in = chunk_decays(ar, ar.mT(to_chunks(ar, alpha, chunk, fill=1.0)))
        pairs = ar.mT(qc)[..., :, :, None] * ar.mT(kc)[..., :, None, :] * gamma
        scores = ar.fill(ar.sum(pairs, axis=-3), incl, 0.0)
        q_in, k_out, carry = qc * ar.mT(p_in), kc * ar.mT(gamma[..., chunk - 1, :]), p_in[..., chunk - 1]
    state = ar.held(ar.zeros((B, H, dk, dv)) if initial_state is None else initial_state)
    outs = []
    for i in range(qc.shape[2]):
        outs.append(ar.matmul(q_in[:, :, i], state) + ar.matmul(scores[:, :, i], vc[:, :, i]))
        if carry is not None:
            state = carry[:, :, i, :, None] * state
        state = state + ar.matmul(ar.mT(k_out[:, :, i]), vc[:, :, i])
    out = ar.stack(outs, axis=2).reshape(B, H, qc.shape[2] * chunk, dv)[:, :, :N]
    return (out, state) if with_state else out


def ref_normalised_gated(ar: Any, fq: Any, fk: Any, v: Any, g: Any, *, eps: float = 0.0) -> Any:
    """Causal o_t = sum_{s<=t} w_ts v_s / (sum_{s<=t} w_ts + eps) with w_ts = phi(q_t).phi(k_s) e^{b_t - b_s},
    b the cumulative log-decays g: the normalised gated recurrence over [V, 1]."""
    dv = v.shape[-1]
    ones = ar.asarray(np.ones(v.shape[:-1] + (1,)))
    out = gated_recurrence(ar, fq, fk, ar.concat([v, ones], axis=-1), ar.exp(ar.held(g)))
    return ar.div(out[..., :dv], out[..., dv:] + eps)


def torch_normalised(
    fq: Any, fk: Any, v: Any, *, causal: bool, form: str, chunk_size: int, eps: float = 0.0, g: Any = None
) -> Any:
    """The same quotient computed by one pass of a linear form over [V, 1] (numerator and denominator
    share every rounding pattern of the form, and any decays ``g``, which therefore cancel), divided in
    the accumulation dtype and stored in v's dtype once, as a kernel normalises its float32
    accumulators: a float16 numerator overflows at 65504 where the quotient, at most max |v|, does not.
    The features may be wider than v (the callers compute them in float32 registers, as kernels do)."""
    from ..forms import linear_recurrence

    dv = v.shape[-1]
    va = _torch().cat([v, v.new_ones(*v.shape[:-1], 1)], dim=-1)
    out = linear_recurrence(fq, fk, va, g, causal=causal, form=form, chunk_size=chunk_size, wide_output=True)
    return (out[..., :dv] / (out[..., dv:] + eps)).to(v.dtype)


def in_float32(ar: Any, x: Any, fn: Any) -> Any:
    """fn(x), computed in float32 when ``ar`` is the torch arithmetic and x is float16/bfloat16 (as
    production norms do: sums of squares overflow float16 at |x| ~ 256), else as is."""
    if getattr(ar, "name", "") == "torch" and str(x.dtype) in ("torch.float16", "torch.bfloat16"):
        return fn(x.float()).to(x.dtype)
    return fn(x)


def standardise(ar: Any, x: Any, eps: float) -> Any:
    """(x - mean) / sqrt(var + eps) over the last axis (LayerNorm / GroupNorm per head, no affine)."""
    d = x.shape[-1]

    def f(y: Any) -> Any:
        c = y - ar.sum(y, axis=-1, keepdims=True) / float(d)
        return c / ar.sqrt(ar.sum(c * c, axis=-1, keepdims=True) / float(d) + eps)

    return in_float32(ar, x, f)


def rms_normalise(ar: Any, x: Any, eps: float) -> Any:
    """x / sqrt(mean(x^2) + eps) over the last axis (RMSNorm with unit gain, SRMSNorm)."""
    d = x.shape[-1]
    return in_float32(ar, x, lambda y: y / ar.sqrt(ar.sum(y * y, axis=-1, keepdims=True) / float(d) + eps))


def attention_matrix(
    var: Any, q: Any, k: Any, *, causal: bool, params: Mapping[str, Any], extras: Mapping[str, Any]
) -> np.ndarray:
    """The matrix M (B, H, N, N) with O = M V of a variant linear in V: its float64 reference on V = I_N."""
    B, H, N, _ = np.shape(q)
    eye = np.broadcast_to(np.eye(N), (B, H, N, N)).copy()
    return np.asarray(var.reference(q, k, eye, causal=causal, **params, **extras))


def _torch() -> Any:
    import torch

    return torch
