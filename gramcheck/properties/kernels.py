"""Random-feature kernels (FAVOR+): unbiasedness and the closed-form MSE checked statistically, ORF
against iid (Theorem 2), the block conditioning of orthogonal projections, and the propagation of the
kernel error through row normalisation (proofs/favor-mse.md, proofs/orf-conditioning.md,
proofs/row-normalisation.md).

Statistical checks use R independent projections and a two-sided (one-sided for ORF) z-test on the
sample mean over the R draws, at a false-alarm rate ``alpha`` for the whole Finding (Bonferroni over the
P pairs): z_crit = Phi^{-1}(1 - alpha / (2P)). With R = 2000 and pairs of norm <= 0.8 the statistics'
tails are light enough for the normal approximation (proofs/favor-mse.md, "false alarms")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.stats import norm as _normal

from .. import bounds
from ..arith import F64
from ..featuremaps import favor, random_projection
from ..findings import Finding
from ..precision import unit_roundoff
from ..strategies import AttentionInputs
from ..targets import Target
from .base import bound_of, guarded, ratio_finding

DRAWS = 2000
ALPHA = 1e-6
Sampler = Callable[[int, int, int], np.ndarray]  # (m, d, seed) -> W (m, d)


def orf_sampler(m: int, d: int, seed: int) -> np.ndarray:
    return random_projection(m, d, kind="orf", seed=seed)


def iid_sampler(m: int, d: int, seed: int) -> np.ndarray:
    return random_projection(m, d, kind="iid", seed=seed)


def probe_pairs(d: int, seed: int = 0, norms: tuple[float, ...] = (0.2, 0.5, 0.8)) -> tuple[np.ndarray, np.ndarray]:
    """P = 2 len(norms) pairs (x, y) of the given norms: aligned (|x + y| large, where positive features
    are worst) and anti-aligned (SM small, where trig features are worst), in random directions."""
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for r in norms:
        for sign in (1.0, -1.0):
            u = rng.standard_normal(d)
            u /= np.linalg.norm(u)
            w = sign * u + 0.3 * rng.standard_normal(d) / np.sqrt(d)
            xs.append(r * u)
            ys.append(r * w / np.linalg.norm(w))
    return np.array(xs), np.array(ys)


def estimates(kind: str, x: np.ndarray, y: np.ndarray, m: int, sampler: Sampler, draws: int, seed: int) -> np.ndarray:
    """(draws, P) estimates phi(x_p) . phi(y_p) of exp(x_p . y_p), one projection per draw."""
    w = np.stack([sampler(m, x.shape[-1], seed + r) for r in range(draws)])  # (R, m, d)
    fx = favor(F64, np.broadcast_to(x, (draws, *x.shape)), w, kind=kind, is_query=True, scale=1.0, stabilize=False)
    fy = favor(F64, np.broadcast_to(y, (draws, *y.shape)), w, kind=kind, is_query=True, scale=1.0, stabilize=False)
    return np.sum(fx * fy, axis=-1)


def _z_finding(name: str, z: np.ndarray, crit: float, **details: Any) -> Finding:
    measured = float(np.max(z))
    return Finding(name, bool(measured <= crit), measured, crit, details=details)


def kernel_unbiased(
    kind: str = "positive",
    *,
    m: int = 16,
    d: int = 16,
    sampler: Sampler = orf_sampler,
    draws: int = DRAWS,
    alpha: float = ALPHA,
    seed: int = 0,
) -> Finding:
    """E[phi(x).phi(y)] = exp(x.y) (Lemma 1): max_p |mean_R(est) - SM| / (sd / sqrt(R)) <= z_crit."""
    x, y = probe_pairs(d, seed)
    est = estimates(kind, x, y, m, sampler, draws, seed)
    sm = bounds.softmax_kernel(x, y)
    z = np.abs(est.mean(0) - sm) / (est.std(0, ddof=1) / np.sqrt(draws))
    crit = float(_normal.isf(alpha / (2 * len(sm))))
    return _z_finding("kernel-unbiased", z, crit, kind=kind, m=m, d=d, draws=draws, alpha=alpha)


def kernel_mse(
    kind: str = "positive",
    *,
    m: int = 16,
    d: int = 16,
    draws: int = DRAWS,
    alpha: float = ALPHA,
    seed: int = 0,
    sampler: Sampler = iid_sampler,
) -> Finding:
    """iid features: the sample MSE matches bounds.favor_mse (Lemma 2), two-sided z-test on the mean of
    (est - SM)^2; details give the measured/theory ratio per pair."""
    x, y = probe_pairs(d, seed)
    est = estimates(kind, x, y, m, sampler, draws, seed)
    sq = (est - bounds.softmax_kernel(x, y)) ** 2
    theory = bounds.favor_mse(x, y, m, kind)
    z = np.abs(sq.mean(0) - theory) / (sq.std(0, ddof=1) / np.sqrt(draws))
    crit = float(_normal.isf(alpha / (2 * len(theory))))
    return _z_finding(
        "kernel-mse",
        z,
        crit,
        kind=kind,
        m=m,
        d=d,
        draws=draws,
        alpha=alpha,
        ratio=[float(r) for r in sq.mean(0) / theory],
    )


def orf_mse(
    *, m: int = 16, d: int = 16, draws: int = DRAWS, alpha: float = ALPHA, seed: int = 0, sampler: Sampler = orf_sampler
) -> Finding:
    """Positive features, m <= d: MSE_ort <= MSE_iid - 2(m-1)/(m(d+2)) (SM - e^{-(|x|^2+|y|^2)/2})^2
    (Theorem 2), one-sided z-test at alpha; details give the measured ORF MSE / the bound."""
    x, y = probe_pairs(d, seed)
    est = estimates("positive", x, y, m, sampler, draws, seed)
    sq = (est - bounds.softmax_kernel(x, y)) ** 2
    bound = bounds.favor_mse(x, y, m, "positive") - bounds.orf_mse_reduction(x, y, m, d)
    z = (sq.mean(0) - bound) / (sq.std(0, ddof=1) / np.sqrt(draws))
    crit = float(_normal.isf(alpha / len(bound)))
    return _z_finding(
        "orf-mse", z, crit, m=m, d=d, draws=draws, alpha=alpha, ratio=[float(r) for r in sq.mean(0) / bound]
    )


def orf_conditioning(
    sampler: Sampler = orf_sampler, *, m: int = 32, d: int = 16, seeds: int = 20, dtype: str = "float64"
) -> Finding:
    """Each complete d-row block of an orthogonal projection has cond_2 = max/min row norm exactly
    (W_b W_b^T = diag |w_i|^2); measured = max over blocks of (cond / ratio - 1) against the rounding
    slack 2 u sqrt(d) (1 + ratio) / (1 - u sqrt(d) ratio) (proofs/orf-conditioning.md)."""
    u = unit_roundoff(dtype)
    worst, worst_bound, seen = 0.0, 1.0, []
    for s in range(seeds):
        for cond, ratio in bounds.orf_block_condition(sampler(m, d, s), d):
            slack = 2 * u * np.sqrt(d) * (1 + ratio) / (1 - u * np.sqrt(d) * ratio) + 4 * d * np.finfo(float).eps
            dev = cond / ratio - 1
            seen.append(dev / slack)
            if dev / slack > worst / worst_bound:
                worst, worst_bound = dev, slack
    measured = float(max(seen)) if seen else 0.0
    return Finding(
        "orf-conditioning",
        measured <= 1.0,
        measured,
        1.0,
        rigour="proved",
        details={"max_relative_excess": worst, "m": m, "d": d, "draws": seeds},
    )


def _exact_kernel(target: Target, q: np.ndarray, k: np.ndarray) -> np.ndarray:
    s = target.variant.scale(target.params, q.shape[-1])
    return np.exp(s * q @ np.swapaxes(k, -1, -2))


@guarded("row-normalisation")
def row_normalisation(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """FAVOR+ (positive/hyperbolic) against exact softmax: with eps_i = max_j |K'_ij / K_ij - 1| < 1 for
    the same projection, |o'_ik - o_ik| <= (L_i / 2) range_j(v_jk) + rounding, L_i = 2 eps_i / (1 - eps_i)
    (proofs/row-normalisation.md); o' is the target's output, o exact softmax attention."""
    fq, fk = target.variant.features(ex.q, ex.k, **target.params, **ex.extras)
    est = fq @ np.swapaxes(fk, -1, -2)
    with np.errstate(all="ignore"):
        exact = _exact_kernel(target, ex.q, ex.k)
        n = ex.q.shape[-2]
        keep = np.tril(np.ones((n, n), bool)) if causal else np.ones((n, n), bool)
        rel = np.where(keep, np.abs(est / exact - 1), 0.0)
    eps = rel.max(-1)  # (B, H, N)
    if not np.all(np.isfinite(exact)) or np.any(exact[..., keep] == 0) or not np.all(eps < 1):
        return None  # the premise eps < 1 fails (or the exact kernel over/underflows): bound vacuous
    l1 = bounds.row_normalisation_l1(eps)
    p_exact = np.where(keep, exact, 0.0)
    o = (p_exact @ ex.v) / p_exact.sum(-1, keepdims=True)
    out = target(ex.q, ex.k, ex.v, causal=causal, **ex.extras)
    rounding = bound_of(target, ex, causal=causal) + 8 * np.finfo(float).eps * np.abs(o)
    bound = bounds.row_normalisation_output(l1, ex.v, causal=causal) + rounding
    return ratio_finding("row-normalisation", np.abs(out - o), bound, ex, max_eps=float(eps.max()))
