"""Adapters against the real packages (skipped with the reason where a package cannot be installed)."""

import pytest

from gramcheck import check
from gramcheck.adapters import fla, performer

needs_fla = pytest.mark.skipif(not fla.available(), reason="fla-core (flash-linear-attention) is not installed")
needs_performer = pytest.mark.skipif(not performer.available(), reason="performer-pytorch is not installed")
D = 4
DOMAIN = {"min_d": D, "max_d": D, "max_n": 16}


@needs_fla
@pytest.mark.parametrize("name", ["gla", "retention", "linear_attn"])
def test_fla_naive_references_agree_in_float32(name):
    variant, params = fla.params(name, D)
    props = ["agreement", "causality", "finite-gradients"] + (["state-bound"] if name != "linear_attn" else [])
    r = check(getattr(fla, name), variant, causal=True, params=params, domain=DOMAIN, properties=props)
    assert r.passed, r.summary()


@needs_fla
def test_fla_naive_computes_in_float32_even_for_float64_inputs():
    """The naive code calls .float(). In float64 that is a real finding of agreement: its error is
    float32-sized, far beyond the float64 rounding bound. Its gradients are the float32 computation's own,
    correct to float32's rounding: gradcheck judges them with the noise of that rounding and says so (with
    fixed float32 tolerances it failed them, a false alarm: proofs/jacobian-bounds.md)."""
    variant, params = fla.params("retention", D)
    r = check(
        fla.retention,
        variant,
        causal=True,
        dtype="float64",
        params=params,
        domain=DOMAIN,
        properties=["agreement", "gradcheck"],
    )
    assert not r["agreement"].passed and r["agreement"].measured > 100
    assert r["gradcheck"].passed and r["gradcheck"].details["computes_in"] == "float32"


@needs_performer
def test_performer_pytorch_fast_attention_matches_the_definition():
    kinds = ("gaussian", "spectrum", "near-duplicate", "anti-aligned", "heavy-tail")
    r = check(
        performer.fast_attention,
        performer.VARIANT,
        params=performer.PARAMS,
        domain={"max_d": 4, "max_n": 16, "kinds": kinds},
        properties=["agreement", "rows-sum-to-one", "convex-hull", "permutation-equivariance"],
    )
    assert r.passed, r.summary()
    # without the shift convention (its eps = 1e-4 bias depends on the shift) agreement fails: the
    # adapter's parameters are what makes the definitions equal
    wrong = check(
        performer.fast_attention,
        performer.VARIANT,
        params={"feature_eps": 1e-4},
        domain={"max_d": 4, "max_n": 16, "kinds": kinds},
        properties=["agreement"],
    )
    assert not wrong.passed


@needs_performer
def test_performer_adapter_refuses_causal():
    r = check(
        performer.fast_attention,
        performer.VARIANT,
        causal=True,
        params=performer.PARAMS,
        properties=["agreement"],
        domain={"max_n": 4, "max_d": 2, "examples": 2},
    )
    assert not r.passed and r.findings[0].failure == "raised" and "non-causal only" in r.findings[0].details["error"]
