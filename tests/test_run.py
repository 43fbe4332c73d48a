"""The run: targets from the working directory, streamed progress, a memory budget, process isolation,
upfront argument errors, the CLI's failure messages and standard JSON, one Finding renderer."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from gramcheck import check
from gramcheck import variants as V
from gramcheck.cli import main
from gramcheck.findings import Finding
from gramcheck.report import render_finding

ROOT = Path(__file__).resolve().parents[1]
TINY = {"max_n": 4, "max_d": 2, "examples": 2}
TINY_ARGS = ["--max-n", "4", "--max-d", "2", "--examples", "2"]
SCRIPT = Path(sys.executable).parent / "gramcheck"


@pytest.mark.skipif(not SCRIPT.exists(), reason="the gramcheck console script is not installed")
def test_console_script_imports_targets_from_the_working_directory(tmp_path):
    (tmp_path / "my_cwd_attention.py").write_text(
        "from gramcheck import variants as V\n\n"
        "def attn(q, k, v, *, causal):\n    return V.get('softmax').torch(q, k, v, causal=causal)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [str(SCRIPT), "check", "my_cwd_attention:attn", "--variant", "softmax", "--property", "agreement", *TINY_ARGS],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "1 passed, 0 failed" in r.stdout


def test_results_stream_one_line_per_property_when_not_a_terminal(capsys):
    assert main(["check", "builtin:softmax", "--property", "agreement", "--property", "convex-hull", *TINY_ARGS]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("[1/2] pass agreement: measured") and err[1].startswith("[2/2] pass convex-hull")
    assert "vs tolerance" in err[1] and "at entry (" in err[1]


def test_sizes_are_checked_against_a_memory_budget_up_front(capsys):
    t0 = time.perf_counter()
    huge = r"^domain.max_n: max_n=1000000, .* would need about .* GiB .* budget is 4 GiB"
    with pytest.raises(ValueError, match=huge):
        check("builtin:softmax", properties=["agreement"], domain={"max_n": 10**6})
    assert time.perf_counter() - t0 < 5
    assert main(["spectrum", "--variant", "linear-elu", "--n", "100000000", "--d", "16"]) == 2
    err = capsys.readouterr().err
    assert "--n: --n 100000000 --d 16 would need about" in err and "GiB" in err and "Traceback" not in err
    with pytest.raises(ValueError, match="budget is 0.000977 GiB"):
        check("builtin:softmax", properties=["agreement"], domain={"max_n": 256}, memory_budget=2**20)


# --------------------------------------------------------------------------------------------------------
# isolation
# --------------------------------------------------------------------------------------------------------
def test_process_isolation_kills_a_hung_target_and_the_run_goes_on():
    t0 = time.perf_counter()
    r = check("isolation_targets:sleeps", "linear-elu", properties=["agreement", "determinism"], domain=TINY,
              timeout=0.5, isolation="process")
    assert [f.failure for f in r.findings] == ["timeout", "timeout"]
    assert "worker process killed" in r.findings[0].details["error"]
    assert time.perf_counter() - t0 < 60


def test_a_target_calling_os_exit_is_a_crashed_finding_and_the_run_goes_on():
    r = check("isolation_targets:exits_7", "linear-elu", properties=["agreement", "determinism"], domain=TINY,
              isolation="process")
    assert [f.failure for f in r.findings] == ["crashed", "crashed"]
    assert "exited with code 7" in r.findings[0].details["error"]


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_system_exit_is_reported_as_raised(isolation):
    r = check("isolation_targets:system_exit", "linear-elu", properties=["agreement"], domain=TINY,
              isolation=isolation)
    f = r["agreement"]
    assert f.failure == "raised" and "SystemExit (exit code 3)" in f.details["error"]


@pytest.mark.parametrize("timeout", [None, 5.0])
def test_keyboard_interrupt_is_never_swallowed(timeout):
    from isolation_targets import keyboard_interrupt

    with pytest.raises(KeyboardInterrupt):
        check(keyboard_interrupt, "linear-elu", properties=["agreement"], domain=TINY, timeout=timeout)


_backward_release = threading.Event()


def _with_faulty_backward(fault):
    """linear-elu whose backward calls ``fault(calls)`` (calls: the backward calls so far) before the
    exact gradients."""
    from broken import _with_backward

    calls = {"n": 0}

    def forward(q, k, v):
        return V.get("linear-elu").torch(q, k, v, causal=True)

    def corrupt(grads, inputs):
        calls["n"] += 1
        fault(calls["n"])
        return tuple(grads)

    def fn(q, k, v, *, causal):
        return _with_backward(forward, corrupt)(q, k, v)

    return fn


def _exit(n):
    raise SystemExit(4)


def _hang(n):
    _backward_release.wait(5.0)  # bounded: the abandoned worker thread ends by itself


GRADIENT_PROPS = ["gradcheck", "finite-gradients", "jacobian-norm", "depth-growth", "backward-agreement"]


def test_system_exit_in_the_backward_is_a_raised_finding_of_every_gradient_property():
    r = check(_with_faulty_backward(_exit), "linear-elu", causal=True, properties=GRADIENT_PROPS, domain=TINY)
    assert [f.name for f in r.findings] == GRADIENT_PROPS  # the run went on
    for f in r.findings:
        assert not f.passed and f.failure == "raised", f
        assert "the backward of" in f.details["error"] and "SystemExit (exit code 4)" in f.details["error"]


def test_system_exit_in_a_later_backward_call_is_caught_inside_gradcheck_and_jacobians():
    """The first backward call (the connectedness check) passes; gradcheck's and the Jacobians' own calls raise."""

    def later(n):
        if n > 1:
            raise SystemExit(5)

    for prop in ("gradcheck", "jacobian-norm"):
        f = check(_with_faulty_backward(later), "linear-elu", causal=True, properties=[prop], domain=TINY)[prop]
        assert f.failure == "raised" and "SystemExit (exit code 5)" in f.details["error"], f


def test_a_hanging_backward_is_bounded_by_the_timeout():
    t0 = time.perf_counter()
    try:
        r = check(_with_faulty_backward(_hang), "linear-elu", causal=True, timeout=0.3,
                  properties=["finite-gradients", "gradcheck"], domain=TINY)
        assert [f.failure for f in r.findings] == ["timeout", "timeout"]
        assert all("the backward of" in f.details["error"] and "within 0.3 s" in f.details["error"] for f in r.findings)
        assert time.perf_counter() - t0 < 5.0
    finally:
        _backward_release.set()


def test_keyboard_interrupt_in_the_backward_is_never_swallowed():
    def interrupt(n):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        check(_with_faulty_backward(interrupt), "linear-elu", causal=True, properties=["finite-gradients"], domain=TINY)


def test_gradients_through_a_target_are_exact_to_second_order():
    """Each output is guarded by an autograd Function: gradients and double backward are those of fn."""
    from gramcheck.targets import builtin

    t = builtin("linear-elu", dtype="float64")
    x = [torch.randn(1, 2, 5, 3, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    assert torch.autograd.gradgradcheck(lambda q, k, v: t.call_torch(q, k, v, causal=True), x)
    ours = torch.autograd.grad(t.call_torch(*x, causal=True).square().sum(), x)
    plain = torch.autograd.grad(V.get("linear-elu").torch(*x, causal=True).square().sum(), x)
    assert all(torch.equal(a, b) for a, b in zip(ours, plain, strict=True))
    y = x[0].detach().requires_grad_(True)  # one tensor as q, k and v (depth-growth's layers): one gradient
    ours = torch.autograd.grad(t.call_torch(y, y, y, causal=True).sum(), y)[0]
    plain = torch.autograd.grad(V.get("linear-elu").torch(y, y, y, causal=True).sum(), y)[0]
    assert torch.allclose(ours, plain, rtol=1e-12, atol=0.0)


def test_a_local_callable_falls_back_to_the_thread_with_a_note():
    scale = torch.tensor(1.0)

    def local(q, k, v, *, causal):
        return scale * check_target(q, k, v, causal=causal)

    from isolation_targets import ok as check_target

    with pytest.warns(RuntimeWarning, match="cannot be sent to a worker process"):
        r = check(local, "linear-elu", properties=["agreement"], domain=TINY, isolation="process")
    assert r.passed


# --------------------------------------------------------------------------------------------------------
# upfront argument errors
# --------------------------------------------------------------------------------------------------------
BAD = [
    ({"dtype": "tf32"}, ValueError, r"^dtype: got 'tf32'; tf32 is a matmul precision mode"),
    ({"params": {"eps": "abc"}}, TypeError, r"^eps: got 'abc' for variant 'linear-elu' \(str\); expected a number"),
    ({"params": {"eps": -1}}, ValueError, r"^eps: got -1 for variant 'linear-elu'; expected a number >= 0"),
    ({"seed": "abc"}, TypeError, r"^seed: got 'abc' \(str\); expected an integer"),
    ({"seed": 1.5}, TypeError, r"^seed: got 1.5 \(float\); expected an integer"),
    ({"timeout": 0}, ValueError, r"^timeout: got 0; expected a positive finite number"),
    ({"timeout": -1}, ValueError, r"^timeout: got -1; expected a positive finite number"),
    ({"isolation": "vm"}, ValueError, r"^isolation: got 'vm'"),
    ({"causal": 1}, TypeError, r"^causal: got 1 \(int\); expected True or False"),
    ({"causal": "yes"}, TypeError, r"^causal: got 'yes' \(str\); expected True or False"),
    ({"causal": None}, TypeError, r"^causal: got None \(NoneType\); expected True or False"),
    ({"dtype": None}, TypeError, r"^dtype: got None; expected one of float64, float32, bfloat16, float16"),
    ({"params": {"feature": "tanh"}}, ValueError,
     r"^feature: got 'tanh' for variant 'linear-elu'; expected one of 'elu1', 'relu', 'identity'"),
    ({"params": {"feature": 3}}, TypeError, r"^feature: got 3 for variant 'linear-elu' \(int\); expected one of"),
    ({"params": [("eps", 1e-6)]}, TypeError, r"^params: got \[\('eps', 1e-06\)\] \(list\); expected a dict"),
    ({"domain": {"kinds": []}}, ValueError, r"^domain.kinds: got an empty list; expected a list of names from"),
    ({"domain": {"kinds": "gaussian"}}, TypeError,
     r"^domain.kinds: got the string 'gaussian'; expected a list of names from .* \(e.g. \['gaussian'\]\)"),
    ({"domain": {"gates": "extreme"}}, TypeError, r"^domain.gates: got the string 'extreme'; expected a list"),
    ({"domain": {"gates": []}}, ValueError, r"^domain.gates: got an empty list"),
    ({"domain": {"max_nn": 3}}, TypeError, r"^domain: got the field 'max_nn'; expected fields of Domain: kinds,"),
    ({"domain": [("max_n", 3)]}, TypeError, r"^domain: got \[\('max_n', 3\)\] \(list\); expected a Domain"),
    ({"memory_budget": float("nan")}, ValueError, r"^memory_budget: got nan; expected a positive finite number"),
    ({"memory_budget": -1}, ValueError, r"^memory_budget: got -1; expected a positive finite number of bytes"),
    ({"memory_budget": "4GiB"}, TypeError, r"^memory_budget: got '4GiB' \(str\); expected a positive number of bytes"),
]
if not torch.cuda.is_available():
    BAD.append(({"device": "cuda"}, ValueError, r"^device: got 'cuda'; this machine has no CUDA device"))


@pytest.mark.parametrize("kwargs,exc,match", BAD)
def test_bad_arguments_are_upfront_errors_naming_the_argument(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        check("builtin:linear-elu", **{"properties": ["agreement"], "domain": TINY, **kwargs})


def test_every_string_hyperparameter_is_one_of_its_choices():
    for name in ("transnormer-norm", "qknorm-softmax", "performer-positive"):
        var = V.get(name)
        for param in [p for p, x in var.params.items() if isinstance(x, str)]:
            with pytest.raises(ValueError, match=rf"^{param}: got 'nope' for variant '{name}'; expected one of"):
                var.resolve_params({param: "nope"})


def test_a_string_for_a_list_of_names_is_refused_by_the_strategies_too():
    from gramcheck.strategies import attention_inputs, sample

    with pytest.raises(TypeError, match=r"^kinds: got the string 'gaussian'; expected a list of names"):
        sample(attention_inputs("softmax", kinds="gaussian"), seed=0)


def test_causal_is_checked_by_the_pytest_plugin_too():
    from gramcheck.pytest_plugin import attention_suite

    with pytest.raises(TypeError, match=r"^causal: got 1 \(int\); expected True or False"):
        attention_suite("builtin:linear-elu", causal=1)


def test_certify_checks_its_output_path_before_the_run(tmp_path):
    from gramcheck import certify

    calls = []

    def counted(q, k, v, *, causal):
        calls.append(1)
        return V.get("linear-elu").torch(q, k, v, causal=causal)

    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=r"^out: got '.*', a directory; expected a file path"):
        certify(counted, "linear-elu", properties=["agreement"], domain=TINY, out=str(tmp_path))
    with pytest.raises(ValueError, match=r"^out: got '.*file/c.json'; '.*file' is a file, not a folder"):
        certify(counted, "linear-elu", properties=["agreement"], domain=TINY, out=str(tmp_path / "file" / "c.json"))
    assert calls == []


def test_gate_tau_and_inapplicable_properties_are_upfront_errors():
    with pytest.raises(ValueError, match=r"^gate_tau: got 0 for variant 'gla'; expected a number > 0"):
        check("builtin:gla", causal=True, params={"gate_tau": 0}, properties=["agreement"], domain=TINY)
    with pytest.raises(ValueError, match=r"^properties: 'weight-range' does not apply to variant 'softmax'"):
        check("builtin:softmax", properties=["weight-range"], domain=TINY)


# --------------------------------------------------------------------------------------------------------
# what the CLI shows
# --------------------------------------------------------------------------------------------------------
def test_cli_table_shows_why_a_target_failed_and_json_is_standard(capsys):
    args = ["check", "isolation_targets:raises_long", "--variant", "linear-elu", "--property", "agreement", *TINY_ARGS]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "raised RuntimeError: boom:" in out and "the kernel needs d_k..." in out  # wrapped, truncated
    assert "x" * 100 not in out
    assert main([*args, "--json"]) == 1
    text = capsys.readouterr().out

    def refuse(token):
        raise AssertionError(f"non-standard JSON token {token}")

    data = json.loads(text, parse_constant=refuse)
    f = data["findings"][0]
    assert f["measured"] == "inf" and f["margin"] == 0.0 and "boom" in f["details"]["error"]


def test_one_renderer_shows_error_and_tolerance_in_their_units():
    f = Finding("agreement", 1.09, 1.0, details={"worst_error": 2.3e-5, "worst_bound": 2.1e-5,
                                                         "worst_index": [0, 1, 3, 2]})
    line = render_finding(f)
    assert line == "FAIL agreement: measured 1.09 vs bound 1 (error 2.3e-05 vs tolerance 2.1e-05 at entry (0, 1, 3, 2))"
    from gramcheck.report import Report

    r = Report("t", "softmax", False, "float32", "cpu", "ci", 0, {}, [f])
    assert line in r.summary()
    with pytest.raises(AssertionError, match="tolerance 2.1e-05"):
        r.raise_for_failures()


def test_profiles_are_seeded_not_derandomised():
    """One rule: the search seeds Hypothesis with ``seed``; a derandomised profile would ignore it."""
    from gramcheck.strategies import PROFILES

    assert all(not s.derandomize and s.database is None for s in PROFILES.values())
    a = check("builtin:softmax", properties=["agreement"], domain=TINY, seed=0)["agreement"]
    b = check("builtin:softmax", properties=["agreement"], domain=TINY, seed=0)["agreement"]
    c = check("builtin:softmax", properties=["agreement"], domain=TINY, seed=1)["agreement"]
    assert a.measured == b.measured and (a.measured, a.details) != (c.measured, c.details)


def test_demo_streams_lines(monkeypatch, tmp_path, capsys):
    from gramcheck import demo

    real_forms, softmax = demo.form_findings, demo._variants.get("softmax")

    def tiny_forms(seed=0):
        yield from list(real_forms(seed=seed))[:2]

    monkeypatch.setattr(demo, "form_findings", tiny_forms)
    monkeypatch.setattr(demo, "DEMO_DOMAIN", TINY)
    monkeypatch.setattr(demo._variants, "list", lambda: [softmax])
    main(["demo", "-o", str(tmp_path)])
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("pass agreement[") and any(line.startswith("[1/") and "softmax: " in line for line in err)


def test_cli_isolate_reports_a_crash_and_finishes(capsys):
    args = ["check", "isolation_targets:exits_7", "--variant", "linear-elu", "--property", "agreement", "--isolate"]
    assert main([*args, *TINY_ARGS]) == 1
    out = capsys.readouterr().out
    assert "crashed" in out and "exited with code 7" in out and "0 passed, 1 failed" in out
