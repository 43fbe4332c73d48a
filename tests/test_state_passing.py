"""State passing: the builtin forms of gla, retnet and linear-unnormalised pass the three state properties;
a target that ignores initial_state and one that returns its state transposed fail; the bound's
propagation term is exact where it can be (q >= 0, a non-negative state error)."""

import itertools

import numpy as np
import pytest
from broken import (
    gla_decode_step_without_decay,
    gla_ignoring_initial_state,
    gla_state_as_dv_dk,
    gla_state_stored_in_dtype,
    gla_transposed_state,
    gla_uninitialised_state,
)

from gramcheck import properties as P
from gramcheck import variants as V
from gramcheck.api import check
from gramcheck.precision import round_to
from gramcheck.properties.state import (
    chain_segments,
    propagation,
    split_point,
    state_agreement,
    state_chain,
    state_split,
)
from gramcheck.strategies import AttentionInputs
from gramcheck.targets import Target, builtin

STATE_PROPS = ["state-agreement", "state-split", "state-chain", "zero-initial-state"]
DOMAIN = {"max_n": 70, "max_d": 4, "examples": 6}


@pytest.mark.parametrize("name", ["gla", "retnet", "linear-unnormalised"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_builtin_forms_pass_state_properties(name, dtype):
    assert {p.name for p in P.applicable(name, True, {})} >= set(STATE_PROPS)
    r = check(f"builtin:{name}", causal=True, dtype=dtype, properties=STATE_PROPS, domain=DOMAIN)
    assert r.passed, r.summary() + str([f.details for f in r.findings])
    assert r["zero-initial-state"].details["bit_identical"]


def test_state_properties_apply_only_to_state_passing_variants():
    assert "state-agreement" not in {p.name for p in P.applicable("linear-elu", True, {})}
    assert "state-split" not in {p.name for p in P.applicable("retnet", True, {"group_norm": True})}
    with pytest.raises(ValueError, match="^initial_state: variant 'softmax'"):
        V.get("softmax").reference(*np.ones((3, 1, 1, 2, 2)), causal=True, initial_state=np.ones((1, 1, 2, 2)))


@pytest.mark.parametrize("prop", ["state-agreement", "state-split"])
def test_ignoring_the_initial_state_fails(prop):
    r = check(gla_ignoring_initial_state, "gla", causal=True, properties=[prop], domain=DOMAIN)
    f = r.findings[0]
    assert not f.passed and f.measured > 10, r.summary()
    assert f.details["entry"].startswith(("out[", "final_state[")) and f.counterexample is not None


def test_transposed_state_fails():
    r = check(gla_transposed_state, "gla", causal=True, properties=["state-agreement"], domain={**DOMAIN, "max_d": 3})
    f = r.findings[0]
    assert not f.passed, r.summary()
    # a transposed state is invisible at d = 1: the shrunk example keeps d >= 2 and square
    assert f.counterexample["shape"][-1] >= 2


def test_propagation_term_is_exact_for_nonnegative_queries():
    rng = np.random.default_rng(3)
    q, k, v = np.abs(rng.standard_normal((3, 1, 2, 9, 3)))
    g = -rng.uniform(0, 2, (1, 2, 9, 3))
    ex = AttentionInputs(q, k, v, {"g": g}, dtype="float64")
    t = builtin("gla", dtype="float64")
    s0 = rng.standard_normal((1, 2, 3, 3))
    err = np.abs(rng.standard_normal((1, 2, 3, 3)))
    var = V.get("gla")
    o1, s1 = var.reference(q, k, v, causal=True, g=g, initial_state=s0, output_final_state=True)
    o2, s2 = var.reference(q, k, v, causal=True, g=g, initial_state=s0 + err, output_final_state=True)
    p_out, p_st = propagation(t, ex, err)
    np.testing.assert_allclose(p_out, np.abs(o2 - o1), rtol=1e-9)
    np.testing.assert_allclose(p_st, np.abs(s2 - s1), rtol=1e-9)


@pytest.mark.parametrize("name", ["deltanet", "gated-deltanet"])
def test_propagation_bounds_a_state_error_through_the_delta_rules_signed_transitions(name):
    """The delta rule's transitions alpha (I - beta k k^T) are signed: the reference run on err (>= 0), as
    ``propagation`` did for every variant, is not a bound on the change of out and S_N over |E| <= err (found
    here for some sign pattern of E). |s q_t^T P_t| err and |P_N| err (``transitions``) are, and are tight: every
    entry's bound is attained by some sign pattern (a column-norm bound, used before, is not tight)."""
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((3, 1, 1, 8, 2))
    extras = {"beta": rng.uniform(0.5, 2.0, (1, 1, 8))}
    if name == "gated-deltanet":
        extras["g"] = -rng.uniform(0.0, 0.3, (1, 1, 8))
    ex = AttentionInputs(q, k, v, extras, dtype="float64")
    t = builtin(name, dtype="float64")
    var = V.get(name)
    s0 = rng.standard_normal((1, 1, 2, 2))
    err = np.full((1, 1, 2, 2), 0.1)
    p_out, p_st = propagation(t, ex, err)
    kw = {"causal": True, "output_final_state": True, **extras}
    signed = var.reference(np.abs(q), k, np.zeros_like(v), initial_state=err, **kw)
    o, st = var.reference(q, k, v, initial_state=s0, **kw)
    missed = False
    reach_out, reach_st = np.zeros_like(p_out), np.zeros_like(p_st)
    for signs in itertools.product((-1.0, 1.0), repeat=4):
        e = err * np.reshape(signs, (1, 1, 2, 2))
        o2, st2 = var.reference(q, k, v, initial_state=s0 + e, **kw)
        assert np.all(np.abs(o2 - o) <= p_out), (signs, np.abs(o2 - o) / p_out)
        assert np.all(np.abs(st2 - st) <= p_st), (signs, np.abs(st2 - st) / p_st)
        reach_out, reach_st = np.maximum(reach_out, np.abs(o2 - o)), np.maximum(reach_st, np.abs(st2 - st))
        missed |= bool(np.any(np.abs(o2 - o) > 2 * np.abs(signed[0])))
        missed |= bool(np.any(np.abs(st2 - st) > 2 * np.abs(signed[1])))
    assert missed
    np.testing.assert_allclose(reach_out, p_out, rtol=1e-9)
    np.testing.assert_allclose(reach_st, p_st, rtol=1e-9)


def test_split_points_reach_chunk_boundaries():
    rng = np.random.default_rng(0)
    hits = set()
    for i in range(60):
        q = rng.standard_normal((1, 1, 200, 2))
        t = split_point(AttentionInputs(q, q + i, q))
        assert 1 <= t <= 199
        hits.add(t)
    assert hits & {63, 64, 65} and hits & {127, 128, 129}


def test_uninitialised_state_fails_zero_initial_state():
    r = check(
        gla_uninitialised_state, "gla", causal=True, properties=["zero-initial-state", "state-agreement"], domain=DOMAIN
    )
    assert not r["zero-initial-state"].passed and r["state-agreement"].passed, r.summary()


def test_state_of_the_wrong_shape_or_type_is_a_target_failure():
    from gramcheck.targets import Target

    t = Target(gla_state_as_dv_dk, "gla")
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 1, 1, 4, 3))
    v = rng.standard_normal((1, 1, 4, 2))
    g = -np.ones((1, 1, 4, 3))
    f = P.get("state-agreement").fn(t, AttentionInputs(q, k, v, {"g": g}, dtype="float32"), causal=True)
    assert not f.passed and f.details["failure"] == "wrong-shape" and "(B, H, d_k, d_v)" in f.details["error"]

    def no_pair(q, k, v, *, causal, g, initial_state=None, output_final_state=False):
        return V.get("gla").torch(q, k, v, causal=True, g=g, initial_state=initial_state)

    t2 = Target(no_pair, "gla")
    f2 = P.get("state-split").fn(t2, AttentionInputs(q, k, q, {"g": g}, dtype="float32"), causal=True)
    assert not f2.passed and f2.details["failure"] == "wrong-type"


