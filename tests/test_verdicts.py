"""Verdicts derived in one place, never vacuous, and no false alarms on correct low-precision code."""

import math

import numpy as np
import pytest
from broken import (
    linear_elu_plus_one_feature,
    linear_elu_with_eps_idiom,
    performer_global_key_stabiliser,
    softmax_detached,
    softmax_off_three_percent,
    softmax_plus_one,
)
from correct_lowprec import linear_elu_in_float32, softmax_in_float32

from gramcheck import bounds
from gramcheck import properties as P
from gramcheck.api import check
from gramcheck.arith import ProbabilisticModel, rounding_model
from gramcheck.findings import Finding
from gramcheck.oracle import truth
from gramcheck.precision import gamma
from gramcheck.spectra import normaliser_margin


# --- one verdict rule -------------------------------------------------------------------------------
def test_finding_derives_passed_and_margin_from_measured_and_bound():
    assert Finding("p", 0.5, 1.0).passed and Finding("p", 0.5, 1.0).margin == 2.0
    f = Finding("p", 2.0, 1.0)
    assert not f.passed and f.margin == 0.5 and f.verdict == "fail"
    nan = Finding("p", math.nan, 1.0)
    assert not nan.passed and nan.margin == 0.0
    assert not Finding("p", math.inf, math.inf).passed  # an infinite error never passes
    # relu's 0/0 row: margin -0.0 against "> 0" fails, with margin 0 (not inf)
    relu = Finding("normaliser-margin", -0.0, 0.0, sense=">")
    assert not relu.passed and relu.margin == 0.0
    assert Finding("m", 0.3, 0.0, sense=">").passed
    # a target failure always fails, whatever was measured
    t = Finding("p", 0.0, 1.0, details={"failure": "raised"})
    assert not t.passed and t.margin < 1
    s = Finding.skip("depth-growth", "no bound")
    assert s.passed and s.verdict == "skipped" and s.to_dict()["verdict"] == "skipped"
    with pytest.raises(ValueError, match="^sense"):
        Finding("p", 1.0, 1.0, sense="=")


@pytest.mark.parametrize("measured", [0.0, 0.3, 1.0, 1.0000001, 7.0, math.inf, math.nan, -0.0])
@pytest.mark.parametrize("bound", [0.0, 1.0, 2.5, math.inf])
def test_no_finding_fails_with_infinite_margin_or_passes_above_its_bound(measured, bound):
    f = Finding("p", measured, bound)
    if f.passed:
        assert measured <= bound and f.margin >= 1
    else:
        assert f.margin < 1 and not (measured <= bound and measured < math.inf)


def test_normaliser_margin_is_a_diagnostic_and_fails_relu_0_over_0_with_margin_0():
    from gramcheck import properties as P

    assert "normaliser-margin" not in {p.name for p in P.applicable("linear-relu", False)}
    r = check("builtin:linear-relu", properties=["normaliser-margin"])
    f = r.findings[0]
    assert not f.passed and f.margin == 0.0


# --- no vacuous verdicts -----------------------------------------------------------------------------
def test_rounding_models_share_gamma_and_never_turn_negative():
    m = rounding_model("bfloat16")
    assert m._gammas(300) == math.inf == gamma(300, "bfloat16")
    assert m._gammas(10) == gamma(10, u=m.u)  # the model's u also covers its float64 evaluation
    np.testing.assert_array_equal(m._gammas(np.arange(5.0)), gamma(np.arange(5.0), u=m.u))


@pytest.mark.parametrize("n", [64, 300, 17])
@pytest.mark.parametrize("fn", [softmax_plus_one, softmax_off_three_percent])
def test_bfloat16_wrong_outputs_fail_agreement_at_every_n(fn, n):
    r = check(fn, "softmax", dtype="bfloat16", properties=["agreement"], domain={"min_n": n, "max_n": n})
    f = r.findings[0]
    assert not f.passed, r.summary() + str(f.details)
    assert sum(f.details["judged_by"].values()) > 0


@pytest.mark.parametrize("n", [64, 300])
@pytest.mark.parametrize("name", ["softmax", "linear-elu"])
def test_bfloat16_builtin_forms_pass_agreement(name, n):
    r = check(f"builtin:{name}", dtype="bfloat16", properties=["agreement"], domain={"min_n": n, "max_n": n})
    assert r.passed, r.summary() + str(r.findings[0].details)


def test_probabilistic_bound_holds_and_is_within_lambda_of_typical_errors():
    """Recursive bfloat16 summation of n positive terms: the observed error stays below the
    probabilistic bound gamma~_n(lambda) sum|x| and is within a factor ~lambda of it at the worst of
    200 draws (the bound is sqrt(n) u scale, not n u: nearly tight in its order)."""
    from gramcheck.precision import round_to

    n, u = 256, 2.0**-8
    rng = np.random.default_rng(0)
    model = ProbabilisticModel("bfloat16")
    g = float(model._gammas(n))
    assert g < gamma(n, "bfloat16") / 2  # informative where the worst case is not
    worst = 0.0
    for _ in range(200):
        x = round_to(rng.uniform(0, 1, n), "bfloat16")
        s = 0.0
        for xi in x:
            s = float(round_to(s + xi, "bfloat16"))
        worst = max(worst, abs(s - x.sum()) / x.sum())
        assert abs(s - x.sum()) <= g * x.sum()
    assert worst > g / (4 * model.lam), (worst, g)
    assert u * math.sqrt(n) < g


# --- no false alarms ---------------------------------------------------------------------------------
@pytest.mark.parametrize("fn,name", [(softmax_in_float32, "softmax"), (linear_elu_in_float32, "linear-elu")])
def test_float32_internal_targets_pass_gradient_checks_and_say_so(fn, name):
    r = check(fn, name, dtype="float64", properties=["gradcheck", "jacobian-norm", "depth-growth"])
    assert r.passed, r.summary() + str([f.details for f in r.findings])
    assert r["gradcheck"].details["computes_in"] == "float32"


