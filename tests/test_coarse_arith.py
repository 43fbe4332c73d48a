"""Coarse ball arithmetic (one radius rule per tensor, gramcheck/coarse_arith.py): its midpoints are the plain
float64 evaluation, its radius contains the definition evaluated in mpmath at 400 bits and is never below
the entrywise float64 ball's radius (proofs/ball-arithmetic.md, "Coarse first pass"); broken rules are
caught; the oracle's first pass returns the same values and bounds that hold."""

import numpy as np
import pytest
from helpers import causal_modes, make_inputs
from test_model_certificate import CASES, _case

import gramcheck.coarse_arith as coarse
from gramcheck import variants as V
from gramcheck.arith import BALL_F64, F64, MP
from gramcheck.coarse_arith import COARSE_F64, CoarseArith
from gramcheck.oracle import truth

HI = MP(400)


def _distance(value, exact_mp):
    """|value - exact| computed in mpmath, rounded up to float64."""
    with HI.context():
        d = HI.to_float64(np.abs(np.asarray(exact_mp, dtype=object) - HI.asarray(value)))
    return d * (1 + 2.0**-50)


def _check(name, q, k, v, kw):
    """(contained, dominates, same values) of the coarse evaluation of ``name`` on q, k, v."""
    var = V.get(name)
    value, bound, undefined = COARSE_F64.certify64(var.reference(q, k, v, arith=COARSE_F64, **kw))
    plain = np.asarray(var.reference(q, k, v, arith=F64, **kw))
    entrywise = BALL_F64.radius(var.reference(q, k, v, arith=BALL_F64, **kw))
    exact = var.reference(q, k, v, arith=HI, **kw)
    ok = ~undefined
    contained = bool(np.all(_distance(np.where(ok, value, 0.0), exact)[ok] <= bound[ok]))
    return contained, bool(np.all(bound >= entrywise)), np.array_equal(value, plain, equal_nan=True)


@pytest.mark.parametrize("name", V.names())
def test_every_definition_is_enclosed_and_dominates(name):
    q, k, v, extras = make_inputs(name, N=7, d=3, H=2, seed=3)
    for causal in causal_modes(name):
        contained, dominates, same = _check(name, q, k, v, {"causal": causal, **extras})
        assert contained and dominates and same, (name, causal, contained, dominates, same)


@pytest.mark.parametrize("case", CASES)
def test_adversarial_inputs_are_enclosed_and_dominate(case):
    name, q, k, v, kw = _case(case)
    contained, dominates, same = _check(name, q, k, v, kw)
    assert contained and dominates and same, (case, contained, dominates, same)


def test_radius_is_not_vacuous_on_benign_inputs():
    """Within 2^12 of the entrywise ball's largest radius: coarse, but a useful certificate."""
    q, k, v, extras = make_inputs("softmax", N=64, d=16, H=1, seed=0)
    var = V.get("softmax")
    bound = COARSE_F64.radius(var.reference(q, k, v, arith=COARSE_F64, **extras))
    entrywise = BALL_F64.radius(var.reference(q, k, v, arith=BALL_F64, **extras))
    assert np.all(np.isfinite(bound)) and bound.max() <= 2.0**12 * entrywise.max()


def _failures():
    """Cases (every adversarial case and every definition on small inputs) whose check fails."""
    bad = [c for c in CASES if not all(_check(*_case(c))[:2])]
    for name in V.names():
        q, k, v, extras = make_inputs(name, N=7, d=3, H=2, seed=3)
        for causal in causal_modes(name):
            if not all(_check(name, q, k, v, {"causal": causal, **extras})[:2]):
                bad.append((name, causal))
    return bad


def test_a_radius_divided_by_16_is_caught(monkeypatch):
    radius = CoarseArith.radius
    monkeypatch.setattr(CoarseArith, "radius", lambda self, x: radius(self, x) / 16)
    assert _failures()


def test_a_matmul_rule_without_gamma_n_is_caught(monkeypatch):
    monkeypatch.setattr(coarse, "gamma", lambda n: 0.0)
    assert _failures()


