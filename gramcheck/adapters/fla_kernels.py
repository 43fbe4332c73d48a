"""flash-linear-attention's Triton kernels (fla-core 0.6.0) in gramcheck's calling convention.

Every adapter is ``fn(q, k, v, *, causal=True, <inputs>, <hyperparameters>, initial_state=None,
output_final_state=False, cu_seqlens=None)`` on (B, H, N, d) tensors; it transposes to fla's (B, T, H, d)
layout, calls the fla op and returns o (B, H, N, d_v), or ``(o, final_state)`` with ``output_final_state``
(state (B, H, d_k, d_v), or one per sequence with ``cu_seqlens``: fla's and gramcheck's convention agree,
S_t in R^{d_k x d_v}). Hyperparameters are the variant's own names and are mapped to fla's arguments;
those fla cannot express raise ValueError. On a machine without a GPU the kernels run in Triton's
interpreter (``gramcheck.adapters.triton_interpreter``; bfloat16 is refused there).

| adapters (chunk_X, fused_recurrent_X) | variant(s) | mapping |
| --- | --- | --- |
| gla | gla | g -> gk (B,T,H,K); scale; gk = g / gate_tau |
| simple_gla | gla (g (B,H,N,1)), mamba2 | g -> (B,T,H); mamba2's D must be 0 |
| linear_attn (also fused_chunk_) | linear-unnormalised | feature identity, scale 1/divisor, normalize=False |
| retention | retnet | gamma_h = 1 - 2^(-5-h) fixed; no GroupNorm |
| delta_rule | deltanet | beta (B,T,H); l2norm -> use_qk_l2norm_in_kernel |
| gated_delta_rule | gated-deltanet | g, beta (B,T,H) |
| rwkv6 | rwkv6 | g -> w (B,T,H,K), u (H,K) |
| lightning_attn | lightning | layer_idx, num_layers |

Where fla differs from what it documents: the public ``chunk_delta_rule`` asserts its inputs are not
float32 although its autograd Function (``ChunkDeltaRuleFunction``) computes float32 correctly; the
adapter calls the Function with the wrapper's own argument handling so float32 can be checked.
``chunk_retention`` and ``chunk_lightning_attn`` compute their per-head log-decays in float32.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import triton_interpreter

_MISSING = object()


@dataclass(frozen=True)
class Op:
    """One fla op: the adapter ``fn``, the variants it implements (first: the default), the fla module,
    the other form of the same recurrence (chunk <-> fused_recurrent) and the hyperparameters a target
    defaults to (per variant)."""

    name: str
    fn: Callable[..., Any]
    variants: tuple[str, ...]
    module: str
    pair: str | None = None
    defaults: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
    fixed: tuple[tuple[str, Any, str], ...] = ()  # (hyperparameter, the only value fla supports, why)

    def default_params(self, variant: str) -> dict[str, Any]:
        return dict(dict(self.defaults).get(variant, ()))


def available() -> bool:
    """Whether fla-core and triton can be imported."""
    return all(importlib.util.find_spec(m) is not None for m in ("fla", "triton", "einops"))


def _fla(module: str, attr: str) -> Any:
    """fla's ``module.attr``, with the interpreter prepared and patched first when there is no GPU."""
    triton_interpreter.prepare_environment()
    triton_interpreter.install()
    mod = importlib.import_module(module)
    triton_interpreter.install()  # re-applies the gather patch to fla modules imported just now
    return getattr(mod, attr)


def fla_version() -> str | None:
    try:
        import fla

        return str(fla.__version__)
    except ImportError:  # pragma: no cover
        return None


# --------------------------------------------------------------------------------------------------
# layout and argument checks
# --------------------------------------------------------------------------------------------------
def _to_fla(x: Any) -> Any:
    """(B, H, N, ...) -> (B, N, H, ...)"""
    return x.transpose(1, 2)


