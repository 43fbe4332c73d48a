"""The property catalogue: every applicable property passes on gramcheck's own torch forms and on the
float64 reference, and fails on a broken implementation that breaks exactly what it checks."""

import numpy as np
import pytest
import torch
from broken import (
    coarse_output,
    gla_with_inverted_decay,
    linear_with_detached_features,
    linear_with_huge_eps,
    linear_with_position_bias,
    normattention_without_norm,
    performer_global_key_stabiliser,
    performer_with_halved_rows,
    performer_without_stabiliser,
    qknorm_with_doubled_temperature,
    qknorm_without_key_norm,
    softmax_amplified_values,
    softmax_leaking_one_future_token,
    softmax_shifted,
    unnormalised_times_n,
)

from gramcheck import properties as P
from gramcheck import variants as V
from gramcheck.api import check
from gramcheck.demo import BOUNDED_KINDS, KNOWN_FINDINGS
from gramcheck.properties import kernels as K
from gramcheck.report import PropertyFailure
from gramcheck.search import Domain

SMALL = {"max_n": 8, "max_d": 3, "examples": 6}
# the random-feature variants are checked on bounded-norm kinds, as the demo certifies them (gramcheck.demo)
BOUNDED = BOUNDED_KINDS
# real failure modes the catalogue must report (asserted in test_known_failure_modes_are_found)
KNOWN = set(KNOWN_FINDINGS)


def _modes(var):
    return [True] if "causal-only" in var.declares else [False, True]


CASES = [
    (var.name, causal, p.name)
    for var in V.list()
    for causal in _modes(var)
    for p in P.applicable(var, causal, {}, dtype="float32")
    if (var.name, p.name) not in KNOWN
]


def _domain(name, prop):
    kinds = BOUNDED if "random-features" in V.get(name).declares else None
    if kinds is not None and P.get(prop).kinds != P.DEFAULT_KINDS:
        kinds = P.get(prop).kinds
    return {**SMALL, "kinds": kinds}


@pytest.mark.parametrize("name,causal,prop", CASES, ids=[f"{n}-{'causal' if c else 'full'}-{p}" for n, c, p in CASES])
def test_builtin_torch_form_passes(name, causal, prop):
    report = check(f"builtin:{name}", causal=causal, dtype="float32", properties=[prop], domain=_domain(name, prop))
    f = report.findings[0]
    assert f.passed, report.summary() + f"\n{f.details}\n{f.counterexample}"
    assert f.details.get("examples", 0) >= 1 or "note" in f.details


def numpy_reference(name):
    """The float64 reference as a target (torch in, torch out; no autograd)."""
    var = V.get(name)

    def fn(q, k, v, *, causal, **extras):
        ex = {n: x.double().numpy() for n, x in extras.items()}
        out = var.reference(q.double().numpy(), k.double().numpy(), v.double().numpy(), causal=causal, **ex)
        return torch.as_tensor(np.asarray(out)).to(q.dtype)

    return fn


REF_PROPS = (
    "agreement",
    "rows-sum-to-one",
    "convex-hull",
    "permutation-equivariance",
    "causality",
    "state-bound",
    "qk-scale-invariance",
    "v-scale-invariance",
    "weight-range",
    "unnormalised-growth",
    "row-normalisation",
)


@pytest.mark.parametrize(
    "name",
    [
        "softmax",
        "linear-elu",
        "performer-positive",
        "qknorm-softmax",
        "transnormer-norm",
        "gla",
        "retnet",
        "linear-unnormalised",
    ],
)
def test_reference_passes(name):
    var = V.get(name)
    for causal in _modes(var):
        props = [p.name for p in P.applicable(var, causal, {}, dtype="float64") if p.name in REF_PROPS]
        kinds = BOUNDED if "random-features" in var.declares else None
        report = check(
            numpy_reference(name),
            name,
            causal=causal,
            dtype="float64",
            properties=props,
            domain={**SMALL, "kinds": kinds},
        )
        assert report.passed, report.summary()


