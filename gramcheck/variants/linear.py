"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs").

Normalised:   o_i = phi(q_i)^T S / phi(q_i)^T z,  S = sum_j phi(k_j) v_j^T,  z = sum_j phi(k_j)
              (causal: sums over j <= i), i.e. (A V) / (A 1) with A = phi(Q) phi(K)^T (masked).
              ``eps`` is added to the denominator (fast-transformers uses 1e-6; default 0, the definition).
Unnormalised: O = A V / c (no denominator; its scale grows with N).

phi is elu+1 (positive) or relu (non-negative: a denominator can vanish, and the output is then
undefined). The torch forms are the parallel, recurrent and chunked forms of gramcheck.forms; none
materialises N x N.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..featuremaps import ELEMENTWISE, elementwise
from ..forms import accumulation_dtype, linear_recurrence
from ..torch_arith import TORCH
from .common import attention_matrix, gated_recurrence, kernel_product, ref_normalised, torch_normalised
from .spec import Variant

LINEAR_FORMS = ("chunked", "recurrent", "parallel")


def reference_normalised(ar: Any, q: Any, k: Any, v: Any, *, causal: bool, feature: str, eps: float) -> Any:
    phi = elementwise(feature)
    return ref_normalised(ar, phi(ar, q), phi(ar, k), v, causal=causal, eps=eps)


def torch_normalised_forward(
    q: Any, k: Any, v: Any, *, causal: bool, form: str, chunk_size: int, feature: str, eps: float
) -> Any:
    """The features in the float32 accumulators, as a kernel computes them in registers: elu(x) + 1 of a
    float16 key below -17 is 0 in float16, and a row of such keys 0/0 where the output is finite."""
    phi = elementwise(feature)
    acc = accumulation_dtype(q)
    fq, fk = phi(TORCH, q.to(acc)), phi(TORCH, k.to(acc))
    return torch_normalised(fq, fk, v, causal=causal, form=form, chunk_size=chunk_size, eps=eps)


def reference_unnormalised(
    ar: Any,
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    feature: str,
    divisor: float,
    initial_state: Any = None,
    output_final_state: bool = False,
) -> Any:
    """A V / c. Causal from a state S_0, or returning the state: the recurrence S_t = S_{t-1} + phi(k_t)
    v_t^T, o_t = phi(q_t)^T S_t / c, S_N (without the divisor), so that the rounding model charges the
    state's roundings at its own size every token, as every form that carries a state does (a quadratic
    S_0 + K^T V rounds once at |S|: proofs/state-passing.md)."""
    phi = elementwise(feature)
    fq, fk = phi(ar, q), phi(ar, k)
    if causal and (initial_state is not None or output_final_state):
        out, final = gated_recurrence(ar, fq, fk, v, None, initial_state, output_final_state=True)
        return (out / divisor, final) if output_final_state else out / divisor
    out = kernel_product(ar, fq, fk, v, causal)
    if initial_state is not None:
        out = out + ar.matmul(fq, initial_state)
    out = out / divisor
    if not output_final_state:
        return out
    final = ar.matmul(ar.mT(fk), v)
    return out, (final if initial_state is None else final + initial_state)


def torch_unnormalised_forward(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    form: str,
    chunk_size: int,
    feature: str,
    divisor: float,
    initial_state: Any = None,
    output_final_state: bool = False,
) -> Any:
    phi = elementwise(feature)
    fq, fk = phi(TORCH, q), phi(TORCH, k)
    res = linear_recurrence(
        fq,
        fk,
        v,
        causal=causal,
        form=form,
        chunk_size=chunk_size,
        initial_state=initial_state,
        output_final_state=output_final_state,
    )
    return (res[0] / divisor, res[1]) if output_final_state else res / divisor


def features(ar: Any, q: Any, k: Any, *, feature: str, **_: Any) -> tuple[Any, Any]:
    """(phi(Q), phi(K)) with the elementwise feature map ``feature``."""
    phi = elementwise(feature)
    return phi(ar, q), phi(ar, k)


_NORMALISED_TAGS = frozenset(
    {"causal", "normalised-rows", "convex-hull", "permutation-equivariant", "denominator", "linear-in-v"}
)


def normalised_tags(params: Mapping[str, Any]) -> frozenset[str]:
    """relu features can leave a row with no positive overlap (den = 0); the Q and K Jacobian bounds are
    derived for eps = 0 (proofs/jacobian-bounds.md)."""
    tags = {"vanishing-denominator", "feature-denominator"} if params["feature"] == "relu" else set()
    if not params["eps"]:
        tags.add("jacobian-qk")
    return frozenset(tags)


def jacobian(var: Any, q: Any, k: Any, v: Any, *, causal: bool, params: Any, extras: Any) -> dict[str, float]:
    """||dO/dV|| from the weight matrix; with eps = 0 the Q and K bounds of normalised linear attention
    (one (b, h) slice)."""
    from .. import bounds

    p = attention_matrix(var, q, k, causal=causal, params=params, extras=extras)[0, 0]
    out = {"v": bounds.jacobian_v_bound(p)}
    if not params["eps"]:
        fq, fk = var.features(q, k, **params, **extras)
        out["q"] = bounds.linear_jacobian_q_bound(fq[0, 0], fk[0, 0], v[0, 0], causal=causal)
        out["k"] = bounds.linear_jacobian_k_bound(fq[0, 0], fk[0, 0], v[0, 0], causal=causal)
    return out

VARIANTS = [
    Variant(
        name="linear-elu",
        family="linear",
        summary="normalised linear attention with phi = elu + 1",
        source="Katharopoulos et al. 2020",
        params={"feature": "elu1", "eps": 0.0},
        param_choices={"feature": tuple(ELEMENTWISE)},
        forms=LINEAR_FORMS,
        noncausal_only=("parallel",),
        declares=_NORMALISED_TAGS,
        reference_fn=reference_normalised,
        torch_fn=torch_normalised_forward,
        features_fn=features,
        recurrence="diagonal",
        tags_fn=normalised_tags,
        jacobian_fn=jacobian,
    ),
    Variant(
        name="linear-relu",
        family="linear",
        summary="normalised linear attention with phi = relu (denominators can vanish)",
        source="Katharopoulos et al. 2020 (relu feature map)",
        params={"feature": "relu", "eps": 0.0},
        param_choices={"feature": tuple(ELEMENTWISE)},
        forms=LINEAR_FORMS,
        noncausal_only=("parallel",),
        declares=_NORMALISED_TAGS,
        reference_fn=reference_normalised,
        torch_fn=torch_normalised_forward,
        features_fn=features,
        recurrence="diagonal",
        tags_fn=normalised_tags,
        jacobian_fn=jacobian,
    ),
    Variant(
        name="linear-unnormalised",
        family="linear",
        summary="phi(Q) (phi(K)^T V) / c with no denominator",
        source="Katharopoulos et al. 2020 without normaliser; fla naive linear attention",
        params={"feature": "elu1", "divisor": 1.0},
        param_choices={"feature": tuple(ELEMENTWISE)},
        forms=LINEAR_FORMS,
        noncausal_only=("parallel",),
        declares=frozenset(
            {"causal", "permutation-equivariant", "linear-in-v", "unnormalised-growth", "state-passing"}
        ),
        reference_fn=reference_unnormalised,
        torch_fn=torch_unnormalised_forward,
        features_fn=features,
        recurrence="diagonal",
    ),
]