@pytest.mark.parametrize("seed", [0, 1])
def test_a_float32_internal_target_with_large_outputs_passes_gradcheck(seed):
    """RWKV-6's bonus u draws values up to ~200, so outputs reach ~400 and float32 rounding moves central
    differences of step 1e-3 by ~0.03, beyond a fixed atol of 5e-3 (a false alarm). The float32 computation's
    gradients are judged by backward-agreement's float32 rule instead (``backward.judge_in_float32``), and a
    dq 5% off still fails."""
    from broken import rwkv6_in_float32_with_dq_five_percent_off
    from correct_lowprec import rwkv6_in_float32

    r = check(rwkv6_in_float32, "rwkv6", causal=True, dtype="float64", seed=seed, properties=["gradcheck"])
    assert r.passed, r.summary() + str(r.findings[0].details)
    assert r["gradcheck"].details["computes_in"] == "float32"
    bad = check(
        rwkv6_in_float32_with_dq_five_percent_off, "rwkv6", causal=True, dtype="float64", seed=seed,
        properties=["gradcheck"],
    )
    assert not bad.passed, bad.summary()


def test_a_float32_internal_target_without_dg_fails_gradcheck_where_outputs_are_large():
    """The bonus at mixed scales (up to ~1e3) makes every output row's float32 noise larger than dg itself, so
    central differences cannot see a dropped dg; backward-agreement's float32 rule does."""
    from broken import rwkv6_in_float32_with_dg_detached

    r = check(
        rwkv6_in_float32_with_dg_detached, "rwkv6", causal=True, dtype="float64", seed=0, properties=["gradcheck"],
        domain={"gates": ["mixed"]},
    )
    assert not r.passed, r.summary()


def test_a_float64_forward_with_a_float32_backward_passes_gradcheck():
    """mamba2, seed 2: a float64 forward whose backward runs in float32 (``with_float32_backward``) returned a dg of
    1e-5 where the exact one is 0 (N = 1, keys up to 57), past central differences' float64 atol of 1e-5: a false
    alarm. Where central differences fail at float64's tolerances and the float32 rule passes, they judge at
    float32's: it passes, and its twin with dg 1e-4 off fails."""
    from correct_lowprec import with_float32_backward

    from gramcheck.targets import builtin

    fn = builtin("mamba2", dtype="float64").fn
    kw = {"causal": True, "dtype": "float64", "properties": ["gradcheck"], "seed": 2}
    ok = check(with_float32_backward(fn), "mamba2", **kw)
    assert ok.passed, ok.summary() + str(ok.findings[0].details)
    off = with_float32_backward(fn, lambda n, g: g * (1 + 1e-4) if n == "g" else g)
    bad = check(off, "mamba2", **kw)
    assert not bad.passed, bad.summary()


def test_central_differences_loosen_only_for_a_backward_that_computes_in_float32():
    """A float64 backward dropping the entries of dg below 8e-7 max|dg| fails central differences at float64's
    tolerances and passes the float32 rule (whose floor is relative to max|dg|): the loosened central differences
    passed it (a review's input, rwkv6 seed 0). They loosen only where the backward rounds most entries as float32
    does (``backward_precision``): it fails."""
    import torch
    from broken import with_changed_gradient
    from correct_lowprec import with_float32_backward

    from gramcheck.properties.gradients import backward_precision
    from gramcheck.strategies import attention_inputs, sample
    from gramcheck.targets import Target, builtin

    t = builtin("rwkv6", dtype="float64")
    drop = with_changed_gradient(t.fn, "g", lambda g: torch.where(g.abs() < 8e-7 * g.abs().max(), 0 * g, g))
    f = check(drop, "rwkv6", causal=True, dtype="float64", properties=["gradcheck"], seed=0)["gradcheck"]
    assert not f.passed and "Jacobian mismatch" in f.details.get("error", ""), f.details
    ex = sample(attention_inputs("rwkv6", dtype="float64", max_n=6, max_d=3), seed=0)
    assert backward_precision(Target(drop, "rwkv6", dtype="float64"), ex, True) == "float64"
    assert backward_precision(Target(with_float32_backward(t.fn), "rwkv6", dtype="float64"), ex, True) == "float32"


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_the_float64_call_of_a_float32_internal_target_is_the_one_judged(dtype):
    """The gradients judged are those of the call that is certified (float64), whatever the check's dtype: a
    backward wrong on that entry point only fails, and a target that takes float64 tensors only passes. (A check
    in float16 or bfloat16 judged the call in its own dtype against the float32 rule: a correct target that
    promotes half precision to float32 and rounds its result back failed.)"""
    from broken import linear_elu_float32_inside_with_float64_path_dq_halved
    from correct_lowprec import linear_elu_in_float32_float64_only

    dom = {"max_n": 8, "max_d": 4, "examples": 6}
    bad = check(linear_elu_float32_inside_with_float64_path_dq_halved, "linear-elu", dtype=dtype, domain=dom,
                properties=["gradcheck"])
    assert not bad.passed, bad.summary()
    ok = check(linear_elu_in_float32_float64_only, "linear-elu", dtype=dtype, domain=dom, properties=["gradcheck"])
    assert ok.passed and ok["gradcheck"].details["computes_in"] == "float32", ok.summary()


@pytest.mark.parametrize("causal", [True, False])
def test_a_gradient_too_small_to_judge_is_still_held_to_the_rules_loosest_bound(causal):
    """Where a gradient cancels below its terms' rounding it is listed as not judged, but an error far beyond the
    rule's loosest bound still fails (it passed as 'unjudged' before)."""
    from broken import softmax_in_float32_with_dq_garbage_on_duplicate_keys

    dom = {"max_n": 16, "max_d": 4, "examples": 10}
    r = check(softmax_in_float32_with_dq_garbage_on_duplicate_keys, "softmax", dtype="float64", causal=causal,
              properties=["gradcheck"], seed=0, domain=dom)
    assert not r.passed, r.summary()
    ok = check(softmax_in_float32, "softmax", dtype="float64", causal=causal, properties=["gradcheck"], seed=0,
               domain=dom)
    assert ok.passed and "dq" in ok["gradcheck"].details.get("unjudged", []), ok.summary()