def _scalar_gate(name: str, g: Any, q: Any) -> Any:
    """One log-decay per head and token, (B, H, N) or (B, H, N, 1) or (B, H, N, d_k) with equal channels,
    as fla's (B, T, H)."""
    B, H, N = q.shape[:3]
    if g.dim() == 4:
        if g.shape[:3] != (B, H, N):
            raise ValueError(f"g: got shape {tuple(g.shape)}; expected ({B}, {H}, {N}) or ({B}, {H}, {N}, 1)")
        if g.shape[3] != 1 and not bool((g == g[..., :1]).all()):
            raise ValueError(
                f"g: got {g.shape[3]} different log-decays per token; fla's {name} takes one per head and token, "
                f"expected shape ({B}, {H}, {N}) or ({B}, {H}, {N}, 1)"
            )
        g = g[..., 0]
    if tuple(g.shape) != (B, H, N):
        raise ValueError(f"g: got shape {tuple(g.shape)}; expected ({B}, {H}, {N}) or ({B}, {H}, {N}, 1)")
    return g.transpose(1, 2)


def _per_token(name: str, x: Any, q: Any) -> Any:
    B, H, N = q.shape[:3]
    if tuple(x.shape) != (B, H, N):
        raise ValueError(f"{name}: got shape {tuple(x.shape)}; expected ({B}, {H}, {N}) (B, H, N)")
    return x.transpose(1, 2)


def _channel_gate(name: str, g: Any, q: Any) -> Any:
    if tuple(g.shape) != tuple(q.shape):
        raise ValueError(f"{name}: got shape {tuple(g.shape)}; expected {tuple(q.shape)} (B, H, N, d_k) as q")
    return g.transpose(1, 2)


def _fla_state(initial_state: Any) -> Any:
    """S_0 as fla's kernels keep states: float32 (exact for a low-precision S_0; chunk_gla asserts it)."""
    return initial_state if initial_state is None or initial_state.dtype.itemsize >= 4 else initial_state.float()


def _check(q: Any, k: Any, v: Any, causal: bool, initial_state: Any, cu_seqlens: Any) -> None:
    if not causal:
        raise ValueError("causal: got False; fla's recurrent kernels are causal only")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise ValueError(f"{name}: got dtype {x.dtype}; expected {q.dtype} as q")
    triton_interpreter.check_dtype(q.dtype)
    B, H, N, dk = q.shape
    if initial_state is not None:
        n_seq = B if cu_seqlens is None else int(cu_seqlens.numel()) - 1
        expected = (n_seq, H, dk, v.shape[-1])
        if tuple(initial_state.shape) != expected:
            raise ValueError(
                f"initial_state: got shape {tuple(initial_state.shape)}; expected {expected} (sequences, H, d_k, d_v)"
            )
    if cu_seqlens is not None and B != 1:
        raise ValueError(f"cu_seqlens: needs B = 1 (packed sequences); got q of shape {tuple(q.shape)}")


def _out(o: Any, ht: Any, output_final_state: bool) -> Any:
    o = o.transpose(1, 2)
    return (o, ht) if output_final_state else o


def _only(name: str, value: Any, allowed: Any, why: str) -> None:
    if value != allowed:
        raise ValueError(f"{name}: got {value!r}; fla's kernel supports only {allowed!r} ({why})")


# --------------------------------------------------------------------------------------------------
# adapters
# --------------------------------------------------------------------------------------------------
def chunk_gla(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = True,
    g: Any,
    scale: float = 1.0,
    gate_tau: float = 1.0,
    initial_state: Any = None,
    output_final_state: bool = False,
    cu_seqlens: Any = None,
) -> Any:
    """fla.ops.gla.chunk_gla: S_t = diag(exp(g_t / gate_tau)) S_{t-1} + k_t v_t^T, o_t = S_t^T (scale q_t)."""
    _check(q, k, v, causal, initial_state, cu_seqlens)
    gk = _channel_gate("g", g, q) / gate_tau
    o, ht = _fla("fla.ops.gla", "chunk_gla")(
        _to_fla(q), _to_fla(k), _to_fla(v), gk, scale=scale, initial_state=_fla_state(initial_state),
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )  # fmt: skip
    return _out(o, ht, output_final_state)


def fused_recurrent_gla(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = True,
    g: Any,
    scale: float = 1.0,
    gate_tau: float = 1.0,
    initial_state: Any = None,
    output_final_state: bool = False,
    cu_seqlens: Any = None,
) -> Any:
    """fla.ops.gla.fused_recurrent_gla (gk = g / gate_tau): the token-by-token form of chunk_gla."""
    _check(q, k, v, causal, initial_state, cu_seqlens)
    gk = _channel_gate("g", g, q) / gate_tau
    o, ht = _fla("fla.ops.gla", "fused_recurrent_gla")(
        _to_fla(q), _to_fla(k), _to_fla(v), gk=gk, scale=scale, initial_state=_fla_state(initial_state),
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )  # fmt: skip
    return _out(o, ht, output_final_state)


