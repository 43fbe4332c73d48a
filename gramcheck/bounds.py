"""Closed-form bounds, each with its derivation or citation in proofs/ (named in the docstring) and a test
on inputs where it is tight. Public API: ``gramcheck.bounds.favor_mse(...)`` etc.

Shapes: x, y are single vectors (d,) or batches (..., d); returned arrays broadcast over the batch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .featuremaps import FAVOR_KINDS
from .precision import gamma
from .validation import check_choice


def _finite(name: str, x: Any) -> np.ndarray:
    """x as a float64 array; ValueError naming ``name`` when an entry is NaN or infinite."""
    arr = np.asarray(x, dtype=np.float64)
    bad = ~np.isfinite(arr)
    if bad.any():
        raise ValueError(
            f"{name}: got {int(bad.sum())} non-finite entries (first {arr[bad].ravel()[0]!r}) in an array of "
            f"shape {arr.shape}; expected finite real numbers"
        )
    return arr


def _sq(x: Any) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return np.sum(x * x, axis=-1)


def softmax_kernel(x: Any, y: Any) -> np.ndarray:
    """SM(x, y) = exp(x . y)."""
    return np.exp(np.sum(np.asarray(x, dtype=np.float64) * np.asarray(y, dtype=np.float64), axis=-1))


def favor_mse(x: Any, y: Any, m: int, kind: str = "positive") -> np.ndarray:
    """Mean squared error of the FAVOR+ estimate phi(x).phi(y) of SM(x, y) = exp(x.y) with m iid
    w_i ~ N(0, I_d) (Choromanski et al. 2021, Lemma 2; proofs/favor-mse.md):

    positive:   (1/m) SM^2 (exp(|x+y|^2) - 1)
    hyperbolic: (1/2) (1 - exp(-|x+y|^2)) * positive        (m pairs exp(+-w.x), 2m features)
    trig:       (1/(2m)) exp(|x|^2 + |y|^2) (1 - exp(-|x-y|^2))^2
    """
    check_choice("kind", kind, FAVOR_KINDS)
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(f"m: got {m!r}; expected a positive integer number of random features")
    x = _finite("x", x)
    y = _finite("y", y)
    z2 = _sq(x + y)
    if kind == "trig":
        return np.exp(_sq(x) + _sq(y)) * (-np.expm1(-_sq(x - y))) ** 2 / (2 * m)
    pos = softmax_kernel(x, y) ** 2 * np.expm1(z2) / m
    return pos if kind == "positive" else 0.5 * (-np.expm1(-z2)) * pos


def favor_output_moments(
    x: Any, y: Any, v: Any, m: int, kind: str = "positive", *, causal: bool = False
) -> dict[str, np.ndarray]:
    """What m iid features w_a ~ N(0, I_d) guarantee about the normalised FAVOR+ output
    o_i = sum_j K^_ij v_j / sum_j K^_ij, K^_ij = phi(x_i).phi(y_j) (proofs/favor-output.md). x, y: scaled
    queries and keys (B, H, N, d) (kernel exp(x.y)), v (B, H, N, d_v); j <= i when ``causal``.

    With kappa_j = exp(x_i.y_j), b = sum kappa_j, r = sum kappa_j v_j / b (the exact output) and the
    covariance of the estimates Sigma_jl = kappa_j kappa_l (E_jl - 1) / m, where E = exp(Z Z^T) for
    positive and cosh(Z Z^T) for hyperbolic features (Z_j = x_i + y_j; its diagonal is favor_mse),
    c = v - r, D = max_j |c_j|, var_B = 1^T Sigma 1, var_c = c^T Sigma c and, for a split point
    theta in (0, 1), p_theta >= P(B < theta b) (Chebyshev, or Maurer's bound for a mean of m
    non-negative terms with second moment m var_B + b^2, whichever is smaller):

        |E o - r|    <= min(D sqrt(var_B) / b,  min_theta sqrt(var_c var_B) / (theta b^2) + D p_theta)   'bias'
        E (o - r)^2  <= min_theta var_c / (theta b)^2 + D^2 p_theta                                    'mse'

    Returns arrays (B, H, N, d_v): 'exact' r, 'bias', 'mse', 'lo' and 'hi' (o lies in [lo, hi]: the
    weights are positive), 'spread' D."""
    if kind not in ("positive", "hyperbolic"):
        raise ValueError(f"kind: got {kind!r}; expected 'positive' or 'hyperbolic' (positive weights)")
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(f"m: got {m!r}; expected a positive integer number of random features")
    x, y, v = _finite("x", x), _finite("y", y), _finite("v", v)
    B, H, N, _ = x.shape
    theta = np.array(_SPLITS)[:, None]
    out = {name: np.zeros((B, H, N, v.shape[-1])) for name in ("exact", "bias", "mse", "lo", "hi", "spread")}
    for b_, h, i in np.ndindex(B, H, N):
        n = i + 1 if causal else N
        xi, ys, vs = x[b_, h, i], y[b_, h, :n], v[b_, h, :n]
        kappa = np.exp(ys @ xi)
        z = xi + ys
        g = z @ z.T
        excess = np.expm1(g) if kind == "positive" else 2.0 * np.sinh(g / 2.0) ** 2  # E - 1
        sigma = np.outer(kappa, kappa) * excess / m
        total = kappa.sum()
        r = kappa @ vs / total
        c = vs - r
        # var_B / b^2 and var_c / b^2, each raised by its float64 rounding (sums of n^2 signed terms, and
        # c's own error dr): never below the exact value, never negative (var_c = 0 for repeated keys)
        grow = gamma(n * n + 10)
        dr = gamma(n + 2) * np.max(np.abs(vs), axis=0)
        mag = np.abs(sigma)
        rel_b = (max(sigma.sum(), 0.0) + grow * mag.sum()) / total**2
        rel_c = np.einsum("jc,jl,lc->c", c, sigma, c)
        slack = grow * np.einsum("jc,jl,lc->c", np.abs(c), mag, np.abs(c))
        slack += np.einsum("jc,jl->c", 2.0 * np.abs(c) + dr, mag) * dr
        rel_c = (np.maximum(rel_c, 0.0) + slack) / total**2
        spread = np.max(np.abs(c), axis=0)
        with np.errstate(divide="ignore", over="ignore"):
            chebyshev = np.minimum(1.0, rel_b / (1.0 - theta) ** 2)
            tail = np.minimum(chebyshev, np.exp(-((1.0 - theta) ** 2) / (2.0 * (rel_b + 1.0 / m))))  # Maurer
        bias = np.min(np.sqrt(rel_c * rel_b) / theta + spread * tail, axis=0)
        out["exact"][b_, h, i] = r
        out["bias"][b_, h, i] = np.minimum(spread * math.sqrt(rel_b), bias)
        out["mse"][b_, h, i] = np.min(rel_c / theta**2 + spread**2 * tail, axis=0)
        out["lo"][b_, h, i] = vs.min(axis=0)
        out["hi"][b_, h, i] = vs.max(axis=0)
        out["spread"][b_, h, i] = spread
    return out


_SPLITS = (0.25, 0.5, 0.7, 0.8, 0.9, 0.95)  # split points theta the output bounds minimise over


def bernstein_deviation(variance: Any, width: Any, draws: int, log_terms: float) -> np.ndarray:
    """t with P(|mean of ``draws`` iid X - E X| >= t) <= 2 exp(-log_terms) when Var X <= ``variance`` and
    |X - E X| <= ``width`` (Bernstein's inequality, solved for t; proofs/favor-output.md):
    t = (w L / 3 + sqrt((w L / 3)^2 + 2 R s^2 L)) / R, L = ``log_terms``. One-sided: P(mean - E X >= t)
    <= exp(-L)."""
    w = np.asarray(width, dtype=np.float64) * log_terms / 3.0
    return (w + np.sqrt(w**2 + 2.0 * draws * np.asarray(variance, dtype=np.float64) * log_terms)) / draws


def orf_mse_reduction(x: Any, y: Any, m: int, d: int) -> np.ndarray:
    """Theorem 2 of Choromanski et al. 2021 (proofs/favor-mse.md): for positive features and m <= d
    orthogonal rows, MSE_ort <= MSE_iid - 2(m-1)/(m(d+2)) (SM(x,y) - exp(-(|x|^2 + |y|^2)/2))^2.
    Returns the subtracted term (>= 0)."""
    if not 1 <= m <= d:
        raise ValueError(f"m: got {m}; expected 1 <= m <= d = {d} (one orthogonal block)")
    gap = softmax_kernel(x, y) - np.exp(-(_sq(x) + _sq(y)) / 2)
    return 2 * (m - 1) / (m * (d + 2)) * gap**2


def row_normalisation_l1(eps: float | np.ndarray, *, tight: bool = False) -> np.ndarray:
    """If every kernel entry of a row has relative error at most eps < 1, the row's normalised weights
    move by at most 2 eps / (1 - eps) in L1, or by the sharp
    2 eps / (1 + sqrt(1 - eps^2)) (attained; proofs/row-normalisation.md)."""
    e = np.asarray(eps, dtype=np.float64)
    if np.any(np.isnan(e)) or np.any(e < 0) or np.any(e >= 1):
        raise ValueError(f"eps: got {eps!r}; expected 0 <= eps < 1")
    return 2 * e / (1 + np.sqrt(1 - e * e)) if tight else 2 * e / (1 - e)


def value_hull(v: Any, *, causal: bool, rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo), each (..., rows, d_v): per output row i and channel, the max and min of v_jk over the
    keys row i sees (all N, or j <= i when causal); v (..., N, d_v), rows = N by default."""
    v = np.asarray(v, dtype=np.float64)
    if causal:
        return np.maximum.accumulate(v, axis=-2), np.minimum.accumulate(v, axis=-2)
    shape = v.shape[:-2] + (v.shape[-2] if rows is None else rows, v.shape[-1])
    return np.broadcast_to(v.max(-2, keepdims=True), shape), np.broadcast_to(v.min(-2, keepdims=True), shape)


def row_normalisation_output(l1: Any, v: Any, *, causal: bool = False) -> np.ndarray:
    """Output error from a row-weight change of L1 size ``l1`` (..., N) per row: |o'_ik - o_ik| <=
    (l1_i / 2) (max_j v_jk - min_j v_jk) (the weight changes sum to zero; proofs/row-normalisation.md).
    v: (..., N_keys, d_v); causal ranges run over j <= i (N_keys = N). Returns (..., N, d_v)."""
    l1 = np.asarray(l1, dtype=np.float64)
    hi, lo = value_hull(v, causal=causal, rows=l1.shape[-1])
    return 0.5 * l1[..., None] * (hi - lo)


def qknorm_weight_range(n: int, tau: float) -> tuple[float, float]:
    """Sharp range of a softmax weight over n keys with logits in [-tau, tau]:
    [1 / (1 + (n-1) e^{2 tau}), 1 / (1 + (n-1) e^{-2 tau})] (proofs/qknorm-weight-range.md).
    n >= 1 keys (with n = 1 the one weight is 1) and a finite tau >= 0; anything else is a ValueError."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n: got {n!r}; expected an integer number of keys >= 1")
    if not (isinstance(tau, (int, float, np.floating)) and math.isfinite(tau) and tau >= 0):
        raise ValueError(f"tau: got {tau!r}; expected a finite logit bound tau >= 0")
    return 1.0 / (1.0 + (n - 1) * math.exp(2 * tau)), 1.0 / (1.0 + (n - 1) * math.exp(-2 * tau))


def gated_state_bound(k: Any, v: Any, alpha_max: float) -> np.ndarray:
    """|S_t| <= max_s |k_s| |v_s|^T / (1 - alpha_max) entrywise, for every t (proofs/gated-state-bound.md).
    k (..., N, d_k), v (..., N, d_v) -> (..., d_k, d_v)."""
    if not 0 <= alpha_max < 1:
        raise ValueError(f"alpha_max: got {alpha_max!r}; expected 0 <= alpha_max < 1")
    k = np.abs(np.asarray(k, dtype=np.float64))
    v = np.abs(np.asarray(v, dtype=np.float64))
    return np.max(k[..., :, :, None] * v[..., :, None, :], axis=-3) / (1 - alpha_max)


def unnormalised_output_bound(fq: Any, fk: Any, v: Any, divisor: float = 1.0, *, causal: bool = False) -> np.ndarray:
    """|o_i| <= sum_j |phi(q_i).phi(k_j)| |v_j| / c <= n_i max_j |A_ij| max_j |v_j| / c with n_i the number
    of keys in row i (N, or i + 1 causal): the unnormalised output grows linearly with N
    (proofs/unnormalised-growth.md). fq, fk (N, m), v (N, d_v) -> (N,) bound on max_k |o_ik|."""
    a = np.abs(np.asarray(fq, dtype=np.float64) @ np.asarray(fk, dtype=np.float64).T)
    if causal:
        a = np.tril(a)
    n_i = np.arange(1, a.shape[0] + 1) if causal else np.full(a.shape[0], a.shape[0])
    return n_i * a.max(axis=1) * np.max(np.abs(v)) / divisor


def orf_block_condition(projection: Any, d: int) -> list[tuple[float, float]]:
    """For each complete block of d rows of an orthogonal random matrix W (m, d): (cond_2 of the
    block, max row norm / min row norm). Orthogonal rows make W_b W_b^T = diag(|w_i|^2), so the two are
    equal; iid rows give a larger condition number (proofs/orf-conditioning.md)."""
    w = np.asarray(projection, dtype=np.float64)
    out = []
    for start in range(0, w.shape[0] - d + 1, d):
        blk = w[start : start + d]
        s = np.linalg.svd(blk, compute_uv=False)
        norms = np.linalg.norm(blk, axis=1)
        out.append((float(s[0] / s[-1]), float(norms.max() / norms.min())))
    return out


# ---------------------------------------------------------------------------------------------------
# Jacobian bounds (proofs/jacobian-bounds.md); p is one row-normalised weight matrix (N, N)
# ---------------------------------------------------------------------------------------------------
def jacobian_v_bound(p: Any) -> float:
    """O = P V is linear in V with Jacobian P (x) I, so ||dO/dV||_2 = ||P||_2 <= sqrt(||P||_1 ||P||_inf);
    for row-stochastic P, ||P||_inf = 1 and the bound is sqrt(max column sum)."""
    p = np.abs(np.asarray(p, dtype=np.float64))
    return float(math.sqrt(p.sum(0).max() * p.sum(1).max()))


def softmax_jacobian_q_bound(p: Any, k: Any, v: Any, scale: float) -> float:
    """o_i depends on q_i only, with do_i/dq_i = s Cov_{p_i}(v, k) = s sum_j p_ij (v_j - o_i)(k_j - kbar_i)^T;
    ||.||_2 <= s sqrt(E_p |v - o_i|^2 E_p |k - kbar_i|^2) (Cauchy-Schwarz). Bound: max over i."""
    p = np.asarray(p, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    o, kb = p @ v, p @ k
    ev = np.einsum("ij,ij->i", p, _sq(v[None, :, :] - o[:, None, :]))
    ek = np.einsum("ij,ij->i", p, _sq(k[None, :, :] - kb[:, None, :]))
    return float(scale * np.sqrt(ev * ek).max())


def _linear_parts(fq: Any, fk: Any, v: Any, causal: bool) -> tuple[np.ndarray, ...]:
    fq = np.asarray(fq, dtype=np.float64)
    fk = np.asarray(fk, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    a = fq @ fk.T
    keep = np.tril(np.ones(a.shape, bool)) if causal else np.ones(a.shape, bool)
    a = np.where(keep, a, 0.0)
    den = a.sum(1)
    o = (a @ v) / den[:, None]
    dev = np.where(keep, np.sqrt(_sq(v[None, :, :] - o[:, None, :])), 0.0)  # (N, N): |v_j - o_i|, j in row i
    return fq, fk, den, dev


def linear_jacobian_q_bound(fq: Any, fk: Any, v: Any, dphi_max: float = 1.0, *, causal: bool = False) -> float:
    """Normalised linear attention, o_i = sum_j a_ij v_j / den_i, a_ij = phi(q_i).phi(k_j) (j <= i causal):
    do_i/dphi(q_i) = sum_j (v_j - o_i) phi(k_j)^T / den_i, so
    ||dO/dQ||_2 <= dphi_max max_i sum_j |v_j - o_i| |phi(k_j)| / den_i, unbounded as den_i -> 0
    (TransNormer's argument; proofs/jacobian-bounds.md). dphi_max bounds |phi'| (1 for elu+1, relu)."""
    fq, fk, den, dev = _linear_parts(fq, fk, v, causal)
    return float(dphi_max * ((dev @ np.sqrt(_sq(fk))) / den).max())


def linear_jacobian_k_bound(fq: Any, fk: Any, v: Any, dphi_max: float = 1.0, *, causal: bool = False) -> float:
    """do_i/dphi(k_j) = (v_j - o_i) phi(q_i)^T / den_i, so
    ||dO/dK||_2 <= dphi_max sqrt(sum_i |phi(q_i)|^2 sum_j |v_j - o_i|^2 / den_i^2) (proofs/jacobian-bounds.md)."""
    fq, fk, den, dev = _linear_parts(fq, fk, v, causal)
    return float(dphi_max * math.sqrt(np.sum(_sq(fq) * np.sum(dev**2, axis=1) / den**2)))


def softmax_jacobian_k_bound(p: Any, q: Any, v: Any, scale: float) -> float:
    """do_i/dk_j = s p_ij (v_j - o_i) q_i^T, so ||dO/dK||_2 <= s sqrt(max_i |q_i|^2 E_{p_i}|v - o_i|^2
    * max_j sum_i p_ij) (Cauchy-Schwarz twice; proofs/jacobian-bounds.md)."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    o = p @ v
    ev = np.einsum("ij,ij->i", p, _sq(v[None, :, :] - o[:, None, :]))
    return float(scale * math.sqrt(np.max(_sq(q) * ev) * p.sum(0).max()))


def normattention_jacobian_v_bound(a: Any, v: Any, *, gain: float = 1.0, eps: float = 0.0) -> float:
    """NormAttention O = Norm(U), U = A V (A the masked kernel phi(Q) phi(K)^T, no denominator), Norm the
    RMSNorm y = g sqrt(d_v) u / sqrt(|u|^2 + d_v eps) of each row. dy/du = (g sqrt(d_v)/r)(I - u u^T / r^2),
    r = sqrt(|u|^2 + d_v eps), of norm g sqrt(d_v)/r; with dU = A dV:
    ||dO/dV||_2 <= g max_i sqrt(d_v) / r_i * ||A||_2 (proofs/jacobian-bounds.md). Bounded unless a row's
    |u_i| is small: the norm replaces the denominator's 1/den by 1/|u|."""
    a = np.asarray(a, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    u = a @ v
    dv = v.shape[-1]
    r = np.sqrt(_sq(u) + dv * eps)
    return float(gain * np.max(np.sqrt(dv) / r) * np.linalg.norm(a, 2))
