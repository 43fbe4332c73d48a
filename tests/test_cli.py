"""Every CLI command end to end in a subprocess: exit codes, output, files written; determinism of
certificates across two processes; fuzzing the certificate loader and the argument parser."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gramcheck import variants as V
from gramcheck.certificate import CertificateError, load
from gramcheck.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--max-n", "6", "--max-d", "3", "--examples", "3"]
LEAK = ["broken:softmax_leaking_one_future_token", "--variant", "softmax", "--causal", "--property", "causality", *FAST]


def run(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-m", "gramcheck", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600
    )


def test_list():
    r = run("list")
    assert r.returncode == 0
    for word in ("linear-elu", "performer-trig", "retnet", "agreement", "proofs/jacobian-bounds.md"):
        assert word in r.stdout


def test_check_passes_and_fails_with_exit_codes():
    good = run("check", "builtin:linear-elu", "--causal", "--property", "agreement", "--property", "causality", *FAST)
    assert good.returncode == 0, good.stderr
    assert "agreement" in good.stdout and "causality" in good.stdout and "2 passed, 0 failed" in good.stdout
    bad = run("check", *LEAK)
    assert bad.returncode == 1 and "FAIL" in bad.stdout and "0 passed, 1 failed" in bad.stdout
    js = run("check", "builtin:softmax", "--property", "convex-hull", "--json", *FAST)
    assert js.returncode == 0 and json.loads(js.stdout)["findings"][0]["name"] == "convex-hull"


def test_bad_input_exits_2_with_a_message():
    r = run("check", "builtin:nope")
    assert r.returncode == 2 and "variant: got 'nope'" in r.stderr
    r = run("check", "no_such_module_xyz:f", "--variant", "softmax")
    assert r.returncode == 2 and "cannot import module" in r.stderr
    r = run("check", "builtin:softmax", "--max-n", "0")
    assert r.returncode == 2 and "expected a positive integer" in r.stderr
    r = run("check", "builtin:softmax", "--param", "nope")
    assert r.returncode == 2 and "KEY=VALUE" in r.stderr


def test_certify_verify_and_determinism_across_processes(tmp_path):
    args = [
        "certify",
        "builtin:performer-positive",
        "--causal",
        "--property",
        "agreement",
        "--property",
        "causality",
        "--kind",
        "gaussian",
        *FAST,
    ]
    a = run(*args, "-o", str(tmp_path / "a.json"))
    b = run(*args, "-o", str(tmp_path / "b.json"))
    assert a.returncode == 0 and b.returncode == 0, a.stderr
    assert "certificate written to" in a.stdout
    # same seed, target and versions: the same bytes (the file names inside differ only by stem: none here)
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    v = run("verify", str(tmp_path / "a.json"))
    assert v.returncode == 0 and "reproduced" in v.stdout
    raw = (tmp_path / "a.json").read_text()
    (tmp_path / "a.json").write_text(raw.replace('"seed":0', '"seed":1'))
    t = run("verify", str(tmp_path / "a.json"))
    assert t.returncode == 2 and "content hash mismatch" in t.stderr


def test_certify_a_failing_target_writes_its_counterexample(tmp_path):
    out = tmp_path / "leak.json"
    r = run("certify", *LEAK, "-o", str(out))
    assert r.returncode == 1
    data = load(out)
    assert data["passed"] is False and (tmp_path / data["properties"][0]["counterexample_file"]).exists()
    v = run("verify", str(out), "--accept-recorded-failures", cwd=tmp_path)
    assert v.returncode == 0, v.stdout + v.stderr  # a failing certificate reproduces as failing
    assert "failed (as recorded)" in v.stdout


def test_spectrum_with_plot(tmp_path):
    png = tmp_path / "s.png"
    r = run("spectrum", "--variant", "linear-elu", "--n", "48", "--d", "8", "--kind", "spectrum", "--plot", str(png))
    assert r.returncode == 0, r.stderr
    assert "condition" in r.stdout and "energy share" in r.stdout and "normaliser margin" in r.stdout
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = run("spectrum", "--variant", "softmax", "--n", "16", "--d", "4")
    assert r.returncode == 0 and "dense" in r.stdout


@pytest.mark.slow
def test_demo_writes_certificates(tmp_path):
    r = run("demo", "-o", str(tmp_path / "certs"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    files = sorted(p.name for p in (tmp_path / "certs").glob("*.json"))
    assert "linear-elu.json" in files and len(files) == len(V.names())  # one certificate per registered variant
    assert "0 failed" in r.stdout  # normaliser-margin, the known relu/trig finding, is an opt-in diagnostic


# ------------------------------------------------------------------------------------------------------
# fuzzing (Hypothesis): the loader and the parser never fail with anything but their own clear errors
# ------------------------------------------------------------------------------------------------------
JSON = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False) | st.integers() | st.text(max_size=8),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=20,
)


@settings(
    max_examples=150,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(payload=st.one_of(st.binary(max_size=200), JSON.map(lambda x: json.dumps(x).encode())))
def test_fuzz_certificate_loader(tmp_path, payload):
    p = tmp_path / "fuzz.json"
    p.write_bytes(payload)
    with pytest.raises(CertificateError):
        load(p)


@settings(max_examples=150, deadline=None, database=None, derandomize=True)
@given(
    argv=st.lists(
        st.one_of(
            st.sampled_from(
                [
                    "list",
                    "check",
                    "certify",
                    "verify",
                    "spectrum",
                    "demo",
                    "--variant",
                    "--n",
                    "--max-n",
                    "-1",
                    "0",
                    "x",
                    "--kind",
                    "--param",
                    "a=1",
                    "--dtype",
                    "float16",
                    "--causal",
                ]
            ),
            st.text(max_size=6),
        ),
        max_size=6,
    )
)
def test_fuzz_argument_parser(argv):
    parser = build_parser()
    try:
        parser.parse_args(argv)
    except SystemExit as exc:  # argparse's own usage error: exit status 2 (or 0 for --help/--version)
        assert exc.code in (0, 2)


def test_a_target_that_never_returns_does_not_keep_gramcheck_alive():
    r = run(
        "check",
        "broken:hangs_forever",
        "--variant",
        "softmax",
        "--property",
        "agreement",
        "--property",
        "convex-hull",
        "--timeout",
        "0.5",
        *FAST,
    )
    assert r.returncode == 1 and r.stdout.count("timeout") == 2 and "0 passed, 2 failed" in r.stdout


def test_a_skipped_property_reads_skipped_with_its_reason(capsys):
    from gramcheck.cli import main

    target = "broken:retnet_decays_in_the_input_dtype"  # takes no initial_state
    code = main(["check", target, "--variant", "retnet", "--causal", "--property", "state-agreement", *FAST])
    out = capsys.readouterr().out
    assert "skipped" in out and "takes no" in out and "pass " not in out
    assert code == 1 and "nothing was judged" in out  # a check of skipped properties alone checked nothing


FLIP = '''
from pathlib import Path

from gramcheck import variants as V


def attn(q, k, v, *, causal):
    out = V.get("linear-elu").torch(q, k, v, causal=causal)
    return out * 1.5 if Path("broken").exists() else out
'''


def test_output_paths_are_checked_before_the_run_and_printed_as_text(tmp_path, monkeypatch, capsys):
    from gramcheck.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "flip_attention.py").write_text(FLIP)
    target = ["flip_attention:attn", "--variant", "linear-elu", "--property", "agreement", *FAST]
    (tmp_path / "taken").write_text("")
    for out, why in (
        (str(tmp_path), "a directory; expected a file path"),
        (str(tmp_path / "taken" / "c.json"), "is a file, not a folder"),
    ):
        assert main(["certify", *target, "-o", out]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"gramcheck certify: error: -o: got {out!r}") and why in err, err
    odd = tmp_path / "a[/b]" / "c[/i].json"  # rich markup in a path is printed as it is
    assert main(["certify", *target, "-o", str(odd)]) == 0
    assert f"certificate written to {odd}" in capsys.readouterr().out.replace("\n", "")
    (tmp_path / "broken").write_text("")
    assert main(["verify", str(odd)]) == 1
    assert f"{odd}: did not reproduce: results changed" in capsys.readouterr().out.replace("\n", "")


def test_cli_arguments_named_in_errors(capsys):
    from gramcheck.cli import main

    for args, message in (
        (["--param", "feature=tanh"], "error: feature: got 'tanh' for variant 'linear-elu'; expected one of"),
        (["--param", "=3"], "--param: got '=3'; expected KEY=VALUE with a non-empty KEY"),
        (["--memory-budget", "nan"], "argument --memory-budget: got 'nan'; expected a positive finite number of GiB"),
        (["--memory-budget", "-1"], "argument --memory-budget: got '-1'; expected a positive finite number of GiB"),
    ):
        try:
            rc = main(["check", "builtin:linear-elu", "--property", "agreement", *FAST, *args])
        except SystemExit as exc:  # argparse's own usage error
            rc = exc.code
        assert rc == 2 and message in capsys.readouterr().err, args


def test_keygen_refuses_one_path_for_both_keys(tmp_path, capsys):
    pytest.importorskip("cryptography")
    from gramcheck.cli import main

    key = tmp_path / "k.pem"
    assert main(["keygen", str(key), str(key)]) == 2
    assert "as both the private and the public key file; expected two different paths" in capsys.readouterr().err
    assert not key.exists()
    assert main(["keygen", str(key), str(tmp_path / "k.pub")]) == 0
    assert main(["keygen", str(key), str(tmp_path / "other.pub")]) == 2  # never overwrites a key
    assert f"private key file {key} exists" in capsys.readouterr().err
