"""Faulty targets become failing Findings of their own kind; bad input gets a clear error naming the
argument; the run continues to the other properties and the certificate records it."""

import json
import threading

import numpy as np
import pytest
import torch

from gramcheck import CertificateError, Domain, certify, check, verify
from gramcheck import variants as V
from gramcheck.certificate import load

SMALL = {"max_n": 6, "max_d": 3, "examples": 4}
PROPS = ["determinism", "agreement", "causality"]


def ok(q, k, v, *, causal):
    return V.get("linear-elu").torch(q, k, v, causal=causal)


def raises(q, k, v, *, causal):
    raise RuntimeError("boom")


def wrong_shape(q, k, v, *, causal):
    return ok(q, k, v, causal=causal)[..., :-1, :]


def wrong_dtype(q, k, v, *, causal):
    return ok(q, k, v, causal=causal).double()


def wrong_type(q, k, v, *, causal):
    return ok(q, k, v, causal=causal).numpy()


def returns_nan(q, k, v, *, causal):
    return ok(q, k, v, causal=causal) * float("nan")


def mutates(q, k, v, *, causal):
    out = ok(q, k, v, causal=causal)
    q.mul_(2.0)
    return out


_calls = {"n": 0}


def nondeterministic(q, k, v, *, causal):
    _calls["n"] += 1
    return ok(q, k, v, causal=causal) + _calls["n"] * 1e-3


_release = threading.Event()


def hangs(q, k, v, *, causal):
    _release.wait(5.0)  # bounded: the abandoned worker thread ends by itself
    return ok(q, k, v, causal=causal)


@pytest.mark.parametrize(
    "fn,kind,prop",
    [
        (raises, "raised", "agreement"),
        (wrong_shape, "wrong-shape", "agreement"),
        (wrong_dtype, "wrong-dtype", "agreement"),
        (wrong_type, "wrong-type", "agreement"),
        (mutates, "mutates-inputs", "agreement"),
        (nondeterministic, "nondeterministic", "determinism"),
    ],
)
def test_faulty_target_is_a_failing_finding_of_its_kind(fn, kind, prop):
    r = check(fn, "linear-elu", causal=True, properties=PROPS, domain=SMALL)
    assert len(r.findings) == 3  # the run continued to every property
    f = r[prop]
    assert not f.passed and f.failure == kind, f
    assert f.counterexample is not None and f.details["error"]


def test_nan_output_fails_agreement_with_the_worst_entry():
    r = check(returns_nan, "linear-elu", properties=["agreement"], domain=SMALL)
    f = r["agreement"]
    assert not f.passed and f.measured == float("inf") and f.failure is None


def test_hanging_target_times_out_and_the_run_continues():
    """One call per property waits out the timeout; the hanging target is not called again."""
    calls = {"n": 0}

    def counted(q, k, v, *, causal):
        calls["n"] += 1
        return hangs(q, k, v, causal=causal)

    try:
        r = check(
            counted,
            "linear-elu",
            properties=["agreement", "determinism"],
            timeout=0.2,
            domain={"max_n": 4, "max_d": 2, "examples": 5},
        )
        assert [f.failure for f in r.findings] == ["timeout", "timeout"]
        assert all(not f.passed and "did not return within 0.2 s" in f.details["error"] for f in r.findings)
        assert calls["n"] == 2
    finally:
        _release.set()


def test_certificate_records_target_failures(tmp_path):
    cert = certify(raises, "linear-elu", properties=["agreement"], domain=SMALL, out=str(tmp_path / "c.json"))
    data = load(tmp_path / "c.json")
    entry = data["properties"][0]
    assert not cert.passed and entry["failure"] == "raised" and "boom" in entry["details"]["error"]
    assert entry["counterexample_file"] and (tmp_path / entry["counterexample_file"]).exists()
    with np.load(tmp_path / entry["counterexample_file"]) as z:
        assert set(z.files) == {"q", "k", "v"}


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"variant": "nope"}, r"^variant: got 'nope'; expected one of"),
        ({"properties": ["nope"]}, r"^properties: got 'nope'"),
        ({"profile": "fast"}, r"^profile: got 'fast'"),
        ({"dtype": "int8"}, r"^dtype: got 'int8'"),
        ({"domain": {"max_n": 0}}, r"^domain.max_n: got 0; expected a positive integer"),
        ({"domain": {"max_d": -3}}, r"^domain.max_d: got -3"),
        ({"domain": {"examples": 0}}, r"^domain.examples: got 0"),
        ({"domain": {"kinds": ["nope"]}}, r"^domain.kinds: got 'nope'"),
        ({"domain": {"min_n": 5, "max_n": 2}}, r"^domain: got N in \[5, 2\]"),
        ({"params": {"nope": 1}}, r"^nope: not a hyperparameter of variant 'linear-elu'"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, match):
    base = {"variant": "linear-elu", "properties": ["agreement"], "domain": SMALL}
    with pytest.raises(ValueError, match=match):
        check(ok, **{**base, **kwargs})


