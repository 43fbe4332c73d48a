"""The arithmetic shim: reference code is written once against an ``Arith`` and evaluated in any of four.

* ``F64``           float64 NumPy arrays.
* ``MP(prec)``      NumPy object arrays of mpmath ``mpf`` at ``prec`` bits (>= 53, so float64 inputs
                    convert exactly).
* ``BALL_F64``      midpoint-radius ("ball") arithmetic over float64: every value carries a radius that
                    encloses the exact real result of the same formula on the same (exact) inputs.
* ``BallMP(prec)``  the same over mpmath, for inputs float64 cannot enclose tightly.

Reference code uses the operators ``+ - * /`` (with arrays of the arithmetic or exact Python scalars) and
the methods below; nothing else. Ball rules follow Rump's midpoint-radius arithmetic with the standard
model fl(x op y) = (x op y)(1 + delta) + e, |delta| <= u, |e| <= eta / 2 (eta the smallest subnormal) and
e = 0 unless the exact result is a nonzero subnormal (sums whose result is subnormal are exact);
library functions (exp, log, sin, cos) are trusted to 1 ulp (2u relative, eta where subnormal). Every
radius is computed in the same arithmetic and then inflated by (1 + 2ku) for a k-operation formula, which
covers the rounding of the radius computation itself (all its terms are non-negative). Derivations:
proofs/ball-arithmetic.md.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Any

import mpmath
import numpy as np

from .precision import PROBABILISTIC_LAMBDA, gamma, gamma_tilde, mp_precision, round_to

Array = Any  # an ndarray (float64 or object of mpf) or a Ball


# --------------------------------------------------------------------------------------------------
# backends: elementwise functions on plain values
# --------------------------------------------------------------------------------------------------
class _F64Backend:
    name = "float64"
    u = math.ldexp(1.0, -53)
    eta = math.ldexp(1.0, -1074)  # smallest subnormal: the spacing of the numbers below ``tiny``
    tiny = math.ldexp(1.0, -1022)  # smallest normal: a result at or above it does not underflow
    prec = 53

    exp = staticmethod(np.exp)
    expm1 = staticmethod(np.expm1)
    log = staticmethod(np.log)
    log1p = staticmethod(np.log1p)
    sqrt = staticmethod(np.sqrt)
    sin = staticmethod(np.sin)
    cos = staticmethod(np.cos)

    @staticmethod
    def asarray(x: Any) -> np.ndarray:
        return np.asarray(x, dtype=np.float64)

    @staticmethod
    def to_float64(x: Any) -> np.ndarray:
        return np.asarray(x, dtype=np.float64)

    @staticmethod
    def scalar(c: float) -> Any:
        return float(c)

    @staticmethod
    def div(a: Any, b: Any) -> Any:
        return np.divide(a, b)

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
            yield


def _ufunc(f: Any) -> Any:
    return np.frompyfunc(f, 1, 1)


def _mp_div(a: Any, b: Any) -> Any:
    """IEEE-style quotient: x/0 is +-inf, 0/0 is nan (mpmath itself raises ZeroDivisionError)."""
    if b == 0:
        return mpmath.nan if a == 0 or mpmath.isnan(a) else mpmath.inf * mpmath.sign(a)
    return a / b


class _MPBackend:
    def __init__(self, prec: int):
        if prec < 53:
            raise ValueError(f"prec: got {prec}; expected >= 53 bits so float64 inputs convert exactly")
        self.prec = int(prec)
        self.u = mpmath.mpf(2) ** (-self.prec)
        self.eta = 0  # mpmath's exponent range is unbounded: no underflow
        self.tiny = 0
        self.name = f"mpmath[{self.prec}]"

    exp = staticmethod(_ufunc(mpmath.exp))
    expm1 = staticmethod(_ufunc(mpmath.expm1))
    log = staticmethod(_ufunc(mpmath.log))
    log1p = staticmethod(_ufunc(mpmath.log1p))
    sqrt = staticmethod(_ufunc(mpmath.sqrt))
    sin = staticmethod(_ufunc(mpmath.sin))
    cos = staticmethod(_ufunc(mpmath.cos))

    _to_mpf = np.vectorize(mpmath.mpf, otypes=[object])
    _to_float = np.vectorize(float, otypes=[np.float64])

    def asarray(self, x: Any) -> np.ndarray:
        arr = np.asarray(x)
        return self._to_mpf(arr if arr.dtype == object else np.asarray(arr, dtype=np.float64))

    def to_float64(self, x: Any) -> np.ndarray:
        with np.errstate(invalid="ignore", over="ignore"):
            return self._to_float(np.asarray(x, dtype=object))

    def scalar(self, c: float) -> Any:
        return mpmath.mpf(c)

    div = staticmethod(np.frompyfunc(_mp_div, 2, 1))

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        with mp_precision(self.prec):
            yield


# --------------------------------------------------------------------------------------------------
# plain arithmetic
# --------------------------------------------------------------------------------------------------
class Arith:
    """Plain evaluation over a backend. Subclass ``BallArith`` carries enclosures."""

    enclosing = False

    def __init__(self, backend: Any):
        self.b = backend
        self.name = backend.name

    def __repr__(self) -> str:
        return f"<Arith {self.name}>"

    @property
    def u(self) -> Any:
        """Unit roundoff of this arithmetic."""
        return self.b.u

    @property
    def prec(self) -> int:
        return int(self.b.prec)

    def context(self) -> contextlib.AbstractContextManager[None]:
        return self.b.context()

    # conversion --------------------------------------------------------------------------------
    def asarray(self, x: Any) -> Array:
        return self.b.asarray(x)

    def const(self, c: Any) -> Array:
        """An exact constant of the formula: a number or an array of numbers the host computes in float64
        (scales, decay schedules, lags), held as each arithmetic's kernels hold it (``RoundedArith``:
        exact until it meets a tensor), never rounded to a target dtype as ``asarray`` inputs are."""
        return self.b.scalar(c) if np.ndim(c) == 0 else self.b.asarray(c)

    def held(self, x: Array) -> Array:
        """x as a kernel holds a recurrence's state and decays: in float32 registers (at least), where
        the state is updated and decayed without rounding to a 16-bit dtype (fla's kernels and its naive
        references alike). Only the arithmetics of a target's dtype act on it (``RoundedArith``,
        ``TorchDefinition``); every other arithmetic returns x."""
        return x

    def to_float64(self, x: Array) -> np.ndarray:
        return self.b.to_float64(x)

    def radius(self, x: Array) -> np.ndarray:
        """Enclosure radius (zero shape-alike array for plain arithmetic: no enclosure is claimed)."""
        return np.zeros(np.shape(x))

    def mid(self, x: Array) -> Array:
        return x

    # elementwise -------------------------------------------------------------------------------
    def exp(self, x: Array) -> Array:
        return self.b.exp(x)

    def log(self, x: Array) -> Array:
        return self.b.log(x)

    def sqrt(self, x: Array) -> Array:
        return self.b.sqrt(x)

    def sin(self, x: Array) -> Array:
        return self.b.sin(x)

    def cos(self, x: Array) -> Array:
        return self.b.cos(x)

    def abs(self, x: Array) -> Array:
        return np.abs(x)

    def div(self, a: Array, b: Array) -> Array:
        """a / b that yields inf or nan where b == 0 in every arithmetic (for data-dependent
        denominators that may vanish)."""
        return self.b.div(a, b)

    def maximum(self, x: Array, c: float) -> Array:
        return np.where(_gt(x, c), x, self.b.scalar(c))

    def minimum(self, x: Array, c: float) -> Array:
        return np.where(_gt(x, c), self.b.scalar(c), x)

    def where_pos(self, x: Array, a: Array, b: Array) -> Array:
        """a where x > 0 else b, for a piecewise function continuous at x = 0."""
        return np.where(_gt(x, 0), a, b)

    # structure ---------------------------------------------------------------------------------
    def mT(self, x: Array) -> Array:
        return np.swapaxes(x, -1, -2)

    def fill(self, x: Array, keep: np.ndarray, value: float) -> Array:
        """x where ``keep`` (a boolean array, broadcast) else the exact constant ``value``."""
        return np.where(keep, x, self.b.scalar(value))

    def concat(self, xs: Sequence[Array], axis: int = -1) -> Array:
        return np.concatenate(list(xs), axis=axis)

    def stack(self, xs: Sequence[Array], axis: int = 0) -> Array:
        return np.stack(list(xs), axis=axis)

    def zeros(self, shape: tuple[int, ...]) -> Array:
        return self.b.asarray(np.zeros(shape))

    # reductions and products -------------------------------------------------------------------
    def sum(self, x: Array, axis: int, keepdims: bool = False) -> Array:
        return np.sum(x, axis=axis, keepdims=keepdims)

    def cumsum(self, x: Array, axis: int) -> Array:
        return np.cumsum(x, axis=axis)

    def matmul(self, a: Array, b: Array) -> Array:
        return np.matmul(a, b)

    def stop_max(self, x: Array, axis: int | tuple[int, ...], keep: np.ndarray | None = None) -> Array:
        """An exact constant, the maximum of x over ``axis`` (keepdims) among entries where ``keep``.
        For stabilising shifts that cancel exactly: the enclosing arithmetics treat it as exact."""
        vals = np.asarray(self.b.to_float64(self.mid(x)))
        if keep is not None:
            vals = np.where(keep, vals, -np.inf)
        m = np.max(vals, axis=axis, keepdims=True)
        return self.constant_from(np.where(np.isfinite(m), m, 0.0), x)

    def running_max(self, x: Array, axis: int) -> Array:
        """An exact constant, the cumulative maximum of x along ``axis`` (x itself an exact constant, e.g.
        from ``stop_max``): a stabilising shift that may only look backwards."""
        return self.constant_from(np.maximum.accumulate(np.asarray(self.b.to_float64(self.mid(x))), axis=axis), x)

    def constant_from(self, c: np.ndarray, x: Array) -> Array:
        """A constant taken from the values of x (a stabilising maximum), as the arithmetic holds x's values."""
        return self.asarray(c)

    def shifted(self, x: Array, base: Array, axis: int) -> Array:
        """x - (top - base) with top = max_axis (x + base), for a stabilising constant ``base``
        (``running_max``): the exponents x + base shifted so that their largest is 0, without forming
        x + base in the arithmetic. top is an exact constant from the float64 values (it is one number
        per row, which cancels); top - base is computed in the arithmetic, since a per-column shift does
        not cancel; x meets it in one operation: one rounding of a result near 0 where it matters, where
        (x + base) - top would round twice at the magnitude of base. The forms that round subtract the
        result's own maximum once more (``TorchArith.shifted``, ``RoundedArith.shifted``: exact 0 in exact
        arithmetic); that operation's rounding is charged here as the subtraction of an exact 0."""
        vals = np.asarray(self.b.to_float64(self.mid(x))) + np.asarray(self.b.to_float64(self.mid(base)))
        with np.errstate(invalid="ignore"):
            top = np.max(vals, axis=axis, keepdims=True)
        return x - (self.const(np.where(np.isfinite(top), top, 0.0)) - base) - self.const(0.0)


