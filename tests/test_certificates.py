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
from gramcheck.certificate import canonical_json, content_hash, load, source_hash
from gramcheck.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = {"max_n": 4, "max_d": 2, "examples": 2}
LEAK = "broken:softmax_leaking_one_future_token"


def _rewrite(path, data):
    data.pop("signature", None)
    data["content_hash"] = content_hash(data)
    path.write_text(canonical_json(data))


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


def test_the_source_hash_of_a_partial_target_covers_the_module_that_defines_it(tmp_path, monkeypatch):
    """A 'module:attr' target that is a functools.partial: its own __module__ is functools, and the hash covered the
    standard library; it covers the module the attribute lives in (and what it imports) now."""
    from gramcheck.api import certificate_of, check

    pkg = tmp_path / "gcpart"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    body = "import functools\n\nfrom gramcheck import variants as V\n\n\ndef _attn(q, k, v, *, causal, shift):\n"
    body += "    return V.get('softmax').torch(q, k, v, causal=causal) + shift\n\n\n"
    body += "fn = functools.partial(_attn, shift=0.0)\n"
    (pkg / "attn.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    report = check("gcpart.attn:fn", "softmax", properties=["agreement"], domain=TINY)
    h0 = certificate_of(report, "gcpart.attn:fn").data["target"]["source_sha256"]
    (pkg / "attn.py").write_text(body.replace("shift=0.0", "shift=0.5"))
    assert certificate_of(report, "gcpart.attn:fn").data["target"]["source_sha256"] != h0


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


def test_a_key_given_twice_or_a_rewritten_layout_is_refused_even_under_a_signature(leaky, tmp_path):
    """The signature covers the canonical JSON of the parsed object, and Python's parser keeps the last of a key
    given twice: a key prepended to a signed file (``"passed":true`` before the real one) left the signature
    valid while a first-key reader saw another certificate. A repeated key is refused, and so is any layout
    other than the canonical bytes gramcheck writes (the bytes hashed and signed)."""
    pytest.importorskip("cryptography")
    assert main(["keygen", str(tmp_path / "k.pem"), str(tmp_path / "k.pub")]) == 0
    cert, _ = leaky
    signed = tmp_path / "signed.json"
    cert.sign(tmp_path / "k.pem").write(signed)
    for name in cert.attachments:
        (tmp_path / name).write_bytes(cert.attachments[name])
    load(signed)
    text = signed.read_text()
    doubled = tmp_path / "doubled.json"
    doubled.write_text('{"passed":true,"properties":[],' + text[1:])
    with pytest.raises(CertificateError, match="repeats the key 'passed'"):
        load(doubled)
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps(json.loads(text), indent=1))
    for name in cert.attachments:
        (tmp_path / name).write_bytes(cert.attachments[name])
    with pytest.raises(CertificateError, match="not in canonical form"):
        load(pretty)


def test_every_field_of_a_property_is_compared_and_each_property_is_listed_once(leaky, tmp_path):
    """verify compared verdict, measured, bound, examples, rigour and failure only: a rehashed file whose details
    dropped the 'not judged' note, or whose margin or counterexample was edited, reproduced.
    Every field is compared now, and a property listed twice (a made-up entry before the real one) is refused."""
    _, path = leaky
    for npz in path.parent.glob("leak.*.npz"):  # the counterexample files, beside the edited copies
        (tmp_path / npz.name).write_bytes(npz.read_bytes())
    data = json.loads(path.read_text())
    at = next(i for i, e in enumerate(data["properties"]) if e["verdict"] == "pass")
    edits = {
        "details": lambda e: e["details"].update(note="every entry judged"),
        "margin": lambda e: e.update(margin=1e9),
        "counterexample": lambda e: e.update(counterexample={"kind": "gaussian"}),
    }
    for field, edit in edits.items():
        forged = json.loads(path.read_text())
        edit(forged["properties"][at])
        out = tmp_path / f"{field}.json"
        _rewrite(out, forged)
        result = verify(out, accept_recorded_failures=True)
        assert not result.ok and any(f".{field}" in d for d in result.differences), (field, result.differences)
    twice = json.loads(path.read_text())
    twice["properties"].insert(0, dict(twice["properties"][at], measured=0.0, rigour="proved"))
    out = tmp_path / "twice.json"
    _rewrite(out, twice)
    with pytest.raises(CertificateError, match="more than once"):
        load(out)


def test_verify_is_ok_only_for_a_reproduced_pass(leaky, capsys):
    """README's ``assert gramcheck.verify("cert.json").ok`` let a reproduced record of failures through (the CLI
    exited 1 on it): ``ok`` is now a reproduced certificate that records a pass, or failures accepted."""
    _, path = leaky
    result = verify(path)
    assert result.reproduced and not result.ok and result.status == "reproduced"
    assert verify(path, accept_recorded_failures=True).ok


