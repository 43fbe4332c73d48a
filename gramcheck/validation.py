"""Input checks shared by the reference forms, the torch forms and the public API.

Every failure is a ``ValueError`` (``TypeError`` for a wrong kind of object) whose message names the
argument, what it got (shape, dtype, device) and what was expected.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_FLOAT_KINDS = ("float16", "bfloat16", "float32", "float64")


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _dtype_str(x: Any) -> str:
    return str(x.dtype).removeprefix("torch.")


def _finite(x: Any) -> bool:
    """Every entry finite. A finite sum proves it in one reduction (an inf or NaN entry makes the sum inf or
    NaN); only where the sum is not finite (such an entry, or an overflowing sum) are the entries checked."""
    if _is_torch(x):
        import torch

        return bool(torch.isfinite(x.detach().sum())) or bool(torch.isfinite(x).all())
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(np.sum(x))) or bool(np.isfinite(x).all())


def check_array(
    name: str,
    x: Any,
    *,
    ndim: int | None = 4,
    layout: str = "(B, H, N, d)",
    allow_nonfinite: bool = False,
) -> None:
    """Check one array argument: an array (NumPy or torch) of floating dtype, the right rank, no empty
    dimension, and (unless allowed) only finite entries."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name}: got {type(x).__name__}; expected a numpy array or torch tensor {layout}")
    shape = tuple(x.shape)
    if ndim is not None and len(shape) != ndim:
        raise ValueError(f"{name}: got shape {shape} (rank {len(shape)}); expected rank {ndim}, layout {layout}")
    if any(s <= 0 for s in shape):
        raise ValueError(f"{name}: got shape {shape}; expected every dimension >= 1, layout {layout}")
    if _dtype_str(x) not in _FLOAT_KINDS:
        raise ValueError(f"{name}: got dtype {_dtype_str(x)}; expected a floating dtype ({', '.join(_FLOAT_KINDS)})")
    if not allow_nonfinite and not _finite(x):
        raise ValueError(f"{name}: contains NaN or Inf (shape {shape}); expected finite values")


def check_qkv(q: Any, k: Any, v: Any) -> tuple[int, int, int, int, int]:
    """Check q (B, H, N, d_k), k (B, H, N, d_k), v (B, H, N, d_v): arrays of one kind, dtype and device.
    Extra inputs are checked against their specs (``gramcheck.inputs``). Returns (B, H, N, d_k, d_v)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_array(name, x)
    B, H, N, dk = q.shape
    if tuple(k.shape) != tuple(q.shape):
        raise ValueError(f"k: got shape {tuple(k.shape)}; expected the shape of q, {tuple(q.shape)} (B, H, N, d_k)")
    if tuple(v.shape[:3]) != (B, H, N):
        raise ValueError(f"v: got shape {tuple(v.shape)}; expected (B, H, N, d_v) = ({B}, {H}, {N}, d_v) to match q")
    check_same_kind([("q", q), ("k", k), ("v", v)])
    return B, H, N, dk, int(v.shape[3])


def check_same_kind(tensors: list[tuple[str, Any]]) -> None:
    """The arrays are all NumPy or all torch, of one dtype and (torch) one device."""
    first_name, first = tensors[0]
    for name, x in tensors[1:]:
        if _is_torch(x) != _is_torch(first):
            raise TypeError(
                f"{name}: is a {type(x).__name__} but {first_name} is a {type(first).__name__}; expected one kind"
            )
        if _dtype_str(x) != _dtype_str(first):
            raise ValueError(f"{name}: got dtype {_dtype_str(x)}; expected {_dtype_str(first)} as {first_name}")
        if _is_torch(x) and x.device != first.device:
            raise ValueError(f"{name}: is on device {x.device}; expected {first.device} as {first_name}")


def check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: got {value!r}; expected a positive integer")
    return int(value)


def check_choice(name: str, value: Any, choices: tuple[str, ...] | list[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name}: got {value!r}; expected one of {', '.join(map(repr, choices))}")
    return str(value)
