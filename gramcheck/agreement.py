"""Reference agreement: a torch form's output against the oracle's truth, within a bound derived from
the unit roundoff of the dtype (proofs/fp-forward-error.md).

bound_ij = C * R_ij(u_dtype) where R(u) is the first-order componentwise rounding-error bound of the
variant's definitional formula evaluated with unit roundoff u (ball arithmetic over
``arith.rounding_model``: each operation contributes u |result|, each product of length n contributes
gamma_n |A| |B|, radii propagate through the formula), and C = 2 allows one reassociation (recurrent
or chunked order) of the same non-negative sums. The truth is computed to within 1% of the bound.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import variants as _variants
from .arith import rounding_model
from .findings import Finding
from .oracle import truth
from .precision import dtype_name

REASSOCIATION_FACTOR = 2.0


def rounding_bound(variant: Any, q: Any, k: Any, v: Any, *, causal: bool, dtype: Any, **kwargs: Any) -> np.ndarray:
    """C * R(u_dtype), componentwise, for inputs exactly representable in ``dtype``."""
    model = rounding_model(dtype)
    ball = _variants.get(variant).reference(q, k, v, causal=causal, arith=model, **kwargs)
    return REASSOCIATION_FACTOR * model.radius(ball)


def check_agreement(
    name: str,
    output: np.ndarray,
    variant: Any,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool,
    dtype: Any,
    **kwargs: Any,
) -> Finding:
    """Finding: max_ij |out - truth| / bound_ij <= 1. Inputs must already be representable in dtype."""
    out = np.asarray(output, dtype=np.float64)
    bound = rounding_bound(variant, q, k, v, causal=causal, dtype=dtype, **kwargs)
    t = truth(variant, q, k, v, causal=causal, digits=None, atol=np.maximum(0.01 * bound, 1e-300), **kwargs)
    if out.shape != t.value.shape:
        return Finding(
            name, False, float("inf"), 1.0, details={"error": f"output shape {out.shape}, expected {t.value.shape}"}
        )
    defined = ~t.undefined
    # where the rounding model's bound is infinite (a denominator that can round to zero in this dtype,
    # features that underflow) the definition cannot be computed in this dtype at all: no error is
    # excluded, and such entries are counted, not judged
    unbounded = defined & ~np.isfinite(bound)
    judged = defined & ~unbounded
    err = np.abs(out - t.value) + t.bound  # worst case over the truth's own uncertainty
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(judged, err / bound, 0.0)
    ratio = np.where(np.isnan(ratio), np.inf, ratio)
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    measured = float(ratio[worst])
    abs_err = np.where(judged, np.abs(out - t.value), 0.0)
    bits = float(np.log2(max(float(np.nanmax(abs_err, initial=0.0)) / max(float(bound[worst]), 1e-300), 1.0)))
    return Finding(
        name,
        bool(measured <= 1.0),
        measured,
        1.0,
        rigour="sampled",
        counterexample=None
        if measured <= 1.0
        else {"index": [int(i) for i in worst], "error": float(err[worst]), "bound": float(bound[worst])},
        details={
            "max_abs_error": float(np.max(abs_err)),
            "oracle": t.arithmetic,
            "undefined_entries": int(t.undefined.sum()),
            "unbounded_entries": int(unbounded.sum()),
            "bits_beyond_bound": bits,
            "dtype": dtype_name(dtype),
            # the ratio's worst entry in its own units: error (with the truth's uncertainty) and tolerance
            "worst_index": [int(i) for i in worst],
            "worst_error": float(err[worst]),
            "worst_bound": float(bound[worst]),
        },
    )
