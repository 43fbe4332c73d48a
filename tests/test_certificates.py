"""Certificates a reviewer can trust: verify re-runs what was requested and fails on a forged file,
signatures, recorded failures, environment differences, the source hash, containment, nesting, the
example stream's independence of the working directory, one certificate per check whatever the front end."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gramcheck import CertificateError, certify, verify
from gramcheck.certificate import content_hash, load, source_hash
from gramcheck.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = {"max_n": 4, "max_d": 2, "examples": 2}
LEAK = "broken:softmax_leaking_one_future_token"


def _rewrite(path, data):
    data.pop("signature", None)
    data["content_hash"] = content_hash(data)
    path.write_text(json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n")


@pytest.fixture(scope="module")
def leaky(tmp_path_factory):
    """A certificate of every applicable property of a causal softmax that leaks one future token."""
    path = tmp_path_factory.mktemp("leak") / "leak.json"
    cert = certify(LEAK, "softmax", causal=True, domain=TINY, out=str(path))
    return cert, path


def test_forged_certificate_with_failures_dropped_fails_verify(leaky, tmp_path):
    cert, path = leaky
    data = json.loads(path.read_text())
    assert data["requested"] is None and not data["passed"]
    failing = [e["property"] for e in data["properties"] if e["verdict"] == "fail"]
    assert "causality" in failing
    forged = dict(data, properties=[e for e in data["properties"] if e["verdict"] == "pass"], passed=True)
    out = tmp_path / "forged.json"
    _rewrite(out, forged)
    load(out)  # a well-formed file with a correct content hash
    result = verify(out)
    assert not result.ok and result.status == "results changed"
    assert any(d.startswith("property causality: missing from the certificate") for d in result.differences)
    assert main(["verify", str(out)]) == 1


def test_verify_exits_nonzero_on_recorded_failures_unless_accepted(leaky, capsys):
    _, path = leaky
    assert main(["verify", str(path)]) == 1
    assert "records failures" in capsys.readouterr().out
    assert main(["verify", str(path), "--accept-recorded-failures"]) == 0


def test_environment_differences_are_reported_not_failures_unless_strict(tmp_path, capsys):
    path = tmp_path / "c.json"
    certify("builtin:softmax", properties=["agreement"], domain=TINY, out=str(path))
    data = json.loads(path.read_text())
    data["environment"]["numpy"] = "0.0.1"
    data["environment"]["hypothesis"] = "0.0.1"
    _rewrite(path, data)
    result = verify(path)
    assert result.ok and result.status == "reproduced"
    assert "environment.numpy: '0.0.1' -> " in " ".join(result.environment)
    assert main(["verify", str(path)]) == 0
    assert "environment differs" in capsys.readouterr().out
    assert not verify(path, strict=True).ok
    assert main(["verify", str(path), "--strict"]) == 1


def test_signed_certificates(tmp_path, capsys):
    pytest.importorskip("cryptography")
    assert main(["keygen", str(tmp_path / "k.pem"), str(tmp_path / "k.pub")]) == 0
    assert main(["keygen", str(tmp_path / "o.pem"), str(tmp_path / "o.pub")]) == 0
    assert (tmp_path / "k.pem").stat().st_mode & 0o077 == 0
    path = tmp_path / "c.json"
    args = ["certify", "builtin:softmax", "--property", "agreement", "--max-n", "4", "--max-d", "2", "--examples", "2"]
    assert main([*args, "-o", str(path), "--sign-key", str(tmp_path / "k.pem")]) == 0
    assert main(["verify", str(path), "--trusted-key", str(tmp_path / "k.pub")]) == 0
    assert "signed by the trusted key" in capsys.readouterr().out
    assert main(["verify", str(path), "--trusted-key", str(tmp_path / "o.pub")]) == 2  # someone else's key
    assert "not by the trusted key" in capsys.readouterr().err
    # a forger who edits the file and recomputes the content hash cannot re-sign it
    data = json.loads(path.read_text())
    data["seed"] = 1
    data["content_hash"] = content_hash(data)
    path.write_text(json.dumps(data))
    with pytest.raises(CertificateError, match="signature does not match"):
        load(path)
    # an unsigned file fails where a trusted key is asked for
    data.pop("signature")
    _rewrite(path, data)
    with pytest.raises(CertificateError, match="is not signed"):
        verify(path, trusted_key=tmp_path / "k.pub")


def _package(root, helper_body):
    pkg = root / "gcpkg"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text(helper_body)
    (pkg / "attn.py").write_text(
        textwrap.dedent(
            '''
            """A target."""
            from gramcheck import variants as V

            from .helper import shift


            def fn(q, k, v, *, causal):
                return V.get("softmax").torch(q, k, v, causal=causal) + shift()  # the output
            '''
        )
    )


def test_source_hash_ignores_comments_and_docstrings_and_sees_imported_helpers(tmp_path, monkeypatch):
    _package(tmp_path, "def shift():\n    return 0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import gcpkg.attn

    h0 = source_hash(gcpkg.attn.fn)
    attn = tmp_path / "gcpkg" / "attn.py"
    attn.write_text(attn.read_text().replace("# the output", "# a comment changed").replace("A target", "Docs"))
    assert source_hash(gcpkg.attn.fn) == h0
    (tmp_path / "gcpkg" / "helper.py").write_text("def shift():\n    return 0.0 * 1\n")
    assert source_hash(gcpkg.attn.fn) != h0


def test_verify_tells_source_changes_from_result_changes(tmp_path, monkeypatch):
    _package(tmp_path, "def shift():\n    return 0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("gcpkg")]:
        monkeypatch.delitem(sys.modules, name)
    path = tmp_path / "c.json"
    certify("gcpkg.attn:fn", "softmax", properties=["agreement"], domain=TINY, out=str(path))
    helper = tmp_path / "gcpkg" / "helper.py"
    helper.write_text("def shift():\n    return 0.0\n\n\ndef unused():\n    return 1\n")
    result = verify(path)
    assert result.ok and result.status == "source changed, results identical"
    helper.write_text("def shift():\n    return 0.1\n")
    import gcpkg.helper

    monkeypatch.setattr(gcpkg.helper, "shift", lambda: 0.1)
    monkeypatch.setattr(gcpkg.attn, "shift", lambda: 0.1)
    result = verify(path)
    assert not result.ok and result.status == "results changed"


def test_counterexample_file_outside_the_folder_is_refused(leaky, tmp_path):
    _, path = leaky
    data = json.loads(path.read_text())
    entry = next(e for e in data["properties"] if e["counterexample_file"])
    outside = tmp_path / "outside.npz"
    outside.write_bytes((path.parent / entry["counterexample_file"]).read_bytes())
    link = path.parent / "link.npz"
    link.symlink_to(outside)
    for name in ("../../etc/passwd", "/etc/passwd", str(outside), "link.npz"):
        entry["counterexample_file"] = name
        forged = path.parent / "forged.json"
        _rewrite(forged, data)
        with pytest.raises(CertificateError, match="outside the certificate's folder"):
            load(forged)


def test_deep_nesting_is_a_clear_error(tmp_path):
    p = tmp_path / "deep.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CertificateError, match="nests JSON 100000 levels deep"):
        load(p)
    p.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(CertificateError, match="levels deep"):
        load(p)


def test_no_local_constants_while_searching(tmp_path, monkeypatch):
    """Hypothesis harvests literals of every imported module outside site-packages; gramcheck's search
    sees none of them."""
    from hypothesis.internal.conjecture import providers

    from gramcheck.search import _no_local_constants

    (tmp_path / "gc_local_consts.py").write_text("C = [0.123456789, 98765.4321, 31337]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import gc_local_consts  # noqa: F401

    assert 31337 in providers._get_local_constants().integers
    with _no_local_constants():
        assert len(providers._get_local_constants()) == 0
    assert 31337 in providers._get_local_constants().integers


def test_certificate_bytes_do_not_depend_on_the_working_directory(tmp_path):
    args = ["certify", "builtin:linear-elu", "--causal", "--property", "causality", "--max-n", "4", "--max-d", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    (tmp_path / "other").mkdir()
    for cwd, name in ((ROOT, "a.json"), (tmp_path / "other", "b.json")):  # ROOT holds gramcheck's source
        r = subprocess.run(
            [sys.executable, "-m", "gramcheck", *args, "--examples", "2", "-o", str(tmp_path / name)],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
        )
        assert r.returncode == 0, r.stderr
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert json.loads((tmp_path / "a.json").read_text())["environment"]["hypothesis"]


def test_plugin_and_cli_certificates_have_the_same_bytes(pytester):
    import shutil

    shutil.copytree(ROOT / "examples" / "thirdparty_ci", pytester.path, dirs_exist_ok=True)
    pytester.makepyfile(
        test_small="""
        from mylinattn.attention import linear_attention
        from gramcheck.pytest_plugin import attention_suite

        test_small = attention_suite(linear_attention, "linear-elu", causal=True,
                                     properties=["causality", "agreement"],
                                     domain={"max_n": 4, "max_d": 2, "examples": 2})
        """
    )
    r = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "test_small.py", "--gramcheck-certificates", "pl")
    assert r.ret == 0
    (plugin,) = (pytester.path / "pl").glob("*.json")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(pytester.path)]), "OMP_NUM_THREADS": "1"}
    cli = subprocess.run(
        [sys.executable, "-m", "gramcheck", "certify", "mylinattn.attention:linear_attention", "--variant",
         "linear-elu", "--causal", "--property", "causality", "--property", "agreement", "--max-n", "4",
         "--max-d", "2", "--examples", "2", "-o", str(pytester.path / "cli" / plugin.name)],
        cwd=pytester.path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert cli.returncode == 0, cli.stderr
    assert (pytester.path / "cli" / plugin.name).read_bytes() == plugin.read_bytes()


def test_a_certificate_of_the_default_domain_states_its_sizes_and_verifies(tmp_path, capsys):
    """The profile's sizes are recorded (the schema requires integers): certify with no domain, then verify."""
    path = tmp_path / "default.json"
    cert = certify("builtin:linear-elu", properties=["determinism"], out=str(path))
    domain = json.loads(path.read_text())["domain"]
    assert cert.passed and domain["max_n"] == 320 and domain["max_d"] == 64
    assert main(["verify", str(path)]) == 0
    assert "reproduced" in capsys.readouterr().out


def test_a_flushing_target_is_recorded_and_verified_under_the_flushing_model(tmp_path, capsys):
    path = tmp_path / "flush.json"
    cert = certify(
        "builtin:retnet", causal=True, subnormals="flush", properties=["agreement"], domain=TINY, out=str(path)
    )
    assert cert.data["environment"]["subnormals"] == "flush"
    assert verify(path).ok
    assert main(["verify", str(path)]) == 0
    gradual = certify("builtin:retnet", causal=True, properties=["agreement"], domain=TINY)
    assert "subnormals" not in gradual.data["environment"]  # gradual certificates keep their bytes
    data = json.loads(path.read_text())
    data["environment"]["subnormals"] = "ftz"
    _rewrite(path, data)
    with pytest.raises(CertificateError):
        verify(path)
    with pytest.raises(ValueError, match="subnormals: got 'ftz'"):
        certify("builtin:retnet", causal=True, subnormals="ftz", properties=["agreement"], domain=TINY)
    assert main(["check", "builtin:retnet", "--causal", "--subnormals", "flush", "--property", "agreement",
                 "--max-n", "4", "--max-d", "2", "--examples", "2"]) == 0
    assert "flushing subnormals" in capsys.readouterr().out