def test_non_finite_midpoints_have_no_finite_radius():
    with COARSE_F64.context():
        x = COARSE_F64.exp(COARSE_F64.asarray(np.array([1.0, 800.0])))  # exp(800) overflows
        _, bound, undefined = COARSE_F64.certify64(x * 2.0)
    assert undefined.tolist() == [False, True] and np.all(np.isinf(bound))


def test_quotient_by_a_ball_reaching_zero_is_unbounded():
    with COARSE_F64.context():
        b = COARSE_F64.sin(COARSE_F64.asarray(np.array([np.pi, 1.0])))  # sin(pi) ~ 1e-16 +- 2u
        q = COARSE_F64.div(COARSE_F64.asarray(np.ones(2)), b - 1.2246467991473532e-16)
    assert np.all(np.isinf(COARSE_F64.radius(q)))


@pytest.mark.parametrize("name", ["softmax", "linear-elu", "retnet"])
def test_truth_on_benign_inputs_is_the_coarse_pass(name):
    q, k, v, extras = make_inputs(name, N=16, d=4, H=1, seed=1)
    causal = causal_modes(name)[-1]
    var = V.get(name)
    t = truth(name, q, k, v, causal=causal, digits=6, **extras)
    assert t.arithmetic == "float64-coarse" and t.met and not t.escalated and t.tried == ["float64-coarse"]
    ball = var.reference(q, k, v, causal=causal, arith=BALL_F64, **extras)
    assert np.array_equal(t.value, BALL_F64.to_float64(ball))
    exact = var.reference(q, k, v, causal=causal, arith=HI, **extras)
    assert np.all(_distance(t.value, exact) <= t.bound)
    assert np.all(t.bound <= 1e-6 * np.abs(t.value))


def test_truth_on_cancelling_inputs_falls_back_and_escalates():
    name, q, k, v, kw = _case("linear-elu-cancel")
    t = truth(name, q, k, v, digits=10, **kw)
    assert t.tried[:2] == ["float64-coarse", "float64"] and t.escalated and t.met
    exact = V.get(name).reference(q, k, v, arith=HI, **kw)
    assert np.all(_distance(t.value, exact) <= t.bound)


@pytest.mark.parametrize("rows", [1, 2])
def test_products_of_a_small_operand_against_a_large_one(rows):
    """A (rows x 8) against B (8 x 8), the bound by max ||A_i:||_1 max |B| (a recurrence's query against its
    state), fuzzy and exact operands: contained and dominating."""
    rng = np.random.default_rng(rows)
    a0, b0 = rng.standard_normal((2, rows, 8)), rng.standard_normal((2, 8, 8))

    def formula(ar):
        a, b = ar.asarray(a0), ar.asarray(b0)
        fa, fb = ar.exp(a) * a - 0.5, ar.sin(b) * 3.0 + b
        return [ar.matmul(x, y) for x in (a, fa) for y in (b, fb)]

    with COARSE_F64.context(), BALL_F64.context():
        coarse_out, ball_out = formula(COARSE_F64), formula(BALL_F64)
    with HI.context():
        exact = formula(HI)
    for c, bl, ex in zip(coarse_out, ball_out, exact, strict=True):
        value, bound, _ = COARSE_F64.certify64(c)
        assert np.all(_distance(value, ex) <= bound) and np.all(bound >= BALL_F64.radius(bl))


# --- a gated recurrence as one rule ------------------------------------------------------------------
RECURRENCES = ["gla", "retnet", "linear-unnormalised", "performer-positive"]


def _recurrence(name, seed=5, N=150, d=4):
    """Inputs over three blocks of states (N = 150 > 2 * 64), from a drawn initial state with the final
    state returned where the variant passes states (causal FAVOR+, normalised, has none): (variant, q, k,
    v, keyword arguments)."""
    var = V.get(name)
    q, k, v, extras = make_inputs(name, N=N, d=d, H=2, seed=seed)
    kw = {"causal": True, **extras}
    if "state-passing" in var.tags():
        kw.update(initial_state=np.random.default_rng(seed).standard_normal((1, 2, d, d)), output_final_state=True)
    return var, q, k, v, kw