@pytest.mark.parametrize("causal", [True, False])
def test_a_float32_relu_is_judged_by_the_rule_with_its_denominators_measured(causal):
    """relu's denominator can vanish; where it does not on the example (measured: ``denominator_condition``) the
    float32 rule judges a target that computes in float32 inside: the correct float32 form passes, a dq 10% off
    fails."""
    from broken import linear_relu_in_float32_with_dq_ten_percent_off
    from correct_lowprec import linear_relu_in_float32

    dom = {"max_n": 8, "max_d": 4, "examples": 10}
    ok = check(linear_relu_in_float32, "linear-relu", dtype="float64", causal=causal, properties=["gradcheck"],
               domain=dom)
    assert ok.passed and ok["gradcheck"].details["computes_in"] == "float32", ok.summary()
    assert "naive_errors" in ok["gradcheck"].details, ok["gradcheck"].details  # the rule's yardstick: it judged
    bad = check(linear_relu_in_float32_with_dq_ten_percent_off, "linear-relu", dtype="float64", causal=causal,
                properties=["gradcheck"], domain=dom)
    assert not bad.passed, bad.summary()


@pytest.mark.parametrize("causal", [True, False])
def test_central_differences_with_rows_held_to_their_noise_judge_trig_features_with_eps(causal):
    """Trig features with eps: a denominator that can vanish and is not the features' own (their quotient's
    features differ by a factor per row), so no rule measures it and central differences judge a float32 form, each
    row held to its own output's float32 noise: the correct form passes, a dq 10% off fails."""
    import gramcheck.variants as V

    def trig_in_float32(q, k, v, *, causal, projection, off=0.0):
        q = q + off * (q - q.detach())
        p = {"eps": 1e-3, "projection": projection.float()}
        return V.get("performer-trig").torch(q.float(), k.float(), v.float(), causal=causal, **p).to(q.dtype)

    def dq_off(q, k, v, *, causal, projection):
        return trig_in_float32(q, k, v, causal=causal, projection=projection, off=0.1)

    kw = {"dtype": "float64", "causal": causal, "properties": ["gradcheck"], "params": {"eps": 1e-3}}
    kw["domain"] = {"max_n": 8, "max_d": 4, "examples": 10}
    ok = check(trig_in_float32, "performer-trig", **kw)["gradcheck"]
    assert ok.passed and ok.details["computes_in"] == "float32", ok.details
    assert "float32 tolerances" in ok.details["note"], ok.details
    bad = check(dq_off, "performer-trig", **kw)["gradcheck"]
    assert not bad.passed, bad.details


def test_each_jacobian_row_is_held_to_its_own_outputs_rounding_noise():
    """Central differences (the fallback where backward-agreement's rule does not apply): output i is divided by
    w_i = max(1, 2 E_i / (eps atol)), which holds row i to max(atol, 2 E_i / eps); one large output loosens its own
    row only, and an entry without a finite noise bound keeps the fixed tolerance."""
    from gramcheck.properties.gradients import GRADCHECK_TOLERANCES, difference_weights

    base = GRADCHECK_TOLERANCES["float32"]
    w = difference_weights(np.array([0.0, 1e-9, 1e-3, np.inf]), "float32")
    assert w[0] == 1.0 and w[1] == 1.0 and w[3] == 1.0
    assert w[2] == pytest.approx(2e-3 / (base["eps"] * base["atol"]))


# --- issue-13 verdicts ---------------------------------------------------------------------------------
@pytest.mark.parametrize("prop", ["jacobian-norm", "depth-growth", "gradcheck"])
def test_detached_output_fails_gradient_properties(prop):
    r = check(softmax_detached, "softmax", dtype="float64", properties=[prop])
    assert not r.passed and r.findings[0].measured == math.inf, r.summary()
    assert check("builtin:softmax", dtype="float64", properties=[prop]).passed


def test_eps_idiom_passes_invariants_and_lists_depth_growth_as_skipped():
    r = check(linear_elu_with_eps_idiom, "linear-elu", params={"eps": 1e-6})
    assert r.passed, r.summary()
    assert r["rows-sum-to-one"].verdict == "pass" and r["convex-hull"].verdict == "pass"
    dg = r["depth-growth"]
    assert dg.verdict == "skipped" and "eps" in dg.details["skipped"]


def test_large_magnitude_kind_catches_elu_plus_one_and_passes_the_builtin():
    dom = {"kinds": ["large-magnitude"]}
    r = check(linear_elu_plus_one_feature, "linear-elu", properties=["agreement"], domain=dom)
    assert not r.passed and r.findings[0].measured == math.inf, r.summary()
    for causal in (False, True):
        ok = check("builtin:linear-elu", causal=causal, properties=["agreement", "convex-hull"], domain=dom)
        assert ok.passed, ok.summary()
    assert check("builtin:softmax", properties=["agreement", "convex-hull"], domain=dom).passed


def test_default_domain_catches_elu_plus_one():
    """The default ci domain reaches F.elu(x) + 1's 0/0 (outliers or large-magnitude rows, whichever the
    search meets first); every kind the search did not draw gets an example of its own."""
    r = check(linear_elu_plus_one_feature, "linear-elu", properties=["agreement"])
    f = r.findings[0]
    assert not f.passed and f.counterexample["kind"] in ("large-magnitude", "outliers"), r.summary()
    ok = check("builtin:linear-elu", properties=["agreement"]).findings[0]
    assert ok.passed and set(ok.details["kinds_drawn"]) == set(P.DEFAULT_KINDS), ok.details


# --- bounds functions refuse what they cannot bound -----------------------------------------------------
def test_bounds_functions_reject_nan():
    with pytest.raises(ValueError, match="^x: got 1 non-finite"):
        bounds.favor_mse(np.array([math.nan, 0.0]), np.zeros(2), 4)
    with pytest.raises(ValueError, match="^eps"):
        bounds.row_normalisation_l1(math.nan)
    with pytest.raises(ValueError, match="^fq"):
        normaliser_margin(np.full((2, 2), math.nan), np.ones((2, 2)))
    with pytest.raises(ValueError, match="^n: got 0"):
        bounds.qknorm_weight_range(0, 1.0)
    with pytest.raises(ValueError, match="^tau"):
        bounds.qknorm_weight_range(3, math.nan)
    lo, hi = bounds.qknorm_weight_range(1, 1.0)
    assert lo == hi == 1.0
    q = np.ones((1, 1, 2, 2))
    with pytest.raises(ValueError, match="^digits"):
        truth("softmax", q, q, q, digits=math.nan)


