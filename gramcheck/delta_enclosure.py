"""A certified float64 evaluation of the (gated) delta rule: the definition's recurrence in plain float64
with a rigorous componentwise bound on the distance to the exact output (proofs/delta-enclosure.md).

Ball arithmetic cannot serve this recurrence: its componentwise radii pass through S_{t-1}^T k_t and
k_t delta_t^T every token and grow by a constant factor per token (the wrapping effect; about 0.7 bits
per token at d = 16-64), so the float64 ball is useless beyond N ~ 60 and mpmath balls need hundreds of
bits at N = 320. The exact recurrence, S_t = F_t(S_{t-1}) with F_t(S) = alpha_t (I - beta_t k_t k_t^T) S
+ beta_t k_t v_t^T, is affine with Lipschitz constant c_t = alpha_t max(1, |1 - beta_t |k_t|^2|) in the
Frobenius norm (c_t <= 1 for normalised keys and beta in [0, 2]), so the error of the computed state
E_t = S^_t - S_t obeys |E_t|_F <= c_t |E_{t-1}|_F + |rho_t|_F, rho_t = S^_t - F_t(S^_{t-1}) the error of one
computed step (its rounding and the error of the normalised inputs), bounded componentwise by
Higham's gamma_n. In the contractive regime the errors add up instead of multiplying.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .arith import BALL_F64
from .hyperparams import scale_value
from .precision import gamma

# covers the float64 rounding of the bound's own evaluation: relative (N + d_k d_v + d_k + 20) u at most,
# below 2^-20 while that count is below 2^30 (larger problems are left to the balls)
SAFETY = 1.0 + 2.0**-20
LIMIT = 2**30
ETA = 2.0**-1074  # the absolute error a product can make when its result underflows (Higham, eq. (2.8))
TINY = 2.0**-1000  # added to every bound: the underflow of the bound's own products


def _norm(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """The 2-norm of the non-negative x over ``axes``, scaled by the largest entry so that the squares
    cannot underflow (an underflowing error norm would drop accumulated error from the bound)."""
    top = np.max(x, axis=axes, keepdims=True)
    scaled = np.sqrt(np.sum((x / np.where(top > 0, top, 1.0)) ** 2, axis=axes))
    return np.squeeze(top, axis=axes) * scaled


def _abs_dot(x: np.ndarray, m: np.ndarray) -> np.ndarray:
    """|x|^T-style products (B, H, d) x (B, H, d, e) -> (B, H, e) on non-negative arrays."""
    return np.einsum("bhk,bhke->bhe", x, m)


def enclosure(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool,
    beta: np.ndarray,
    g: np.ndarray | None = None,
    scale: Any,
    l2norm: bool,
    l2norm_eps: float,
    initial_state: np.ndarray | None = None,
    output_final_state: bool = False,
) -> tuple[Any, Any] | None:
    """(o^, bound) with |o^ - o| <= bound componentwise, o the exact output of the variant's definition
    (variants.deltanet.reference) on the float64 inputs q, k (B, H, N, d_k), v (B, H, N, d_v), beta, g
    (B, H, N), S_0 (B, H, d_k, d_v); with ``output_final_state``, ((o^, S^_N), (bound, state bound)), every
    entry of S^_N bounded by the recursion's |E_N|_F. Entries whose bound is not finite are left to the
    oracle's balls; None for a problem too large for the bound's own rounding allowance (``LIMIT``)."""
    from .variants.deltanet import l2_normalise

    B, H, N, dk = q.shape
    dv = v.shape[-1]
    if N + dk * dv + dk + 20 >= LIMIT:
        return None
    # the inputs of the recurrence through balls: normalised, scaled q and k, alpha = exp(g)
    with BALL_F64.context():
        qb, kb = BALL_F64.asarray(q), BALL_F64.asarray(k)
        if l2norm:
            qb, kb = l2_normalise(BALL_F64, qb, l2norm_eps), l2_normalise(BALL_F64, kb, l2norm_eps)
        qb = qb * scale_value(BALL_F64, scale, dk)
        ab = None if g is None else BALL_F64.exp(BALL_F64.asarray(g))
    qm, rq = BALL_F64.to_float64(qb), BALL_F64.radius(qb)
    km, rk = BALL_F64.to_float64(kb), BALL_F64.radius(kb)
    qa, ka = np.abs(qm) + rq, np.abs(km) + rk  # |q|, |k| of the exact inputs (and of the midpoints)
    am, ram = (None, None) if ab is None else (BALL_F64.to_float64(ab), BALL_F64.radius(ab))
    g1, g2, gk = gamma(1), gamma(2), gamma(dk)
    state = np.zeros((B, H, dk, dv)) if initial_state is None else np.asarray(initial_state, dtype=np.float64)
    err = np.zeros((B, H))  # |E_t|_F
    out = np.empty((B, H, N, dv))
    bound = np.empty((B, H, N, dv))
    for t in range(N):
        kt, rt, Kt, b = km[:, :, t], rk[:, :, t], ka[:, :, t], beta[:, :, t]
        if am is None or ram is None:
            s, ds, alpha_hi = state, 0.0, 1.0
        else:
            a, ra = am[:, :, t], ram[:, :, t]
            s = a[..., None, None] * state
            ds = g1 * np.abs(s) + ra[..., None, None] * np.abs(state) + ETA  # |s^ - alpha S^|
            alpha_hi = a + ra
        p = np.einsum("bhk,bhkv->bhv", kt, s)
        sa = np.abs(s)
        dp = gk * _abs_dot(Kt, sa) + _abs_dot(rt, sa) + _abs_dot(Kt, np.broadcast_to(ds, sa.shape)) + dk * ETA
        delta = b[..., None] * (v[:, :, t] - p)
        ddelta = g2 * np.abs(b)[..., None] * (np.abs(v[:, :, t]) + np.abs(p)) + np.abs(b)[..., None] * dp + ETA
        new = s + kt[..., :, None] * delta[..., None, :]
        rho = (
            g2 * (sa + np.abs(kt)[..., :, None] * np.abs(delta)[..., None, :])
            + ds
            + rt[..., :, None] * np.abs(delta)[..., None, :]
            + Kt[..., :, None] * ddelta[..., None, :]
            + ETA
            + TINY
        )
        # |k|^2 in [norm_lo, norm_hi], widened by the sums' own rounding (and underflow)
        norm_hi = np.sum(Kt**2, axis=-1) * (1.0 + gk) + dk * ETA
        norm_lo = np.sum(np.maximum(np.abs(kt) - rt, 0.0) ** 2, axis=-1) * (1.0 - gk)
        lipschitz = alpha_hi * np.maximum(1.0, np.maximum(np.abs(1.0 - b * norm_lo), np.abs(1.0 - b * norm_hi)))
        err = lipschitz * err + _norm(rho, (-2, -1))
        state = new
        qt, aq = qm[:, :, t], np.abs(state)
        out[:, :, t] = np.einsum("bhk,bhkv->bhv", qt, state)
        q_norm = _norm(qa[:, :, t], (-1,))
        bound[:, :, t] = (
            gk * _abs_dot(np.abs(qt), aq) + _abs_dot(rq[:, :, t], aq) + (err * q_norm)[..., None] + dk * ETA
        )
    bound = bound * SAFETY + TINY
    if not output_final_state:
        return _certified(out, bound)
    state_bound = np.broadcast_to((err * SAFETY + TINY)[..., None, None], state.shape)
    (o, bo), (s, bs) = _certified(out, bound), _certified(state, state_bound)
    return (o, s), (bo, bs)


def _certified(value: np.ndarray, bound: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(value, bound) with an infinite bound (and value 0) where either is not finite."""
    bad = ~(np.isfinite(value) & np.isfinite(bound))
    return np.where(bad, 0.0, value), np.where(bad, np.inf, bound)
