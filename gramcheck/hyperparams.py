"""Hyperparameter rules: values that depend on the input's head dimension, written once.

A ``scale`` hyperparameter is a number or a rule of the head dimension d (the size of the last axis of
q): ``None`` or ``"d^-1/2"`` for 1/sqrt(d) (the softmax convention), ``"d^-1"`` for 1/d, ``"d^-1/4"``
for d^{-1/4}. The rule is evaluated in the caller's arithmetic, so the reference evaluates the exact
1/sqrt(d) (an enclosure in ball arithmetic) and the torch forms the float nearest to it.
"""

from __future__ import annotations

import math
from typing import Any

SCALE_RULES = ("d^-1/2", "d^-1", "d^-1/4")


def check_scale(scale: Any) -> None:
    """ValueError naming ``scale`` unless it is None, a rule from SCALE_RULES or a finite number."""
    if scale is None or scale in SCALE_RULES:
        return
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale: got {scale!r}; expected a finite number, None or one of {SCALE_RULES}")


def scale_value(ar: Any, scale: Any, d: int) -> Any:
    """The scale for head dimension ``d`` in arithmetic ``ar`` (a number passes through as a float)."""
    check_scale(scale)
    if scale is None or scale == "d^-1/2":
        return 1.0 / ar.sqrt(ar.const(d))
    if scale == "d^-1":
        return 1.0 / ar.const(d)
    if scale == "d^-1/4":
        return 1.0 / ar.sqrt(ar.sqrt(ar.const(d)))
    return float(scale)