def test_a_subset_certificate_names_what_it_does_not_cover(leaky, tmp_path, capsys):
    """A certificate of the properties a check was asked for is legitimate and verifies, the failing ones dropped
    included when they were not requested; it says so: verify names the requested subset and the applicable
    properties it does not cover. An empty property list is an error, not a certificate of nothing."""
    _, path = leaky
    data = json.loads(path.read_text())
    kept = [e for e in data["properties"] if e["verdict"] == "pass"]
    narrowed = dict(data, properties=kept, passed=True, requested=[e["property"] for e in kept])
    out = tmp_path / "subset.json"
    _rewrite(out, narrowed)
    result = verify(out)
    assert result.ok and result.coverage.startswith("only the requested"), result.coverage
    assert "not checked: " in result.coverage and "causality" in result.coverage.split("not checked: ")[1]
    assert main(["verify", str(out)]) == 0
    assert "covers only the requested" in capsys.readouterr().out
    with pytest.raises(ValueError, match="properties: got an empty list"):
        certify(LEAK, "softmax", causal=True, domain=TINY, properties=[])


def test_a_check_that_judges_nothing_does_not_pass(tmp_path, capsys):
    """Every property skipped (packing and packing-isolation on a target without ``cu_seqlens``): the report, the
    certificate and the CLI said passed. Nothing was judged, so nothing passed: ``passed`` is False, the summary
    says so, a skipped property records 0 examples, and the certificate loads with passed false."""
    from gramcheck import check

    spec = "broken:gla_with_inverted_decay"  # any target without cu_seqlens: packing does not apply to it
    r = check(spec, "gla", causal=True, properties=["packing", "packing-isolation"], domain=TINY)
    assert all(f.skipped for f in r.findings) and not r.failures, r.summary()
    assert not r.passed and "nothing was judged" in r.summary()
    assert all(f.details["examples"] == 0 for f in r.findings), [f.details for f in r.findings]
    out = tmp_path / "nothing.json"
    cert = certify(spec, "gla", causal=True, properties=["packing"], domain=TINY, out=str(out))
    assert not cert.passed and not load(out)["passed"]
    assert verify(out).reproduced and not verify(out, accept_recorded_failures=True).ok  # no failure to accept
    args = ["check", spec, "--variant", "gla", "--causal", "--property", "packing", "--max-n", "4", "--max-d", "2"]
    assert main(args) == 1
    assert "nothing was judged" in capsys.readouterr().out


def test_a_failure_whose_message_changes_between_runs_still_verifies(tmp_path):
    """The target's exception text is its own words, which may hold ids or times: verify compares the failure
    kind and the verdict, not the text (comparing every detail made an honest failing certificate 'results
    changed')."""
    out = tmp_path / "raises.json"
    spec = "isolation_targets:raises_with_an_id"
    cert = certify(spec, "softmax", properties=["agreement"], domain=TINY, out=str(out))
    assert not cert.passed and cert.data["properties"][0]["failure"] == "raised"
    result = verify(out, accept_recorded_failures=True)
    assert result.ok and result.status == "reproduced", result.differences


def test_the_limits_are_recorded_and_verify_applies_them(tmp_path, monkeypatch):
    """A check that timed out under a short timeout reproduces only under the same timeout: the certificate
    records the timeout and the memory budget, and verify re-runs with them; one written before they were
    recorded verifies with the defaults."""
    import gramcheck.api as api

    path = tmp_path / "limits.json"
    cert = certify("builtin:retnet", causal=True, properties=["agreement"], domain=TINY, timeout=30.0,
                   memory_budget=2.0**31, out=str(path))
    assert cert.data["limits"] == {"timeout": 30.0, "memory_budget": 2.0**31}
    seen = []
    original = api.certify

    def spy(*args, **kw):
        seen.append({k: kw.get(k) for k in ("timeout", "memory_budget")})
        return original(*args, **kw)

    monkeypatch.setattr(api, "certify", spy)
    assert verify(path).ok
    assert seen[-1] == {"timeout": 30.0, "memory_budget": 2.0**31}
    data = json.loads(path.read_text())
    data["limits"]["timeout"] = 7.0
    _rewrite(path, data)
    v = verify(path)
    assert seen[-1]["timeout"] == 7.0 and v.ok  # the same result under the recorded limit
    del data["limits"]
    _rewrite(path, data)
    assert verify(path).ok and seen[-1] == {"timeout": None, "memory_budget": None}
    data["limits"] = {"timeout": 0}
    _rewrite(path, data)
    with pytest.raises(CertificateError):
        verify(path)