def test_bad_targets_and_modes():
    with pytest.raises(ValueError, match="^target: got 42"):
        check(42, "softmax")
    with pytest.raises(ValueError, match="^target: cannot import module 'no_such_module_xyz'"):
        check("no_such_module_xyz:f", "softmax")
    with pytest.raises(ValueError, match="^target: module 'math' has no attribute 'nope'"):
        check("math:nope", "softmax")
    with pytest.raises(ValueError, match="^target: 'math:pi' is a float; expected a callable"):
        check("math:pi", "softmax")
    with pytest.raises(ValueError, match="^variant: got None"):
        check(ok)
    with pytest.raises(ValueError, match="^causal: got False; variant 'gla' is causal-only"):
        check("builtin:gla", causal=False)
    with pytest.raises(ValueError, match="^variant: got 'softmax' for target builtin:gla"):
        check("builtin:gla", "softmax", causal=True)


def test_array_api_rejects_bad_arrays():
    from gramcheck import spectra

    q = np.random.default_rng(0).standard_normal((1, 1, 4, 2))
    with pytest.raises(ValueError, match=r"^q: contains NaN or Inf"):
        spectra.gram_spectra("linear-elu", np.where(q > 0, np.inf, q), q)
    with pytest.raises(ValueError, match=r"^k: got shape \(1, 1, 3, 2\); expected the shape of q"):
        spectra.gram_spectra("linear-elu", q, q[:, :, :3])
    with pytest.raises(ValueError, match=r"^q: got dtype int64"):
        V.get("softmax").reference(q.astype(np.int64), q, q)
    if torch.cuda.is_available():  # pragma: no cover - mixed devices need a second device
        with pytest.raises(ValueError, match="^k: is on device"):
            V.get("softmax").torch(torch.tensor(q), torch.tensor(q).cuda(), torch.tensor(q))


def _cert(tmp_path):
    return certify(
        "builtin:softmax", properties=["agreement", "convex-hull"], domain=SMALL, out=str(tmp_path / "c.json")
    ), tmp_path / "c.json"