@pytest.mark.parametrize("name", ["linear-unnormalised", "retnet"])
def test_a_state_larger_than_its_updates_is_rounded_every_token(name, monkeypatch):
    """A recurrent form adds every token's update to a state far larger than the update, rounding at the
    state's size each time; the definition with a state is that recurrence, so its rounding model charges
    those roundings (a quadratic S_0 + K^T V rounds once at |S|, and the builtin recurrent forms measured
    1.04-3.5 against it: proofs/state-passing.md)."""
    import gramcheck.properties.state as S

    rng = np.random.default_rng(3)
    # eight heads: RetNet's slowest head keeps gamma = 1 - 2^-12, so S_0 stays large to the end
    q, k, v = (np.float32(rng.standard_normal((1, 8, 64, 8))).astype(np.float64) for _ in range(3))
    big = np.float32(rng.standard_normal((1, 8, 8, 8)) * 1e4).astype(np.float64)  # 1e4 times the updates
    monkeypatch.setattr(S, "initial_state_of", lambda *a, **kw: big)
    target = builtin(name, dtype="float32", form="recurrent")
    f = P.get("state-agreement").fn(target, AttentionInputs(q, k, v, {}, dtype="float32"), causal=True)
    assert f.passed and f.measured > 0.05, f


def test_a_state_kernel_missing_its_batch_offset_fails_the_default_domain():
    """Right at B = 1, wrong at B >= 2: the state properties draw two batch rows (Property.min_b), and
    agreement, which draws one, passes it."""
    from broken import gla_states_of_the_first_batch_row

    r = check(gla_states_of_the_first_batch_row, "gla", causal=True, properties=["state-agreement", "agreement"])
    f = r["state-agreement"]
    assert not f.passed and f.measured > 10 and f.counterexample["shape"][0] == 2, r.summary()
    assert r["agreement"].passed, r.summary()
    # each says what it drew: the domain's one row, and the state property's two beside it
    assert f.details["max_b"] == 2 and "max_b" not in r["agreement"].details, r["agreement"].details


