"""The definition, differentiable: the shim over torch tensors of one dtype, complete (``asarray``,
``zeros``, ``stack``, ``fill``, ``cumsum``) so that a variant's ``reference_fn`` runs in torch with
autograd. In float64 it gives the reference gradients of backward agreement; in the target's dtype it
gives the definition's own gradient in that dtype (proofs/backward-agreement.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .torch_arith import TorchArith


class TorchDefinition(TorchArith):
    """``TorchArith`` whose constants and fresh arrays are tensors of ``dtype`` on ``device``.
    ``carried_shift``: a stabilising maximum (``stop_max``) carries its gradient, for the other gradient
    convention of a stabiliser that does not cancel (FAVOR+ with feature_eps > 0: performer-pytorch holds
    the shift constant, a plain autograd implementation differentiates through it)."""

    def __init__(self, dtype: Any, device: Any = "cpu", carried_shift: bool = False):
        import torch

        self.dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        self.device = device
        self.carried_shift = carried_shift

    def __repr__(self) -> str:
        return f"<Arith torch {self.dtype}>"

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        yield

    def asarray(self, x: Any) -> Any:
        import torch

        if isinstance(x, torch.Tensor):
            return x
        return torch.as_tensor(np.asarray(x, dtype=np.float64)).to(dtype=self.dtype, device=self.device)

    def const(self, c: Any) -> Any:
        """A number stays a Python float (torch computes it with a tensor in float32 below float32); an
        array of constants (a decay schedule, lags) is a tensor in float32 below float32, as kernels hold
        them: it is never rounded to a 16-bit dtype."""
        import torch

        if np.ndim(c) == 0:
            return float(c)
        work = torch.promote_types(self.dtype, torch.float32)
        return torch.as_tensor(np.array(c, dtype=np.float64)).to(dtype=work, device=self.device)

    def held(self, x: Any) -> Any:
        """A recurrence's state or decays, held in float32 below float32 (``Arith.held``)."""
        import torch

        return x.to(torch.promote_types(self.dtype, torch.float32))

    def stored(self, x: Any) -> Any:
        """The output as a kernel stores it, in the dtype (``RoundedArith.stored``)."""
        return x.to(self.dtype)

    def matmul(self, a: Any, b: Any) -> Any:
        """a @ b; of two operands of different dtypes (one met a float32 constant, or is a held state)
        the narrower is promoted, as ``RoundedArith`` computes a product with a held operand in float32."""
        if a.dtype != b.dtype:
            import torch

            wide = torch.promote_types(a.dtype, b.dtype)
            a, b = a.to(wide), b.to(wide)
        return a @ b

    def zeros(self, shape: tuple[int, ...]) -> Any:
        import torch

        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def stack(self, xs: Sequence[Any], axis: int = 0) -> Any:
        import torch

        return torch.stack(list(xs), dim=axis)

    def fill(self, x: Any, keep: np.ndarray, value: float) -> Any:
        import torch

        mask = torch.as_tensor(np.asarray(keep, dtype=bool), device=x.device)
        return x.masked_fill(~mask, value)

    def cumsum(self, x: Any, axis: int) -> Any:
        return x.cumsum(dim=axis)

    def stop_max(self, x: Any, axis: int | tuple[int, ...], keep: Any = None) -> Any:
        import torch

        if keep is not None and not isinstance(keep, torch.Tensor):
            keep = torch.as_tensor(np.asarray(keep, dtype=bool), device=x.device)
        held = super().stop_max(x, axis, keep)
        if not self.carried_shift:
            return held
        y = x if keep is None else x.masked_fill(~keep, -np.inf)
        top = y.amax(dim=(axis,) if isinstance(axis, int) else tuple(axis), keepdim=True)
        return torch.where(torch.isfinite(top), top, torch.zeros_like(top))
