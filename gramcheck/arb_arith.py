"""Ball arithmetic in C for the oracle's escalation: python-flint's ``arb`` (Arb: midpoint-radius balls
with rigorous error propagation, F. Johansson, IEEE Trans. Computers 66(8), 2017) behind the arithmetic
shim, on NumPy object arrays of ``arb``.

Every ``arb`` operation returns a ball that contains the exact result of the operation on every point of
its operands' balls, so a definition evaluated here encloses the exact output, as ``BallMP`` does, at a
fraction of its cost (matrix products through ``arb_mat``). Conventions shared with ``BallArith``: a
quotient whose denominator ball contains 0 without being exactly 0 keeps the midpoint quotient with an
infinite radius (arb itself returns an indeterminate ball), so that the oracle raises the precision
instead of calling the entry undefined; an exact 0 denominator gives the undefined value (NaN midpoint);
where a branch point (x > c) falls inside x's ball, both branches are covered (their union).

Optional: ``available()`` says whether python-flint is importable (extra ``gramcheck[arb]``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from .arith import Arith


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

    def log(self, x: Any) -> np.ndarray:
        return _map(lambda a: self._arb(a).log(), x)

    def sqrt(self, x: Any) -> np.ndarray:
        return _map(lambda a: self._arb(a).sqrt(), x)

    def sin(self, x: Any) -> np.ndarray:
        return _map(lambda a: self._arb(a).sin(), x)

    def cos(self, x: Any) -> np.ndarray:
        return _map(lambda a: self._arb(a).cos(), x)

    def _div1(self, a: Any, b: Any) -> Any:
        a, b = self._arb(a), self._arb(b)
        if b.is_exact() and b.is_zero():
            return _flint().arb("nan")  # x / 0: undefined, as 0/0 and x/0 in the other arithmetics
        if b.contains(0):  # a denominator straddling 0: the midpoint quotient, radius unbounded
            mb = b.mid()
            return _flint().arb(float((a.mid() / mb).mid()) if not mb.is_zero() else math.nan, math.inf)
        return a / b

    def div(self, a: Any, b: Any) -> np.ndarray:
        return _map(self._div1, a, b)

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        ctx = _flint().ctx
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
        """Radii as float64 rounded up (one part in 2^52); inf where the ball is not finite."""

        def rad(a: Any) -> float:
            a = self.b._arb(a)
            r = float(a.rad())
            return r if a.is_finite() else math.inf

        return np.asarray(_map(rad, x), dtype=np.float64) * (1.0 + 2.0**-52)

    def mid(self, x: Any) -> np.ndarray:
        return _map(lambda a: self.b._arb(a).mid(), x)

    def certify64(self, x: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(float64 midpoints, bounds on |float64 value - exact|, undefined: NaN or infinite midpoint)."""
        with self.context():
            value = self.b.to_float64(x)
            undefined = ~np.isfinite(value) & ~np.asarray(_map(lambda a: self.b._arb(a).mid().is_finite(), x), bool)
            diff = x - self.b.asarray(np.where(np.isfinite(value), value, 0.0))
            bound = np.asarray(_map(lambda a: float(a.abs_upper()), diff), dtype=np.float64) * (1.0 + 2.0**-52)
        finite_ball = np.asarray(_map(lambda a: self.b._arb(a).is_finite(), x), dtype=bool)
        bound = np.where(finite_ball & ~undefined, bound, math.inf)
        return value, bound, undefined

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