# --- builtin forms against their own catalogue (features underflowing in float32) ------------------------
HEAVY_TAIL_N1 = {
    "q": [[[[-2.225749969482422, 5.846498489379883, -724.6710205078125]]]],
    "k": [[[[-1.545772671699524, -3.3744330406188965, 117.21083068847656]]]],
    "v": [[[[-0.6975185871124268, 0.0908302515745163, -1.8356095552444458]]]],
    "projection": [
        [0.10793046653270721, 0.09004929661750793, 1.1193914413452148],
        [-0.522000253200531, -1.4603499174118042, 0.16780833899974823],
        [1.1004440784454346, -0.40183019638061523, -0.07377839833498001],
        [-0.4848887324333191, -0.8909136056900024, -0.28059282898902893],
        [-0.5963385105133057, 0.5350288152694702, -0.6682518124580383],
        [0.46293404698371887, -0.09730847924947739, -0.49102482199668884],
    ],
}


@pytest.mark.parametrize("name", ["performer-positive", "performer-hyperbolic"])
@pytest.mark.parametrize("prop", ["rows-sum-to-one", "convex-hull", "agreement"])
def test_causal_favor_stabilised_per_feature_computes_rows_that_one_shift_per_token_loses(name, prop):
    """The shrunk heavy-tail input of the causal FAVOR+ forms (N = 1, float32): the query's and the key's
    largest features sit on different coordinates, so with the query shifted by its own maximum and the
    key by its own, phi(q) . phi(k) underflows to 0 and the row is 0/0 (the builtin form did this, and its
    catalogue's invariants failed it until the entry was called uncertifiable). Shifted feature by
    feature (featuremaps.favor_causal), the largest term is 1: the builtin returns v exactly and every
    entry is judged, by the worst-case bound; a form with one shift per token still returns 0/0 and
    fails."""
    from gramcheck.strategies import AttentionInputs
    from gramcheck.targets import Target, builtin

    a = {n: np.asarray(x) for n, x in HEAVY_TAIL_N1.items()}
    ex = AttentionInputs(a["q"], a["k"], a["v"], {"projection": a["projection"]}, "heavy-tail", "float32")
    t = builtin(name)
    assert np.array_equal(t(ex.q, ex.k, ex.v, causal=True, projection=a["projection"]), a["v"])
    f = P.get(prop).fn(t, ex, causal=True)
    assert f.passed, f
    if prop == "agreement":
        assert f.details["judged_by"]["worst-case"] == a["v"].size and f.details["unbounded_entries"] == 0, f
    per_token = Target(performer_global_key_stabiliser, "performer-positive", dtype="float32", name="per-token")
    assert not P.get(prop).fn(per_token, ex, causal=True).passed


def test_elu_features_underflowing_in_float32_are_uncertifiable_not_failures():
    """linear-elu, causal, N = 1: q = -125.7 gives elu(q) + 1 = exp(-125.7), below float32's smallest
    subnormal: the form returns 0/0 where the definition is v. Convex-hull used to report measured inf."""
    from gramcheck import properties as P
    from gramcheck.strategies import AttentionInputs
    from gramcheck.targets import builtin

    ex = AttentionInputs(
        np.full((1, 1, 1, 1), -125.730224609375),
        np.full((1, 1, 1, 1), 132.1048583984375),
        np.full((1, 1, 1, 1), 640.4226684570312),
        {},
        "outliers",
        "float32",
    )
    f = P.get("convex-hull").fn(builtin("linear-elu"), ex, causal=True)
    assert f.passed and f.details["uncertifiable_entries"] == 1, f
    # a form that returns NaN where the bound is finite still fails
    ex_ok = AttentionInputs(np.full((1, 1, 1, 1), -5.0), ex.k, ex.v, {}, "outliers", "float32")
    nan_form = builtin("linear-elu")
    nan_form.fn = lambda q, k, v, *, causal: v * float("nan")
    assert not P.get("convex-hull").fn(nan_form, ex_ok, causal=True).passed


def test_jacobian_norm_falls_back_for_a_custom_backward_vmap_cannot_batch():
    import torch
    from correct_lowprec import softmax_with_custom_backward
    from torch.autograd.functional import jacobian

    q = torch.randn(1, 1, 3, 2, dtype=torch.float64)
    with pytest.raises(RuntimeError):
        jacobian(lambda x: softmax_with_custom_backward(x, q, q, causal=False), q, vectorize=True)
    r = check(softmax_with_custom_backward, "softmax", dtype="float64", properties=["jacobian-norm"])
    assert r.passed, r.summary() + str(r.findings[0].details)


def _float32_favor_case(name, seed, n, d, m, scale):
    """(variant, params without 'features', q, k, v, projection): float32 values, q and k ~ N(0, scale^2),
    v ~ N(0, 1), shape (1, 1, n, d), an iid projection (m, d)."""
    from gramcheck import variants as V
    from gramcheck.featuremaps import random_projection
    from gramcheck.precision import round_to

    var = V.get(name)
    params = {p: x for p, x in var.params.items() if p != "features"}
    rng = np.random.default_rng(seed)
    q, k, v = (round_to(rng.standard_normal((1, 1, n, d)) * s, "float32") for s in (scale, scale, 1.0))
    return var, params, q, k, v, round_to(random_projection(m, d, seed=seed), "float32")


