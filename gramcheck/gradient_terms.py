"""The size of a gradient's terms: reverse mode with every local partial derivative taken in magnitude.

The chain rule writes each entry of a gradient as a sum over the paths from that input to the loss, each
path contributing the product of the local partial derivatives along it. A backward pass forms those sums
(grouped in whatever order its algorithm chose) from partials that are themselves computed values, sums of
forward terms (the partial of A v with respect to v is A = Q K^T, a d-term inner product per entry). The size
its rounding errors are measured against is therefore

    T_i = sum_paths prod_edges M(d(out)/d(in)),

M the size of a partial's own terms: for a leaf |x|; through +, -, * and matmul the sums and products of the
operands' sizes (so a multilinear form's M is its expansion into monomials with every factor in magnitude);
through a / b, M(a)/|b| (plus |a/b| (M(b) - |b|)/|b| where the denominator is itself a sum that cancels);
through an elementary function (exp, log, sqrt, sin, cos) the magnitude of its value: its argument is taken
as given, as a decay exp(b_t - b_s) is a positive factor, not a sum. T is computed by one reverse pass that
propagates the adjoint's size through the partials' sizes, seeded with |dL/d(output)|
(proofs/backward-agreement.md).
For a form multilinear in q, k, v, S_0 with positive decays it is exactly the sum of |terms| of every entry.

``TermArith`` is the arithmetic shim (``gramcheck.arith``'s interface) over ``Var`` values that record
that pass; the forward values are the float64 values of the definition itself. numpy only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

Vjp = Callable[[np.ndarray], np.ndarray]


def _unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum g over the axes numpy broadcast to reach g.shape from ``shape``."""
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    for axis, n in enumerate(shape):
        if n == 1 and g.shape[axis] != 1:
            g = g.sum(axis=axis, keepdims=True)
    return g


def _advanced(idx: Any) -> bool:
    parts = idx if isinstance(idx, tuple) else (idx,)
    return any(isinstance(p, (np.ndarray, list)) for p in parts)


class Var:
    """A float64 value, the size M of its terms, and its parents with the size-vjp of each edge."""

    __slots__ = ("ar", "val", "mag", "parents", "adj")
    __array_priority__ = 1000.0

    def __init__(self, ar: TermArith, val: Any, mag: Any = None, parents: Sequence[tuple[Var, Vjp]] = ()):
        self.ar = ar
        self.val = np.asarray(val, dtype=np.float64)
        self.mag = np.abs(self.val) if mag is None else np.asarray(mag, dtype=np.float64)
        self.parents = tuple(parents)
        self.adj: np.ndarray | None = None
        if self.parents:
            ar.tape.append(self)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.val.shape

    @property
    def ndim(self) -> int:
        return self.val.ndim

    def __getitem__(self, idx: Any) -> Var:
        shape = self.shape

        def vjp(g: np.ndarray) -> np.ndarray:
            z = np.zeros(shape)
            if _advanced(idx):
                np.add.at(z, idx, g)
            else:
                z[idx] += g
            return z

        return Var(self.ar, self.val[idx], self.mag[idx], [(self, vjp)])

    def reshape(self, *shape: Any) -> Var:
        old = self.shape
        return Var(self.ar, self.val.reshape(*shape), self.mag.reshape(*shape), [(self, lambda g: g.reshape(old))])

    def __add__(self, o: Any) -> Var:
        return self.ar.add(self, o)

    __radd__ = __add__

    def __sub__(self, o: Any) -> Var:
        return self.ar.add(self, o, sign=-1.0)

    def __rsub__(self, o: Any) -> Var:
        return self.ar.add(o, self, sign=-1.0)

    def __neg__(self) -> Var:
        return Var(self.ar, -self.val, self.mag, [(self, lambda g: g)])

    def __mul__(self, o: Any) -> Var:
        return self.ar.mul(self, o)

    __rmul__ = __mul__

    def __truediv__(self, o: Any) -> Var:
        return self.ar.div(self, o)

    def __rtruediv__(self, o: Any) -> Var:
        return self.ar.div(o, self)

    def __repr__(self) -> str:
        return f"Var(shape={self.shape})"


