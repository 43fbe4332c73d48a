"""Unit roundoff, the Higham constants gamma_n, and mpmath precision contexts.

Unit roundoff u = 2^-p for a format with p significand bits (round to nearest):
float64 2^-53, float32 2^-24, tf32 2^-11, bfloat16 2^-8, float16 2^-11
(Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., sec. 2.1; proofs/fp-forward-error.md).

gamma_n = n u / (1 - n u), defined while n u < 1 (Higham, Lemma 3.1).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import mpmath
import numpy as np

# significand bits including the implicit bit
_BITS: dict[str, int] = {
    "float64": 53,
    "float32": 24,
    "tf32": 11,
    "bfloat16": 8,
    "float16": 11,
}

_ALIASES: dict[str, str] = {
    "double": "float64",
    "f64": "float64",
    "fp64": "float64",
    "float": "float32",
    "single": "float32",
    "f32": "float32",
    "fp32": "float32",
    "bf16": "bfloat16",
    "half": "float16",
    "f16": "float16",
    "fp16": "float16",
}


def dtype_name(dtype: Any) -> str:
    """Canonical name ('float64', 'float32', 'tf32', 'bfloat16', 'float16') of a dtype given as a string,
    a NumPy dtype or a torch dtype. Raises ValueError naming the argument for anything else."""
    if isinstance(dtype, str):
        name = dtype.lower().removeprefix("torch.")
    elif type(dtype).__module__.startswith("torch"):
        name = str(dtype).removeprefix("torch.")
    else:
        try:  # numpy dtypes and scalar types
            name = np.dtype(dtype).name
        except TypeError:
            name = str(dtype)
    name = _ALIASES.get(name, name)
    if name not in _BITS:
        raise ValueError(f"dtype: got {dtype!r}; expected one of {sorted(_BITS)} (or a numpy/torch float dtype)")
    return name


def significand_bits(dtype: Any) -> int:
    """Significand bits p (implicit bit included) of a floating-point format."""
    return _BITS[dtype_name(dtype)]


def unit_roundoff(dtype: Any) -> float:
    """u = 2^-p, the unit roundoff of round-to-nearest in the format (an exact power of two)."""
    return math.ldexp(1.0, -significand_bits(dtype))


def gamma(n: Any, dtype: Any = "float64", *, u: Any = None) -> Any:
    """gamma_n = n u / (1 - n u) (Higham, Lemma 3.1). Returns inf when n u >= 1, where no bound of
    this form exists. ``u`` overrides the dtype's unit roundoff (e.g. 2^-prec for mpmath, an mpf).
    ``n`` may be an array (elementwise; float64 or object array of mpf, following ``u``). The one
    definition of gamma_n: the rounding models of ``arith`` use it too."""
    uu = unit_roundoff(dtype) if u is None else u
    if np.ndim(n) == 0:
        if n != n or n < 0:
            raise ValueError(f"n: got {n}; expected n >= 0")
        nu = n * uu
        return math.inf if nu >= 1 else nu / (1 - nu)
    arr = np.asarray(n)
    if np.any(arr < 0):
        raise ValueError(f"n: got an array with minimum {arr.min()}; expected every n >= 0")
    nu = arr * uu
    ok = np.asarray(nu < 1, dtype=bool)
    return np.where(ok, nu / np.where(ok, 1 - nu, 1), math.inf)


PROBABILISTIC_LAMBDA = 8.0


def gamma_tilde(n: Any, dtype: Any = "float64", *, lam: float = PROBABILISTIC_LAMBDA, u: Any = None) -> Any:
    """gamma~_n(lambda) = exp(lambda sqrt(n) u + n u^2 / (1 - u)) - 1 (Higham & Mary 2019, Theorem 2.4):
    the relative error of a product of n rounding factors (a sum or inner product of n terms in any
    order) with probability at least 1 - 2 exp(-lambda^2 (1 - u)^2 / 2) per product, when rounding errors
    are independent with mean zero (proofs/probabilistic-rounding.md). ``n`` may be an array; ``u``
    overrides the dtype's unit roundoff. The one definition: the probabilistic rounding model and the
    backward rule's accumulation floor use it."""
    uu = unit_roundoff(dtype) if u is None else float(u)
    nn = np.asarray(n, dtype=np.float64)
    if np.any(nn < 0):
        raise ValueError(f"n: got minimum {nn.min()}; expected every n >= 0")
    out = np.expm1(lam * np.sqrt(nn) * uu + nn * uu * uu / (1 - uu))
    return float(out) if np.ndim(n) == 0 else out


