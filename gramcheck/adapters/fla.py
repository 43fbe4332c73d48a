"""flash-linear-attention's naive (pure torch) references: GLA, retention, linear attention.

fla/ops/__init__ imports the Triton kernels, so on a machine without Triton ``fla.ops.gla.naive`` cannot be
imported by name; the naive files are pure torch + einops and are loaded by file path from the installed
package. Layout (B, T, H, K) for GLA and linear attention, (B, H, T, D) for retention;
the naive code computes in float32 whatever the input dtype and casts back.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType
from typing import Any

SPECS: dict[str, tuple[str, dict[str, Any]]] = {
    "gla": ("gla", {"scale": None}),  # scale filled per call: d^-1/2
    "retention": ("retnet", {}),
    "linear_attn": ("linear-unnormalised", {"feature": "identity"}),
}
_CACHE: dict[str, ModuleType] = {}


def available() -> bool:
    return importlib.util.find_spec("fla") is not None and importlib.util.find_spec("einops") is not None


def _naive(op: str) -> ModuleType:
    if op not in _CACHE:
        spec_fla = importlib.util.find_spec("fla")
        if spec_fla is None or spec_fla.origin is None:
            raise ImportError("the fla adapters need flash-linear-attention: pip install fla-core")
        path = Path(spec_fla.origin).parent / "ops" / op / "naive.py"
        spec = importlib.util.spec_from_file_location(f"gramcheck_fla_naive_{op}", path)
        if spec is None or spec.loader is None:  # pragma: no cover
            raise ImportError(f"fla: no naive module at {path}")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _CACHE[op] = mod
    return _CACHE[op]


def gla(q: Any, k: Any, v: Any, *, causal: bool = True, g: Any) -> Any:
    """naive_recurrent_gla on (B, H, N, d) tensors; g are per-channel log-decays (fla's gk)."""
    o, _ = _naive("gla").naive_recurrent_gla(*(x.transpose(1, 2) for x in (q, k, v, g)))
    return o.transpose(1, 2)


def retention(q: Any, k: Any, v: Any, *, causal: bool = True) -> Any:
    """naive_retention (already (B, H, T, D)); gamma_h = 1 - 2^(-5-h), scale d^-1/2."""
    return _naive("retention").naive_retention(q, k, v)


def linear_attn(q: Any, k: Any, v: Any, *, causal: bool = True) -> Any:
    """naive_recurrent_linear_attn without normalisation: causal q (K^T V) / sqrt(d), no feature map."""
    o, _ = _naive("linear_attn").naive_recurrent_linear_attn(*(x.transpose(1, 2) for x in (q, k, v)))
    return o.transpose(1, 2)


def params(name: str, d: int) -> tuple[str, dict[str, Any]]:
    """(gramcheck variant, hyperparameters) that the adapter ``name`` implements at head dim d."""
    variant, base = SPECS[name]
    p = dict(base)
    if name == "gla":
        p["scale"] = d**-0.5
    if name == "linear_attn":
        p["divisor"] = math.sqrt(d)
    return variant, p