def test_a_certificate_says_how_many_batch_rows_the_state_properties_drew():
    """The domain records max_b = 1; the state properties draw two rows, and their entries say so."""
    from gramcheck import certify

    cert = certify("builtin:gla", causal=True, properties=["state-split", "agreement"], domain={"examples": 3}).data
    assert cert["domain"]["max_b"] == 1
    rows = {p["property"]: p["details"].get("max_b") for p in cert["properties"]}
    assert rows == {"state-split": 2, "agreement": None}, rows


@pytest.mark.parametrize(
    ("name", "params", "unit"),
    [("deltanet", {}, True), ("deltanet", {"l2norm": False}, False), ("gated-deltanet", {}, True), ("gla", {}, False)],
)
def test_written_keys_are_the_keys_the_recurrence_writes(name, params, unit):
    """The delta rule with l2norm writes unit keys (1000 times the raw keys here); without it, and for every other
    variant, the keys as given."""
    var = V.get(name)
    rng = np.random.default_rng(0)
    k = 1000 * rng.standard_normal((1, 2, 5, 4))
    extras = {"beta": np.ones((1, 2, 5)), "g": -np.ones((1, 2, 5) if name == "gated-deltanet" else (1, 2, 5, 4))}
    extras = {n: x for n, x in extras.items() if n in var.input_names}
    w = var.written_keys(k, **var.resolve_params(params), **extras)
    if unit:
        np.testing.assert_allclose(np.linalg.norm(w, axis=-1), 1.0, rtol=1e-9)  # l2norm_eps 1e-6 on |k|^2 ~ 1e7
    else:
        np.testing.assert_array_equal(w, k)