class TermArith:
    """The arithmetic shim over ``Var``: float64 forward values and term sizes, recorded for the reverse pass."""

    enclosing = False
    name = "terms"

    def __init__(self) -> None:
        self.tape: list[Var] = []

    def __repr__(self) -> str:
        return "<Arith gradient terms>"

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        with np.errstate(all="ignore"):
            yield

    # values ------------------------------------------------------------------------------------
    def asarray(self, x: Any) -> Var:
        return x if isinstance(x, Var) else Var(self, x)

    def const(self, c: float) -> Var:
        return Var(self, c)

    def held(self, x: Any) -> Var:
        """Sizes of terms do not depend on the dtype a state is held in (``Arith.held``)."""
        return self.asarray(x)

    def zeros(self, shape: tuple[int, ...]) -> Var:
        return Var(self, np.zeros(shape))

    def to_float64(self, x: Any) -> np.ndarray:
        return self.asarray(x).val

    # arithmetic ----------------------------------------------------------------------------------
    def add(self, a: Any, b: Any, sign: float = 1.0) -> Var:
        a, b = self.asarray(a), self.asarray(b)
        edges = [(a, lambda g: _unbroadcast(g, a.shape)), (b, lambda g: _unbroadcast(g, b.shape))]
        return Var(self, a.val + sign * b.val, a.mag + b.mag, edges)

    def mul(self, a: Any, b: Any) -> Var:
        a, b = self.asarray(a), self.asarray(b)
        edges = [(a, lambda g: _unbroadcast(g * b.mag, a.shape)), (b, lambda g: _unbroadcast(g * a.mag, b.shape))]
        return Var(self, a.val * b.val, a.mag * b.mag, edges)

    def div(self, a: Any, b: Any) -> Var:
        """y = a / b = a (1/b), 1/b an elementary function of b whose argument's own cancellation is kept:
        M(y) = (M(a) + |y| (M(b) - |b|)) / |b|; partials of sizes 1/|b| and M(a)/b^2."""
        a, b = self.asarray(a), self.asarray(b)
        y = a.val / b.val
        over = 1.0 / np.abs(b.val)
        edges = [
            (a, lambda g: _unbroadcast(g * over, a.shape)),
            (b, lambda g: _unbroadcast(g * a.mag * over * over, b.shape)),
        ]
        return Var(self, y, (a.mag + np.abs(y) * (b.mag - np.abs(b.val))) * over, edges)

    def matmul(self, a: Any, b: Any) -> Var:
        a, b = self.asarray(a), self.asarray(b)
        edges = [
            (a, lambda g: _unbroadcast(np.matmul(g, np.swapaxes(b.mag, -1, -2)), a.shape)),
            (b, lambda g: _unbroadcast(np.matmul(np.swapaxes(a.mag, -1, -2), g), b.shape)),
        ]
        return Var(self, np.matmul(a.val, b.val), np.matmul(a.mag, b.mag), edges)

    # elementary functions: the argument taken as given, the value's size |f(x)|, the partial |f'(x)| ----
    def _function(self, x: Any, f: Callable[[np.ndarray], np.ndarray], df: Callable[[np.ndarray], np.ndarray]) -> Var:
        x = self.asarray(x)
        xv = x.val
        return Var(self, f(xv), None, [(x, lambda g: g * np.abs(df(xv)))])

    def exp(self, x: Any) -> Var:
        return self._function(x, np.exp, np.exp)

    def log(self, x: Any) -> Var:
        return self._function(x, np.log, lambda v: 1.0 / v)

    def sqrt(self, x: Any) -> Var:
        return self._function(x, np.sqrt, lambda v: 0.5 / np.sqrt(v))

    def sin(self, x: Any) -> Var:
        return self._function(x, np.sin, np.cos)

    def cos(self, x: Any) -> Var:
        return self._function(x, np.cos, np.sin)

    # piecewise linear: sizes selected with the values -------------------------------------------
    def _select(self, pick: np.ndarray, a: Any, b: Any) -> Var:
        a, b = self.asarray(a), self.asarray(b)
        edges = [(a, lambda g: _unbroadcast(g * pick, a.shape)), (b, lambda g: _unbroadcast(g * ~pick, b.shape))]
        return Var(self, np.where(pick, a.val, b.val), np.where(pick, a.mag, b.mag), edges)

    def abs(self, x: Any) -> Var:
        x = self.asarray(x)
        return Var(self, np.abs(x.val), x.mag, [(x, lambda g: g)])

    # at a tie x == c the value is the same either way; the adjoint flows to x, as torch's clamp sends it
    def maximum(self, x: Any, c: float) -> Var:
        x = self.asarray(x)
        return self._select(x.val >= c, x, self.const(c))

    def minimum(self, x: Any, c: float) -> Var:
        x = self.asarray(x)
        return self._select(x.val <= c, x, self.const(c))

    def where_pos(self, x: Any, a: Any, b: Any) -> Var:
        return self._select(self.asarray(x).val > 0, a, b)

    def fill(self, x: Any, keep: np.ndarray, value: float) -> Var:
        return self._select(np.asarray(keep, dtype=bool), x, self.const(value))

    # structure ---------------------------------------------------------------------------------
    def mT(self, x: Any) -> Var:
        x = self.asarray(x)
        back = [(x, lambda g: np.swapaxes(g, -1, -2))]
        return Var(self, np.swapaxes(x.val, -1, -2), np.swapaxes(x.mag, -1, -2), back)

    def concat(self, xs: Sequence[Any], axis: int = -1) -> Var:
        vs = [self.asarray(x) for x in xs]
        ends = np.cumsum([v.shape[axis] for v in vs])
        edges = [
            (v, lambda g, lo=int(e - v.shape[axis]), hi=int(e): np.take(g, np.arange(lo, hi), axis=axis))
            for v, e in zip(vs, ends, strict=True)
        ]
        return Var(self, np.concatenate([v.val for v in vs], axis), np.concatenate([v.mag for v in vs], axis), edges)

    def stack(self, xs: Sequence[Any], axis: int = 0) -> Var:
        vs = [self.asarray(x) for x in xs]
        edges = [(v, lambda g, i=i: np.take(g, i, axis=axis)) for i, v in enumerate(vs)]
        return Var(self, np.stack([v.val for v in vs], axis), np.stack([v.mag for v in vs], axis), edges)

    # reductions --------------------------------------------------------------------------------
    def sum(self, x: Any, axis: int, keepdims: bool = False) -> Var:
        x = self.asarray(x)
        shape = x.shape

        def vjp(g: np.ndarray) -> np.ndarray:
            return np.broadcast_to(g if keepdims else np.expand_dims(g, axis), shape)

        return Var(self, np.sum(x.val, axis, keepdims=keepdims), np.sum(x.mag, axis, keepdims=keepdims), [(x, vjp)])

    def cumsum(self, x: Any, axis: int) -> Var:
        x = self.asarray(x)

        def vjp(g: np.ndarray) -> np.ndarray:
            return np.flip(np.cumsum(np.flip(g, axis), axis=axis), axis)

        return Var(self, np.cumsum(x.val, axis=axis), np.cumsum(x.mag, axis=axis), [(x, vjp)])

    def stop_max(self, x: Any, axis: int | tuple[int, ...], keep: np.ndarray | None = None) -> Var:
        """A constant (no path through it): the maximum of x over ``axis`` among entries where ``keep``."""
        vals = self.asarray(x).val
        if keep is not None:
            vals = np.where(keep, vals, -np.inf)
        m = np.max(vals, axis=axis, keepdims=True)
        return Var(self, np.where(np.isfinite(m), m, 0.0))

    def running_max(self, x: Any, axis: int) -> Var:
        """A constant, the cumulative maximum of x along ``axis``."""
        return Var(self, np.maximum.accumulate(self.asarray(x).val, axis=axis))

    def shifted(self, x: Any, base: Any, axis: int) -> Var:
        """x - (max_axis (x + base) - base), the shift one constant (``Arith.shifted``)."""
        x, b = self.asarray(x), self.asarray(base).val
        top = self.stop_max(Var(self, x.val + b), axis).val
        return x - Var(self, top - b)

    # the reverse pass --------------------------------------------------------------------------
    def backward(self, seeds: Sequence[tuple[Var, np.ndarray]]) -> None:
        """Propagate the adjoint's size from each (output, |dL/d output|) through the partials' sizes."""
        for out, seed in seeds:
            s = np.abs(np.broadcast_to(np.asarray(seed, dtype=np.float64), out.shape))
            out.adj = s if out.adj is None else out.adj + s
        for node in reversed(self.tape):
            if node.adj is None:
                continue
            for parent, vjp in node.parents:
                with np.errstate(all="ignore"):
                    c = vjp(node.adj)
                # 0 * inf (a zero adjoint times an infinite partial, inside a product or a sum) gives NaN; it
                # is taken as 0, which can only make T smaller there (a tighter floor, never a looser one)
                c = np.where(np.isnan(c), 0.0, c)
                parent.adj = c if parent.adj is None else parent.adj + c