def _recurrence_check(name, **kw):
    """(contained, dominates, same values) of the output and of the final state."""
    var, q, k, v, kw = _recurrence(name, **kw)
    every = [var.reference(q, k, v, arith=ar, **kw) for ar in (COARSE_F64, F64, BALL_F64, HI)]
    if not kw.get("output_final_state"):
        every = [[x] for x in every]
    out = []
    for c, p, b, e in zip(*every, strict=True):
        value, bound, undefined = COARSE_F64.certify64(c)
        assert not undefined.any()
        out.append(
            (
                bool(np.all(_distance(value, e) <= bound)),
                bool(np.all(bound >= BALL_F64.radius(b))),
                np.array_equal(value, np.asarray(p)),
            )
        )
    return out


@pytest.mark.parametrize("name", RECURRENCES)
def test_a_gated_recurrence_over_several_blocks_is_enclosed_and_dominates(name):
    """The whole-recurrence rule (``CoarseArith.enclose_gated_recurrence``) for the output and the final
    state, across blocks of kept states, with and without decays."""
    checks = _recurrence_check(name)
    assert checks == [(True, True, True)] * len(checks) and len(checks) == 1 + (name != "performer-positive")


def test_the_recurrence_rule_is_nearly_tight(monkeypatch):
    """The rule's radii divided by 4 fall below the entrywise balls' somewhere: a rule 4x looser than needed,
    or one missing a term of that size, would fail the dominance check above."""
    rule = CoarseArith.enclose_gated_recurrence

    def quartered(self, *a):
        o, s = rule(self, *a)
        return tuple(coarse.CoarseBall(self, x.mid, x.rad / 4, x.rel / 4) for x in (o, s))

    monkeypatch.setattr(CoarseArith, "enclose_gated_recurrence", quartered)
    assert any(not dominates for name in RECURRENCES for _, dominates, _ in _recurrence_check(name))


def test_the_recurrence_rule_is_no_looser_than_one_rule_per_operation(monkeypatch):
    """On benign inputs the whole-recurrence radius is at most the per-operation coarse rules' (which it
    replaced) times 1.5."""
    var, q, k, v, kw = _recurrence("gla")
    whole = [COARSE_F64.radius(x).max() for x in var.reference(q, k, v, arith=COARSE_F64, **kw)]
    monkeypatch.delattr(CoarseArith, "enclose_gated_recurrence")
    steps = [COARSE_F64.radius(x).max() for x in var.reference(q, k, v, arith=COARSE_F64, **kw)]
    assert all(w <= 1.5 * s for w, s in zip(whole, steps, strict=True)), (whole, steps)


def test_the_recurrence_rule_is_tight_where_every_entry_is_alike():
    """Constant q, k, v, decays and initial state: every entry of a state is alike, so the maxima the rule
    takes lose nothing, and its radii of the final state and of the last token's output (the largest, the
    one radius the rule gives every token) equal the entrywise balls' to 1e-9, from above. A rule missing
    any of its rounding terms (the decay's product, the update's, the sum's) falls below them here."""
    N, d = 150, 4
    var = V.get("gla")
    q, k, v = (np.full((1, 2, N, d), c) for c in (0.7, 1.3, 0.9))
    g = np.full((1, 2, N, d), np.log(0.95) * var.params["gate_tau"])
    kw = {"causal": True, "g": g, "initial_state": np.full((1, 2, d, d), 0.5), "output_final_state": True}
    whole = var.reference(q, k, v, arith=COARSE_F64, **kw)
    entrywise = var.reference(q, k, v, arith=BALL_F64, **kw)
    for c, b in zip(whole, entrywise, strict=True):
        ratio = COARSE_F64.radius(c) / BALL_F64.radius(b)
        last = ratio[..., -1, :] if ratio.shape[-2] == N else ratio
        assert 1 <= ratio.min() and last.max() <= 1 + 1e-9, (ratio.min(), last.max())
