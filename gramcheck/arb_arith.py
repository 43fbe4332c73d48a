"""Ball arithmetic in C for the oracle's escalation: python-flint's ``arb`` (Arb: midpoint-radius balls
with rigorous error propagation, F. Johansson, IEEE Trans. Computers 66(8), 2017) behind the arithmetic
shim, on NumPy object arrays of ``arb``.

Every ``arb`` operation returns a ball that contains the exact result of the operation on every point of
its operands' balls, so a definition evaluated here encloses the exact output, as ``BallMP`` does, at a
fraction of its cost (matrix products through ``arb_mat``). Conventions shared with ``BallArith``: a
quotient whose denominator ball contains 0 without being exactly 0 is unknown, not undefined, so that the
oracle raises the precision; only a quotient by an exact 0 (and the logarithm of an exact 0) is undefined,
marked by a plain float NaN or -inf in the object array (any arithmetic on the marker yields an arb NaN,
which is unknown again); every other arb whose midpoint is NaN or infinite (Arb's indeterminate balls:
a division by a ball containing 0 through the ``/`` operator) is unknown, with an infinite bound; the
square root of a ball reaching below 0 covers [0, sqrt(upper end)], as the shim's balls do; where a
branch point (x > c) falls inside x's ball, both branches are covered (their union).

Optional: ``available()`` says whether python-flint is importable (extra ``gramcheck[arb]``).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from .arith import Arith, float_up_one

_PRECISION_LOCK = threading.RLock()  # flint.ctx.prec is process-global


def available() -> bool:
    try:
        import flint  # noqa: F401
    except ImportError:
        return False
    return True


def _flint() -> Any:
    import flint

    return flint


def _map(f: Any, *xs: Any) -> np.ndarray:
    return np.asarray(np.frompyfunc(f, len(xs), 1)(*xs), dtype=object)


def _radius_up(e: Any) -> float:
    if not isinstance(e, _flint().arb):
        return 0.0 if math.isfinite(e) else math.inf
    return float_up_one(e.rad()) if e.is_finite() else math.inf


def _certify1(e: Any) -> tuple[float, float, bool]:
    """(value, bound >= |value - exact|, undefined) for one entry: its midpoint rounded to float64 and the
    upper end of |ball - value|, mid and radius each rounded up and their sum one step up."""
    if not isinstance(e, _flint().arb):  # a plain float: exact, or the undefined marker
        return float(e), (0.0 if math.isfinite(e) else math.inf), not math.isfinite(e)
    if not e.is_finite():
        return 0.0, math.inf, False
    value = float(e.mid())
    if not math.isfinite(value):  # a finite ball beyond float64's range: no float64 value is certified
        return value, math.inf, False
    d = e - _flint().arb(value)
    a, r = float_up_one(abs(d.mid())), float_up_one(d.rad())
    return value, (a if r == 0 else math.nextafter(a + r, math.inf)), False


class _ArbBackend:
    def __init__(self, prec: int):
        if prec < 53:
            raise ValueError(f"prec: got {prec}; expected >= 53 bits so float64 inputs convert exactly")
        self.prec = int(prec)
        self.u = math.ldexp(1.0, -self.prec)
        self.eta = 0.0
        self.name = f"arb[{self.prec}]"

    def _arb(self, x: Any) -> Any:
        arb = _flint().arb
        return x if isinstance(x, arb) else arb(float(x))

    def asarray(self, x: Any) -> np.ndarray:
        arr = np.asarray(x)
        if arr.dtype != object:
            arr = np.asarray(arr, dtype=np.float64)
        return _map(self._arb, arr)

    def scalar(self, c: float) -> Any:
        return _flint().arb(float(c))

    def to_float64(self, x: Any) -> np.ndarray:
        """The midpoints, rounded to float64."""
        return np.asarray(_map(lambda a: float(self._arb(a).mid()), x), dtype=np.float64)

    def exp(self, x: Any) -> np.ndarray:
        return _map(lambda a: self._arb(a).exp(), x)

    def _log1(self, a: Any) -> Any:
        a = self._arb(a)
        if a > 0:
            return a.log()
        if a.is_exact() and a.is_zero():
            return -math.inf  # log 0: the undefined marker
        return _flint().arb(0, math.inf)  # a ball reaching 0 or below: unknown at this precision

    def log(self, x: Any) -> np.ndarray:
        return _map(self._log1, x)

    def _sqrt1(self, a: Any) -> Any:
        a = self._arb(a)
        if a > 0 or not a.is_finite():
            return a.sqrt()
        hi = a.upper()
        return _flint().arb(0).union((hi if hi > 0 else _flint().arb(0)).sqrt())  # [0, sqrt(upper end)]

    def sqrt(self, x: Any) -> np.ndarray:
        return _map(self._sqrt1, x)

    def sin(self, x: Any) -> np.ndarray:
        return _map(lambda a: self._arb(a).sin(), x)

    def cos(self, x: Any) -> np.ndarray:
        return _map(lambda a: self._arb(a).cos(), x)

    def _div1(self, a: Any, b: Any) -> Any:
        a, b = self._arb(a), self._arb(b)
        if b.is_exact() and b.is_zero():
            return math.nan  # x / 0: the undefined marker, as 0/0 and x/0 in the other arithmetics
        if b.contains(0):  # a denominator straddling 0: unknown at this precision
            return _flint().arb(0, math.inf)
        return a / b

    def div(self, a: Any, b: Any) -> np.ndarray:
        return _map(self._div1, a, b)

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        """flint's working precision for the block. It is one setting per process, so the block holds a
        lock: a truth evaluated in another thread meanwhile waits instead of changing it."""
        ctx = _flint().ctx
        with _PRECISION_LOCK:
            old = ctx.prec
            ctx.prec = self.prec
            try:
                yield
            finally:
                ctx.prec = old


class ArbArith(Arith):
    """The arithmetic shim over object arrays of ``arb`` at ``prec`` bits (an enclosing arithmetic)."""

    enclosing = True

    def __init__(self, prec: int):
        super().__init__(_ArbBackend(prec))

    # enclosures ------------------------------------------------------------------------------------
    def radius(self, x: Any) -> np.ndarray:
        """Radii as float64 rounded up; inf where the ball is not finite (an unknown or undefined entry)."""
        return np.asarray(_map(_radius_up, x), dtype=np.float64)

    def mid(self, x: Any) -> np.ndarray:
        return _map(lambda a: self.b._arb(a).mid(), x)

    def certify64(self, x: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(float64 values, bounds on |value - exact| rounded up, undefined). Undefined: the markers of an
        exact x/0 or log 0. An entry whose ball is not finite is unknown: value 0, bound inf."""
        with self.context():
            out = [_certify1(e) for e in np.ravel(np.asarray(x, dtype=object))]
        shape = np.shape(x)
        value, bound, undefined = (np.asarray([o[i] for o in out]).reshape(shape) for i in range(3))
        return value.astype(np.float64), bound.astype(np.float64), undefined.astype(bool)

    # branches: where the branch point lies inside the ball, the union of both branches --------------
    def _branch(self, x: Any, c: float, above: Any, below: Any) -> np.ndarray:
        arb = _flint().arb
        c_arb = arb(float(c))

        def pick(xi: Any, a: Any, b: Any) -> Any:
            xi, a, b = self.b._arb(xi), self.b._arb(a), self.b._arb(b)
            if xi > c_arb:
                return a
            if xi < c_arb or (xi.is_exact() and xi.mid() == c_arb):
                return b
            return a.union(b)

        shape = np.broadcast_shapes(np.shape(x), np.shape(above), np.shape(below))
        return _map(pick, np.broadcast_to(x, shape), np.broadcast_to(above, shape), np.broadcast_to(below, shape))

    def maximum(self, x: Any, c: float) -> np.ndarray:
        return self._branch(x, c, x, self.b.scalar(c))

    def minimum(self, x: Any, c: float) -> np.ndarray:
        return self._branch(x, c, self.b.scalar(c), x)

    def where_pos(self, x: Any, a: Any, b: Any) -> np.ndarray:
        return self._branch(x, 0.0, a, b)

    def abs(self, x: Any) -> np.ndarray:
        return _map(lambda a: abs(self.b._arb(a)), x)

    # products: arb_mat per matrix of the batch --------------------------------------------------------
    def matmul(self, a: Any, b: Any) -> np.ndarray:
        flint = _flint()
        a, b = np.asarray(a, dtype=object), np.asarray(b, dtype=object)
        if a.ndim < 2 or b.ndim < 2:
            return np.matmul(a, b)
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        a = np.broadcast_to(a, batch + a.shape[-2:])
        b = np.broadcast_to(b, batch + b.shape[-2:])
        n, m = a.shape[-2], b.shape[-1]
        out = np.empty(batch + (n, m), dtype=object)
        arb = self.b._arb
        for idx in np.ndindex(*batch):
            ma = flint.arb_mat(a[idx].shape[0], a[idx].shape[1], [arb(e) for e in a[idx].ravel()])
            mb = flint.arb_mat(b[idx].shape[0], b[idx].shape[1], [arb(e) for e in b[idx].ravel()])
            prod = ma * mb
            out[idx] = np.asarray(prod.entries(), dtype=object).reshape(n, m)
        return out