def test_rows_the_dtypes_range_decided_are_not_judged_by_the_low_precision_rule():
    """FAVOR+ hyperbolic, non-causal (the reference code's shifts: queries by their own maximum, keys by
    the global one), float32, entries of norm ~30: key and query features underflow into float32's
    subnormals, so the definition in float32 returns, on some rows, values quantised by the subnormal
    grid (not by rounding). A target's value on such a row is counted, not judged (twice the builtin's passes);
    a NaN there fails all the same (rule ``non-finite``: the definition in float32 computes a finite value), as a
    NaN on a row the dtype computes within its range does. (The causal forms, shifted feature by feature, no
    longer leave such rows.)"""
    from gramcheck.agreement import check_agreement, naive_definition, rounding_bound
    from gramcheck.targets import builtin

    var, params, q, k, v, w = _float32_favor_case("performer-hyperbolic", 0, 16, 8, 16, 30.0)
    kw = dict(causal=False, dtype="float32", projection=w, **params)
    naive = naive_definition(var, q, k, v, **kw)
    wide = naive_definition(var, q, k, v, wide_range=True, **kw)
    out = builtin("performer-hyperbolic")(q, k, v, causal=False, projection=w)
    t = truth(var, q, k, v, causal=False, digits=8, projection=w, **params)
    finite = np.isfinite(naive).all(-1)[0, 0]
    row = lambda x: np.linalg.norm(x, axis=-1)[0, 0]  # noqa: E731
    moved = row(naive - wide) > row(wide - t.value) + 2**-24 * row(t.value)
    # rows whose worst-case bound is vacuous (not below the slice's magnitude): the rule would judge them
    mag = max(np.abs(t.value).max(), np.abs(v).max())
    vacuous = ~(rounding_bound(var, q, k, v, **kw) < mag).all(-1)[0, 0]
    by_range = np.flatnonzero(finite & moved & vacuous)
    in_range = np.flatnonzero(finite & ~moved & np.isfinite(out).all(-1)[0, 0])
    assert by_range.size and in_range.size, (by_range, in_range)
    base = check_agreement("agreement", out, var, q, k, v, **kw)
    assert base.passed, base
    moved_there = out.copy()
    moved_there[0, 0, by_range] *= 2.0
    f = check_agreement("agreement", moved_there, var, q, k, v, **kw)
    assert f.passed and f.details["unbounded_entries"] >= 8 * by_range.size, f
    nan_there = out.copy()
    nan_there[0, 0, by_range] = np.nan
    f = check_agreement("agreement", nan_there, var, q, k, v, **kw)
    assert f.details["rule"] == "non-finite" and f.details["nonfinite_entries"] == 8 * by_range.size, f.details
    nan_in_range = out.copy()
    nan_in_range[0, 0, in_range[-1]] = np.nan
    assert not check_agreement("agreement", nan_in_range, var, q, k, v, **kw).passed


def test_the_naive_definition_accumulates_in_float32_below_float64():
    """RoundedArith's sums and products accumulate as float32 kernels do (float32 accumulator), also in
    the wide-range twin, whose scaling by powers of two changes no significand rounding."""
    from gramcheck.arith import RoundedArith
    from gramcheck.precision import round_to

    rng = np.random.default_rng(0)
    a, b = (round_to(rng.standard_normal(s) * 1e3, "float32") for s in ((5, 300), (300, 4)))
    want = np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(np.float64)
    for wide in (False, True):
        ar = RoundedArith("float32", wide_range=wide)
        assert np.array_equal(ar.to_float64(ar.matmul(a, b)), want)
        assert np.array_equal(ar.to_float64(ar.sum(ar.asarray(a), axis=-1)), a.astype(np.float32).sum(-1))
    assert not np.array_equal(RoundedArith("float64").to_float64(RoundedArith("float64").matmul(a, b)), want)


def test_trigonometric_favor_in_float32_is_judged_against_a_float32_accumulator(monkeypatch):
    """FAVOR+ trig features cancel (amplitude exp(|x|^2 / 2)): with a float64 accumulator the naive
    definition was 56x more accurate than any float32 kernel and the rule failed the builtin recurrent
    form, whose order is the naive definition's own, at 27.4; with a float32 accumulator those entries'
    probabilistic bound at float32's u still reaches their magnitude. Every standard algorithm in float32
    computes those rows to better than 2^-10 of their magnitude, so they are not noise
    (``agreement.quiet_rows``): the rule judges them and the builtin passes; a target 3% off fails, and so
    does a row 1% off there and a NaN. Without that evidence they are rounding noise, counted and not judged
    (proofs/low-precision-rule.md), and the row 1% off passed: the gate had let it through."""
    from gramcheck import agreement
    from gramcheck.agreement import check_agreement, probabilistic_bound
    from gramcheck.targets import builtin

    var, params, q, k, v, w = _float32_favor_case("performer-trig", 1, 29, 62, 64, 4.0)
    kw = dict(causal=True, dtype="float32", projection=w, **params)
    out = builtin("performer-trig", form="recurrent")(q, k, v, causal=True, projection=w)
    pb = probabilistic_bound(var, q, k, v, causal=True, dtype="float32", projection=w, **params)[0]
    noise = np.argwhere(pb >= 0.5 * max(np.abs(out).max(), np.abs(v).max()))
    assert len(noise), "the input has no entry the float32 bound calls noise"
    nan, row = out.copy(), np.array(out, dtype=np.float64)
    nan[tuple(noise[0])] = np.nan
    row[tuple(noise[0][:3])] *= 1.01
    f = check_agreement("agreement", out, var, q, k, v, **kw)
    assert f.passed and f.details["noise_entries"] == 0 and f.details["judged_by"]["low-precision rule"] > 0, f
    for wrong in (nan, row, out * (1 + 0.03)):
        assert not check_agreement("agreement", wrong, var, q, k, v, **kw).passed
    monkeypatch.setattr(agreement, "NOISE_EVIDENCE", 0.0)
    f = check_agreement("agreement", out, var, q, k, v, **kw)
    assert f.passed and f.details["noise_entries"] >= 29, f
    assert f.details["unbounded_entries"] >= f.details["noise_entries"]
    assert not check_agreement("agreement", nan, var, q, k, v, **kw).passed
    assert check_agreement("agreement", row, var, q, k, v, **kw).passed


def test_float16_softmax_overflowing_before_its_scale_fails_where_a_standard_algorithm_stays_in_range():
    """|q.k| = 2^17 > 65504 while s q.k = 2^15 (d = 16): the definition's order overflows float16, the
    scaled-queries order (softmax.scaled_queries) does not, so the overflow is no excuse for the target
    (ultralytics/ultralytics#24990); the builtin (queries scaled first) and torch's SDPA pass."""
    from broken import softmax_scaled_after_product
    from correct_lowprec import softmax_sdpa

    from gramcheck.agreement import check_agreement
    from gramcheck.api import make_target

    rng = np.random.default_rng(0)
    q = np.full((1, 1, 4, 16), 2.0**6) * np.sign(rng.standard_normal((1, 1, 4, 16)))
    k = q.copy()
    v = rng.standard_normal((1, 1, 4, 16)).astype(np.float16).astype(np.float64)
    verdicts = {}
    for fn in (softmax_scaled_after_product, softmax_sdpa, "builtin:softmax"):
        t = make_target(fn, "softmax", dtype="float16")
        out = t(q, k, v, causal=True)
        f = check_agreement("agreement", out, "softmax", q, k, v, causal=True, dtype="float16")
        verdicts[getattr(fn, "__name__", fn)] = (f.passed, f.measured)
    assert not verdicts["softmax_scaled_after_product"][0] and verdicts["softmax_scaled_after_product"][1] == np.inf
    assert verdicts["softmax_sdpa"][0] and verdicts["builtin:softmax"][0], verdicts