def _long_memory_gla(dtype, seed, n=130, d=8):
    rng = np.random.default_rng(seed)
    q, k, v = (round_to(rng.standard_normal((1, 1, n, d)), dtype) for _ in range(3))
    g = round_to(np.log(rng.uniform(0.99, 1.0, (1, 1, n, d))), dtype)
    return AttentionInputs(q, k, v, {"g": g}, dtype=dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_state_stored_in_the_dtype_between_calls_fails_state_chain(dtype):
    """ollama#15865: a state right within each call but returned in 16 bits is rounded whole at every decode
    call. With long memory nothing erases those roundings; 128 of them err past the rule's floor (twice one
    rounding of the final state) while one call, or two, stays within it. The builtin returns float32 states and
    is handed them back."""
    for seed in range(3):
        ex = _long_memory_gla(dtype, seed)
        bad, good = Target(gla_state_stored_in_dtype, "gla", dtype=dtype), builtin("gla", dtype=dtype)
        f = state_chain(bad, ex, causal=True)
        assert not f.passed and f.measured > 1.2 and f.details["calls"] == 129, (seed, f.measured, f.details)
        assert f.details["state_dtype"] == dtype and "rounds it whole at every call" in f.details["note"]
        assert state_agreement(bad, ex, causal=True).passed and state_split(bad, ex, causal=True).passed
        assert state_chain(good, ex, causal=True).measured < 0.3


def test_a_decode_step_that_drops_the_decay_fails_state_chain():
    r = check(gla_decode_step_without_decay, "gla", causal=True, properties=["state-chain"], domain=DOMAIN)
    f = r.findings[0]
    assert not f.passed and f.measured > 10, r.summary()
    assert f.counterexample["shape"][2] >= 2  # a prefill and at least one decode step


def test_the_chain_hands_back_the_state_each_call_returned():
    """A decode loop: one prefill from S_0, then one call per token, the last 128 tokens at most; each call after the
    first receives the state the call before returned, in its dtype (float32 from the builtin's bfloat16 calls),
    the first S_0 in the dtype of the state the prefill returns without one (found by one more call), and the
    Finding records the dtype."""
    seen = []

    def recording(q, k, v, *, causal, g, initial_state=None, output_final_state=False):
        seen.append((q.shape[-2], None if initial_state is None else initial_state.dtype))
        return V.get("gla").torch(q, k, v, causal=True, g=g, initial_state=initial_state,
                                  output_final_state=output_final_state)  # fmt: skip

    import torch

    ex = _long_memory_gla("bfloat16", 0, n=140, d=2)
    assert [s.q.shape[-2] for s in chain_segments(ex)] == [12] + [1] * 128
    t = Target(recording, "gla", dtype="bfloat16")
    assert state_chain(t, ex, causal=True).details["state_dtype"] == "float32"
    assert seen[:2] == [(12, None), (12, torch.float32)] and seen[2:] == [(1, torch.float32)] * 128


def test_a_state_in_the_dtype_of_the_state_given_passes_state_chain():
    """A kernel whose final state takes the dtype of the initial state it is given (empty_like(h0)), float32
    without one, is correct in a loop that hands its states back: its cache holds float32, and S_0 is handed to it
    so. (Started from S_0 in the inputs' dtype, the loop failed it at 1.05-2.41.)"""
    import torch

    def like_initial(q, k, v, *, causal, g, initial_state=None, output_final_state=False):
        res = _gla_state_pair(q, k, v, g, initial_state)
        return res[0], res[1].to(torch.float32 if initial_state is None else initial_state.dtype)

    for seed in range(3):
        ex = _long_memory_gla("bfloat16", seed)
        f = state_chain(Target(like_initial, "gla", dtype="bfloat16"), ex, causal=True)
        assert f.passed and f.measured < 0.3 and f.details["state_dtype"] == "float32", (seed, f.measured)


def _gla_state_pair(q, k, v, g, initial_state):
    return V.get("gla").torch(q, k, v, causal=True, g=g, initial_state=initial_state, output_final_state=True)


@pytest.mark.parametrize("name", ["gla", "gated-deltanet", "mamba2"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_decode_path_of_its_own_passes_state_chain(name, dtype):
    """A correct target that computes a decode step otherwise than its prefill (the chunked form for several
    tokens, the token recurrence in float32 for one, as serving kernels split prefill and decode) passes."""
    var = V.get(name)

    def split_paths(q, k, v, *, causal, initial_state=None, output_final_state=False, **extras):
        form = "recurrent" if q.shape[-2] == 1 else "chunked"
        return var.torch(q, k, v, causal=True, form=form, initial_state=initial_state,
                         output_final_state=output_final_state, **extras)  # fmt: skip

    r = check(Target(split_paths, name, dtype=dtype), causal=True, properties=["state-chain"], domain=DOMAIN)
    assert r.passed, r.summary()