def _simple_gla(attr: str, q: Any, k: Any, v: Any, causal: bool, g: Any, scale: float, gate_tau: float, D: Any,
                initial_state: Any, output_final_state: bool, cu_seqlens: Any) -> Any:  # fmt: skip
    _check(q, k, v, causal, initial_state, cu_seqlens)
    _only("D", D, 0.0, "simple_gla has no skip connection D v_t")
    gs = _scalar_gate(attr, g, q) / gate_tau
    o, ht = _fla("fla.ops.simple_gla", attr)(
        _to_fla(q), _to_fla(k), _to_fla(v), g=gs, scale=scale, initial_state=_fla_state(initial_state),
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )  # fmt: skip
    return _out(o, ht, output_final_state)


def chunk_simple_gla(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = True,
    g: Any,
    scale: float = 1.0,
    gate_tau: float = 1.0,
    D: Any = 0.0,
    initial_state: Any = None,
    output_final_state: bool = False,
    cu_seqlens: Any = None,
) -> Any:
    """fla.ops.simple_gla.chunk_simple_gla: one log-decay g per head and token, S_t = exp(g_t) S_{t-1} +
    k_t v_t^T, o_t = S_t^T (scale q_t). As ``gla``: g of shape (B, H, N, 1); as ``mamba2``: (B, H, N)."""
    return _simple_gla("chunk_simple_gla", q, k, v, causal, g, scale, gate_tau, D, initial_state,
                       output_final_state, cu_seqlens)  # fmt: skip


def fused_recurrent_simple_gla(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = True,
    g: Any,
    scale: float = 1.0,
    gate_tau: float = 1.0,
    D: Any = 0.0,
    initial_state: Any = None,
    output_final_state: bool = False,
    cu_seqlens: Any = None,
) -> Any:
    """fla.ops.simple_gla.fused_recurrent_simple_gla: the token-by-token form of chunk_simple_gla."""
    return _simple_gla("fused_recurrent_simple_gla", q, k, v, causal, g, scale, gate_tau, D, initial_state,
                       output_final_state, cu_seqlens)  # fmt: skip


def _linear(attr: str, q: Any, k: Any, v: Any, causal: bool, feature: str, divisor: float, initial_state: Any,
            output_final_state: bool, cu_seqlens: Any) -> Any:  # fmt: skip
    _check(q, k, v, causal, initial_state, cu_seqlens)
    _only("feature", feature, "identity", "fla's linear_attn kernels apply no feature map")
    o, ht = _fla("fla.ops.linear_attn", attr)(
        _to_fla(q), _to_fla(k), _to_fla(v), scale=1.0 / divisor, initial_state=_fla_state(initial_state),
        output_final_state=output_final_state, normalize=False, cu_seqlens=cu_seqlens,
    )  # fmt: skip
    return _out(o, ht, output_final_state)


def chunk_linear_attn(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = True,
    feature: str = "identity",
    divisor: float = 1.0,
    initial_state: Any = None,
    output_final_state: bool = False,
    cu_seqlens: Any = None,
) -> Any:
    """fla.ops.linear_attn.chunk_linear_attn(normalize=False, scale=1/divisor):
    o_t = sum_{s<=t} (q_t . k_s) v_s / divisor."""
    return _linear("chunk_linear_attn", q, k, v, causal, feature, divisor, initial_state, output_final_state,
                   cu_seqlens)  # fmt: skip


def fused_chunk_linear_attn(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = True,
    feature: str = "identity",
    divisor: float = 1.0,
    initial_state: Any = None,
    output_final_state: bool = False,
    cu_seqlens: Any = None,
) -> Any:
    """fla.ops.linear_attn.fused_chunk_linear_attn(normalize=False, scale=1/divisor)."""
    return _linear("fused_chunk_linear_attn", q, k, v, causal, feature, divisor, initial_state,
                   output_final_state, cu_seqlens)  # fmt: skip


def fused_recurrent_linear_attn(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = True,
    feature: str = "identity",
    divisor: float = 1.0,
    initial_state: Any = None,
    output_final_state: bool = False,
    cu_seqlens: Any = None,
) -> Any:
    """fla.ops.linear_attn.fused_recurrent_linear_attn(normalize=False, scale=1/divisor)."""
    return _linear("fused_recurrent_linear_attn", q, k, v, causal, feature, divisor, initial_state,
                   output_final_state, cu_seqlens)  # fmt: skip


