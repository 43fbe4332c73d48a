"""Input checks shared by the reference forms, the torch forms and the public API.

Every failure is a ``ValueError`` (``TypeError`` for a wrong kind of object) whose message names the
argument, what it got (shape, dtype, device) and what was expected.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
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


def check_bool(name: str, value: Any) -> bool:
    """A flag: True or False (a NumPy bool too); 1, "yes" or None are a TypeError naming ``name``."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: got {value!r} ({type(value).__name__}); expected True or False")
    return bool(value)


def check_names(name: str, values: Any, choices: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """A non-empty list of names, each one of ``choices``, as a tuple. A single string is refused (it
    would be read as a list of its characters), as is an empty list (None is the caller's default)."""
    expected = f"expected a list of names from {', '.join(map(repr, choices))}"
    if isinstance(values, str):
        raise TypeError(f"{name}: got the string {values!r}; {expected} (e.g. [{values!r}])")
    try:
        names = tuple(values)
    except TypeError:
        raise TypeError(f"{name}: got {values!r} ({type(values).__name__}); {expected}") from None
    if not names:
        raise ValueError(f"{name}: got an empty list; {expected}, at least one (or None for the default)")
    for value in names:
        check_choice(name, value, choices)
    return names


def check_positive_number(name: str, value: Any, *, unit: str, default: str) -> float | None:
    """None (the default, described by ``default``) or a positive finite number of ``unit``; a wrong kind is
    a TypeError, NaN, infinities and numbers <= 0 a ValueError, both naming ``name``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(
            f"{name}: got {value!r} ({type(value).__name__}); expected a positive number of {unit}, or None ({default})"
        )
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: got {value!r}; expected a positive finite number of {unit}, or None ({default})")
    return float(value)


def check_writable_file(name: str, path: Any) -> Path:
    """``path`` can be written as a file: not a directory, and either a writable file or a new name under
    the nearest existing folder above it, where a file can be created (tried with a temporary file, removed
    at once; folders that do not exist yet are created when the file is written). A ValueError naming
    ``name`` otherwise."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name}: got {path!r} ({type(path).__name__}); expected a file path")
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{name}: got {str(p)!r}, a directory; expected a file path such as {str(p / 'cert.json')!r}")
    if p.exists():
        if not os.access(p, os.W_OK):
            raise ValueError(f"{name}: got {str(p)!r}; the file exists and cannot be written")
        return p
    folder = p.absolute().parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise ValueError(f"{name}: got {str(p)!r}; {str(folder)!r} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise ValueError(f"{name}: got {str(p)!r}; cannot create files in {str(folder)!r} ({exc.strerror})") from None
    return p