BROKEN = [
    # small: the unstabilised features overflow, and every shrink step then escalates the oracle to mpmath
    (performer_without_stabiliser, "performer-positive", False, "float32", "agreement",
     {"kinds": ["outliers"], "max_n": 24, "max_d": 8}),
    (softmax_leaking_one_future_token, "softmax", True, "float32", "causality", None),
    (linear_with_huge_eps, "linear-elu", False, "float32", "rows-sum-to-one", None),
    (linear_with_detached_features, "linear-elu", False, "float32", "gradcheck", None),
    (gla_with_inverted_decay, "gla", True, "float32", "state-bound", None),
    (linear_with_position_bias, "linear-elu", False, "float32", "permutation-equivariance", None),
    (qknorm_without_key_norm, "qknorm-softmax", False, "float32", "qk-scale-invariance", None),
    (qknorm_with_doubled_temperature, "qknorm-softmax", False, "float32", "weight-range", None),
    (normattention_without_norm, "transnormer-norm", False, "float32", "v-scale-invariance", None),
    (unnormalised_times_n, "linear-unnormalised", False, "float32", "unnormalised-growth", None),
    (softmax_shifted, "softmax", False, "float32", "convex-hull", None),
    (softmax_amplified_values, "softmax", False, "float64", "jacobian-norm", None),
    (softmax_amplified_values, "softmax", False, "float64", "depth-growth", None),
    (coarse_output, "linear-elu", False, "bfloat16", "low-precision", None),
    (performer_with_halved_rows, "performer-positive", False, "float32", "row-normalisation", None),
]


@pytest.mark.parametrize("fn,name,causal,dtype,prop,domain", BROKEN, ids=[f"{b[0].__name__}-{b[4]}" for b in BROKEN])
def test_broken_implementation_fails_its_property(fn, name, causal, dtype, prop, domain):
    broken = check(fn, name, causal=causal, dtype=dtype, properties=[prop], domain=domain)
    assert not broken.passed, broken.summary()
    f = broken.findings[0]
    assert f.counterexample is not None and f.arrays is not None  # the shrunk input is reported
    # the same property on the builtin form of the same variant, same domain, passes
    builtin = check(f"builtin:{name}", causal=causal, dtype=dtype, properties=[prop], domain=domain or None)
    if prop == "agreement":  # the stabilised builtin still underflows on outliers (known); use a bounded domain
        builtin = check(f"builtin:{name}", causal=causal, dtype=dtype, properties=[prop], domain={"kinds": BOUNDED})
    assert builtin.passed, builtin.summary()


def test_known_failure_modes_are_found():
    """Real failure modes, reported (not hidden): relu features give zero denominators, trig features
    give negative ones, and FAVOR+ features underflow for large norms (0/0 rows) in every dtype."""
    relu = check("builtin:linear-relu", properties=["normaliser-margin"])
    assert not relu.passed and relu.findings[0].details["margin"] <= 0
    trig = check("builtin:performer-trig", properties=["normaliser-margin"])
    assert not trig.passed and trig.findings[0].details["min_denominator"] < 0


def test_global_key_stabiliser_is_not_causal_and_the_running_maximum_is():
    """Causal FAVOR+ with the reference code's key maximum over all tokens: a later key can move the shift
    of every earlier one, and an outlier key k_0 = 60 whose log-amplitudes (60 w - 1800) sit far below a
    benign later key's turns row 0 into 0/0, where with k_1 = k_0 it was v_0. The builtin's running
    maximum (per feature) returns v_0 bit for bit in both. Found by the property search too (seed 0,
    N <= 8)."""
    from gramcheck.targets import builtin

    w = torch.tensor([[1.0], [-1.0], [0.5], [2.0]])
    q, v = torch.ones(1, 1, 2, 1), torch.tensor([[[[3.0], [-2.0]]]])
    past = torch.tensor([[[[60.0], [60.0]]]])
    future = torch.tensor([[[[60.0], [1.0]]]])
    ours = builtin("performer-positive")
    for k in (past, future):
        assert torch.equal(torch.as_tensor(ours(q, k, v, causal=True, projection=w))[..., 0, :], v[..., 0, :])
    glob = [performer_global_key_stabiliser(q, k, v, causal=True, projection=w)[..., 0, 0] for k in (past, future)]
    assert float(glob[0]) == 3.0 and torch.isnan(glob[1]).all()
    domain = {"kinds": ["outliers"], "max_n": 8, "max_d": 2, "examples": 50}
    found = check(
        performer_global_key_stabiliser, "performer-positive", causal=True, properties=["causality"], domain=domain
    )
    assert not found.passed, found.summary()
    ours = check("builtin:performer-positive", causal=True, properties=["causality", "agreement"], domain=domain)
    assert ours.passed, ours.summary()


def test_report_views():
    r = check(softmax_shifted, "softmax", properties=["convex-hull", "agreement"], domain=SMALL)
    assert not r.passed and {f.name for f in r.failures} == {"convex-hull", "agreement"}
    assert r["convex-hull"].margin < 1
    with pytest.raises(PropertyFailure, match="counterexample"):
        r.raise_for_failures()
    assert "2 failed" in r.summary()
    d = r.to_dict()
    assert d["passed"] is False and len(d["findings"]) == 2 and "arrays" not in d["findings"][0]