def test_certificate_round_trip_and_tamper_detection(tmp_path):
    cert, path = _cert(tmp_path)
    assert cert.passed and verify(path).ok
    text = path.read_text()
    data = json.loads(text)
    # a changed byte: a measured value edited by hand
    data["properties"][0]["measured"] = 0.0
    path.write_text(json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n")
    with pytest.raises(CertificateError, match="content hash mismatch"):
        verify(path)
    path.write_text(text[: len(text) // 2])  # truncated
    with pytest.raises(CertificateError, match="is not valid JSON"):
        load(path)
    newer = json.loads(text)
    newer["schema_version"] = 99
    path.write_text(json.dumps(newer))
    with pytest.raises(CertificateError, match="schema_version 99; this gramcheck reads up to 1"):
        load(path)
    missing = json.loads(text)
    del missing["seed"]
    path.write_text(json.dumps(missing))
    with pytest.raises(CertificateError, match="does not match the schema .*'seed' is a required property"):
        load(path)
    path.write_text("[1, 2]")
    with pytest.raises(CertificateError, match="holds a JSON list; expected an object"):
        load(path)
    with pytest.raises(CertificateError, match="cannot read"):
        load(tmp_path / "absent.json")


def test_verify_reports_a_changed_target(tmp_path, monkeypatch):
    cert, path = _cert(tmp_path)
    from gramcheck import targets

    real = targets.builtin

    def drifted(variant, **kw):  # the "same" target, now 1e-3 off
        t = real(variant, **kw)
        inner = t.fn
        t.fn = lambda q, k, v, *, causal, **ex: inner(q, k, v, causal=causal, **ex) + 1e-3
        return t

    monkeypatch.setattr("gramcheck.api.builtin", drifted)
    result = verify(path)
    assert not result.ok and any("agreement" in d for d in result.differences)


def test_domain_is_recorded():
    d = Domain(kinds=["gaussian"], max_n=5)
    assert d.to_dict()["kinds"] == ["gaussian"] and d.to_dict()["max_n"] == 5


def test_replacing_tokens_stays_within_a_float16_range():
    """causality and packing-isolation replace tokens by N(0, 1) (1 + max|x|): near float16's 65504 that
    overflowed to inf, and the check failed correct targets with an internal error (the bug set's
    ultralytics#24990 fixed twin)."""
    import numpy as np

    from gramcheck.precision import round_to
    from gramcheck.properties.invariants import causality
    from gramcheck.strategies import AttentionInputs
    from gramcheck.targets import builtin

    rng = np.random.default_rng(0)
    q, k, v = (round_to(np.clip(rng.standard_normal((1, 1, 8, 4)) * 3e4, -6e4, 6e4), "float16") for _ in range(3))
    ex = AttentionInputs(q, k, v, {}, kind="large-magnitude", dtype="float16")
    f = causality(builtin("softmax", dtype="float16"), ex, causal=True)
    assert f is not None and f.passed and f.failure is None, f


def test_two_runs_that_overflow_alike_are_permutation_equivariant():
    """linear-unnormalised, float16, N = d = 1, q = k = v = 100 (a default check's outlier at seed 13): o = 1e6 is
    inf in every run of the builtin, and inf - inf failed permutation-equivariance at inf. Equal infinities
    agree now; a target that is NaN in both runs, or inf in one alone, still fails."""
    from gramcheck.properties.invariants import permutation_equivariance
    from gramcheck.strategies import AttentionInputs
    from gramcheck.targets import Target, builtin

    hundred = np.full((1, 1, 1, 1), 100.0)
    one = np.ones((1, 1, 2, 1))
    t = builtin("linear-unnormalised", dtype="float16")
    for x, passes in ((hundred, True), (one, True)):
        ex = AttentionInputs(x, x, x, {}, kind="outliers", dtype="float16")
        f = permutation_equivariance(t, ex, causal=False)
        assert f is not None and f.passed == passes and f.failure is None, f

    def nan(q, k, v, *, causal):
        return t.fn(q, k, v, causal=causal) * float("nan")

    calls = []

    def inf_once(q, k, v, *, causal):
        calls.append(1)
        return t.fn(q, k, v, causal=causal) * (float("inf") if len(calls) == 2 else 1.0)

    for fn in (nan, inf_once):
        wrong = Target(fn, "linear-unnormalised", dtype="float16", name=fn.__name__)
        ex = AttentionInputs(one, one, one, {}, kind="gaussian", dtype="float16")
        f = permutation_equivariance(wrong, ex, causal=False)
        assert f is not None and not f.passed, (fn.__name__, f)


def disconnected(q, k, v, *, causal):
    """Right values, but the output is a fresh leaf: no gradient reaches q, k or v."""
    return ok(q, k, v, causal=causal).detach().requires_grad_(True)


def value_only_at_one_token(q, k, v, *, causal):
    """Softmax attention that returns v itself at N = 1 (where the output does not depend on q or k):
    autograd gives None for dq and dk there, a true gradient of 0."""
    if q.shape[-2] == 1:
        return v * 1.0
    return V.get("softmax").torch(q, k, v, causal=causal)


def test_finite_gradients_fails_where_no_gradient_reaches_an_input():
    from broken import linear_with_detached_features

    f = check(disconnected, "linear-elu", causal=True, properties=["finite-gradients"], domain=SMALL).findings[0]
    assert not f.passed and f.details["missing_gradient"] and "no gradient reaches" in f.details["error"], f
    f = check(linear_with_detached_features, "linear-elu", causal=True, properties=["finite-gradients"],
              domain=SMALL).findings[0]
    assert not f.passed and f.details["disconnected"] == ["q"], f
    assert "no gradient reaches q " in f.details["error"]


def test_a_none_gradient_where_the_output_does_not_depend_on_the_input_passes():
    for prop in ("finite-gradients", "gradcheck"):
        f = check(value_only_at_one_token, "softmax", causal=True, properties=[prop],
                  domain={"max_n": 1, "max_d": 3, "examples": 4}).findings[0]
        assert f.passed and f.details["examples"] > 0, f


def test_backward_agreement_compares_a_missing_gradient_as_zeros_and_says_so():
    from broken import linear_with_detached_features

    f = check(linear_with_detached_features, "linear-elu", causal=True, properties=["backward-agreement"],
              domain=SMALL).findings[0]
    assert not f.passed and f.details["disconnected"] == ["dq"], f
    assert "no gradient reaches q (autograd gives None): compared as zeros" in f.details["note"]


class _UnreadableMessage(Exception):
    def __str__(self):
        raise ValueError("no message")


def raises_huge(q, k, v, *, causal):
    raise RuntimeError("x" * 100_000)


def raises_unreadable(q, k, v, *, causal):
    raise _UnreadableMessage()


def raises_with_an_address(q, k, v, *, causal):
    raise RuntimeError(f"bad state {object()!r}")


def exits_with_a_long_code(q, k, v, *, causal):
    raise SystemExit("y" * 100_000)


def test_a_target_message_is_kept_bounded_with_its_type():
    from gramcheck.targets import MESSAGE_LIMIT

    errors = {}
    for fn in (raises_huge, raises_unreadable, raises_with_an_address, exits_with_a_long_code):
        f = check(fn, "linear-elu", properties=["agreement"], domain=SMALL)["agreement"]
        assert f.failure == "raised", f
        errors[fn.__name__] = f.details["error"]
    assert "raised RuntimeError: " + "x" * MESSAGE_LIMIT + f"... ({100_000 - MESSAGE_LIMIT} more characters)" in (
        errors["raises_huge"]
    )
    assert errors["raises_unreadable"].endswith("raised _UnreadableMessage: its message could not be read: ValueError")
    assert errors["raises_with_an_address"].endswith("RuntimeError: bad state <object object at 0x...>")
    assert "raised SystemExit (exit code 'yyy" in errors["exits_with_a_long_code"]
    assert all(len(e) < 2 * MESSAGE_LIMIT for e in errors.values())


def test_certificates_of_a_target_with_addresses_in_its_messages_are_identical(tmp_path):
    kw = {"properties": ["agreement"], "domain": SMALL}
    a, b = (certify(raises_with_an_address, "linear-elu", out=str(tmp_path / d / "c.json"), **kw) for d in "ab")
    assert not a.passed and a.to_json() == b.to_json()
