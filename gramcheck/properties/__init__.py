"""The property catalogue. Each ``Property`` checks one theory-backed statement on one drawn input and
returns a ``Finding``; ``applicable(variant, causal, params)`` lists those meaningful for a target, from
the tags the variant holds with those hyperparameters (``Variant.tags``).
Component properties of random features (kernel MSE, ORF) are plain functions in ``kernels``.

| name                      | applies to                                      | proof                        |
| ------------------------- | ----------------------------------------------- | ---------------------------- |
| determinism               | every variant                                   | invariants.md                |
| agreement                 | every variant                                   | fp-forward-error.md          |
| low-precision             | bfloat16 / float16 targets                      | low-precision-rule.md        |
| rows-sum-to-one           | normalised-rows                                 | invariants.md                |
| convex-hull               | convex-hull                                     | invariants.md                |
| permutation-equivariance  | permutation-equivariant, non-causal             | invariants.md                |
| causality                 | causal mode                                     | invariants.md                |
| qk-scale-invariance       | qk-scale-invariant                              | invariants.md                |
| v-scale-invariance        | v-scale-invariant                               | invariants.md                |
| weight-range              | weight-range (QK-norm softmax)                  | qknorm-weight-range.md       |
| row-normalisation         | row-normalisation (FAVOR+ positive, hyperbolic) | row-normalisation.md         |
| normaliser-margin (diag.) | vanishing-denominator (relu, trig features)     | invariants.md                |
| unnormalised-growth       | unnormalised-growth                             | unnormalised-growth.md       |
| state-bound               | bounded-state (decay_bound)                     | gated-state-bound.md         |
| gradcheck                 | every variant (float64, small inputs)           | jacobian-bounds.md           |
| finite-gradients          | every variant                                   | jacobian-bounds.md           |
| jacobian-norm             | jacobian-v (+ Q, K where jacobian-qk)           | jacobian-bounds.md           |
| depth-growth              | jacobian-qk and not gated                       | jacobian-bounds.md           |
| energy-share (diagnostic) | every variant                                   | gram-spectrum.md             |
| state-agreement           | state-passing, causal                           | state-passing.md             |
| state-split               | state-passing, causal                           | state-passing.md             |
| state-chain               | state-passing, causal                           | state-passing.md             |
| zero-initial-state        | state-passing, causal                           | state-passing.md             |
| packing                   | causal mode, targets taking cu_seqlens          | state-passing.md             |
| packing-isolation         | causal mode, targets taking cu_seqlens          | state-passing.md             |
| backward-agreement        | denominators measured; float64: float32 rule    | backward-agreement.md        |
| output-unbiased (stat.)   | random features with positive weights; default  | favor-output.md              |
| output-mse (stat.)        | for targets drawing their own (no `projection`) | favor-output.md              |

A target that draws its own random features (``Target.own_draws``) runs only the properties marked
``any_draw`` (they hold for every draw) and the statistical ones; the others are listed as skipped.
"""

from __future__ import annotations

import builtins
from typing import Any

from ..validation import check_choice
from . import accuracy, backward, conditioning, gradients, invariants, kernels, packing, state, statistical
from .base import DEFAULT_KINDS, Property, always, declares

LOW_PRECISION = ("bfloat16", "float16")
# the state and backward properties draw two batch rows: a kernel missing its batch offset (a state's, a
# gradient's batch stride) is right at B = 1
STATE_BATCH = 2

