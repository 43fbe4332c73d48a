"""Spectra of attention Gram matrices, computed from their low-rank factors (proofs/gram-spectrum.md).

For A = Phi_Q Phi_K^T (N x N, rank <= m) with thin QR factorisations Phi_Q = U_1 R_1, Phi_K = U_2 R_2,
A = U_1 (R_1 R_2^T) U_2^T, so the nonzero singular values of A are those of the m x m core R_1 R_2^T:
O(N m^2) work and O(N m) memory, never N x N.

Resolution. A computed singular value carries an absolute error of at most
    floor = c(N, m) u ||Phi_Q||_2 ||Phi_K||_2,    c(N, m) = max(N, m) + m,
(Weyl's inequality plus the normwise backward errors of Householder QR, the m x m product and the SVD;
proofs/gram-spectrum.md, with the constant as the usual LAPACK-style model). Values at or below the
floor are *unresolved*: they are reported as a count, never as numbers. With ``precision='auto'`` a
float64 result with unresolved or poorly resolved values (floor > rtol * s_i) is recomputed in mpmath at
a precision chosen from the shortfall, where m is small enough (``mp_max_m``); exact zeros (exact low
rank) stay unresolved at any precision, and the report says at which floor.

Variants without a low-rank factorisation (softmax, masks, decays) fall back to the dense matrix, and the
``Spectrum`` says so (``method='dense'``, floor = N u s_1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import mpmath
import numpy as np

from .validation import check_array

U64 = math.ldexp(1.0, -53)


@dataclass
class Spectrum:
    """Nonzero singular values of one N x N (or m x m) matrix, descending, resolved ones only.

    ``floor``: every reported value is within ``floor`` of the exact one, and every unresolved value
    is at most ``floor``. ``condition`` = s_1 / s_r over the r resolved values (the numerical rank),
    ``effective_rank`` = exp(H(p)), p_i = s_i / sum s (Roy & Vetterli 2007), ``energy_share`` =
    s_1^2 / sum s_i^2 (over the resolved values; the unresolved add at most ``unresolved`` floor^2)."""

    values: np.ndarray
    unresolved: int
    floor: float
    method: str  # 'factors' or 'dense'
    arithmetic: str  # 'float64' or 'mpmath[p]'
    size: int  # number of candidate nonzero values, min(N, m)
    note: str = ""
    head: tuple[int, ...] = field(default=())

    @property
    def rank(self) -> int:
        """Numerical rank: the number of singular values provably above the floor."""
        return int(self.values.size)

    @property
    def condition(self) -> float:
        if self.values.size == 0:
            return math.inf
        return float(self.values[0] / self.values[-1])

    @property
    def effective_rank(self) -> float:
        return effective_rank(self.values)

    @property
    def energy_share(self) -> float:
        return energy_share(self.values)

    def to_dict(self) -> dict[str, Any]:
        return {
            "values": [float(x) for x in self.values],
            "unresolved": self.unresolved,
            "floor": self.floor,
            "rank": self.rank,
            "condition": self.condition,
            "effective_rank": self.effective_rank,
            "energy_share": self.energy_share,
            "method": self.method,
            "arithmetic": self.arithmetic,
            "size": self.size,
            "note": self.note,
            "head": list(self.head),
        }


def effective_rank(s: np.ndarray) -> float:
    """exp(-sum p_i log p_i) with p_i = s_i / sum s (Roy & Vetterli 2007); 1 <= erank <= rank."""
    s = np.asarray(s, dtype=np.float64)
    if s.size == 0 or s.sum() == 0:
        return 0.0
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-np.sum(p * np.log(p))))


def energy_share(s: np.ndarray) -> float:
    """s_1^2 / sum s_i^2, in [1 / rank, 1]."""
    s = np.asarray(s, dtype=np.float64)
    if s.size == 0:
        return 0.0
    top = s.max()
    if top == 0:
        return 0.0
    e = 1.0 / np.linalg.norm(s / top)  # scaled by s_1 first so the squares cannot overflow
    return float(e * e)


def resolution_constant(n: int, m: int) -> int:
    """c(N, m) = max(N, m) + m (proofs/gram-spectrum.md)."""
    return max(n, m) + m


# --------------------------------------------------------------------------------------------------
# the factor path
# --------------------------------------------------------------------------------------------------
def _core_f64(fq: np.ndarray, fk: np.ndarray) -> tuple[np.ndarray, float]:
    r1: np.ndarray = np.asarray(np.linalg.qr(fq, mode="r"))
    r2: np.ndarray = np.asarray(np.linalg.qr(fk, mode="r"))
    s = np.linalg.svd(r1 @ r2.T, compute_uv=False)
    scale = float(np.linalg.norm(r1, 2) * np.linalg.norm(r2, 2))
    return s, scale


def _core_mp(fq: np.ndarray, fk: np.ndarray, prec: int) -> tuple[np.ndarray, float]:
    """The same algorithm in mpmath at ``prec`` bits (float64 inputs convert exactly)."""
    with mpmath.workprec(prec):
        _, r1 = mpmath.qr(mpmath.matrix(fq.tolist()), mode="skinny")
        _, r2 = mpmath.qr(mpmath.matrix(fk.tolist()), mode="skinny")
        core = r1 * r2.T
        s = mpmath.svd_r(core, compute_uv=False)
        vals = np.array(sorted((float(x) for x in s), reverse=True))
        n1 = float(mpmath.svd_r(r1, compute_uv=False)[0]) if r1.rows else 0.0
        n2 = float(mpmath.svd_r(r2, compute_uv=False)[0]) if r2.rows else 0.0
    return vals, n1 * n2


def _mp_split(fq: np.ndarray, fk: np.ndarray, prec: int, c: int) -> tuple[np.ndarray, int, float]:
    """(resolved values, unresolved count, floor) of the factor path in mpmath at ``prec`` bits."""
    s, scale = _core_mp(fq, fk, prec)
    floor = c * math.ldexp(1.0, -prec) * scale
    return (*_split(s, floor), floor)


def _split(s: np.ndarray, floor: float) -> tuple[np.ndarray, int]:
    s = np.sort(np.asarray(s, dtype=np.float64))[::-1]
    keep = s > floor
    return s[keep], int((~keep).sum())


def factor_spectrum(
    fq: Any,
    fk: Any,
    *,
    precision: str | int = "auto",
    rtol: float = 1e-3,
    mp_max_m: int = 64,
) -> Spectrum:
    """Spectrum of A = fq fk^T from the factors fq (N, m), fk (N, m) without forming A.

    ``precision``: 'float64', an mpmath precision in bits (>= 53), or 'auto' (float64, then mpmath where
    some value is unresolved or resolved to worse than ``rtol`` relative, if m <= ``mp_max_m``)."""
    fq = np.asarray(fq, dtype=np.float64)
    fk = np.asarray(fk, dtype=np.float64)
    check_array("fq", fq, ndim=2, layout="(N, m)")
    check_array("fk", fk, ndim=2, layout="(N, m)")
    if fq.shape[1] != fk.shape[1]:
        raise ValueError(f"fk: got shape {fk.shape}; expected (N, {fq.shape[1]}) with the m of fq {fq.shape}")
    n, m = max(fq.shape[0], fk.shape[0]), fq.shape[1]
    size = min(fq.shape[0], fk.shape[0], m)
    c = resolution_constant(n, m)
    if precision not in ("auto", "float64"):
        if isinstance(precision, bool) or not isinstance(precision, (int, np.integer)) or precision < 53:
            raise ValueError(f"precision: got {precision!r}; expected 'auto', 'float64' or bits >= 53")
        vals, unres, floor = _mp_split(fq, fk, int(precision), c)
        return Spectrum(vals, unres, floor, "factors", f"mpmath[{int(precision)}]", size)
    s, scale = _core_f64(fq, fk)
    floor = c * U64 * scale
    vals, unres = _split(s, floor)
    poorly = bool(vals.size and floor > rtol * vals[-1])
    if precision == "float64" or not (unres or poorly):
        return Spectrum(vals, unres, floor, "factors", "float64", size)
    if m > mp_max_m:
        return Spectrum(
            vals,
            unres,
            floor,
            "factors",
            "float64",
            size,
            note=f"m = {m} > mp_max_m = {mp_max_m}: values at or below the float64 floor are not resolved",
        )
    # bits float64 lacked for the smallest value it saw (floor / (rtol s)), plus guard bits; values
    # float64 could not separate from zero get 64 extra bits, doubled once if still unresolved
    smallest = vals[-1] if vals.size else scale
    short = math.log2(max(floor / (rtol * max(smallest, 1e-300)), 1.0))
    prec = 53 + int(math.ceil(short)) + 20 + (64 if unres else 0)
    vals, unres, floor_mp = _mp_split(fq, fk, prec, c)
    if unres:
        prec *= 2
        vals, unres, floor_mp = _mp_split(fq, fk, prec, c)
    note = f"{unres} value(s) at or below {floor_mp:.3g} even in mpmath[{prec}]: numerically zero" if unres else ""
    return Spectrum(vals, unres, floor_mp, "factors", f"mpmath[{prec}]", size, note=note)


def dense_spectrum(a: Any, *, reason: str = "") -> Spectrum:
    """Spectrum of a dense matrix a (N, M) by LAPACK's SVD; floor = max(N, M) u s_1."""
    a = np.asarray(a, dtype=np.float64)
    check_array("a", a, ndim=2, layout="(N, M)")
    s = np.linalg.svd(a, compute_uv=False)
    floor = max(a.shape) * U64 * float(s[0]) if s.size else 0.0
    vals, unres = _split(s, floor)
    return Spectrum(vals, unres, floor, "dense", "float64", min(a.shape), note=reason)


