"""Coarse ball arithmetic over float64: one radius rule per tensor.

A ``CoarseBall`` is a float64 midpoint array together with two non-negative float64 numbers R (absolute)
and e (relative) such that |exact_i - mid_i| <= R + e |mid_i| for every entry i. Its midpoints are exactly
those of the plain float64 evaluation (the same NumPy operations on the same values), so it certifies the
float64 result at about the cost of that evaluation plus one reduction per operation: each rule is
``BallArith``'s entrywise rule with the radii replaced by their largest values and |mid| by
M = max |mid| over the tensor (cached on the ball, computed once, lazily; infinite where a midpoint is
not finite), except that terms proportional to the output's own |y| (rounding errors, exp, quotients,
sums and products of non-negative tensors) stay relative. Every entrywise rule is non-decreasing in the
input radii and in |mid| (non-increasing in |denominator|), so the coarse rule dominates it entrywise;
inner products of signed tensors are bounded by Cauchy-Schwarz. Radii are computed in float64 and
inflated by (1 + 2ku) for a k-operation formula, as ``BallArith`` does. A gated linear recurrence is
bounded as a whole (``enclose_gated_recurrence``) rather than operation by operation. Derivations:
proofs/ball-arithmetic.md, "Coarse first pass" and "A gated recurrence as one rule".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .arith import Arith, Operators, _F64Backend
from .precision import gamma as _gamma_n

_U = math.ldexp(1.0, -53)
_ETA = math.ldexp(1.0, -1074)
_INF = math.inf


@functools.lru_cache(maxsize=4096)
def gamma(n: int) -> float:
    """gamma_n at float64's unit roundoff (precision.gamma: inf where n u >= 1), for an int n, cached."""
    return float(_gamma_n(int(n)))


def _amax(y: np.ndarray) -> float:
    """max |y| over the array (0 for an empty one); inf where an entry is NaN or infinite."""
    if y.size == 0:
        return 0.0
    m = float(np.abs(y).max())
    return m if m < _INF else _INF  # NaN compares False: inf


def _inflate(r: float, k: int) -> float:
    """r (1 + 2ku), covering k roundings of a non-negative radius formula; NaN (0 * inf) becomes inf."""
    r = r * (1.0 + 2 * k * _U)
    return r if r == r else _INF


class CoarseBall(Operators):
    """Midpoints ``mid`` (float64 array) and two numbers for every entry's radius: |exact - mid_i| <=
    ``rad`` + ``rel`` |mid_i| (an absolute and a relative part, both non-negative). ``_max`` caches an
    upper bound on max |mid| (exact where computed here; a slice keeps its source's), ``_pos`` whether
    every midpoint is >= 0."""

    __slots__ = ("ar", "mid", "rad", "rel", "_max", "_pos", "_src")

    def __init__(
        self,
        ar: CoarseArith,
        mid: np.ndarray,
        rad: float,
        rel: float = 0.0,
        mx: float | None = None,
        src: Any = None,
        pos: bool | None = None,
    ):
        self.ar = ar
        self.mid = mid
        self.rad = rad
        self.rel = rel
        self._max = mx
        self._src = src  # a ball whose max |mid| bounds this one's (a slice's source), read lazily
        self._pos = pos

    @property
    def amax(self) -> float:
        """An upper bound on max |mid| (inf where a midpoint is not finite), computed once."""
        if self._max is None:
            self._max = self._src.amax if self._src is not None else _amax(self.mid)
        return self._max

    @property
    def nonneg(self) -> bool:
        """Every midpoint >= 0 (NaN: False), computed once unless known from the operation."""
        if self._pos is None:
            # a slice or rearrangement of a non-negative tensor is non-negative; the converse is not needed
            if self._src is not None and self._src.nonneg:
                self._pos = True
            else:
                self._pos = bool(self.mid.size == 0 or np.min(self.mid) >= 0)
        return self._pos

    @property
    def bound(self) -> float:
        """The largest entry radius, rad + rel M (an upper bound, rounded up)."""
        if not self.rel:
            return self.rad
        return _inflate(self.rad + self.rel * self.amax, 2)

    def __getitem__(self, idx: Any) -> CoarseBall:
        return CoarseBall(self.ar, self.mid[idx], self.rad, self.rel, self._max, self, self._pos)

    def reshape(self, *shape: Any) -> CoarseBall:
        return CoarseBall(self.ar, np.reshape(self.mid, shape), self.rad, self.rel, self._max, self, self._pos)

    def __neg__(self) -> CoarseBall:
        return CoarseBall(self.ar, -self.mid, self.rad, self.rel, self._max)

    def __repr__(self) -> str:
        return f"CoarseBall(shape={self.shape}, rad={self.rad!r}, rel={self.rel!r})"