def _retention(attr: str, q: Any, k: Any, v: Any, causal: bool, gamma: Any, scale: Any, group_norm: bool,
               initial_state: Any, output_final_state: bool, cu_seqlens: Any) -> Any:  # fmt: skip
    _check(q, k, v, causal, initial_state, cu_seqlens)
    _only("gamma", gamma, None, "fla fixes gamma_h = 1 - 2^(-5-h)")
    _only("group_norm", group_norm, False, "the kernel returns the retention before GroupNorm")
    o, ht = _fla("fla.ops.retention", attr)(
        _to_fla(q), _to_fla(k), _to_fla(v), scale=scale, initial_state=_fla_state(initial_state),
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )  # fmt: skip
    return _out(o, ht, output_final_state)


def chunk_retention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = True,
    gamma: Any = None,
    scale: float | None = None,
    group_norm: bool = False,
    norm_eps: float = 1e-5,
    initial_state: Any = None,
    output_final_state: bool = False,
    cu_seqlens: Any = None,
) -> Any:
    """fla.ops.retention.chunk_retention: S_t = gamma_h S_{t-1} + k_t v_t^T, gamma_h = 1 - 2^(-5-h), scale
    d_k^-1/2 by default (``norm_eps`` only matters with GroupNorm, which fla's kernel does not apply)."""
    return _retention("chunk_retention", q, k, v, causal, gamma, scale, group_norm, initial_state,
                      output_final_state, cu_seqlens)  # fmt: skip


def fused_recurrent_retention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = True,
    gamma: Any = None,
    scale: float | None = None,
    group_norm: bool = False,
    norm_eps: float = 1e-5,
    initial_state: Any = None,
    output_final_state: bool = False,
    cu_seqlens: Any = None,
) -> Any:
    """fla.ops.retention.fused_recurrent_retention: the token-by-token form of chunk_retention."""
    return _retention("fused_recurrent_retention", q, k, v, causal, gamma, scale, group_norm, initial_state,
                      output_final_state, cu_seqlens)  # fmt: skip


def chunk_delta_rule(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = True,
    beta: Any,
    scale: float | None = None,
    l2norm: bool = True,
    l2norm_eps: float = 1e-6,
    initial_state: Any = None,
    output_final_state: bool = False,
    cu_seqlens: Any = None,
) -> Any:
    """fla's chunked delta rule, S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, o_t = S_t^T (s q_t)
    (q, k l2-normalised in the kernel when ``l2norm``). Calls ``ChunkDeltaRuleFunction`` as the public
    ``chunk_delta_rule`` does, without its float32 refusal (the Function computes float32 correctly)."""
    _check(q, k, v, causal, initial_state, cu_seqlens)
    _only("l2norm_eps", l2norm_eps, 1e-6, "fla's in-kernel l2norm adds 1e-6")
    fn = _fla("fla.ops.delta_rule.chunk", "ChunkDeltaRuleFunction")
    s = q.shape[-1] ** -0.5 if scale is None else scale
    cpu = None if cu_seqlens is None else cu_seqlens.cpu()
    o, ht = fn.apply(_to_fla(q), _to_fla(k), _to_fla(v), _per_token("beta", beta, q), s, initial_state,
                     output_final_state, l2norm, cu_seqlens, cpu, 64)  # fmt: skip
    return _out(o, ht, output_final_state)


def fused_recurrent_delta_rule(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = True,
    beta: Any,
    scale: float | None = None,
    l2norm: bool = True,
    l2norm_eps: float = 1e-6,
    initial_state: Any = None,
    output_final_state: bool = False,
    cu_seqlens: Any = None,
) -> Any:
    """fla.ops.delta_rule.fused_recurrent_delta_rule: the token-by-token form of chunk_delta_rule."""
    _check(q, k, v, causal, initial_state, cu_seqlens)
    _only("l2norm_eps", l2norm_eps, 1e-6, "fla's in-kernel l2norm adds 1e-6")
    o, ht = _fla("fla.ops.delta_rule", "fused_recurrent_delta_rule")(
        _to_fla(q), _to_fla(k), _to_fla(v), beta=_per_token("beta", beta, q), scale=scale,
        initial_state=_fla_state(initial_state), output_final_state=output_final_state, use_qk_l2norm_in_kernel=l2norm,
        cu_seqlens=cu_seqlens,
    )  # fmt: skip
    return _out(o, ht, output_final_state)