def float_up_one(e: Any) -> float:
    """An exact mpf, arb or float as a float64 no smaller: to nearest, then one step up where that fell
    below (the comparison is exact for exact values)."""
    f = float(e)
    return math.nextafter(f, math.inf) if f < e else f


def float_up(x: Any) -> np.ndarray:
    """Values as float64, never below the value: float64 arrays as they are; exact mpf or arb entries
    converted to nearest, then one step up where that fell below (subnormals included, where a relative
    margin would not help)."""
    arr = np.asarray(x)
    if arr.dtype != object:
        return np.asarray(arr, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and overflowing radii convert as they are
        return np.asarray(np.frompyfunc(float_up_one, 1, 1)(arr), dtype=np.float64)


def sum_up(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a + b for non-negative float64 arrays, never below the exact sum (one step up unless exact)."""
    s = a + b
    exact = (s - a == b) & (s - b == a)
    return np.where(exact | ~np.isfinite(s), s, np.nextafter(s, np.inf))


def _exact_difference(mid: Any, val: np.ndarray) -> Any:
    """mid - val exactly (mpf midpoints: mpmath's exact subtraction; float64 midpoints: val is mid)."""
    if np.asarray(mid).dtype != object:
        return np.asarray(mid, dtype=np.float64) - val
    sub = np.frompyfunc(lambda m, v: mpmath.fsub(m, mpmath.mpf(float(v)), exact=True), 2, 1)
    return sub(np.asarray(mid, dtype=object), val)


def _nonfinite(x: Any) -> np.ndarray:
    """Entries of a float64 or mpf array that are NaN or infinite."""
    if np.asarray(x).dtype != object:
        return ~np.isfinite(np.asarray(x, dtype=np.float64))
    return np.vectorize(lambda e: not mpmath.isfinite(e), otypes=[bool])(np.asarray(x, dtype=object))


def _gt(x: Any, c: float) -> np.ndarray:
    return np.asarray(x > c, dtype=bool)


# --------------------------------------------------------------------------------------------------
# ball arithmetic
# --------------------------------------------------------------------------------------------------
class Operators:
    """The shape of an enclosure type with midpoints ``mid``, and its ``+ - * /`` with arrays of the
    arithmetic or exact Python scalars on either side, delegated to its arithmetic ``ar`` (``_lift``,
    ``_add``, ``_mul``, ``_div``); the type defines ``__neg__``."""

    __array_ufunc__ = None  # make numpy defer to our reflected operators
    __slots__ = ()
    ar: Any
    mid: Any

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(np.shape(self.mid))

    @property
    def ndim(self) -> int:
        return int(np.ndim(self.mid))

    def __add__(self, o: Any) -> Any:
        return self.ar._add(self, self.ar._lift(o))

    __radd__ = __add__

    def __sub__(self, o: Any) -> Any:
        return self.ar._add(self, -self.ar._lift(o))

    def __rsub__(self, o: Any) -> Any:
        return self.ar._add(self.ar._lift(o), -self)

    def __neg__(self) -> Any:
        raise NotImplementedError

    def __mul__(self, o: Any) -> Any:
        return self.ar._mul(self, self.ar._lift(o))

    __rmul__ = __mul__

    def __truediv__(self, o: Any) -> Any:
        return self.ar._div(self, self.ar._lift(o))

    def __rtruediv__(self, o: Any) -> Any:
        return self.ar._div(self.ar._lift(o), self)


class Ball(Operators):
    """A midpoint-radius enclosure: the exact value lies in [mid - rad, mid + rad] entrywise. ``exact``
    marks a ball known to have radius 0 everywhere (a lifted input or constant, or a slice or
    rearrangement of one), so that operations can skip its radius terms without looking at them.
    ``held`` marks a value a kernel holds in float32 (``Arith.held``; only ``RoundedArith`` reads it)."""

    def __init__(self, ar: BallArith, mid: Any, rad: Any, exact: bool = False, held: bool = False):
        self.ar = ar
        self.mid = mid
        self.rad = rad
        self.exact = exact
        self.held = held

    def __getitem__(self, idx: Any) -> Ball:
        return Ball(self.ar, self.mid[idx], self.rad[idx], self.exact, self.held)

    def reshape(self, *shape: Any) -> Ball:
        return Ball(self.ar, np.reshape(self.mid, shape), np.reshape(self.rad, shape), self.exact, self.held)

    def __neg__(self) -> Ball:
        return Ball(self.ar, -self.mid, self.rad, self.exact, self.held)

    def __repr__(self) -> str:
        return f"Ball(shape={self.shape}, arith={self.ar.name})"


class BallArith(Arith):
    """Midpoint-radius arithmetic over a backend (float64 or mpmath)."""

    enclosing = True

    def __init__(self, backend: Any):
        super().__init__(backend)
        self.name = f"ball-{backend.name}"
        self._eta = backend.eta
        self._tiny = getattr(backend, "tiny", 0.0) * (1 + 2.0**-49)  # results below it may underflow
        self._flush = bool(getattr(backend, "flush", False))  # results below tiny become 0 (``subnormals``)

    # helpers -----------------------------------------------------------------------------------
    def _lift(self, x: Any) -> Ball:
        if isinstance(x, Ball):
            return x
        m = self.b.asarray(x)
        if self._flush and self._eta:  # a flushing kernel reads a subnormal operand as 0
            sub = (m != 0) & (np.abs(m) < self.b.tiny)
            if np.any(sub):
                return Ball(self, m, self.b.asarray(np.where(sub, np.abs(m), 0.0)))
        return Ball(self, m, self.b.asarray(np.zeros(np.shape(m))), exact=True)

    def _inflate(self, r: Any, k: int) -> Any:
        return r * (1 + 2 * k * self.b.u)

    def without_underflow(self) -> None:
        """Charge no underflow from here on (eta = 0): the radii of the formula's relative rounding alone
        (``algorithm_underflow``)."""
        self._eta = 0.0

    def _rnd(self, y: Any, ulps: int = 1, carried: Any = 0.0, operands: Sequence[Ball] = ()) -> Any:
        """Rounding error of one operation whose result is y, the exact result on the computed operands
        within ``carried`` of it, and an exact zero where one of ``operands`` is: ulps * u * |y|, plus
        ulps * eta / 2 where that result may be a nonzero number below the smallest normal (``_underflow``)."""
        a = np.abs(y)
        return ulps * self.b.u * a + self._underflow(a, carried, ulps, operands)

    def _underflow(self, a: Any, carried: Any = 0.0, ulps: int = 1, operands: Sequence[Ball] = ()) -> Any:
        """ulps * eta / 2 where |y| = ``a``, less ``carried``, may be below the smallest normal and the exact
        result may be nonzero (no operand in ``operands`` the exact zero: decided by the operands, since a
        midpoint of 0 may be the backend's own underflow), else 0: a correctly rounded result in the
        subnormal range errs by at most eta / 2, one that is normal, or an exact zero, has no underflow
        error (proofs/fp-forward-error.md, "Underflow"). The threshold is raised by 2^-49 relatively for the
        midpoint's own rounding."""
        if not self._eta:
            return 0.0
        lowest = a if np.isscalar(carried) and carried == 0 else a - carried
        if np.min(lowest, initial=np.inf) >= self._tiny:
            return 0.0
        may = lowest < self._tiny
        for x in operands:
            may &= self._nonzero(x)
        if self._flush:  # a flushed result errs by its own magnitude: at most a + carried, and below tiny
            return may * np.minimum(self._underflow_errors(1), a + carried)
        return may * self._underflow_errors(ulps)

    def _underflow_errors(self, count: Any) -> Any:
        """The most ``count`` underflowing results err together, rounded up: count * eta / 2 under gradual
        underflow (exact where eta / 2 is a normal float64 number, every modelled format; eta *
        ceil(count / 2) in float64's own range, where eta / 2 is not a float64 number), count * tiny (the
        smallest normal) where results below it are flushed to zero (proofs/fp-forward-error.md,
        "Flushing kernels")."""
        if self._flush:
            return self.b.tiny * np.asarray(count, dtype=np.float64)
        if 0.5 * self._eta >= 2.0**-1022:
            return 0.5 * self._eta * count
        return self._eta * np.ceil(0.5 * np.asarray(count, dtype=np.float64))

    def _nonzero(self, x: Ball) -> Any:
        """Where the ball of x is not the exact zero."""
        return x.mid != 0 if self._exact(x) else (x.mid != 0) | (x.rad != 0)

    # conversion --------------------------------------------------------------------------------
    def asarray(self, x: Any) -> Ball:
        return self._lift(x)

    def const(self, c: Any) -> Ball:
        return self._lift(np.asarray(c, dtype=np.float64))

    def to_float64(self, x: Ball) -> np.ndarray:
        return self.b.to_float64(x.mid)

    def widened(self, x: Any, rad: Any) -> Ball:
        """x with ``rad`` (a non-negative float64 array broadcasting to x) added to its radius: an input known
        only to within rad, such as the log-decays a form perturbs by summing them (``decay_sums``)."""
        x = self._lift(x)
        return Ball(self, x.mid, x.rad + self.b.asarray(np.broadcast_to(rad, np.shape(x.mid))), held=x.held)

    def radius(self, x: Ball) -> np.ndarray:
        """Radius as float64 rounded up (``float_up``), and by one more part in 2^52. A NaN radius (an
        unbounded radius times an exact zero, e.g. a vacuous softmax row against the zeros of V = I) is
        unknown: inf, never small."""
        r = float_up(x.rad) * (1.0 + 2.0**-52)
        return np.where(np.isnan(r), np.inf, r)

    def mid(self, x: Any) -> Any:
        return x.mid if isinstance(x, Ball) else x

    def certify64(self, x: Ball) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(float64 midpoints, bounds on |float64 value - exact| = rad + |mid - float64(mid)|, undefined:
        a NaN or infinite midpoint, where the bound is inf)."""
        with self.context():
            val = self.b.to_float64(x.mid)
            undefined = ~np.isfinite(val) & _nonfinite(x.mid)
            rounding = float_up(np.abs(_exact_difference(x.mid, np.where(undefined, 0.0, val))))
            bound = sum_up(self.radius(x), rounding)
        return val, np.where(undefined, np.inf, bound), undefined

    # the four operations -------------------------------------------------------------------------
    def _add(self, a: Ball, b: Ball) -> Ball:
        y = a.mid + b.mid
        r = a.rad + b.rad + self.b.u * np.abs(y)
        if self._flush:  # a sum that cancels below tiny is flushed (gradual: exact); 0 + 0 is exact
            r = r + self._underflow(np.abs(y), a.rad + b.rad) * (self._nonzero(a) | self._nonzero(b))
        return Ball(self, y, self._inflate(r, 3))

    def _mul(self, a: Ball, b: Ball) -> Ball:
        y = a.mid * b.mid
        if a.exact and b.exact:  # the radius terms of exact operands are exact zeros (as in matmul)
            r = 0.0
        elif b.exact:
            r = a.rad * np.abs(b.mid)
        elif a.exact:
            r = np.abs(a.mid) * b.rad
        else:
            r = np.abs(a.mid) * b.rad + a.rad * np.abs(b.mid) + a.rad * b.rad
        return Ball(self, y, self._inflate(r + self._rnd(y, carried=r, operands=(a, b)), 6))

    def _div(self, a: Ball, b: Ball) -> Ball:
        y = self.b.div(a.mid, b.mid)
        ab = np.abs(b.mid)
        gap = ab - b.rad
        safe = _gt(gap, 0)
        gap_s = np.where(safe, gap, 1)
        r = (a.rad + np.abs(y) * (1 + self.b.u) * b.rad) / gap_s
        r = r + self._rnd(y, carried=r, operands=(a,))
        r = np.where(safe, r, self.b.scalar(math.inf))
        return Ball(self, y, self._inflate(r, 6))

    def div(self, a: Any, b: Any) -> Ball:
        return self._div(self._lift(a), self._lift(b))

    # elementwise -------------------------------------------------------------------------------
    def exp(self, x: Ball) -> Ball:
        y = self.b.exp(x.mid)
        a = np.abs(y)
        carried = a * self.b.expm1(x.rad) * (1 + 2 * self.b.u)
        r = carried + a * 2 * self.b.u * (1 + 2 * self.b.u) + self._underflow(a, carried, 2)
        return Ball(self, y, self._inflate(r, 4))

    def log(self, x: Ball) -> Ball:
        y = self.b.log(x.mid)
        safe = _gt(x.mid - x.rad, 0)
        ratio = np.where(safe, x.rad / np.where(safe, x.mid, 1), 0)
        carried = -self.b.log1p(-ratio)
        r = carried + self._rnd(y, 2, carried)
        r = np.where(safe, r, self.b.scalar(math.inf))
        return Ball(self, y, self._inflate(r, 4))

    def sqrt(self, x: Ball) -> Ball:
        y = self.b.sqrt(np.where(_gt(x.mid, 0), x.mid, 0))
        lo = x.mid - x.rad
        pos = _gt(lo, 0)
        lo_s = np.where(pos, lo, 0)
        r_pos = x.rad / (self.b.sqrt(lo_s) + np.where(pos, y, 1))
        r_neg = self.b.sqrt(np.abs(x.mid) + x.rad)  # [0, mid + rad] covered by y +- sqrt(mid + rad)
        r = np.where(pos, r_pos, r_neg)
        r = r + self._rnd(y, carried=r, operands=(x,))
        return Ball(self, y, self._inflate(r, 4))

    def sin(self, x: Ball) -> Ball:
        y = self.b.sin(x.mid)
        return Ball(self, y, self._inflate(x.rad + self._rnd(y, 2, x.rad, (x,)), 2))

    def cos(self, x: Ball) -> Ball:
        y = self.b.cos(x.mid)
        return Ball(self, y, self._inflate(x.rad + self._rnd(y, 2, x.rad), 2))

    def abs(self, x: Ball) -> Ball:
        return Ball(self, np.abs(x.mid), x.rad)

    def maximum(self, x: Ball, c: float) -> Ball:
        return Ball(self, np.where(_gt(x.mid, c), x.mid, self.b.scalar(c)), x.rad)

    def minimum(self, x: Ball, c: float) -> Ball:
        return Ball(self, np.where(_gt(x.mid, c), self.b.scalar(c), x.mid), x.rad)

    def where_pos(self, x: Ball, a: Any, b: Any) -> Ball:
        a, b = self._lift(a), self._lift(b)
        pick = _gt(x.mid, 0)
        y = np.where(pick, a.mid, b.mid)
        r = np.where(pick, a.rad, b.rad)
        # where the ball of x straddles 0 the exact value may sit on the other branch: cover both
        straddle = np.asarray(np.abs(x.mid) <= x.rad, dtype=bool)
        # two roundings (the difference, the sum) on non-negative terms: inflated as every radius is
        both = self._inflate(np.where(_gt(a.rad, b.rad), a.rad, b.rad) + np.abs(a.mid - b.mid), 2)
        return Ball(self, y, np.where(straddle, both, r))

    # structure ---------------------------------------------------------------------------------
    def mT(self, x: Ball) -> Ball:
        return Ball(self, np.swapaxes(x.mid, -1, -2), np.swapaxes(x.rad, -1, -2), x.exact, x.held)

    def fill(self, x: Ball, keep: np.ndarray, value: float) -> Ball:
        return Ball(self, np.where(keep, x.mid, self.b.scalar(value)), np.where(keep, x.rad, 0), x.exact, x.held)

    def concat(self, xs: Sequence[Ball], axis: int = -1) -> Ball:
        bs = [self._lift(x) for x in xs]
        exact, held = all(b.exact for b in bs), all(b.held for b in bs)
        mid, rad = np.concatenate([b.mid for b in bs], axis), np.concatenate([b.rad for b in bs], axis)
        return Ball(self, mid, rad, exact, held)

    def stack(self, xs: Sequence[Ball], axis: int = 0) -> Ball:
        bs = [self._lift(x) for x in xs]
        exact, held = all(b.exact for b in bs), all(b.held for b in bs)
        return Ball(self, np.stack([b.mid for b in bs], axis), np.stack([b.rad for b in bs], axis), exact, held)

    def zeros(self, shape: tuple[int, ...]) -> Ball:
        return self._lift(np.zeros(shape))

    # reductions and products -------------------------------------------------------------------
    def _gammas(self, n: Any) -> Any:
        """gamma_n at this arithmetic's unit roundoff (precision.gamma: inf where n u >= 1)."""
        return gamma(n, u=self.b.u)

    # An exact operand (radius all zero) skips the radius terms it would contribute: they are exact
    # zeros, and x + 0 = x, so the radii are bit-for-bit those of the general formula.
    @staticmethod
    def _exact(x: Ball) -> bool:
        return x.exact or not np.any(x.rad)

    def sum(self, x: Ball, axis: int, keepdims: bool = False) -> Ball:
        n = np.shape(x.mid)[axis]
        y = np.sum(x.mid, axis=axis, keepdims=keepdims)
        r = self._gammas(max(n - 1, 0)) * np.sum(np.abs(x.mid), axis=axis, keepdims=keepdims)
        if not self._exact(x):
            r = np.sum(x.rad, axis=axis, keepdims=keepdims) + r
        flushed = self._flushed_sums(x, axis, cumulative=False)
        r = r + (np.expand_dims(flushed, axis) if keepdims and np.ndim(flushed) else flushed)
        return Ball(self, y, self._inflate(r, n + 2))

    def cumsum(self, x: Ball, axis: int) -> Ball:
        n = np.shape(x.mid)[axis]
        y = np.cumsum(x.mid, axis=axis)
        shape = [1] * np.ndim(x.mid)
        shape[axis] = n
        g = self._gammas(self.b.asarray(np.arange(n, dtype=np.float64))).reshape(shape)  # gamma_{k-1}
        r = g * np.cumsum(np.abs(x.mid), axis=axis)
        if not self._exact(x):
            r = np.cumsum(x.rad, axis=axis) + r
        return Ball(self, y, self._inflate(r + self._flushed_sums(x, axis, cumulative=True), n + 2))

    def matmul(self, a: Any, b: Any) -> Ball:
        """Radius |a| rad_b + rad_a (|b| + rad_b) + gamma_n |a| |b| + nz eta / 2 (``_underflowing_products``),
        computed as (gamma_n |a| + rad_a) |b| + (|a| + rad_a) rad_b + nz eta / 2: two radius products, one
        when b is exact (four before: proofs/ball-arithmetic.md); every term is non-negative, and the
        inflation by (1 + 2 (n + 6) u) covers the n + 4 roundings on the longest path plus gamma_n's own."""
        a, b = self._lift(a), self._lift(b)
        n = np.shape(a.mid)[-1]
        y = np.matmul(a.mid, b.mid)
        aa, ab = np.abs(a.mid), np.abs(b.mid)
        a_exact = self._exact(a)
        left = self._gammas(n) * aa
        r = np.matmul(left if a_exact else left + a.rad, ab)
        if not self._exact(b):
            r = r + np.matmul(aa if a_exact else aa + a.rad, b.rad)
        return Ball(self, y, self._inflate(r + self._underflowing_products(a, b, n), n + 6))

    def _underflowing_products(self, a: Ball, b: Ball, n: int) -> Any:
        """eta / 2 for each product a_il b_lj that may be nonzero: the most underflow can add to an inner
        product, whether each product is rounded (a subnormal product errs by at most eta / 2, and a sum
        whose result is subnormal is exact) or fused into the sum (a subnormal partial sum errs by at most
        eta / 2, and a zero product leaves the sum unchanged); proofs/fp-forward-error.md, "Underflow".
        Flushing (``subnormals``): ``_flushed_products``."""
        if not self._eta:
            return 0.0
        if self._flush:
            return self._flushed_products(a, b, n)
        return self._underflow_errors(self._nonzero_products(a, b, n))

    def _nonzero_products(self, a: Ball, b: Ball, n: int) -> Any:
        """How many of the products a_il b_lj of each inner product may be nonzero."""
        full_a, full_b = bool(np.all(a.mid)), bool(np.all(b.mid))  # no midpoint 0: no operand exactly zero
        if full_a and full_b:
            return n
        if full_b:  # the count of a row's nonzero entries (a causal mask's: the tokens it reads)
            return np.sum(self._nonzero(a), axis=-1, keepdims=True, dtype=np.float64)
        if full_a:
            return np.sum(self._nonzero(b), axis=-2, keepdims=True, dtype=np.float64)
        return np.matmul(self._nonzero(a).astype(np.float64), self._nonzero(b).astype(np.float64))

    def _flushed_products(self, a: Ball, b: Ball, n: int) -> Any:
        """Where results below tiny are flushed to 0: tiny for each nonzero product of an inner product
        whose products may fall below tiny (judged from the least |a_il| and |b_lj| of its row and column),
        and for each nonzero product but one where the products may differ in sign (a partial sum that
        cancels below tiny is flushed; products of one sign, each 0 or at least tiny once flushed, have
        partial sums 0 or at least tiny); each charge at most what it flushes, sum_l |a_il| |b_lj|
        (proofs/fp-forward-error.md, "Flushing kernels")."""
        nz = self._nonzero_products(a, b, n)
        low_a = np.where(self._nonzero(a), np.maximum(np.abs(a.mid) - a.rad, 0.0), np.inf)
        low_b = np.where(self._nonzero(b), np.maximum(np.abs(b.mid) - b.rad, 0.0), np.inf)
        row, col = np.min(low_a, axis=-1, initial=np.inf), np.min(low_b, axis=-2, initial=np.inf)
        with np.errstate(invalid="ignore"):
            small = (row[..., :, None] * col[..., None, :]) < self._tiny
        additions = 0.0 if self._one_sign(a) and self._one_sign(b) else np.maximum(nz - 1.0, 0.0)
        # a flushed product or partial sum errs by its own magnitude: the products together, and each partial
        # sum, at most sum_l |a_il| |b_lj| (the balls' upper ends)
        most = np.matmul(np.abs(a.mid) + a.rad, np.abs(b.mid) + b.rad)
        with np.errstate(invalid="ignore"):
            products = np.minimum(self._underflow_errors(nz * small), most)
            return products + additions * np.minimum(self._underflow_errors(1), most)

    def _one_sign(self, x: Ball) -> bool:
        """Whether every number of every ball of x has one sign (zeros included)."""
        return bool(np.all(x.mid - x.rad >= 0) or np.all(x.mid + x.rad <= 0))

    def _flushed_sums(self, x: Ball, axis: int, cumulative: bool) -> Any:
        """Where results below tiny are flushed to 0: tiny for each nonzero term but one of a sum (of each
        prefix, ``cumulative``) whose terms may differ in sign, else 0 (``_flushed_products``)."""
        if not (self._flush and self._eta):
            return 0.0
        nz = self._nonzero(x)
        up, down = nz & (x.mid + x.rad > 0), nz & (x.mid - x.rad < 0)
        upper = np.abs(x.mid) + x.rad  # a flushed partial sum errs by its magnitude, at most the terms' sum
        if cumulative:
            count = np.cumsum(nz, axis=axis, dtype=np.float64)
            mixed = np.logical_or.accumulate(up, axis=axis) & np.logical_or.accumulate(down, axis=axis)
            most = np.cumsum(upper, axis=axis)
        else:
            count = np.sum(nz, axis=axis, dtype=np.float64)
            mixed = np.any(up, axis=axis) & np.any(down, axis=axis)
            most = np.sum(upper, axis=axis)
        return mixed * np.maximum(count - 1.0, 0.0) * np.minimum(self._underflow_errors(1), most)


SUBNORMALS = ("gradual", "flush")
_SUBNORMALS: ContextVar[str] = ContextVar("gramcheck_subnormals", default="gradual")


@contextlib.contextmanager
def subnormals(mode: str) -> Iterator[None]:
    """Within the block, the rounding models (``RoundingModel``, ``ProbabilisticModel``) take the target's
    underflow to be ``mode``: 'gradual' (IEEE 754 subnormals, the default) or 'flush' (a result or an
    operand below the smallest normal reads as 0: FTZ/DAZ, -ftz builds, approximate GPU exp). Flushing is
    modelled at float32's and wider formats' own smallest normal; float16 computes in float32, whose flush
    range lies below float16's underflow unit, and keeps the gradual model (proofs/fp-forward-error.md,
    "Flushing kernels")."""
    if mode not in SUBNORMALS:
        raise ValueError(f"subnormals: got {mode!r}; expected one of {SUBNORMALS}")
    token = _SUBNORMALS.set(mode)
    try:
        yield
    finally:
        _SUBNORMALS.reset(token)


def flushes(dtype: Any) -> bool:
    """Whether the rounding model of ``dtype`` flushes here (``subnormals``)."""
    from .precision import smallest_normal

    return _SUBNORMALS.get() == "flush" and smallest_normal(dtype) <= smallest_normal("float32")


class _ModelBackend(_F64Backend):
    """float64 values with the unit roundoff and underflow unit of another format: a ball evaluation
    over it bounds, to first order, the rounding error of the same formula evaluated in that format
    (``flush``: with results below the format's smallest normal flushed to 0; ``subnormals``)."""

    def __init__(self, dtype: Any):
        from .precision import dtype_name, smallest_normal, underflow_unit, unit_roundoff

        self.u = unit_roundoff(dtype) + math.ldexp(1.0, -53)
        self.eta = underflow_unit(dtype)
        self.tiny = smallest_normal(dtype)
        self.flush = flushes(dtype)
        self.name = f"model-{dtype_name(dtype)}" + ("-flush" if self.flush else "")


class RoundingModel(BallArith):
    """Ball arithmetic whose radii model rounding in ``dtype``: midpoints in float64, radii at the
    dtype's unit roundoff u' = u_dtype + 2^-53 and underflow unit eta'.

    Its midpoints are the float64 evaluation of the formula, and its radii, scaled by ``float64_scale``
    (the least power of two lambda >= 2^-53 / u' with 2^-1074 <= lambda eta'), bound that evaluation's
    error from the exact value: every radius rule is r = P(input radii) + c u |y| + (k eta / 2 where
    subnormal) with P(lambda r) <= lambda P(r) for lambda <= 1, so by induction the float64 ball's radii
    stay below lambda times this one's (proofs/ball-arithmetic.md, "One pass for the rounding bound and
    the truth"). Two rules break the induction: a branch (``where_pos``) whose ball straddles the branch
    point with different branch values, and a square root whose ball reaches 0; ``scales`` turns False
    where either occurred, and
    ``float64_certificate`` then returns None."""

    def __init__(self, dtype: Any):
        super().__init__(_ModelBackend(dtype))
        lam = 2.0 ** math.ceil(math.log2(math.ldexp(1.0, -53) / self.b.u))
        while lam * self.b.u < math.ldexp(1.0, -53):  # guard against log2's rounding
            lam *= 2.0
        self.float64_scale = max(lam, math.ldexp(1.0, -1074) / self.b.eta)  # both powers of two
        self.scales = self.float64_scale <= 1.0

    def without_underflow(self) -> None:
        super().without_underflow()
        self.scales = False  # the scaled radii no longer bound the float64 evaluation's underflow

    def sqrt(self, x: Ball) -> Ball:
        # the rule for a ball reaching 0, sqrt(|m| + r), does not scale with r (sqrt is concave)
        reaches_zero = ~_gt(x.mid - x.rad, 0) & ((x.mid != 0) | (x.rad != 0))
        self.scales = self.scales and not bool(np.any(reaches_zero))
        return super().sqrt(x)

    def where_pos(self, x: Ball, a: Any, b: Any) -> Ball:
        # a straddling ball adds |m_a - m_b|, which does not scale with the radii
        a, b = self._lift(a), self._lift(b)
        straddle = np.asarray(np.abs(x.mid) <= x.rad, dtype=bool)
        self.scales = self.scales and not bool(np.any(straddle & (a.mid != b.mid)))
        return super().where_pos(x, a, b)

    def float64_certificate(self, x: Ball) -> tuple[np.ndarray, np.ndarray] | None:
        """(value, bound) with |value - exact| <= bound entrywise: the float64 midpoints (the formula
        evaluated in float64) and the radius scaled by ``float64_scale``, rounded up; None where the scaling
        does not hold (``scales``). A non-finite value or radius proves nothing (bound inf)."""
        if not self.scales:
            return None
        value = self.to_float64(x)
        bound = np.ldexp(self.radius(x), int(math.log2(self.float64_scale)))
        bound = np.where((bound > 0) & (bound < 2.0**-1022), np.nextafter(bound, np.inf), bound)  # subnormal: rounded
        return value, np.where(np.isfinite(value), bound, np.inf)


def rounding_model(dtype: Any) -> RoundingModel:
    """Ball arithmetic whose radii model rounding in ``dtype`` (unit roundoff u, underflow unit eta)."""
    return RoundingModel(dtype)


class ProbabilisticModel(BallArith):
    """The rounding model of ``dtype`` with every accumulation of n roundings (sums, cumulative sums,
    inner products) charged gamma~_n(lambda) = exp(lambda sqrt(n) u + n u^2 / (1 - u)) - 1 instead of
    gamma_n (Higham & Mary 2019, Theorem 2.4): each such bound holds with probability at least
    1 - 2 exp(-lambda^2 (1 - u)^2 / 2) per product of rounding factors when rounding errors are
    independent with mean zero. Elementwise operations keep their deterministic u |y| (one rounding).
    ``products`` counts the products of rounding factors bounded so far (one per term of every
    accumulation), so that ``failure_probability`` is the union bound for the whole evaluation
    (proofs/probabilistic-rounding.md)."""

    def __init__(self, dtype: Any, lam: float = PROBABILISTIC_LAMBDA):
        super().__init__(_ModelBackend(dtype))
        self.lam = float(lam)
        self.name = f"probabilistic-{self.b.name.removeprefix('model-')}"
        self.products = 0

    def _gammas(self, n: Any) -> Any:
        return gamma_tilde(np.asarray(n, dtype=np.float64), lam=self.lam, u=self.b.u)

    def failure_probability(self) -> float:
        """Union bound: P(some bounded product exceeds its bound) <= products * 2 exp(-lambda^2 (1-u)^2 / 2)."""
        u = self.b.u
        return min(1.0, self.products * 2.0 * math.exp(-(self.lam**2) * (1 - u) ** 2 / 2))

    def sum(self, x: Ball, axis: int, keepdims: bool = False) -> Ball:
        self.products += int(np.prod(np.shape(x.mid)))  # one per term, each in one output
        return super().sum(x, axis, keepdims)

    def cumsum(self, x: Ball, axis: int) -> Ball:
        n = np.shape(x.mid)[axis]
        self.products += int(np.prod(np.shape(x.mid))) * (n + 1) // 2  # term j enters n - j partial sums
        return super().cumsum(x, axis)

    def matmul(self, a: Any, b: Any) -> Ball:
        a, b = self._lift(a), self._lift(b)
        n = np.shape(a.mid)[-1]
        rows = int(np.prod(np.shape(a.mid)[:-1])) * int(np.shape(b.mid)[-1])
        self.products += rows * n
        return super().matmul(a, b)


class ResolutionModel(BallArith):
    """The rounding model of ``dtype`` with every accumulation charged one rounding, u sum |terms|,
    instead of gamma_n: to first order, what rounding each stored result once costs, as a kernel that
    accumulates in float32 and stores in the dtype does. The low-precision rule's yardstick where the
    exact output is 0 (proofs/low-precision-rule.md, "Outputs that are exactly 0")."""

    def __init__(self, dtype: Any):
        super().__init__(_ModelBackend(dtype))
        self.name = f"resolution-{self.b.name.removeprefix('model-')}"

    def _gammas(self, n: Any) -> Any:
        return np.where(np.asarray(n) >= 1, self.b.u, 0.0)


F64 = Arith(_F64Backend())
BALL_F64 = BallArith(_F64Backend())


def MP(prec: int) -> Arith:
    """Plain mpmath arithmetic at ``prec`` bits (>= 53)."""
    return Arith(_MPBackend(prec))


def BallMP(prec: int) -> BallArith:
    """Ball arithmetic over mpmath at ``prec`` bits (>= 53)."""
    return BallArith(_MPBackend(prec))


# --------------------------------------------------------------------------------------------------
# the definition evaluated in a low-precision format (the "plain reference in the same dtype")
# --------------------------------------------------------------------------------------------------
class RoundedArith(BallArith):
    """The definition evaluated with every operation's result rounded to ``dtype`` (round to nearest
    even, via ``precision.round_to``); products and sums are accumulated in float32 (float64 for
    float64) and rounded once, as a float32 kernel, or a bf16/fp16 matmul with float32 accumulation,
    does. Scalar constants are computed in float64 and cast to float32 where they meet a tensor, as
    host code and torch's opmath do (``_r``, ``_pair``). Radii stay zero: this is a plain arithmetic that
    reuses Ball's operators. A value marked ``held`` (a recurrence's state and decays) and every result
    computed from one is rounded to float32 instead (a kernel reads its state out in float32; fla's
    chunked kernels cast it to the dtype once per chunk, not per token). It is the naive
    reference of the low-precision rule (proofs/low-precision-rule.md, "Constants as kernels compute
    them", "States and decays in float32"). ``wide_range`` rounds to the
    dtype's significand in float64's exponent range, which tells the dtype's rounding from its
    underflow and overflow. ``reverse`` accumulates every sum and product from the other end of its
    axis (prefix sums excepted): the same algorithm in another summation order, whose error can differ
    several-fold where terms cancel (proofs/low-precision-rule.md, "Summation order"). ``wide_products``
    holds each product of two tensors in float32, as a kernel forms it (proofs/low-precision-rule.md,
    "Products in float32")."""

    enclosing = False

    def __init__(self, dtype: Any, *, wide_range: bool = False, reverse: bool = False, wide_products: bool = False):
        from .precision import dtype_name, smallest_normal

        super().__init__(_F64Backend())
        self.dtype = dtype_name(dtype)
        self.held_dtype = "float64" if self.dtype == "float64" else "float32"
        self.wide_range = wide_range
        self.reverse = reverse
        self.wide_products = wide_products
        # where the target flushes (``subnormals``), every result and input below the smallest normal is 0
        # (an accumulation's partial sums are not); its wide-range twin keeps them, so that the rule tells
        # the flushed entries as range-decided
        self.flush_below = smallest_normal(self.dtype) if flushes(self.dtype) and not wide_range else 0.0
        flush = "-flush" if self.flush_below else ""
        options = ("-wide" if wide_range else "") + ("-reversed" if reverse else "")
        options += "-wide-products" if wide_products else ""
        self.name = f"rounded-{self.dtype}{options}{flush}"

    def held(self, x: Any) -> Ball:
        x = self._lift(x)
        return Ball(self, x.mid, x.rad, x.exact, held=True)

    def stored(self, x: Ball) -> np.ndarray:
        """The output as a kernel stores it, in the dtype (a held output is rounded once more)."""
        return round_to(self.to_float64(x), self.dtype, wide_range=self.wide_range)

    def shifted(self, x: Any, base: Any, axis: int) -> Ball:
        """``Arith.shifted`` as ``TorchArith.shifted`` computes it: the maximum and the shift in float32
        (float64 for float64), then the rounded result's own maximum subtracted (a constant per row, which
        the row's normalisation cancels; the subtraction is exact near the maximum), so that the largest
        exponent is exactly 0, one rounding of the result to the dtype. Without the second shift, shifts of
        1e13 in float32 (FAVOR+ with |q| ~ 4e6) rounded a query's largest exponent to +6e5 or -6e4: a
        feature of inf, or every feature 0, and 0 / 0."""
        x, base = self._lift(x), self._lift(base)
        wide = self.held_dtype
        with np.errstate(invalid="ignore"):
            top = np.max(round_to(x.mid + base.mid, wide, wide_range=self.wide_range), axis=axis, keepdims=True)
            shift = round_to(np.where(np.isfinite(top), top, 0.0) - base.mid, wide, wide_range=self.wide_range)
            y = round_to(x.mid - shift, wide, wide_range=self.wide_range)
            peak = np.max(y, axis=axis, keepdims=True)
            y = round_to(y - np.where(np.isfinite(peak), peak, 0.0), wide, wide_range=self.wide_range)
        return self._r(y, x)

    def _r(self, y: Any, *operands: Ball) -> Ball:
        """y rounded to the dtype (to float32 where an operand is ``held``); an operation on constants only
        (``exact`` balls: ``const`` and the Python scalars of the formula) stays exact in float64, as a
        kernel computes its scalar constants (scale d^-1/2, 1/sqrt(m)) in host floating point before they
        meet a tensor. Below float32 the result is rounded to float32 first, as torch computes 16-bit
        operations in float32 and rounds that result (float16 x times 0.69 rounds twice)."""
        held = any(o.held for o in operands)
        if operands and all(o.exact for o in operands):
            return Ball(self, np.asarray(y, dtype=np.float64), np.zeros(np.shape(y)), exact=True, held=held)
        return Ball(self, self._computed(y, self._dtype_of(held)), np.zeros(np.shape(y)), held=held)

    def _dtype_of(self, held: bool) -> str:
        """The dtype a tensor is in: float32 for a ``held`` one, the target's dtype otherwise."""
        return self.held_dtype if held else self.dtype

    def _computed(self, y: Any, to: str) -> np.ndarray:
        """y as torch computes a result in ``to``: in float32 below float32, then rounded to ``to``."""
        if to in ("bfloat16", "float16"):
            y = round_to(y, "float32", wide_range=self.wide_range)
        out = round_to(y, to, wide_range=self.wide_range)
        return np.where(np.abs(out) < self.flush_below, 0.0 * out, out) if self.flush_below else out

    def _pair(self, a: Ball, b: Ball, *, to_tensor: bool = False) -> tuple[Any, Any]:
        """The operands' values as an elementwise kernel sees them: a constant meeting a tensor is cast to
        the operation's arithmetic, float32 below float64 (torch's opmath: a Python float times a
        bfloat16 or float32 tensor is computed in float32); ``to_tensor``: to the tensor's own dtype first,
        as torch's CPU kernels do for a sum with a Python float (bfloat16 x + 0.69 adds bfloat16(0.69))."""
        if a.exact == b.exact or self.dtype == "float64":
            return a.mid, b.mid
        tensor = b if a.exact else a
        to = self._dtype_of(tensor.held) if to_tensor else "float32"
        x, y = (round_to(o.mid, to, wide_range=self.wide_range) if o.exact else o.mid for o in (a, b))
        return x, y

    def asarray(self, x: Any) -> Ball:
        return self._r(np.asarray(x, dtype=np.float64))

    def radius(self, x: Ball) -> np.ndarray:
        return np.zeros(np.shape(x.mid))

    def constant_from(self, c: np.ndarray, x: Any) -> Ball:
        """In the precision x is in: float32 where x is ``held`` (a kernel takes the maximum of its registers; a
        shift rounded to the dtype leaves the largest exponent up to an ulp of it away from 0)."""
        return self._r(c, self._tensor(x)) if getattr(x, "held", False) else self.asarray(c)

    def _add(self, a: Ball, b: Ball) -> Ball:
        x, y = self._pair(a, b, to_tensor=True)
        return self._r(x + y, a, b)

    def _mul(self, a: Ball, b: Ball) -> Ball:
        x, y = self._pair(a, b)
        return self._r(x * y, *self._product_of(a, b))

    def _div(self, a: Ball, b: Ball) -> Ball:
        x, y = self._pair(a, b)
        if a.exact and not b.exact and self.dtype != "float64":
            # a Python float over a tensor: torch computes the tensor's reciprocal, rounded to its dtype,
            # times the constant in float32
            with np.errstate(divide="ignore", invalid="ignore"):
                inv = self._computed(np.divide(1.0, y), self._dtype_of(b.held))
            return self._r(x * inv, a, b)
        return self._r(np.divide(x, y), a, b)

    def exp(self, x: Ball) -> Ball:
        return self._r(np.exp(x.mid), x)

    def log(self, x: Ball) -> Ball:
        return self._r(np.log(x.mid), x)

    def sqrt(self, x: Ball) -> Ball:
        return self._r(np.sqrt(x.mid), x)

    def sin(self, x: Ball) -> Ball:
        return self._r(np.sin(x.mid), x)

    def cos(self, x: Ball) -> Ball:
        return self._r(np.cos(x.mid), x)

    def sum(self, x: Ball, axis: int, keepdims: bool = False) -> Ball:
        e = self._exponent(x.mid, axis)
        out = self._in_float32(np.sum, np.ldexp(x.mid, -e), axis=axis, keepdims=True)
        out = np.ldexp(out, e)
        return self._r(out if keepdims else np.squeeze(out, axis=axis), self._tensor(x))

    def cumsum(self, x: Ball, axis: int) -> Ball:
        e = self._exponent(x.mid, axis)
        return self._r(np.ldexp(self._in_float32(np.cumsum, np.ldexp(x.mid, -e), axis=axis), e), self._tensor(x))

    def matmul(self, a: Any, b: Any) -> Ball:
        a, b = self._lift(a), self._lift(b)
        ea, eb = self._exponent(a.mid, -1), self._exponent(b.mid, -2)
        y = np.ldexp(self._in_float32(np.matmul, np.ldexp(a.mid, -ea), np.ldexp(b.mid, -eb)), ea + eb)
        return self._r(y, *self._product_of(self._tensor(a), self._tensor(b)))

    def _product_of(self, a: Ball, b: Ball) -> tuple[Ball, Ball]:
        """The operands of a product; under ``wide_products`` a product of two tensors is held in float32, as a
        kernel forms it in its registers (exact there for 16-bit operands), and so is all computed from it."""
        if self.wide_products and not (a.exact or b.exact):
            return self.held(a), b
        return a, b

    @staticmethod
    def _tensor(x: Ball) -> Ball:
        """x as an operand of a reduction, which a kernel computes on tensors (never exact in float64)."""
        return Ball(x.ar, x.mid, x.rad, False, x.held)

    # Accumulations run in float32 below float64, as kernels accumulate (products of bfloat16 and float16
    # values are exact there). Under ``wide_range`` the operands are first scaled by powers of two into
    # float32's range along the reduced axis (the same significand roundings; only terms 2^-126 below the
    # largest of their row can flush), so that the dtype's range is left out.
    def _exponent(self, x: np.ndarray, axis: int) -> Any:
        if self.dtype == "float64" or not self.wide_range:
            return 0
        with np.errstate(invalid="ignore"):
            top = np.max(np.where(np.isfinite(x), np.abs(x), 0.0), axis=axis, keepdims=True, initial=0.0)
        return np.frexp(top)[1]

    def _in_float32(self, op: Any, *xs: np.ndarray, **kw: Any) -> np.ndarray:
        if self.reverse and op is not np.cumsum:  # the same sums, accumulated from the other end
            xs = (np.flip(xs[0], -1), np.flip(xs[1], -2)) if op is np.matmul else (np.flip(xs[0], kw["axis"]),)
        if self.dtype == "float64":
            return op(*xs, **kw)
        with np.errstate(over="ignore", invalid="ignore"):
            return op(*(np.asarray(x).astype(np.float32) for x in xs), **kw).astype(np.float64)