def test_float16_outputs_past_the_range_and_intermediates_every_algorithm_overflows():
    """float16, q = k = v = 100 at N = 1: (q . k) v = 1e6 is past the range, so inf is its rounding and
    passes, while NaN, -inf and a finite 65504 fail. elu + 1 attention's numerator 1.02e6 overflows in the
    definition's order, but the exact output is 100, which the builtin (normalising its float32
    accumulators) returns: an inf there fails, excused by no standard algorithm's overflow (a review found
    that excuse passing NaN where a careful kernel is finite). A mask applied as a product gives NaN where
    the definition is finite: that fails too (the builtin's causal chunked form did this before it masked
    by selection)."""
    from gramcheck.agreement import check_agreement
    from gramcheck.api import make_target

    x = np.full((1, 1, 1, 1), 100.0)
    lu = make_target("builtin:linear-unnormalised", dtype="float16")
    assert np.isposinf(lu(x, x, x, causal=False)).all()
    for fill, passes in ((np.inf, True), (np.nan, False), (-np.inf, False), (65504.0, False)):
        out = np.full_like(x, fill)
        f = check_agreement("agreement", out, lu.variant, x, x, x, causal=False, dtype="float16", **lu.params)
        assert f.passed == passes, (fill, f.details)
    assert f.details.get("out_of_range_entries") is None and "unjudged" not in f.details, f.details
    elu = make_target("builtin:linear-elu", dtype="float16")
    assert elu(x, x, x, causal=False)[0, 0, 0, 0] == 100.0
    f = check_agreement("agreement", np.full_like(x, np.inf), "linear-elu", x, x, x, causal=False, dtype="float16")
    assert not f.passed, f.details
    # q_0 . k_2 = 301^2 > 65504 is a future score of row 0
    q = np.array([300.0, 1.0, 1.0]).reshape(1, 1, 3, 1)
    k = np.array([1.0, 1.0, 300.0]).reshape(1, 1, 3, 1)
    v = np.array([1.0, -2.0, 3.0]).reshape(1, 1, 3, 1)
    verdicts = {}
    from broken import linear_elu_masked_by_product

    for fn in (linear_elu_masked_by_product, "builtin:linear-elu"):
        t = make_target(fn, "linear-elu", dtype="float16")
        f = check_agreement("agreement", t(q, k, v, causal=True), "linear-elu", q, k, v, causal=True, dtype="float16")
        verdicts[getattr(fn, "__name__", fn)] = (f.passed, f.measured)
    assert verdicts["linear_elu_masked_by_product"] == (False, np.inf), verdicts
    assert verdicts["builtin:linear-elu"][0], verdicts


def test_float16_infinity_of_either_sign_within_the_bound_and_nan_where_no_rule_is_informative():
    """(elu + 1) attention, unnormalised, in float16: phi(q).phi(k) v cancels terms of 1e8 in column 0 to
    -202, whose worst-case bound (1.2e6) reaches past 65520 on both sides, so either infinity is a value
    the bound allows (the builtin's RetNet returned +inf where the exact value was -849; the rule took the
    truth's sign only). Where the exact value is -1.6e6 the bound no longer reaches +65520: +inf fails,
    -inf passes. NaN is within no bound: it fails, although the naive definition overflows there and no
    rule is informative (it passed unjudged before)."""
    from gramcheck.agreement import check_agreement
    from gramcheck.api import make_target

    q = np.full((1, 1, 3, 1), 100.0)
    k = np.array([100.0, 100.0, 1.0]).reshape(1, 1, 3, 1)
    lu = make_target("builtin:linear-unnormalised", dtype="float16")

    def verdicts(c: float) -> dict[float, bool]:
        v = np.array([[10000.0, 40.0], [-10000.0, 40.0], [c, 0.0]]).reshape(1, 1, 3, 2)
        exact = lu.variant.reference(q, k, v, causal=False)
        assert exact[0, 0, 0, 0] == 202.0 * c and exact[0, 0, 0, 1] > 65520, exact
        out = {}
        for fill in (np.inf, -np.inf, np.nan):
            o = lu(q, k, v, causal=False)
            assert np.isposinf(o[..., 1]).all()
            o[..., 0] = fill
            f = check_agreement("agreement", o, lu.variant, q, k, v, causal=False, dtype="float16", **lu.params)
            assert f.details["rule"] == "worst-case" and f.details["worst_bound"] < 1.3e6, f.details
            out[fill] = f.passed
            if fill != fill:
                assert f.measured == np.inf and "unjudged" not in f.details, f.details
        return out

    assert verdicts(-1.0) == {np.inf: True, -np.inf: True, np.nan: False}
    near = verdicts(-8000.0)
    assert near[np.inf] is False and near[-np.inf] is True and near[np.nan] is False, near


def _trig_favor_with_an_unresolved_row():
    """Trigonometric FAVOR+ in float16, N = 12, d = 4, m = 8: row 11's denominator has margin 2.7e-4,
    below one rounding of its features (2u = 9.8e-4); every other row's is resolved 20 times over."""
    from gramcheck.featuremaps import random_projection
    from gramcheck.precision import round_to

    rng = np.random.default_rng(42)
    q, k, v = (round_to(rng.standard_normal((1, 1, 12, 4)) * 1.5, "float16") for _ in range(3))
    return q, k, v, round_to(random_projection(8, 4, seed=42), "float16")


