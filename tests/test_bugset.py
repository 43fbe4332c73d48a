"""The bug set of benchmarks/bugset (real bugs from peers' trackers with their upstream-fixed twins) is
well formed: unique ids, a tracker thread each, a known variant, and a fixed twin that computes the
variant's definition (float64, across a chunk boundary, two batch rows and heads). Whether gramcheck
catches the bugs is measured by benchmarks/bugset/run.py (benchmarks/RESULTS.md), not asserted here."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.bugset.run import cases
from gramcheck import variants
from gramcheck.inputs import draw_extras

CASES = cases()


def test_the_bug_set_is_well_formed():
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)
    assert len({c.source for c in CASES}) == len(CASES)
    for c in CASES:
        assert c.source.startswith("https://github.com/"), c.id
        assert c.variant in variants.names(), c.id
        assert c.buggy is not c.fixed and c.summary, c.id


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_fixed_twin_computes_the_definition(case):
    var = variants.get(case.variant)
    rng = np.random.default_rng(0)
    B, H, N, d = 2, 2, 70, 4
    q, k, v = (rng.standard_normal((B, H, N, d)) for _ in range(3))
    extras = draw_extras(var.inputs, {"B": B, "H": H, "N": N, "dk": d, "dv": d, "m": 8}, dtype="float64", seed=1)
    ref = var.reference(q, k, v, causal=case.causal, **extras, **case.params)
    tensors = {n: torch.as_tensor(x) for n, x in {"q": q, "k": k, "v": v, **extras}.items()}
    with torch.no_grad():
        out = case.fixed(causal=case.causal, **tensors)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-9, atol=1e-12 * np.max(np.abs(ref)))


@pytest.mark.parametrize("case", [c for c in CASES if c.flaw], ids=[c.id for c in CASES if c.flaw])
def test_a_flaw_of_an_upstream_fix_is_shown_not_asserted(case):
    """A fixed twin reported as failing through its upstream fix's own flaw (``Case.flaw``) must show that flaw
    directly, outside gramcheck, or run.py would hide a false alarm as a flaw."""
    assert case.shows_flaw is not None and case.shows_flaw(), case.id
    assert case.flaw_properties, case.id  # what the flaw fails: any other failure of the twin is a false alarm


def test_cases_with_their_own_properties_name_known_ones():
    from gramcheck.properties import names

    for c in CASES:
        assert c.properties is None or set(c.properties) <= set(names()), c.id


def test_a_fixed_twin_failing_beyond_its_flaw_is_a_false_alarm():
    from benchmarks.bugset.run import fails_through_its_flaw

    case = next(c for c in CASES if c.flaw_properties == ("causality",))
    run = {"error": None, "cpu_s": 1.0}
    assert fails_through_its_flaw(case, [{**run, "failed": ["causality inf/1"]}])
    assert not fails_through_its_flaw(case, [{**run, "failed": ["causality inf/1", "agreement 37/1"]}])
    assert not fails_through_its_flaw(case, [{**run, "failed": []}])
    assert not fails_through_its_flaw(case, [{**run, "failed": ["causality inf/1"], "error": "ValueError: x"}])
