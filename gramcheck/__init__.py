"""gramcheck: property tests, error bounds and stability certificates for linear and kernelized attention."""

from __future__ import annotations

from . import variants
from .precision import gamma, unit_roundoff

__version__ = "0.1.0"

__all__ = ["__version__", "gamma", "unit_roundoff", "variants"]
