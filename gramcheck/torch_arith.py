"""The arithmetic shim's interface over torch tensors, so that elementwise formulas (feature maps,
norms) are written once and run in the reference arithmetics and in the target dtype alike.

torch is imported on first use only; the core of gramcheck never needs it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError("gramcheck's torch forms need torch: pip install 'gramcheck[torch]'") from exc
    return torch


class TorchArith:
    """Same methods as ``gramcheck.arith.Arith``; values are torch tensors of any dtype and device."""

    enclosing = False
    name = "torch"

    def __repr__(self) -> str:
        return "<Arith torch>"

    def const(self, c: float) -> float:
        return float(c)

    def held(self, x: Any) -> Any:
        """A recurrence's state or decays: production forms hold them as they choose (``Arith.held``)."""
        return x

    def exp(self, x: Any) -> Any:
        return _torch().exp(x) if not isinstance(x, float) else math.exp(x)

    def log(self, x: Any) -> Any:
        return _torch().log(x) if not isinstance(x, float) else math.log(x)

    def sqrt(self, x: Any) -> Any:
        return _torch().sqrt(x) if not isinstance(x, float) else math.sqrt(x)

    def sin(self, x: Any) -> Any:
        return _torch().sin(x)

    def cos(self, x: Any) -> Any:
        return _torch().cos(x)

    def abs(self, x: Any) -> Any:
        return x.abs()

    def div(self, a: Any, b: Any) -> Any:
        return a / b

    def maximum(self, x: Any, c: float) -> Any:
        return x.clamp_min(c)

    def minimum(self, x: Any, c: float) -> Any:
        return x.clamp_max(c)

    def where_pos(self, x: Any, a: Any, b: Any) -> Any:
        return _torch().where(x > 0, a, b)

    def mT(self, x: Any) -> Any:
        return x.transpose(-1, -2)

    def concat(self, xs: Sequence[Any], axis: int = -1) -> Any:
        return _torch().cat(list(xs), dim=axis)

    def sum(self, x: Any, axis: int, keepdims: bool = False) -> Any:
        return x.sum(dim=axis, keepdim=keepdims)

    def matmul(self, a: Any, b: Any) -> Any:
        return a @ b

    def stop_max(self, x: Any, axis: int | tuple[int, ...], keep: Any = None) -> Any:
        """max over ``axis`` (keepdim), detached: a stabilising shift carries no gradient."""
        x = x.detach()
        if keep is not None:
            x = x.masked_fill(~keep, -math.inf)
        dims = (axis,) if isinstance(axis, int) else tuple(axis)
        m = x.amax(dim=dims, keepdim=True)
        return _torch().where(_torch().isfinite(m), m, _torch().zeros_like(m))

    def running_max(self, x: Any, axis: int) -> Any:
        """Cumulative maximum along ``axis``, detached (a stabilising shift carries no gradient)."""
        return _torch().cummax(x.detach(), dim=axis).values

    def shifted(self, x: Any, base: Any, axis: int) -> Any:
        """``Arith.shifted`` with the maximum and the shift in float32 at least (detached), the result
        rounded once to x's dtype: a 16-bit x + base would put the maximum off by its spacing (4096 at
        5e5 in bfloat16) and exp of the shifted exponents would overflow. The rounded result's own maximum
        is subtracted once more (a constant per row, which the row's normalisation cancels), so that the
        largest exponent is exactly 0 however the shift rounded (``RoundedArith.shifted``)."""
        wide = _torch().promote_types(x.dtype, _torch().float32)
        xw, bw = x.to(wide), base.detach().to(wide)
        top = (xw.detach() + bw).amax(dim=axis, keepdim=True)
        top = _torch().where(_torch().isfinite(top), top, _torch().zeros_like(top))
        y = xw - (top - bw)
        peak = y.detach().amax(dim=axis, keepdim=True)
        return (y - _torch().where(_torch().isfinite(peak), peak, _torch().zeros_like(peak))).to(x.dtype)


TORCH = TorchArith()
