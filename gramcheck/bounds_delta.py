"""Closed-form bounds of the (gated) delta rule S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
(gramcheck.variants.deltanet), each derived in proofs/delta-rule.md and tested where it is tight in
tests/test_delta_rule.py.

Shapes: keys k (..., N, d_k) and values v (..., N, d_v) as the variant sees them (after any l2
normalisation), write strengths beta and log-decays g (..., N). Norms of states are Frobenius norms
(which bound the spectral norm).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _arr(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _alpha(g: Any, shape: tuple[int, ...]) -> np.ndarray:
    return np.ones(shape) if g is None else np.exp(_arr(g))


def transition_norm(beta: Any, k_norm: Any) -> np.ndarray:
    """Spectral norm of the transition I - beta k k^T: max(1, |1 - beta |k|^2|) (its eigenvalues are 1,
    d_k - 1 times, and 1 - beta |k|^2). It is <= 1 iff 0 <= beta |k|^2 <= 2; above, the state can grow by
    this factor per token (proofs/delta-rule.md, section 1)."""
    return np.maximum(1.0, np.abs(1.0 - _arr(beta) * _arr(k_norm) ** 2))


def unit_key_state_bound(v: Any, beta: Any, g: Any = None, initial_norm: Any = 0.0) -> np.ndarray:
    """For unit (or shorter) keys and beta in [0, 2]: |S_t|_F <= sum_{s<=t} (prod_{s<r<=t} alpha_r) beta_s |v_s|
    + (prod_{r<=t} alpha_r) |S_0|_F, returned for every t (..., N). Holds with equality for one repeated
    key, beta = 2 and values of alternating sign (proofs/delta-rule.md, section 2). Does NOT hold for
    beta > 2 or |k| > 1 (section 3)."""
    v, beta = _arr(v), _arr(beta)
    alpha = _alpha(g, beta.shape)
    return _geometric(alpha, beta * np.linalg.norm(v, axis=-1), initial_norm)


def state_norm_bound(k: Any, v: Any, beta: Any, g: Any = None, initial_norm: Any = 0.0) -> np.ndarray:
    """Any keys and write strengths: |S_t|_F <= B_t with B_t = alpha_t rho_t B_{t-1} + |beta_t| |k_t| |v_t|,
    B_0 = |S_0|_F, rho_t = transition_norm(beta_t, |k_t|); returned for every t (..., N). Equals
    ``unit_key_state_bound`` when beta |k|^2 in [0, 2]; beyond, it grows like prod rho_t, and holds with
    equality for one repeated key and values of alternating sign (proofs/delta-rule.md, section 3)."""
    k, v, beta = _arr(k), _arr(v), _arr(beta)
    kn = np.linalg.norm(k, axis=-1)
    rho = transition_norm(beta, kn)
    return _geometric(_alpha(g, beta.shape) * rho, np.abs(beta) * kn * np.linalg.norm(v, axis=-1), initial_norm)


def _geometric(factor: np.ndarray, term: np.ndarray, initial: Any) -> np.ndarray:
    """B_t = factor_t B_{t-1} + term_t along the last axis, B_0 = initial."""
    out = np.empty_like(term)
    acc = np.broadcast_to(_arr(initial), term.shape[:-1]).astype(np.float64)
    for t in range(term.shape[-1]):
        acc = factor[..., t] * acc + term[..., t]
        out[..., t] = acc
    return out


def output_norm_bound(q: Any, state_bound: Any, scale: float) -> np.ndarray:
    """|o_t| = |S_t^T (s q_t)| <= s |q_t| |S_t|_2 <= s |q_t| B_t for a state bound B (..., N)."""
    return float(scale) * np.linalg.norm(_arr(q), axis=-1) * _arr(state_bound)


def ut_system(k: Any, beta: Any, g: Any = None) -> np.ndarray:
    """The chunk's unit lower-triangular matrix M = I + strictly_lower(diag(beta) (K K^T * Gamma)),
    Gamma_ts = exp(b_t - b_s), b the cumulative log-decays inside the chunk; k (..., c, d_k) and beta,
    g (..., c) are one chunk's. Returns (..., c, c)."""
    k, beta = _arr(k), _arr(beta)
    c = k.shape[-2]
    gram = k @ np.swapaxes(k, -1, -2)
    if g is not None:
        b = np.cumsum(_arr(g), axis=-1)
        with np.errstate(over="ignore"):
            gram = gram * np.exp(np.tril(b[..., :, None] - b[..., None, :]))
    return np.eye(c) + np.tril(beta[..., :, None] * gram, -1)


def ut_inverse_bound(k: Any, beta: Any, g: Any = None) -> np.ndarray:
    """Entrywise bound on |M^{-1}| for the chunk's system M = ``ut_system(k, beta, g)``: 1 on the diagonal,
    and for t > s
        |M^{-1}_ts| <= |beta_t| |k_t| |k_s| (prod_{s<r<=t} alpha_r) (prod_{s<r<t} rho_r),
    rho_r = transition_norm(beta_r, |k_r|). With |k| <= 1 and beta in [0, 2] this is <= beta_t <= 2, so
    |M^{-1}|_inf <= 1 + 2 (c - 1). Equality for one repeated key (proofs/delta-rule.md, section 4)."""
    k, beta = _arr(k), _arr(beta)
    c = k.shape[-2]
    kn = np.linalg.norm(k, axis=-1)
    alpha = _alpha(g, beta.shape)
    rho = transition_norm(beta, kn)
    out = np.zeros(beta.shape[:-1] + (c, c))
    for s in range(c):
        out[..., s, s] = 1.0
        path = np.ones(beta.shape[:-1])  # prod_{s<r<t} alpha_r rho_r times alpha_t, built up along t
        for t in range(s + 1, c):
            reach = path * alpha[..., t]
            out[..., t, s] = np.abs(beta[..., t]) * kn[..., t] * kn[..., s] * reach
            path = reach * rho[..., t]
    return out


def ut_condition_bound(c: int, beta_max: float = 2.0) -> float:
    """kappa_inf(M) = |M|_inf |M^{-1}|_inf <= (1 + beta_max (c - 1))^2 for unit keys, beta in [0, beta_max],
    beta_max <= 2, decays <= 1: the triangular solve of a chunk of c tokens is polynomially conditioned.
    Equality for one repeated key and beta = beta_max = 2 (proofs/delta-rule.md, section 4)."""
    if not 0.0 <= beta_max <= 2.0:
        raise ValueError(f"beta_max: got {beta_max}; expected a value in [0, 2] (the contractive regime)")
    if c < 1:
        raise ValueError(f"c: got {c}; expected a chunk size >= 1")
    return float((1.0 + beta_max * (c - 1)) ** 2)
