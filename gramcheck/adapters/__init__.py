"""Adapters: third-party attention code in gramcheck's calling convention fn(q, k, v, *, causal, **extras)
with layout (B, H, N, d), and the variant and hyperparameters each implements.

- ``fla.gla`` (fla-core 0.6.0, naive): gla with scale = d^-1/2
- ``fla.retention`` (fla-core 0.6.0, naive): retnet with its defaults
- ``fla.linear_attn`` (fla-core 0.6.0, naive): linear-unnormalised, feature = identity, divisor = sqrt(d)
- ``performer.fast_attention`` (performer-pytorch 1.1.4): performer-positive, feature_eps = 1e-4,
  shift = 'projection'

Each adapter module imports its package on first use; ``available()`` says whether it can.
"""

from __future__ import annotations

from . import fla, performer

__all__ = ["fla", "performer"]