def _gated_delta(attr: str, q: Any, k: Any, v: Any, causal: bool, g: Any, beta: Any, scale: Any, l2norm: bool,
                 l2norm_eps: float, initial_state: Any, output_final_state: bool, cu_seqlens: Any) -> Any:  # fmt: skip
    _check(q, k, v, causal, initial_state, cu_seqlens)
    _only("l2norm_eps", l2norm_eps, 1e-6, "fla's in-kernel l2norm adds 1e-6")
    o, ht = _fla("fla.ops.gated_delta_rule", attr)(
        _to_fla(q), _to_fla(k), _to_fla(v), g=_scalar_gate(attr, g, q), beta=_per_token("beta", beta, q),
        scale=scale, initial_state=_fla_state(initial_state), output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=l2norm, cu_seqlens=cu_seqlens,
    )  # fmt: skip
    return _out(o, ht, output_final_state)


def chunk_gated_delta_rule(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = True,
    g: Any,
    beta: Any,
    scale: float | None = None,
    l2norm: bool = True,
    l2norm_eps: float = 1e-6,
    initial_state: Any = None,
    output_final_state: bool = False,
    cu_seqlens: Any = None,
) -> Any:
    """fla.ops.gated_delta_rule.chunk_gated_delta_rule: S_t = exp(g_t)(I - beta_t k_t k_t^T) S_{t-1} +
    beta_t k_t v_t^T, o_t = S_t^T (s q_t); g and beta (B, H, N)."""
    return _gated_delta("chunk_gated_delta_rule", q, k, v, causal, g, beta, scale, l2norm, l2norm_eps,
                        initial_state, output_final_state, cu_seqlens)  # fmt: skip


def fused_recurrent_gated_delta_rule(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = True,
    g: Any,
    beta: Any,
    scale: float | None = None,
    l2norm: bool = True,
    l2norm_eps: float = 1e-6,
    initial_state: Any = None,
    output_final_state: bool = False,
    cu_seqlens: Any = None,
) -> Any:
    """fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule: the token-by-token form."""
    return _gated_delta("fused_recurrent_gated_delta_rule", q, k, v, causal, g, beta, scale, l2norm,
                        l2norm_eps, initial_state, output_final_state, cu_seqlens)  # fmt: skip


def _rwkv6(attr: str, q: Any, k: Any, v: Any, causal: bool, g: Any, u: Any, scale: Any, initial_state: Any,
           output_final_state: bool, cu_seqlens: Any) -> Any:  # fmt: skip
    _check(q, k, v, causal, initial_state, cu_seqlens)
    H, dk = q.shape[1], q.shape[-1]
    if tuple(u.shape) != (H, dk):
        raise ValueError(f"u: got shape {tuple(u.shape)}; expected ({H}, {dk}) (H, d_k)")
    o, ht = _fla("fla.ops.rwkv6", attr)(
        _to_fla(q), _to_fla(k), _to_fla(v), _channel_gate("g", g, q), u, scale=scale,
        initial_state=_fla_state(initial_state), output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )  # fmt: skip
    return _out(o, ht, output_final_state)


def chunk_rwkv6(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = True,
    g: Any,
    u: Any,
    scale: float | None = None,
    initial_state: Any = None,
    output_final_state: bool = False,
    cu_seqlens: Any = None,
) -> Any:
    """fla.ops.rwkv6.chunk_rwkv6 (r = q, w = g): o_t = (s r_t)^T (S_{t-1} + diag(u) k_t v_t^T),
    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T."""
    return _rwkv6("chunk_rwkv6", q, k, v, causal, g, u, scale, initial_state, output_final_state, cu_seqlens)


def fused_recurrent_rwkv6(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = True,
    g: Any,
    u: Any,
    scale: float | None = None,
    initial_state: Any = None,
    output_final_state: bool = False,
    cu_seqlens: Any = None,
) -> Any:
    """fla.ops.rwkv6.fused_recurrent_rwkv6: the token-by-token form of chunk_rwkv6."""
    return _rwkv6("fused_recurrent_rwkv6", q, k, v, causal, g, u, scale, initial_state, output_final_state,
                  cu_seqlens)  # fmt: skip