# (exponent of the smallest subnormal, largest finite value) per format
_RANGE: dict[str, tuple[int, float]] = {
    "float64": (-1074, float(np.finfo(np.float64).max)),
    "float32": (-149, float(np.finfo(np.float32).max)),
    "tf32": (-149, float(np.finfo(np.float32).max)),
    "bfloat16": (-133, math.ldexp(255.0, 120)),
    "float16": (-24, 65504.0),
}


def smallest_subnormal(dtype: Any) -> float:
    """The smallest positive (subnormal) value of the format: the absolute error of an underflow under
    gradual underflow (proofs/fp-forward-error.md, "Underflow")."""
    return math.ldexp(1.0, _RANGE[dtype_name(dtype)][0])


def smallest_normal(dtype: Any) -> float:
    """The smallest positive normal value of the format (2^-126 for float32 and bfloat16, 2^-14 for float16)."""
    return smallest_subnormal(dtype) * 2.0 ** (significand_bits(dtype) - 1)


def underflow_unit(dtype: Any) -> float:
    """eta of the rounding model: the absolute error charged to every operation for underflow, under
    gradual underflow (the smallest subnormal). A flushing unit (2^-126 for float32-computing formats)
    charged to every operation passed outputs several percent off wherever intermediates sit below about
    2^-102 without ever reaching the flush range (proofs/fp-forward-error.md, "Underflow")."""
    return smallest_subnormal(dtype)


def max_finite(dtype: Any) -> float:
    """The largest finite value of the format."""
    return _RANGE[dtype_name(dtype)][1]


def overflow_threshold(dtype: Any) -> float:
    """The least magnitude that rounds to infinity in the format: the largest finite value plus half its
    spacing (IEEE 754 round to nearest; float16 65520, float32 (2 - 2^-24) 2^127); infinite for float64,
    whose truths are held in float64 themselves."""
    top = max_finite(dtype)
    half_spacing = math.ldexp(unit_roundoff(dtype), math.floor(math.log2(top)))
    return math.inf if dtype_name(dtype) == "float64" else top + half_spacing


def round_to(x: Any, dtype: Any, *, wide_range: bool = False) -> np.ndarray:
    """x (float64) rounded to the nearest value of ``dtype`` (ties to even, subnormals kept, overflow to
    +-inf), returned as float64 so a reference evaluates exactly what a target in ``dtype`` receives.
    NumPy only: p significand bits and the subnormal exponent define the grid. ``wide_range`` keeps the
    significand bits and takes float64's exponent range: the rounding without the dtype's underflow
    and overflow."""
    name = dtype_name(dtype)
    x = np.asarray(x, dtype=np.float64)
    if name == "float64":
        return x.copy()
    sub_exp, big = _RANGE["float64" if wide_range else name]
    p = _BITS[name]
    with np.errstate(over="ignore", invalid="ignore"):
        _, e = np.frexp(x)  # x = f 2^e, 0.5 <= |f| < 1
        step = np.maximum(e.astype(np.int64) - p, sub_exp)  # spacing 2^step of the grid near x
        out = np.ldexp(np.round(np.ldexp(x, -step)), step)  # np.round: half to even
        return np.where(np.abs(out) > big, np.copysign(np.inf, x), out)


@contextlib.contextmanager
def mp_precision(bits: int) -> Iterator[None]:
    """Run a block with mpmath's working precision set to ``bits``; the previous global precision is
    restored on exit, also when the block raises (mpmath.workprec does the save/restore)."""
    if bits < 2:
        raise ValueError(f"bits: got {bits}; expected an integer >= 2")
    with mpmath.workprec(int(bits)):
        yield