def feature_gram_spectrum(fk: Any, **kw: Any) -> Spectrum:
    """Eigenvalues of the feature Gram G = fk^T fk (m x m), as a Spectrum: lambda_i = s_i(fk)^2
    (computed from fk's own QR/SVD, never by forming G), floor = floor(fk)^2 + 2 s_1 floor(fk).
    Its condition is kappa(fk)^2 and its ``energy_share`` is lambda_1^2 / sum lambda_i^2."""
    fk = np.asarray(fk, dtype=np.float64)
    check_array("fk", fk, ndim=2, layout="(N, m)")
    eye = np.eye(fk.shape[1])  # fk = fk I^T: the same machinery gives the singular values of fk
    sp = factor_spectrum(fk, eye, **kw)
    s1 = float(sp.values[0]) if sp.values.size else 0.0
    floor = sp.floor * (sp.floor + 2 * s1)
    vals, unres = _split(sp.values**2, floor)
    return Spectrum(vals, unres + sp.unresolved, floor, "factors", sp.arithmetic, sp.size, note=sp.note)


# --------------------------------------------------------------------------------------------------
# variants: factors where the variant has them, the dense matrix otherwise
# --------------------------------------------------------------------------------------------------
def decayed_cumsum(x: np.ndarray, g: np.ndarray | None, axis: int = -2) -> np.ndarray:
    """z_t = exp(g_t) z_{t-1} + x_t along ``axis`` (z_0 = x_0), g broadcastable to x; None: the plain cumsum.
    A recurrence, not exp(G_t - G_s) of cumulated logs, so that no term leaves float64's range."""
    if g is None:
        return np.cumsum(x, axis=axis)
    xs = np.moveaxis(x, axis, 0)
    alpha = np.moveaxis(np.broadcast_to(np.exp(g), x.shape), axis, 0)
    z = np.empty(xs.shape, dtype=np.result_type(xs, alpha))
    z[0] = xs[0]
    for t in range(1, xs.shape[0]):
        z[t] = alpha[t] * z[t - 1] + xs[t]
    return np.moveaxis(z, 0, axis)


