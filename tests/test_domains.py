"""Domains that reach production shapes: chunk-boundary lengths, head sizes, a compute budget, extreme
gates, the gradient properties' sequence length, every kind drawn, and failures located by the smallest
failing prefix and its chunk position."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from gramcheck import strategies as S
from gramcheck.api import check
from gramcheck.findings import Finding
from gramcheck.properties import Property
from gramcheck.search import PROFILE_SIZES, Domain, run_property
from gramcheck.targets import builtin


def test_profiles_set_sizes_and_budget():
    ci, th = Domain().resolved("ci"), Domain().resolved("thorough")
    assert (ci.max_n, ci.max_d, ci.budget) == (320, 64, 2**14)
    assert (th.max_n, th.max_d) == (1024, 128) and th.budget == PROFILE_SIZES["thorough"]["budget"]
    fixed = Domain(min_d=32, max_d=32, max_n=200).resolved("ci")
    assert (fixed.min_d, fixed.max_d, fixed.max_n) == (32, 32, 200)


def _recorder(seen, kinds=S.KINDS):
    def fn(target, ex, *, causal):
        seen.append(ex)
        return Finding("recorder", 0.0, 1.0)

    return Property("recorder", fn, lambda v, c, p: True, "invariants.md", "records inputs", kinds=tuple(kinds))


def test_ci_draws_chunk_boundaries_and_head_sizes_within_budget():
    seen = []
    t = builtin("gla")
    for seed in range(4):
        run_property(_recorder(seen), t, causal=True, domain=Domain(examples=60), seed=seed)
    ns = {ex.q.shape[2] for ex in seen}
    ds = {ex.q.shape[3] for ex in seen}
    assert ns & {63, 64, 65} and ns & {127, 128, 129}, sorted(ns)
    assert max(ns) > 200 and {32, 64} <= ds, (sorted(ns), sorted(ds))
    assert all(math.prod(ex.q.shape) <= 2**14 for ex in seen)


def test_domain_fixes_head_size_and_chunks():
    seen = []
    dom = Domain(min_d=16, max_d=16, max_n=100, chunks=(32,), examples=40, kinds=("gaussian",))
    run_property(_recorder(seen), builtin("retnet"), causal=True, domain=dom)
    assert {ex.q.shape[3] for ex in seen} == {16}
    assert {ex.q.shape[2] for ex in seen} & {31, 32, 33, 63, 64, 65}


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(S.attention_inputs("gla", kinds=["gaussian"], min_n=64, max_n=64, max_d=4, gate_regimes=["extreme"]))
def test_extreme_gates_span_more_than_126_binary_orders_per_chunk(ex):
    g = ex.extras["g"]
    assert ex.meta["regimes"]["g"] == "extreme" and g.min() >= -100 and g.max() <= 0
    assert np.all(g[:, :, :64].sum(axis=2) / math.log(2) < -126)


def test_builtin_gla_passes_agreement_under_extreme_gates():
    r = check(
        "builtin:gla",
        causal=True,
        properties=["agreement", "backward-agreement"],
        domain={"gates": ["extreme"], "max_n": 140, "examples": 8},
    )
    assert r.passed, r.summary()


def test_grad_max_n_sets_the_gradient_properties_length():
    from gramcheck import properties as P

    seen = []
    rec = _recorder(seen)
    grad = Property("gradcheck", rec.fn, rec.applies, "jacobian-bounds.md", "", max_n=6)
    run_property(grad, builtin("gla"), causal=True, domain=Domain(grad_max_n=40, examples=30, kinds=("gaussian",)))
    assert max(ex.q.shape[2] for ex in seen) > 6
    assert P.get("gradcheck").max_n == 6


def test_every_kind_is_drawn_or_reported():
    seen = []
    f = run_property(_recorder(seen), builtin("linear-elu"), causal=False, domain=Domain(max_n=16, max_d=4))
    assert set(f.details["kinds_drawn"]) == set(S.KINDS) and "kinds_not_drawn" not in f.details
    seen.clear()
    few = run_property(_recorder(seen), builtin("linear-elu"), causal=False, domain=Domain(max_n=8, examples=3))
    drawn = set(few.details["kinds_drawn"])
    assert drawn | set(few.details["kinds_not_drawn"]) == set(S.KINDS) and drawn == {ex.kind for ex in seen}


def gla_wrong_after_first_chunk(q, k, v, *, causal, g):
    """GLA whose outputs from token 64 on (the second chunk of fla's BT = 64) are off by 1e-3."""
    out = builtin("gla").fn(q, k, v, causal=True, g=g)
    out[:, :, 64:] += 1e-3
    return out


def test_failure_names_entry_and_smallest_failing_length():
    r = check(
        gla_wrong_after_first_chunk,
        "gla",
        causal=True,
        properties=["agreement"],
        domain={"min_n": 60, "max_n": 200, "max_d": 8, "examples": 10},
    )
    f = r.findings[0]
    assert not f.passed
    d = f.details
    assert d["property"] == "agreement" and d["entry"].startswith("out[") and d["shape"][2] >= 65
    assert d["smallest_failing_n"] == 65 and d["chunk_position"]["64"] == 0
    assert d["error_at_entry"] > d["bound_at_entry"]


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"chunks": (0,)}, "^domain.chunks"),
        ({"gates": ("feeble",)}, "^domain.gates"),
        ({"budget": 0}, "^domain.budget"),
        ({"value_dims": "square"}, "^domain.value_dims"),
    ],
)
def test_bad_domain_is_a_clear_error(kw, match):
    with pytest.raises(ValueError, match=match):
        Domain(**kw)


def test_value_dims_any_draws_rectangular_heads_within_budget():
    seen = []
    t = builtin("gla")
    run_property(_recorder(seen), t, causal=True, domain=Domain(examples=60, value_dims="any"), seed=0)
    pairs = {(ex.q.shape[3], ex.v.shape[3]) for ex in seen}
    assert any(dk != dv for dk, dv in pairs), sorted(pairs)
    assert any(dk < dv for dk, dv in pairs) and any(dk > dv for dk, dv in pairs), sorted(pairs)
    assert all(math.prod(ex.v.shape) <= 2**14 for ex in seen)
    same = []
    run_property(_recorder(same), t, causal=True, domain=Domain(examples=20), seed=0)
    assert all(ex.q.shape[3] == ex.v.shape[3] for ex in same)


def test_value_dims_is_recorded_only_where_it_is_not_the_default():
    assert "value_dims" not in Domain().to_dict()  # certificates of square heads keep their bytes
    assert Domain(value_dims="any").to_dict()["value_dims"] == "any"


def test_an_output_allocated_like_q_fails_only_where_d_v_is_drawn_apart():
    from broken import linear_elu_output_shaped_like_q

    dom = {"max_n": 16, "max_d": 8, "examples": 30}
    square = check(linear_elu_output_shaped_like_q, "linear-elu", properties=["agreement"], domain=dom)
    assert square.passed, square.summary()
    rect = check(
        linear_elu_output_shaped_like_q, "linear-elu", properties=["agreement"], domain={**dom, "value_dims": "any"}
    )
    assert not rect.passed, rect.summary()
    assert check("builtin:linear-elu", properties=["agreement"], domain={**dom, "value_dims": "any"}).passed