def test_a_row_whose_denominator_the_dtype_does_not_resolve_is_judged_by_no_rule(monkeypatch):
    """Row 11 (above): perturbing each stored feature by at most one rounding (relative u) turns its
    denominator's sign (the construction of proofs/low-precision-rule.md, "Unresolved denominators"),
    while no such perturbation turns another row's. So the dtype determines no digit of row 11, and a
    yardstick's luck there decided the rule in norm (trig FAVOR+ float16 at seed 2 failed at 1.73: the
    builtin erred 1022 in norm against the naive definition's 295, and 0.72 against 0.61 without the
    30 such rows). The row is judged by no rule: the builtin passes, and so does row 11 replaced by other
    values (they fail when the row is judged), while NaN there, or every entry 3% off, fails."""
    import gramcheck.agreement as A
    from gramcheck.api import make_target
    from gramcheck.spectra import denominator_terms

    q, k, v, w = _trig_favor_with_an_unresolved_row()
    t = make_target("builtin:performer-trig", dtype="float16")
    var, kw = t.variant, {**t.params, "projection": w}
    u = 2.0**-11
    fq, fk = var.features(q, k, **kw)
    den, lean, scale = denominator_terms(fq, fk, causal=False)
    rng = np.random.default_rng(0)
    for i in range(12):
        sigma = np.sign(den[0, 0, i])
        eps = -sigma * u * np.sign(fq[0, 0, i] * fk[0, 0])  # keys: every term towards 0
        z = np.sum(fk[0, 0] * (1 + eps), axis=0)
        delta = -sigma * u * np.sign(fq[0, 0, i] * z)
        turned = np.sign(np.sum(fq[0, 0, i] * (1 + delta) * z)) != sigma
        assert turned == (i == 11), (i, den[0, 0, i] / scale[0, 0, i])
        reach = u * lean[0, 0, i] + (u + u * u) * scale[0, 0, i]  # no perturbation moves den farther
        if i != 11:
            assert abs(den[0, 0, i]) > reach
            for _ in range(50):
                e, dl = (u * rng.uniform(-1, 1, x.shape) for x in (fk[0, 0], fq[0, 0, i]))
                assert np.sign(np.sum(fq[0, 0, i] * (1 + dl) * np.sum(fk[0, 0] * (1 + e), axis=0))) == sigma

    def agreement(out):
        return A.check_agreement("agreement", out, var, q, k, v, causal=False, dtype="float16", **kw)

    out = t(q, k, v, causal=False, projection=w)
    f = agreement(out)
    assert f.passed and f.details["unresolved_entries"] == 4, f.details
    other = out.copy()
    other[0, 0, 11] = -10 * out[0, 0, 11]
    assert agreement(other).passed
    nan = out.copy()
    nan[0, 0, 11, 2] = np.nan
    g = agreement(nan)
    assert not g.passed and g.details["rule"] == "unresolved", g.details
    assert not agreement(out * 1.03).passed
    monkeypatch.setattr(A, "unresolved_entries", lambda *a, **kw: np.zeros(np.shape(v), dtype=bool))
    assert agreement(out).passed and not agreement(other).passed


def test_rows_a_review_found_flagged_unresolved_though_the_definition_resolves_them():
    """Each was flagged, and a wrong row there passed (a review): a relu row with no overlap divided by eps
    (0 / 1e-6 = 0 exactly), where the flag ignored eps; trig FAVOR+ with eps = 1, whose margin is then 0.34;
    keys of 20 whose float64 features overflow (inf <= inf); and feature_eps > 0, whose unstabilised features
    are not the definition's. None is flagged now, and the wrong rows fail."""
    from gramcheck import variants
    from gramcheck.agreement import check_agreement, unresolved_entries
    from gramcheck.featuremaps import random_projection
    from gramcheck.precision import round_to

    def wrong_row_fails(name, q, k, v, dtype, causal, row, value, **kw):
        var = variants.get(name)
        assert not unresolved_entries(var, q, k, v, causal=causal, dtype=dtype, **kw).any()
        extras = {n: x for n, x in kw.items() if n == "projection"}
        params = var.resolve_params({n: x for n, x in kw.items() if n not in extras})
        exact = var.reference(q, k, v, causal=causal, **params, **extras)
        assert check_agreement("a", exact, var, q, k, v, causal=causal, dtype=dtype, **kw).passed
        bad = exact.copy()
        bad[0, 0, row] = value(exact[0, 0, row])
        assert not check_agreement("a", bad, var, q, k, v, causal=causal, dtype=dtype, **kw).passed, (name, kw)

    rng = np.random.default_rng(0)
    q, k, v = (round_to(rng.standard_normal((1, 1, 16, 8)), "float16") for _ in range(3))
    q[0, 0, 3] = -np.abs(q[0, 0, 3])  # relu(q_3) = 0
    for fill in (1000.0, np.inf):
        wrong_row_fails("linear-relu", q, k, v, "float16", False, 3, lambda r, f=fill: np.full_like(r, f), eps=1e-6)
    q, k, v, w = _trig_favor_with_an_unresolved_row()
    wrong_row_fails("performer-trig", q, k, v, "float16", False, 11, lambda r: -5 * r + 3, eps=1.0, projection=w)
    rng = np.random.default_rng(1)
    q, k, v = (round_to(rng.standard_normal((1, 1, 8, 16)), "float16") for _ in range(3))
    k[0, 0, 0] = round_to(20 * np.sign(rng.standard_normal(16)), "float16")
    q[0, 0, 2] = q[0, 0, 5] = k[0, 0, 0]  # rows 2 and 5 are v_0, exactly
    w = round_to(random_projection(8, 16, seed=1), "float16")
    for causal in (False, True):
        wrong_row_fails("performer-trig", q, k, v, "float16", causal, 2, lambda r: 1000.0 + 0 * r, projection=w)
    rng = np.random.default_rng(30)
    q, k, v = (round_to(rng.standard_normal((1, 1, 16, 4)) * 3.5, "float16") for _ in range(3))
    w = round_to(random_projection(4, 4, seed=30), "float16")
    wrong_row_fails("performer-trig", q, k, v, "float16", False, 8, lambda r: 5 - 7 * r, feature_eps=0.03, projection=w)


def test_a_pass_against_a_coarse_yardstick_says_so():
    """Trigonometric FAVOR+ in bfloat16 with feature_eps = 0.03 and inputs of 3.5 (a review's input): the naive
    definition errs 42% of the output's norm, so the rule passes a row replaced by 5 - 7 times itself (0.09).
    That is the rule as stated, but such a verdict says little, and the Finding's note now says so; a
    well-resolved input (the same at scale 0.5) has no such note."""
    from gramcheck import variants
    from gramcheck.agreement import check_agreement
    from gramcheck.featuremaps import random_projection
    from gramcheck.precision import round_to

    var = variants.get("performer-trig")
    w = round_to(random_projection(4, 4, seed=3), "bfloat16")
    params = {**var.resolve_params({"feature_eps": 0.03}), "projection": w}
    for scale, coarse in ((3.5, True), (0.5, False)):
        rng = np.random.default_rng(3)
        q, k, v = (round_to(rng.standard_normal((1, 1, 16, 4)) * scale, "bfloat16") for _ in range(3))
        exact = var.reference(q, k, v, causal=False, **params)
        f = check_agreement("a", exact, var, q, k, v, causal=False, dtype="bfloat16", feature_eps=0.03, projection=w)
        assert f.passed and ("yardstick_share" in f.details) == coarse, f.details
        if coarse:
            assert f.details["yardstick_share"] > 0.4 and "says little" in f.details["note"], f.details