def test_applicable_properties_follow_declared_tags():
    names = {p.name for p in P.applicable("linear-elu", False)}
    assert {"agreement", "rows-sum-to-one", "convex-hull", "permutation-equivariance", "jacobian-norm"} <= names
    assert "causality" not in names and "state-bound" not in names and "low-precision" not in names
    assert "causality" in {p.name for p in P.applicable("linear-elu", True)}
    assert "low-precision" in {p.name for p in P.applicable("softmax", False, dtype="bfloat16")}
    assert "state-bound" not in {p.name for p in P.applicable("retnet", True, {"group_norm": True})}
    assert "energy-share" in {p.name for p in P.applicable("softmax", False, include_diagnostics=True)}
    with pytest.raises(ValueError, match="^properties: got 'nope'"):
        P.get("nope")


def test_energy_share_flags_rank_one_attention():
    """Diagnostic: identical keys make phi(Q) phi(K)^T rank one (share 1); orthogonal ones do not."""
    n, d = 6, 6
    q = np.eye(n, d)[None, None] * 2.0
    k_same = np.ones((1, 1, n, d))
    ok = check("builtin:linear-relu", properties=["energy-share"], domain=SMALL)  # random inputs
    from gramcheck.properties.conditioning import energy_share
    from gramcheck.strategies import AttentionInputs
    from gramcheck.targets import builtin

    t = builtin("linear-relu")
    flat = energy_share(t, AttentionInputs(q, k_same, q), causal=False)
    spread = energy_share(t, AttentionInputs(q, q, q), causal=False)
    assert not flat.passed and flat.measured == pytest.approx(1.0)
    assert spread.passed and spread.measured == pytest.approx(1 / n)
    assert ok.findings[0].name == "energy-share"


# ------------------------------------------------------------------------------------------------------
# random-feature kernels (statistical, false-alarm rate alpha = 1e-6 each)
# ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["positive", "hyperbolic", "trig"])
def test_favor_unbiased_and_mse_match_lemma_2(kind):
    assert K.kernel_unbiased(kind).passed
    f = K.kernel_mse(kind)
    assert f.passed, f
    # the MSE formula is an equality: the sample MSE / theory ratios are near 1 (tight)
    assert all(0.75 < r < 1.35 for r in f.details["ratio"]), f.details["ratio"]


def test_orf_does_no_worse_than_theorem_2():
    for m in (4, 16):
        f = K.orf_mse(m=m, d=16)
        assert f.passed, f


def test_a_biased_sampler_is_detected():
    def scaled(m, d, seed):  # rows 1.2 times too long: E[phi(x) . phi(y)] != exp(x . y)
        return 1.2 * K.iid_sampler(m, d, seed)

    assert not K.kernel_unbiased("positive", sampler=scaled).passed
    assert not K.kernel_mse("positive", sampler=scaled).passed


def test_iid_passed_off_as_orthogonal_is_detected():
    assert K.orf_conditioning(K.orf_sampler).passed
    f = K.orf_conditioning(K.iid_sampler)
    assert not f.passed and f.measured > 1e6
    assert K.orf_conditioning(K.orf_sampler, dtype="float32").passed


def test_domain_object_and_examples_count():
    r = check("builtin:softmax", properties=["agreement"], domain=Domain(max_n=4, max_d=2, examples=3))
    assert r.findings[0].details["examples"] == 3 and r.domain["max_n"] == 4


def test_qk_scale_invariance_never_scales_a_row_past_the_dtypes_range():
    """A heavy-tailed float16 query row of 2e4 times the property's scale 4 was inf, and the target rightly refused
    it (the default float16 check of builtin:gated-deltanet failed qk-scale-invariance at inf). Such a row is scaled
    by the reciprocal instead: the builtin passes, and every scaled input stays finite."""
    import gramcheck.properties.invariants as I
    from gramcheck.inputs import draw_extras
    from gramcheck.strategies import AttentionInputs
    from gramcheck.targets import builtin
    from gramcheck.variants import get

    assert np.all(np.isfinite(I._rows_scaled(np.full((1, 1, 1, 9), 2.0e4), np.full((1, 1, 1, 1), 4.0), "float16")))
    dims = {"B": 1, "H": 1, "N": 1, "dk": 9, "dv": 9}
    extras = draw_extras(get("gated-deltanet").inputs, dims, dtype="float16", seed=0)
    t = builtin("gated-deltanet", dtype="float16")
    for j in range(8):  # the property's scales come from the example's bytes: eight examples, eight draws
        x = np.full((1, 1, 1, 9), 2.0e4 + 16 * j)
        ex = AttentionInputs(x, x / 1e4, x / 1e4, extras, "heavy-tail", "float16", {})
        assert I.qk_scale_invariance(t, ex, causal=True).passed