def _lightning(attr: str, q: Any, k: Any, v: Any, causal: bool, scale: Any, layer_idx: int, num_layers: int,
               initial_state: Any, output_final_state: bool, cu_seqlens: Any) -> Any:  # fmt: skip
    _check(q, k, v, causal, initial_state, cu_seqlens)
    o, ht = _fla("fla.ops.lightning_attn", attr)(
        _to_fla(q), _to_fla(k), _to_fla(v), layer_idx=layer_idx, num_layers=num_layers, scale=scale,
        initial_state=_fla_state(initial_state), output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )  # fmt: skip
    return _out(o, ht, output_final_state)


def chunk_lightning_attn(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = True,
    scale: float | None = None,
    layer_idx: int = 0,
    num_layers: int = 2,
    initial_state: Any = None,
    output_final_state: bool = False,
    cu_seqlens: Any = None,
) -> Any:
    """fla.ops.lightning_attn.chunk_lightning_attn: per-head decay exp(-(8/H)(1 - layer_idx/num_layers) h)."""
    return _lightning("chunk_lightning_attn", q, k, v, causal, scale, layer_idx, num_layers, initial_state,
                      output_final_state, cu_seqlens)  # fmt: skip


def fused_recurrent_lightning_attn(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = True,
    scale: float | None = None,
    layer_idx: int = 0,
    num_layers: int = 2,
    initial_state: Any = None,
    output_final_state: bool = False,
    cu_seqlens: Any = None,
) -> Any:
    """fla.ops.lightning_attn.fused_recurrent_lightning_attn: the token-by-token form."""
    return _lightning("fused_recurrent_lightning_attn", q, k, v, causal, scale, layer_idx, num_layers,
                      initial_state, output_final_state, cu_seqlens)  # fmt: skip


# --------------------------------------------------------------------------------------------------
# registry: ``fla:NAME`` targets
# --------------------------------------------------------------------------------------------------
_LINEAR_DEFAULTS = (("linear-unnormalised", (("feature", "identity"),)),)
_LINEAR_FIXED = (("feature", "identity", "fla's linear_attn kernels apply no feature map"),)
_SIMPLE_GLA_FIXED = (("D", 0.0, "simple_gla has no skip connection D v_t"),)
_DELTA_FIXED = (("l2norm_eps", 1e-6, "fla's in-kernel l2norm adds 1e-6"),)
_RETENTION_FIXED = (
    ("gamma", None, "fla fixes gamma_h = 1 - 2^(-5-h)"),
    ("group_norm", False, "the kernel returns the retention before GroupNorm"),
)