def test_an_exact_zero_whose_resolution_is_infinite_keeps_the_naive_yardstick():
    """softmax in float32 with logits ~1e10 over pairs of equal keys with opposite values: every exact
    output is 0 and the naive definition is finite, but the resolution model's exp overflows. Judged
    against an infinite yardstick, NaN and an output equal to v passed (found by a review); they fail."""
    from gramcheck.agreement import check_agreement, resolution_radius
    from gramcheck.precision import round_to

    rng = np.random.default_rng(4)
    q = round_to(rng.standard_normal((1, 1, 4, 16)) * 1e5, "float32")
    k = round_to(rng.standard_normal((1, 1, 4, 16)) * 1e5, "float32")
    v = round_to(rng.standard_normal((1, 1, 4, 16)), "float32")
    k[..., 1, :], k[..., 3, :] = k[..., 0, :], k[..., 2, :]
    v[..., 1, :], v[..., 3, :] = -v[..., 0, :], -v[..., 2, :]
    assert not np.isfinite(resolution_radius("softmax", q, k, v, causal=False, dtype="float32")).all()
    assert check_agreement("agreement", np.zeros_like(v), "softmax", q, k, v, causal=False, dtype="float32").passed
    for wrong in (np.full_like(v, np.nan), v.copy()):
        f = check_agreement("agreement", wrong, "softmax", q, k, v, causal=False, dtype="float32")
        assert not f.passed, f.details


@pytest.mark.parametrize("name", ["performer-positive", "performer-hyperbolic"])
def test_favor_features_of_huge_queries_keep_their_largest_exponent_at_0(name):
    """Causal FAVOR+ in float32 with |q| ~ 2e5 and |k| ~ 1e6 (seed 3's float32 check, heavy tails, N = 1): the
    per-feature shift is ~1e11, and one rounding of it put the query's largest exponent at -6e4 (every feature 0,
    the output 0 / 0) or, on a longer input, at +6e5 (a feature of inf): the builtin returned NaN where the float32
    definition is exact. The shifted exponents' own maximum is now subtracted once more (a row constant, which
    the normalisation cancels), in the builtin and in the naive definition alike: the largest is exactly 0, and
    the builtin passes, while an output 1% off fails."""
    from pathlib import Path

    import torch

    from gramcheck.agreement import check_agreement
    from gramcheck.arith import RoundedArith
    from gramcheck.targets import builtin
    from gramcheck.torch_arith import TORCH

    saved = np.load(Path(__file__).parent / "data" / "performer_positive_f32_causal_huge_magnitude.npz")
    a = {key: np.asarray(x, dtype=np.float64) for key, x in saved.items()}
    q, k, v = a.pop("q"), a.pop("k"), a.pop("v")
    rng = np.random.default_rng(0)
    x, base = rng.standard_normal((2, 5, 8)) * 1e11
    f32 = {"dtype": torch.float32}
    for y in (TORCH.shifted(torch.tensor(x, **f32), torch.tensor(base, **f32), -1).double().numpy(),
              RoundedArith("float32").to_float64(RoundedArith("float32").shifted(x, base, -1))):  # fmt: skip
        assert np.all(np.max(y, axis=-1) == 0.0)
    t = builtin(name, dtype="float32")
    out = np.asarray(t(q, k, v, causal=True, **a), dtype=np.float64)
    assert np.all(np.isfinite(out))

    def agreement(o):
        return check_agreement("agreement", o, t.variant, q, k, v, causal=True, dtype="float32", **t.params, **a)

    assert agreement(out).passed
    assert not agreement(out * 1.01).passed


def test_a_nan_output_where_float32_intermediates_compute_the_entry_fails():
    """linear-elu in float16, N = 2, d = 1: key 0 of -20 has phi(k) = e^-20 = 2e-9, 0 in float16, so row 0 is 0/0 for
    features stored in float16 (the definition in float16 too: its bound is infinite) while its exact output is v_0.
    Float32 features compute it, as the builtin does: a target whose features are float16 returns NaN there and fails
    (rule ``non-finite``; it passed unjudged before, as xformers#96's float16 FAVOR+ features did). With a key of
    -120, e^-120 is 0 in float32 too: no standard precision computes row 0, and the NaN is not judged."""
    import torch

    from gramcheck.agreement import check_agreement
    from gramcheck.api import make_target

    elu = make_target("builtin:linear-elu", dtype="float16")
    q = np.array([1.0, 0.5]).reshape(1, 1, 2, 1)
    v = np.array([3.0, -1.0]).reshape(1, 1, 2, 1)

    def in_float16(q, k, v, *, causal):  # features stored in the inputs' float16 before the quotient
        fq, fk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
        a = fq @ fk.transpose(-1, -2)
        a = a.masked_fill(~torch.ones(2, 2, dtype=torch.bool).tril(), 0.0)
        return (a @ v) / a.sum(-1, keepdim=True)

    def verdict(key0: float, fn):
        k = np.array([key0, 1.0]).reshape(1, 1, 2, 1)
        o = np.asarray(fn(*(torch.tensor(x, dtype=torch.float16) for x in (q, k, v)), causal=True), dtype=np.float64)
        f = check_agreement("agreement", o, elu.variant, q, k, v, causal=True, dtype="float16", **elu.params)
        return o, f

    o, f = verdict(-20.0, in_float16)
    assert np.isnan(o[0, 0, 0, 0]) and np.isfinite(o[0, 0, 1, 0]), o
    assert f.measured == np.inf and f.details["rule"] == "non-finite" and f.details["nonfinite_entries"] == 1, f.details
    o, f = verdict(-20.0, lambda q, k, v, causal: elu.fn(q, k, v, causal=causal))
    assert o[0, 0, 0, 0] == 3.0 and f.passed and "nonfinite_entries" not in f.details, (o, f.details)
    o, f = verdict(-120.0, in_float16)
    assert np.isnan(o[0, 0, 0, 0]) and f.passed and f.details["unbounded_entries"] >= 1, f.details
    assert "nonfinite_entries" not in f.details, f.details