def denominator_terms(
    fq: Any, fk: Any, *, causal: bool = False, g: Any = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(den, lean, scale), each (..., N), from features fq, fk (..., N, m) in float64: with
    z_i = sum_{j (<= i)} phi(k_j), den_i = phi(q_i) . z_i, lean_i = sum_c |phi(q_i)_c z_ic| and
    scale_i = |phi(q_i)| . sum_j |phi(k_j)| (den_i / scale_i is the row's margin). ``g`` (..., N, 1 or m),
    causal only: log decays, key j entering row i as phi(k_j) exp(sum_{j<t<=i} g_t) (``decayed_cumsum``)."""
    if causal:
        z, za = decayed_cumsum(fk, g), decayed_cumsum(np.abs(fk), g)
    else:
        z, za = np.sum(fk, axis=-2, keepdims=True), np.sum(np.abs(fk), axis=-2, keepdims=True)
    return np.sum(fq * z, axis=-1), np.sum(np.abs(fq * z), axis=-1), np.sum(np.abs(fq) * za, axis=-1)


def normaliser_margin(fq: Any, fk: Any, *, causal: bool = False) -> dict[str, float]:
    """For den_i = phi(q_i) . sum_{j (<= i)} phi(k_j): ``margin`` = min_i den_i / (|phi(q_i)| . sum_j
    |phi(k_j)|) (1 for non-negative features; near 0 or negative means cancellation or a vanishing
    denominator), and ``range`` = min_i |den_i| / max_i |den_i|. fq, fk: (..., N, m)."""
    fq = np.asarray(fq, dtype=np.float64)
    fk = np.asarray(fk, dtype=np.float64)
    for name, x in (("fq", fq), ("fk", fk)):
        if not np.all(np.isfinite(x)):
            raise ValueError(f"{name}: got non-finite entries in an array of shape {x.shape}; expected finite features")
    den, _, scale = denominator_terms(fq, fk, causal=causal)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(scale > 0, den / np.where(scale > 0, scale, 1.0), 0.0)
        big = float(np.max(np.abs(den)))
        rng = float(np.min(np.abs(den)) / big) if big > 0 else 0.0
    return {"margin": float(np.min(rel)), "range": rng, "min_denominator": float(np.min(den))}


def gram_spectra(
    variant: Any,
    q: Any,
    k: Any,
    *,
    causal: bool = False,
    normalised: bool = False,
    precision: str | int = "auto",
    **kwargs: Any,
) -> list[Spectrum]:
    """One Spectrum per (b, h) of the variant's Gram matrix on q, k (B, H, N, d).

    Variants with a feature map give A = phi(Q) phi(K)^T from the factors when non-causal
    (``normalised``: P = diag(1/den) A, factors (phi(Q) / den, phi(K))); a causal mask or a variant
    without factors (softmax, DiagAttention, decays) gives the dense attention matrix M with O = M V
    (the reference on V = I_N), with ``method='dense'`` and the reason in ``note``."""
    from . import variants as _variants

    var = _variants.get(variant)
    out: list[Spectrum] = []
    feats = var.features(q, k, **kwargs) if var.features_fn is not None else None
    if feats is not None and not causal:
        fq, fk = feats
        if normalised:
            den = np.sum(fq * np.sum(fk, axis=-2, keepdims=True), axis=-1, keepdims=True)
            fq = fq / den
        for b, h in np.ndindex(*fq.shape[:2]):
            sp = factor_spectrum(fq[b, h], fk[b, h], precision=precision)
            sp.head = (b, h)
            out.append(sp)
        return out
    if feats is not None:  # causal: the masked kernel has no rank-m factorisation
        fq, fk = feats
        mat = np.tril(fq @ np.swapaxes(fk, -1, -2))
        if normalised:
            mat = mat / mat.sum(-1, keepdims=True)
        reason = "causal mask: the masked matrix has no rank-m factorisation"
    else:
        mat = attention_matrix(var, q, k, causal=causal, **kwargs)
        reason = f"variant {var.name!r} has no low-rank factorisation"
    for b, h in np.ndindex(*mat.shape[:2]):
        sp = dense_spectrum(mat[b, h], reason=reason)
        sp.head = (b, h)
        out.append(sp)
    return out


def attention_matrix(variant: Any, q: Any, k: Any, *, causal: bool = False, **kwargs: Any) -> np.ndarray:
    """The matrix M (B, H, N, N) with O = M V, as the float64 reference on V = I_N. Defined for
    variants linear in V (not for an output norm: NormAttention, RetNet with GroupNorm)."""
    from . import variants as _variants
    from .variants.common import attention_matrix as _attention_matrix

    var = _variants.get(variant)
    params, extras = var.split_kwargs(kwargs)
    if "linear-in-v" not in var.tags(params):
        raise ValueError(f"variant: {var.name!r} is not linear in v (output norm); no attention matrix M with O = M V")
    return _attention_matrix(var, q, k, causal=causal, params=params, extras=extras)