class CoarseArith(Arith):
    """Ball arithmetic over float64 with one radius rule per tensor (see the module docstring)."""

    enclosing = True

    def __init__(self) -> None:
        super().__init__(_F64Backend())
        self.name = "float64-coarse"

    # conversion --------------------------------------------------------------------------------
    def _lift(self, x: Any) -> CoarseBall:
        if isinstance(x, CoarseBall):
            return x
        if isinstance(x, (int, float)):
            c = float(x)
            return CoarseBall(self, np.asarray(c), 0.0, 0.0, abs(c) if math.isfinite(c) else _INF, pos=c >= 0)
        return CoarseBall(self, np.asarray(x, dtype=np.float64), 0.0)

    def asarray(self, x: Any) -> CoarseBall:
        return self._lift(x)

    def const(self, c: Any) -> CoarseBall:
        return self._lift(np.asarray(c, dtype=np.float64))

    def to_float64(self, x: CoarseBall) -> np.ndarray:
        return np.asarray(x.mid, dtype=np.float64)

    def mid(self, x: Any) -> Any:
        return x.mid if isinstance(x, CoarseBall) else x

    def radius(self, x: CoarseBall) -> np.ndarray:
        """rad + rel |mid| entrywise, rounded up by 2^-50 (the two roundings of this formula and the one
        part in 2^52 that ``BallArith.radius`` adds); inf everywhere where a midpoint is not finite
        (nothing is proven then)."""
        if not x.amax < _INF or not x.rad == x.rad or not x.rel == x.rel:
            return np.full(x.shape, _INF)
        r = (x.rad + x.rel * np.abs(x.mid)) * (1.0 + 2.0**-50) if x.rel else np.full(x.shape, x.rad * (1.0 + 2.0**-50))
        return np.where(np.isnan(r), _INF, r)

    def certify64(self, x: CoarseBall) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(float64 midpoints, bounds, undefined): the midpoints are float64 numbers already, so the bound
        is the radius (no rounding to float64 to add); a NaN or infinite midpoint is undefined."""
        val = self.to_float64(x)
        undefined = ~np.isfinite(val)
        return val, np.where(undefined, _INF, self.radius(x)), undefined

    # the four operations -------------------------------------------------------------------------
    def _add(self, a: CoarseBall, b: CoarseBall) -> CoarseBall:
        """r = (r_a + r_b at their maxima) + u |y|: rad = bound_a + bound_b, rel = u."""
        return CoarseBall(self, a.mid + b.mid, _inflate(a.bound + b.bound, 3), _inflate(_U, 3))

    def _mul(self, a: CoarseBall, b: CoarseBall) -> CoarseBall:
        """Entrywise |m_a| r_b + r_a |m_b| + r_a r_b + u |y| + eta with r = R + e |m|: the terms in
        |m_a m_b| <= (|y| + eta)(1 + 2u) are relative, rel = (e_a + e_b + e_a e_b)(1 + 2u) + u; the others,
        at their maxima, absolute: rad = M_a R_b + R_a M_b + R_a R_b + R_a e_b M_b + e_a M_a R_b + eta
        + 2 eta (e_a + e_b + e_a e_b). An exact operand's terms are zeros."""
        y = a.mid * b.mid
        ea, eb, ra, rb = a.rel, b.rel, a.rad, b.rad
        rel = _U
        rad = _ETA
        if ea or eb:
            e = ea + eb + ea * eb
            rel += e * (1 + 2 * _U)
            rad += 2 * _ETA * e
        if ra:
            rad += ra * b.amax * (1 + eb) + ra * rb
        if rb:
            rad += a.amax * rb * (1 + ea)
        pos = True if (a._pos and b._pos) else None
        # max |y| <= fl(M_a M_b) + eta (rounding is monotone): recorded where both maxima are known or an
        # operand is small against the output (a broadcast factor), saving a reduction over y
        mx = None
        if (a._max is not None or 4 * a.mid.size <= y.size) and (b._max is not None or 4 * b.mid.size <= y.size):
            mx = a.amax * b.amax * (1 + 2 * _U) + _ETA
            mx = mx if mx == mx else _INF  # 0 * inf
        return CoarseBall(self, y, _inflate(rad, 8), _inflate(rel, 4), mx, pos=pos)

    def _div(self, a: CoarseBall, b: CoarseBall) -> CoarseBall:
        """With rho = R_b / min |m_b| + e_b < 1 (every |b'| >= |m_b| (1 - rho)):
        |a'/b' - m_a/m_b| <= R_a / (min |m_b| (1 - rho)) + |m_a/m_b| (e_a + rho) / (1 - rho), and
        |m_a/m_b| <= (|y| + eta)(1 + 2u); plus u |y| + eta for the rounding. inf where rho >= 1."""
        y = self.b.div(a.mid, b.mid)
        bmin = float(np.min(np.abs(b.mid))) if b.mid.size else _INF
        if not bmin > 0:
            return CoarseBall(self, y, _INF)
        rho = _inflate(b.rad / bmin + b.rel, 2) if (b.rad or b.rel) else 0.0
        if not rho < 1:
            return CoarseBall(self, y, _INF)
        g = 1 - rho  # exact: rho in [0, 1) on a binade boundary is representable, else 1 - rho rounds; covered below
        frac = _inflate((a.rel + rho) / g, 4)
        rad = a.rad / (bmin * g) + _ETA * frac * (1 + 2 * _U) + _ETA
        pos = True if (a._pos and b._pos) else None
        return CoarseBall(self, y, _inflate(rad, 6), _inflate(frac * (1 + 2 * _U) + _U, 4), pos=pos)

    def div(self, a: Any, b: Any) -> CoarseBall:
        return self._div(self._lift(a), self._lift(b))

    # elementwise -------------------------------------------------------------------------------
    def exp(self, x: CoarseBall) -> CoarseBall:
        """rel = (expm1(R) + 2u)(1 + 2u) with R = rad + rel M the largest radius of x; rad = eta."""
        em1 = float(np.expm1(x.bound))
        return CoarseBall(self, np.exp(x.mid), _ETA, _inflate((em1 + 2 * _U) * (1 + 2 * _U), 4), pos=True)

    def log(self, x: CoarseBall) -> CoarseBall:
        """rad = -log1p(-rho) + eta with rho = R / min mid + e < 1 (the largest r_i / m_i), rel = 2u; else inf."""
        y = np.log(x.mid)
        lo = float(np.min(x.mid)) if x.mid.size else _INF
        if not lo > 0:
            return CoarseBall(self, y, _INF)
        rho = _inflate(x.rad / lo + x.rel, 2) if (x.rad or x.rel) else 0.0
        if not rho < 1:
            return CoarseBall(self, y, _INF)
        return CoarseBall(self, y, _inflate(float(-np.log1p(-rho)) + _ETA, 4), _inflate(2 * _U, 2))

    def sqrt(self, x: CoarseBall) -> CoarseBall:
        """Every ball above 0 (rho = R / min mid + e < 1): |sqrt(x') - sqrt(m)| <= sqrt(m) rho / (1 + sqrt(1 - rho))
        and sqrt(m) <= |y| (1 + 2u): rel = rho / (1 + sqrt(1 - rho)) (1 + 2u) + u, rad = eta. Some ball
        reaching 0: rad = sqrt(max(R, -min mid) + R) + eta with R the largest radius, which covers the rule
        sqrt(|m| + r) of such a ball and r / (sqrt(m - r) + y) <= sqrt(r) (1 + u) of the others; rel = u."""
        m = x.mid
        y = np.sqrt(np.where(m > 0, m, 0.0))
        lo = float(np.min(m)) if m.size else 0.0
        if not lo == lo:
            return CoarseBall(self, y, _INF)
        rho = (_inflate(x.rad / lo + x.rel, 2) if (x.rad or x.rel) else 0.0) if lo > 0 else _INF
        if rho < 1:
            rel = rho / (1 + math.sqrt(1 - rho)) * (1 + 2 * _U) + _U
            return CoarseBall(self, y, _ETA, _inflate(rel, 6), pos=True)
        big = x.bound
        return CoarseBall(self, y, _inflate(math.sqrt(max(big, -lo) + big) + _ETA, 4), _inflate(_U, 2), pos=True)

    def sin(self, x: CoarseBall) -> CoarseBall:
        """rad = R + eta, rel = 2u (1-Lipschitz, library sin to 1 ulp)."""
        return CoarseBall(self, np.sin(x.mid), _inflate(x.bound + _ETA, 2), _inflate(2 * _U, 2))

    def cos(self, x: CoarseBall) -> CoarseBall:
        """rad = R + eta, rel = 2u."""
        return CoarseBall(self, np.cos(x.mid), _inflate(x.bound + _ETA, 2), _inflate(2 * _U, 2))

    def abs(self, x: CoarseBall) -> CoarseBall:
        return CoarseBall(self, np.abs(x.mid), x.rad, x.rel, x._max, x, pos=True)

    def maximum(self, x: CoarseBall, c: float) -> CoarseBall:
        """max(x, c) is 1-Lipschitz in x, but an entry replaced by c keeps the radius of x there: rad = R."""
        return CoarseBall(self, np.where(x.mid > c, x.mid, float(c)), x.bound, pos=True if c >= 0 else None)

    def minimum(self, x: CoarseBall, c: float) -> CoarseBall:
        return CoarseBall(self, np.where(x.mid > c, float(c), x.mid), x.bound)

    def where_pos(self, x: CoarseBall, a: Any, b: Any) -> CoarseBall:
        """a where x > 0 else b: each entry keeps its branch's radius (rad = max, rel = max); where some
        ball of x straddles 0 (|mid| <= R_x), rad grows to max(R_a, R_b) + max over those entries of
        |m_a - m_b| (both branches covered)."""
        a, b = self._lift(a), self._lift(b)
        y = np.where(x.mid > 0, a.mid, b.mid)
        rad, rel = max(a.rad, b.rad), max(a.rel, b.rel)
        straddle = np.abs(x.mid) <= x.bound
        if straddle.any():
            gap = np.broadcast_to(np.abs(a.mid - b.mid), np.broadcast_shapes(straddle.shape, y.shape))
            worst = float(np.max(np.where(np.broadcast_to(straddle, gap.shape), gap, 0.0)))
            rad = max(rad, _inflate(max(a.bound, b.bound) + worst, 2)) if worst == worst else _INF
        pos = True if (a._pos and b._pos) else None
        return CoarseBall(self, y, rad, rel, pos=pos)

    # structure ---------------------------------------------------------------------------------
    def mT(self, x: CoarseBall) -> CoarseBall:
        return CoarseBall(self, np.swapaxes(x.mid, -1, -2), x.rad, x.rel, x._max, x, x._pos)

    def fill(self, x: CoarseBall, keep: np.ndarray, value: float) -> CoarseBall:
        """x where ``keep`` else the exact constant ``value``: kept entries keep their radius."""
        pos = True if (x._pos and value >= 0) else None
        mx = None if x._max is None else max(x._max, abs(float(value)))
        return CoarseBall(self, np.where(keep, x.mid, float(value)), x.rad, x.rel, mx, pos=pos)

    def concat(self, xs: Sequence[Any], axis: int = -1) -> CoarseBall:
        bs = [self._lift(x) for x in xs]
        mid = np.concatenate([b.mid for b in bs], axis)
        return CoarseBall(self, mid, max(b.rad for b in bs), max(b.rel for b in bs))

    def stack(self, xs: Sequence[Any], axis: int = 0) -> CoarseBall:
        bs = [self._lift(x) for x in xs]
        return CoarseBall(self, np.stack([b.mid for b in bs], axis), max(b.rad for b in bs), max(b.rel for b in bs))

    def zeros(self, shape: tuple[int, ...]) -> CoarseBall:
        return CoarseBall(self, np.zeros(shape), 0.0, 0.0, 0.0, pos=True)

    # reductions and products -------------------------------------------------------------------
    def _sum_radius(self, x: CoarseBall, n: int) -> tuple[float, float]:
        """Entrywise sum r_i + gamma_{n-1} sum |m_i| = n R + (e + gamma_{n-1}) sum |m_i|. Midpoints all >= 0:
        sum |m_i| = sum m_i <= y / (1 - gamma_{n-1}) (a float64 sum of non-negative terms), a relative
        part; else sum |m_i| <= n M, absolute. Inflated by k = 2n + 4: the n + 2 of ``BallArith.sum`` and n
        more so that the computed value stays above the entrywise rule's computed value."""
        if n == 0:
            return 0.0, 0.0
        g = gamma(n - 1)
        k = 2 * n + 4
        if x.nonneg:
            return _inflate(n * x.rad, k), _inflate((x.rel + g) / (1 - g), k)
        return _inflate(n * x.rad + (x.rel + g) * n * x.amax, k), 0.0

    def sum(self, x: CoarseBall, axis: int, keepdims: bool = False) -> CoarseBall:
        n = np.shape(x.mid)[axis]
        rad, rel = self._sum_radius(x, n)
        return CoarseBall(self, np.sum(x.mid, axis=axis, keepdims=keepdims), rad, rel, pos=x._pos)

    def cumsum(self, x: CoarseBall, axis: int) -> CoarseBall:
        """The k-th prefix's radius is largest at k = n in every term (gamma_{k-1} <= gamma_{n-1})."""
        n = np.shape(x.mid)[axis]
        rad, rel = self._sum_radius(x, n)
        return CoarseBall(self, np.cumsum(x.mid, axis=axis), rad, rel, pos=x._pos)

    @staticmethod
    def _norm_up(x: np.ndarray, axis: int) -> float:
        """An upper bound on max ||x||_2 along ``axis`` (over every other index): the computed sum of n
        squares s satisfies exact <= (s + n eta)(1 + gamma_2n), then the square root (one rounding);
        inflated by (1 + 2 * 4u) for the roundings of this formula."""
        n = x.shape[axis]
        if n == 0 or x.size == 0:
            return 0.0
        s = float((np.einsum("...ij,...ij->...j", x, x) if axis == -2 else np.einsum("...j,...j->...", x, x)).max())
        if not s < _INF:
            return _INF
        return _inflate(math.sqrt((s + n * _ETA) * (1 + gamma(2 * n))), 4)

    def matmul(self, a: Any, b: Any) -> CoarseBall:
        """Entrywise (Higham (3.13)) gamma_n (|A||B|)_ij + (R_A |B|)_ij + ((|A| + R_A) R_B)_ij + n eta with
        R = rad + rel |mid| is, summed over k,
        c (|A||B|)_ij + rad_A (1 + e_B) ||B_:j||_1 + (1 + e_A) rad_B ||A_i:||_1 + n rad_A rad_B + n eta,
        c = gamma_n + e_A + e_B (1 + e_A). Both operands >= 0: (|A||B|)_ij = (AB)_ij <= (|y| + n eta) / (1 - gamma_n),
        a relative part c / (1 - gamma_n). Else, absolute, by Cauchy-Schwarz, (|A||B|)_ij <= N_A N_B with
        N_A = max_i ||A_i:||_2, N_B = max_j ||B_:j||_2, and ||x||_1 <= sqrt(n) ||x||_2; or, where A is much
        smaller than B (a recurrence's query against its state), (|A||B|)_ij <= L_A M_B with
        L_A = max_i ||A_i:||_1 and ||B_:j||_1 <= n M_B (one reduction over A, and M_B, which the next step
        reads anyway). Inflated by k = 2n + 12 (n + 6 as ``BallArith.matmul``; the rest keeps the computed
        value above the entrywise rule's computed value, which may round up by gamma_n, where the bound is
        tight)."""
        a, b = self._lift(a), self._lift(b)
        n = np.shape(a.mid)[-1]
        y = np.matmul(a.mid, b.mid)
        ea, eb, ra, rb = a.rel, b.rel, a.rad, b.rad
        gn = gamma(n)
        c = gn + ea + eb * (1 + ea)
        k = 2 * n + 12
        pos = a.nonneg and b.nonneg
        rad = n * _ETA
        rel = 0.0
        if pos:
            rel = _inflate(c / (1 - gn), k) if gn < 1 else _INF
            rad += rel * n * _ETA
        if not pos or ra or rb:
            if 4 * a.mid.size <= b.mid.size:
                # L_A: a float64 sum of |a| is at least the exact one times (1 - gamma_n)
                la = float(np.abs(a.mid).sum(axis=-1).max()) / (1 - gn) if a.mid.size else 0.0
                la = la if la < _INF else _INF
                ia, ib = la, n * b.amax  # bounds on ||A_i:||_1 and ||B_:j||_1
                both = la * b.amax  # on (|A||B|)_ij
            else:
                na, nb = self._norm_up(a.mid, -1), self._norm_up(b.mid, -2)
                root = math.sqrt(n) * (1 + 2 * _U)  # sqrt rounded: the factor keeps it above the exact root
                ia, ib, both = root * na, root * nb, na * nb
            if not pos:
                rad += c * both
            if ra:
                rad += ra * (1 + eb) * ib
            if rb:
                rad += rb * (1 + ea) * ia
            if ra and rb:
                rad += n * ra * rb
        return CoarseBall(self, y, _inflate(rad, k), rel, pos=True if pos else None)

    # a whole recurrence --------------------------------------------------------------------------
    def enclose_gated_recurrence(
        self, q: Any, k: Any, v: Any, alpha: Any, initial_state: Any
    ) -> tuple[CoarseBall, CoarseBall]:
        """(o, S_N) of S_t = diag(alpha_t) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t (``common.gated_recurrence``)
        with one radius rule for the whole recurrence instead of one per operation and token.

        Midpoints: the definition's float64 operations, the outer products k_t v_t^T of a block of tokens
        at once and the products q_t^T S_t of its states in one batched matmul. Radii, with r_x the largest
        radius of input x, a_t = max |alpha_t|, sigma_t = max |S_t| over the computed states,
        w_t = max |k_t v_t^T| over the computed products, K_t = max |k_t|, V_t = max |v_t|:

            E_t = (a_t + r_a) E_{t-1} + (r_a + u (1 + u) a_t) sigma_{t-1} + r_k V_t + K_t r_v + r_k r_v
                  + u w_t + u / (1 - u) sigma_t + 3 eta,     E_0 = r_0,

        bounds max |S'_t - S_t| over every exact state S'_t of inputs in the balls, and
        |o'_tj - o_tj| <= (Q_t + d_k r_q) E_t + d_k r_q sigma_t + gamma_dk Q_t sigma_t + d_k eta with
        Q_t = max ||q_t||_1 (proofs/ball-arithmetic.md, "A gated recurrence as one rule"). Shapes as
        ``gated_recurrence``: q, k (B, H, N, d_k), v (B, H, N, d_v), alpha (B, H, N, d_k or 1) or None,
        initial_state (B, H, d_k, d_v) or None."""
        q, k, v = self._lift(q), self._lift(k), self._lift(v)
        a = None if alpha is None else self._lift(alpha)
        B, H, N, dk = np.broadcast_shapes(q.shape, k.shape)
        dv = v.shape[-1]
        s0 = None if initial_state is None else self._lift(initial_state)
        s = np.zeros((B, H, dk, dv)) if s0 is None else s0.mid
        r0 = 0.0 if s0 is None else s0.bound
        out = np.empty((B, H, N, dv))
        sigma, wmax = np.empty(N + 1), np.empty(N)
        sigma[0] = _amax(s)
        for lo in range(0, N, _BLOCK):
            hi = min(N, lo + _BLOCK)
            updates = k.mid[:, :, lo:hi, :, None] * v.mid[:, :, lo:hi, None, :]  # (B, H, T, d_k, d_v)
            states = np.empty(np.broadcast_shapes(updates.shape, (B, H, hi - lo, dk, dv)))
            for i in range(hi - lo):
                decayed = s if a is None else a.mid[:, :, lo + i, :, None] * s
                s = np.add(updates[:, :, i], decayed, out=states[:, :, i])
            out[:, :, lo:hi] = np.matmul(q.mid[:, :, lo:hi, None, :], states)[..., 0, :]
            sigma[lo + 1 : hi + 1] = _amax_over(states, (0, 1, 3, 4))
            wmax[lo:hi] = _amax_over(updates, (0, 1, 3, 4))
        if not (np.all(sigma < _INF) and np.all(wmax < _INF)):
            return CoarseBall(self, out, _INF), CoarseBall(self, s, _INF)
        ra = 0.0 if a is None else a.bound
        at = np.ones(N) if a is None else _amax_over(np.broadcast_to(a.mid, (B, H, N, a.shape[-1])), (0, 1, 3))
        kt, vt = _amax_over(k.mid, (0, 1, 3)), _amax_over(v.mid, (0, 1, 3))
        rk, rv, rq = k.bound, v.bound, q.bound
        prod = 0.0 if a is None else _U * (1 + _U)  # the rounding of alpha_t S_{t-1}
        drive = (ra + prod * at) * sigma[:-1] + rk * vt + kt * rv + rk * rv + _U * wmax + _U / (1 - _U) * sigma[1:]
        drive = drive + 3 * _ETA
        growth = (at + ra).tolist()
        errs = np.empty(N)
        e = r0
        for t, d in enumerate(drive.tolist()):
            e = growth[t] * e + d
            errs[t] = e
        # sums and products of non-negative terms, each rounded: the drive's 14 roundings and the
        # recursion's 2 a step, over N steps, counted four times over so that the computed radius stays
        # above the entrywise balls' computed radii, which inflate every operation of every step
        errs = errs * (1 + 2 * 64 * (N + 1) * _U)
        last = float(errs[-1]) if N else r0
        if not last < _INF:
            return CoarseBall(self, out, _INF), CoarseBall(self, s, _INF)
        gk = gamma(dk)
        qt = _amax_over(np.abs(q.mid).sum(axis=-1), (0, 1)) / (1 - gk) if gk < 1 else np.full(N, _INF)
        rad = (qt + dk * rq) * errs + dk * rq * sigma[1:] + gk * qt * sigma[1:]
        rad_o = _inflate(float(np.max(rad)) + dk * _ETA, 2 * dk + 12) if N else 0.0  # NaN: inf
        return CoarseBall(self, out, rad_o), CoarseBall(self, s, last)


_BLOCK = 64  # tokens whose states are kept at once: B H 64 d_k d_v float64 numbers


def _amax_over(y: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """max |y| over ``axes`` (inf where a NaN or an infinity is among them)."""
    m = np.abs(y).max(axis=axes) if y.size else np.zeros(np.delete(y.shape, axes))
    return np.where(np.isnan(m), _INF, m)


COARSE_F64 = CoarseArith()