CATALOGUE: tuple[Property, ...] = (
    Property(
        "determinism",
        invariants.determinism,
        always,
        "invariants.md",
        "two identical calls give bit-identical outputs",
        max_n=16,
    ),
    Property(
        "agreement",
        accuracy.agreement,
        always,
        "fp-forward-error.md",
        "|impl - truth| <= 2 R(u): the definition's componentwise rounding bound",
    ),
    Property(
        "low-precision",
        accuracy.low_precision,
        always,
        "low-precision-rule.md",
        "error <= 2 x error of the definition computed in the same low precision (+ u|o|)",
    ),
    Property(
        "rows-sum-to-one",
        invariants.rows_sum_to_one,
        declares("normalised-rows"),
        "invariants.md",
        "weights (V = I) are >= 0 and each row sums to 1",
        max_n=32,
        any_draw=True,
    ),
    Property(
        "convex-hull",
        invariants.convex_hull,
        declares("convex-hull"),
        "invariants.md",
        "each output lies in the convex hull of the values (j <= i when causal)",
        any_draw=True,
    ),
    Property(
        "permutation-equivariance",
        invariants.permutation_equivariance,
        declares("permutation-equivariant", causal=False),
        "invariants.md",
        "permuting (K, V) together changes nothing; permuting Q permutes O",
    ),
    Property(
        "causality",
        invariants.causality,
        declares("causal", causal=True),
        "invariants.md",
        "replacing future tokens changes no past output (bit-exact unless causal-rounding)",
    ),
    Property(
        "qk-scale-invariance",
        invariants.qk_scale_invariance,
        declares("qk-scale-invariant"),
        "invariants.md",
        "scaling q or k rows by positive constants changes nothing beyond the definition's eps",
    ),
    Property(
        "v-scale-invariance",
        invariants.v_scale_invariance,
        declares("v-scale-invariant"),
        "invariants.md",
        "scaling V changes nothing beyond the output norm's eps",
    ),
    Property(
        "weight-range",
        invariants.weight_range,
        declares("weight-range"),
        "qknorm-weight-range.md",
        "QK-norm softmax weights within [1/(1+(n-1)e^{2 tau}), 1/(1+(n-1)e^{-2 tau})]",
        max_n=32,
    ),
    Property(
        "row-normalisation",
        kernels.row_normalisation,
        declares("row-normalisation"),
        "row-normalisation.md",
        "kernel error eps < 1 moves o by <= eps/(1-eps) range(v) (+ rounding)",
    ),
    Property(
        "normaliser-margin",
        conditioning.margin,
        declares("vanishing-denominator"),
        "invariants.md",
        "diagnostic of the variant: no denominator vanishes or cancels: min den / (|phi(q)| . sum |phi(k)|) > 0",
        default=False,
    ),
    Property(
        "unnormalised-growth",
        conditioning.unnormalised_growth,
        declares("unnormalised-growth"),
        "unnormalised-growth.md",
        "|o_i| <= n_i max|A_ij| max|v| / c: linear growth with N",
    ),
    Property(
        "state-bound",
        conditioning.state_bound,
        declares("bounded-state"),
        "gated-state-bound.md",
        "|S_t| <= max|k||v|^T / (1 - alpha_max) for every t",
    ),
    Property(
        "gradcheck",
        gradients.gradcheck,
        always,
        "jacobian-bounds.md",
        "autograd against central differences in float64",
        kinds=gradients.GRADIENT_KINDS,
        max_n=6,
        max_d=3,
    ),
    Property(
        "finite-gradients",
        gradients.finite_gradients,
        always,
        "jacobian-bounds.md",
        "finite output => finite gradients in the target dtype",
        max_n=32,
        any_draw=True,
    ),
    Property(
        "jacobian-norm",
        gradients.jacobian_norm,
        declares("jacobian-v"),
        "jacobian-bounds.md",
        "||dO/dV|| = ||P|| <= sqrt(||P||_1 ||P||_inf); ||dO/dQ||, ||dO/dK|| against analytic bounds",
        kinds=gradients.GRADIENT_KINDS,
        max_n=12,
        max_d=4,
    ),
    Property(
        "depth-growth",
        gradients.depth_growth,
        lambda v, c, p: "jacobian-qk" in v.tags() and "gated" not in v.tags(p),
        "jacobian-bounds.md",
        "4 residual layers: ||dx_L/dx_0|| <= prod (1 + b_Q + b_K + b_V)",
        kinds=gradients.GRADIENT_KINDS,
        max_n=8,
        max_d=4,
        unless=gradients.depth_growth_unless,
    ),
    Property(
        "state-agreement",
        state.state_agreement,
        state.state_passing,
        "state-passing.md",
        "from a nonzero initial state, out and final state within 2 R(u) of the definition's",
        min_b=STATE_BATCH,
    ),
    Property(
        "state-split",
        state.state_split,
        state.state_passing,
        "state-passing.md",
        "[0, t) then [t, N) with the carried state equals one pass, t at and off chunk boundaries",
        min_b=STATE_BATCH,
    ),
    Property(
        "state-chain",
        state.state_chain,
        state.state_passing,
        "state-passing.md",
        "a prefill, then one call per token from the state each call returns, agrees with the definition",
        min_b=STATE_BATCH,
    ),
    Property(
        "zero-initial-state",
        state.zero_initial_state,
        state.state_passing,
        "state-passing.md",
        "a zero initial state gives what no initial state gives (within the two rounding bounds)",
        min_b=STATE_BATCH,
    ),
    Property(
        "packing",
        packing.packing,
        packing.packable,
        "state-passing.md",
        "packed sequences (cu_seqlens) give each sequence's own outputs, states and gradients",
    ),
    Property(
        "packing-isolation",
        packing.packing_isolation,
        packing.packable,
        "state-passing.md",
        "no token of one packed sequence changes another's output (bit-exact unless causal-rounding)",
    ),
    Property(
        "backward-agreement",
        backward.backward_agreement,
        backward.measured_denominators,
        "backward-agreement.md",
        "gradients in the target dtype: |G - G*| <= 2 max|naive - G*| + 4u (size of the terms) per tensor",
        kinds=gradients.GRADIENT_KINDS,
        max_n=128,
        min_b=STATE_BATCH,
    ),
    *(
        Property(
            name,
            fn,
            statistical.applies,
            "favor-output.md",
            f"statistical, over the target's own draws: {summary} + a Bernstein deviation",
            max_n=8,
            max_d=16,
            default=False,
            unless=statistical.unless,
            any_draw=True,
            max_examples=3,
        )
        for name, fn, summary in (
            ("output-unbiased", statistical.output_unbiased, "|mean o - r| <= the bias bound"),
            ("output-mse", statistical.output_mse, "mean (o - r)^2 <= the MSE bound"),
        )
    ),
    Property(
        "energy-share",
        conditioning.energy_share,
        always,
        "gram-spectrum.md",
        "diagnostic: the Gram matrix's top singular value holds <= 99% of the energy",
        default=False,
    ),
)
_BY_NAME = {p.name: p for p in CATALOGUE}


def get(name: str | Property) -> Property:
    if isinstance(name, Property):
        return name
    return _BY_NAME[check_choice("properties", name, tuple(_BY_NAME))]


def names() -> builtins.list[str]:
    return [p.name for p in CATALOGUE]


def applicable(
    variant: Any,
    causal: bool,
    params: dict[str, Any] | None = None,
    *,
    dtype: str = "float32",
    include_diagnostics: bool = False,
) -> builtins.list[Property]:
    """The properties meaningful for ``variant`` in this mode, dtype and hyperparameters."""
    from .. import variants as _variants

    var = _variants.get(variant)
    params = var.resolve_params(params or {})
    out = []
    for p in CATALOGUE:
        if not (p.default or include_diagnostics):
            continue
        if p.name == "low-precision" and dtype not in LOW_PRECISION:
            continue
        if p.applies(var, causal, params):
            out.append(p)
    return out


STATISTICAL = statistical.STATISTICAL

__all__ = ["CATALOGUE", "DEFAULT_KINDS", "STATISTICAL", "Property", "applicable", "get", "kernels", "names"]
