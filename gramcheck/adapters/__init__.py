"""Adapters: third-party attention code in gramcheck's calling convention fn(q, k, v, *, causal, **extras)
with layout (B, H, N, d), and the variant and hyperparameters each implements.

- ``fla.gla`` (fla-core 0.6.0, naive): gla with scale = d^-1/2
- ``fla.retention`` (fla-core 0.6.0, naive): retnet with its defaults
- ``fla.linear_attn`` (fla-core 0.6.0, naive): linear-unnormalised, feature = identity, divisor = sqrt(d)
- ``performer.fast_attention`` (performer-pytorch 1.1.4): performer-positive, feature_eps = 1e-4,
  shift = 'projection'
- ``fla_kernels.*`` (fla-core 0.6.0 Triton ops, the ``fla:OP`` targets): chunk_gla, chunk_simple_gla,
  chunk_linear_attn, chunk_retention, chunk_delta_rule, chunk_gated_delta_rule, chunk_rwkv6,
  chunk_lightning_attn and their fused forms; on CPU through Triton's interpreter
  (``triton_interpreter``: the patches it needs, applied only there)

Each adapter module imports its package on first use; ``available()`` says whether it can. The
``fla_kernels`` and ``triton_interpreter`` modules are imported on demand (not here): the interpreter
must be chosen before fla's kernels are defined.
"""

from __future__ import annotations

from . import fla, performer

__all__ = ["fla", "performer"]