def _ops() -> dict[str, Op]:
    table = [
        Op("chunk_gla", chunk_gla, ("gla",), "fla.ops.gla", "fused_recurrent_gla"),
        Op("fused_recurrent_gla", fused_recurrent_gla, ("gla",), "fla.ops.gla", "chunk_gla"),
        Op("chunk_simple_gla", chunk_simple_gla, ("gla", "mamba2"), "fla.ops.simple_gla",
           "fused_recurrent_simple_gla", (), _SIMPLE_GLA_FIXED),  # fmt: skip
        Op("fused_recurrent_simple_gla", fused_recurrent_simple_gla, ("gla", "mamba2"), "fla.ops.simple_gla",
           "chunk_simple_gla", (), _SIMPLE_GLA_FIXED),  # fmt: skip
        Op("chunk_linear_attn", chunk_linear_attn, ("linear-unnormalised",), "fla.ops.linear_attn",
           "fused_recurrent_linear_attn", _LINEAR_DEFAULTS, _LINEAR_FIXED),  # fmt: skip
        Op("fused_chunk_linear_attn", fused_chunk_linear_attn, ("linear-unnormalised",), "fla.ops.linear_attn",
           "chunk_linear_attn", _LINEAR_DEFAULTS, _LINEAR_FIXED),  # fmt: skip
        Op("fused_recurrent_linear_attn", fused_recurrent_linear_attn, ("linear-unnormalised",),
           "fla.ops.linear_attn", "chunk_linear_attn", _LINEAR_DEFAULTS, _LINEAR_FIXED),  # fmt: skip
        Op("chunk_retention", chunk_retention, ("retnet",), "fla.ops.retention", "fused_recurrent_retention", (),
           _RETENTION_FIXED),  # fmt: skip
        Op("fused_recurrent_retention", fused_recurrent_retention, ("retnet",), "fla.ops.retention",
           "chunk_retention", (), _RETENTION_FIXED),  # fmt: skip
        Op("chunk_delta_rule", chunk_delta_rule, ("deltanet",), "fla.ops.delta_rule", "fused_recurrent_delta_rule", (),
           _DELTA_FIXED),  # fmt: skip
        Op("fused_recurrent_delta_rule", fused_recurrent_delta_rule, ("deltanet",), "fla.ops.delta_rule",
           "chunk_delta_rule", (), _DELTA_FIXED),  # fmt: skip
        Op("chunk_gated_delta_rule", chunk_gated_delta_rule, ("gated-deltanet",), "fla.ops.gated_delta_rule",
           "fused_recurrent_gated_delta_rule", (), _DELTA_FIXED),  # fmt: skip
        Op("fused_recurrent_gated_delta_rule", fused_recurrent_gated_delta_rule, ("gated-deltanet",),
           "fla.ops.gated_delta_rule", "chunk_gated_delta_rule", (), _DELTA_FIXED),  # fmt: skip
        Op("chunk_rwkv6", chunk_rwkv6, ("rwkv6",), "fla.ops.rwkv6", "fused_recurrent_rwkv6"),
        Op("fused_recurrent_rwkv6", fused_recurrent_rwkv6, ("rwkv6",), "fla.ops.rwkv6", "chunk_rwkv6"),
        Op("chunk_lightning_attn", chunk_lightning_attn, ("lightning",), "fla.ops.lightning_attn",
           "fused_recurrent_lightning_attn"),  # fmt: skip
        Op("fused_recurrent_lightning_attn", fused_recurrent_lightning_attn, ("lightning",),
           "fla.ops.lightning_attn", "chunk_lightning_attn"),  # fmt: skip
    ]
    return {op.name: op for op in table}


OPS: dict[str, Op] = _ops()


def get(name: str) -> Op:
    """The registered op ``name``; ValueError naming the argument."""
    try:
        return OPS[name]
    except (KeyError, TypeError):
        raise ValueError(f"target: got fla:{name}; expected fla: followed by one of {', '.join(sorted(OPS))}") from None


def names() -> list[str]:
    return sorted(OPS)


def bind(
    name: str, variant: str | None, params: dict[str, Any] | None
) -> tuple[Callable[..., Any], str, dict[str, Any]]:
    """(callable, variant, hyperparameters) for the target ``fla:name`` checked as ``variant`` (default: the
    op's first variant) with ``params`` over the op's defaults. The callable passes every hyperparameter
    the variant resolves to (its defaults included) to the adapter, so fla computes what the reference does;
    one the adapter cannot take is a ValueError."""
    from .. import variants as _variants

    op = get(name)
    var = op.variants[0] if variant is None else _variants.get(variant).name
    if var not in op.variants:
        raise ValueError(f"variant: got {var!r} for target fla:{name}; expected one of {', '.join(op.variants)}")
    merged = {**op.default_params(var), **(params or {})}
    resolved = _variants.get(var).resolve_params(merged)
    accepted = set(inspect.signature(op.fn).parameters)
    unknown = sorted(set(resolved) - accepted)
    if unknown:
        raise ValueError(
            f"{unknown[0]}: hyperparameter of variant {var!r} that the adapter fla:{name} cannot pass to fla; "
            f"expected only {', '.join(sorted(accepted - {'q', 'k', 'v'}))}"
        )

    for key, allowed, why in op.fixed:
        if key in resolved:
            _only(key, resolved[key], allowed, why)

    @functools.wraps(op.fn)
    def fn(q: Any, k: Any, v: Any, *, causal: bool = True, **extras: Any) -> Any:
        # per-call keywords (inputs, initial_state, ...) win over bound ones of the same name (variants
        # that list initial_state among their hyperparameters)
        return op.fn(q, k, v, causal=causal, **{**resolved, **extras})

    fn.__qualname__ = f"fla:{name}"
    return fn, var, merged


def environment() -> dict[str, Any]:
    """The versions a certificate of an fla kernel target records."""
    return {"fla": fla_version(), **triton_interpreter.versions()}


__all__ = ["OPS", "Op", "available", "bind", "environment", "get", "names", *sorted(OPS)]
