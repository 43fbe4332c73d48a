"""The pytest plugin, run the way a third-party library runs it (examples/thirdparty_ci with pytester)."""

import json
import shutil
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "thirdparty_ci"


@pytest.fixture
def project(pytester):
    shutil.copytree(EXAMPLE, pytester.path, dirs_exist_ok=True)
    return pytester


def test_example_passes_one_test_per_property(project):
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    outcomes = result.parseoutcomes()
    assert result.ret == 0 and outcomes["passed"] >= 6 and "failed" not in outcomes
    out = result.stdout.str()
    for prop in ("agreement", "causality", "rows-sum-to-one", "convex-hull", "gradcheck"):
        assert f"test_linear_attention[{prop}] PASSED" in out


def test_broken_function_fails_with_the_shrunk_counterexample(project):
    project.makepyfile(
        test_leaky="""
        from mylinattn.attention import leaky_linear_attention
        from gramcheck.pytest_plugin import attention_suite

        test_leaky = attention_suite(leaky_linear_attention, "linear-elu", causal=True,
                                     properties=["causality", "agreement"], domain={"max_n": 8, "max_d": 3})
    """
    )
    result = project.runpytest_subprocess("-q", "-p", "no:cacheprovider", "test_leaky.py")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert "gramcheck: causality failed" in out and "shrunk counterexample" in out and "'shape': [1, 1, 2," in out


def test_certificates_are_identical_with_and_without_xdist(project):
    a = project.runpytest_subprocess("-q", "-p", "no:cacheprovider", "--gramcheck-certificates", "serial")
    b = project.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-n", "2", "--gramcheck-certificates", "parallel")
    assert a.ret == 0 and b.ret == 0
    assert a.parseoutcomes()["passed"] == b.parseoutcomes()["passed"] >= 6
    serial = sorted((project.path / "serial").glob("*.json"))
    parallel = sorted((project.path / "parallel").glob("*.json"))
    assert [p.name for p in serial] == [p.name for p in parallel] and len(serial) == 1
    assert serial[0].read_bytes() == parallel[0].read_bytes()
    assert not list((project.path / "parallel").glob(".*partial*"))  # merged and removed
    cert = json.loads(serial[0].read_text())
    assert cert["passed"] and cert["seed"] == 0 and cert["profile"] == "ci"


def test_profile_and_seed_options(project):
    result = project.runpytest_subprocess(
        *("-q", "-p", "no:cacheprovider", "--gramcheck-seed", "7", "--gramcheck-certificates", "c"),
        *("-k", "agreement and not backward"),
    )
    result.assert_outcomes(passed=1)
    cert = json.loads(next((project.path / "c").glob("*.json")).read_text())
    assert cert["seed"] == 7 and [e["property"] for e in cert["properties"]] == ["agreement"]
    bad = project.runpytest_subprocess("-q", "--gramcheck-profile", "fast")
    assert bad.ret != 0 and "invalid choice" in bad.stderr.str()


TINY = {"max_n": 4, "max_d": 2, "examples": 2}
QUIET = ("-q", "-p", "no:cacheprovider")


def _certificates(directory: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}


@pytest.mark.parametrize(
    ("kwargs", "error", "argument"),
    [
        ({"seed": "x"}, TypeError, "seed:"),
        ({"seed": True}, TypeError, "seed:"),
        ({"profile": "fast"}, ValueError, "profile:"),
        ({"domain": {"kinds": ["bogus"]}}, ValueError, "domain.kinds:"),
        ({"domain": {"min_n": 10**6, "max_n": 10**6}}, ValueError, "domain.max_n:"),
        ({"domain": TINY, "memory_budget": 1000}, ValueError, "memory budget"),
    ],
)
def test_suite_arguments_are_validated_as_check_validates_them(kwargs, error, argument):
    """A bad seed, profile, input kind or a domain over the memory budget is an error when the suite is
    defined (at collection), naming the argument, as ``gramcheck.check`` gives."""
    from gramcheck.pytest_plugin import attention_suite

    with pytest.raises(error, match=argument):
        attention_suite("builtin:linear-elu", causal=True, properties=["causality"], **kwargs)


def test_a_property_that_could_not_be_judged_is_skipped_with_its_reason(project):
    project.makepyfile(
        test_packing=f"""
        from mylinattn.attention import linear_attention
        from gramcheck.pytest_plugin import attention_suite

        test_packing = attention_suite(linear_attention, "linear-elu", causal=True, properties=["packing"],
                                       domain={TINY})
    """
    )
    result = project.runpytest_subprocess(*QUIET, "-rs", "test_packing.py", "--gramcheck-certificates", "c")
    result.assert_outcomes(skipped=1)
    assert "gramcheck: packing not judged: " in result.stdout.str() and "takes no cu_seqlens" in result.stdout.str()
    (cert,) = _certificates(project.path / "c").values()
    assert [(e["property"], e["verdict"]) for e in cert["properties"]] == [("packing", "skipped")]
    # nothing was judged: the merged certificate does not pass, and it loads (passed agrees with its verdicts)
    from gramcheck.certificate import load

    (path,) = (project.path / "c").glob("*.json")
    assert cert["passed"] is False and load(path)["passed"] is False


def test_two_suites_of_one_target_get_a_certificate_each(project):
    """Suites differing in properties or domain only: one certificate each, named deterministically, each
    with its own settings and Findings, each verifying."""
    from gramcheck import verify

    project.makepyfile(
        test_two=f"""
        from gramcheck.pytest_plugin import attention_suite

        test_one = attention_suite("builtin:linear-elu", causal=True, properties=["causality"], domain={TINY})
        test_two = attention_suite("builtin:linear-elu", causal=True, properties=["causality", "agreement"],
                                   domain={TINY})
        test_big = attention_suite("builtin:linear-elu", causal=True, properties=["causality", "agreement"],
                                   domain={{**{TINY}, "max_n": 6}})
    """
    )
    for out in ("a", "b"):
        result = project.runpytest_subprocess(*QUIET, "test_two.py", "--gramcheck-certificates", out)
        result.assert_outcomes(passed=5)
    certs = _certificates(project.path / "a")
    assert [p.read_bytes() for p in sorted((project.path / "a").glob("*.json"))] == [
        p.read_bytes() for p in sorted((project.path / "b").glob("*.json"))
    ]
    both = ["causality", "agreement"]
    settings = sorted(([e["property"] for e in c["properties"]], c["requested"], c["domain"]["max_n"])
                      for c in certs.values())
    assert settings == [(["causality"], ["causality"], 4), (both, both, 4), (both, both, 6)]
    for name in certs:
        assert name.startswith("builtin_linear-elu-linear-elu-causal-float32-")
        v = verify(project.path / "a" / name)
        assert v.ok, v.differences


def test_partial_files_of_another_session_are_not_merged(project):
    """A partial certificate left by a session that never merged (here: a pretend pytest-xdist worker whose
    controller is gone, with another seed) is ignored: the certificate has the bytes of a clean run."""
    project.makepyfile(
        test_one=f"""
        from gramcheck.pytest_plugin import attention_suite

        test_one = attention_suite("builtin:linear-elu", causal=True, properties=["causality"], domain={TINY})
    """
    )
    crashed = project.makeconftest(
        """
        def pytest_configure(config):
            config.workerinput = {"workerid": "gw0", "_gramcheck_session": "0123abcd"}
        """
    )
    run = (*QUIET, "test_one.py", "--gramcheck-certificates")
    project.runpytest_subprocess(*run, "c", "--gramcheck-seed", "7").assert_outcomes(passed=1)
    crashed.unlink()
    (stale,) = (project.path / "c").glob(".*.partial.json")
    project.runpytest_subprocess(*run, "c").assert_outcomes(passed=1)
    project.runpytest_subprocess(*run, "clean").assert_outcomes(passed=1)
    (clean,) = (project.path / "clean").glob("*.json")
    assert [p.name for p in (project.path / "c").glob("[!.]*.json")] == [clean.name]
    assert (project.path / "c" / clean.name).read_bytes() == clean.read_bytes()
    assert json.loads(clean.read_text())["seed"] == 0 and stale.exists()


def test_a_partly_run_suite_certifies_the_properties_that_ran(project):
    """``-k`` runs one property of a suite of every applicable one: the certificate requests that one
    property (not null, "every applicable property"), and verifies."""
    result = project.runpytest_subprocess(*QUIET, "-k", "causality", "--gramcheck-certificates", "c")
    result.assert_outcomes(passed=1, deselected=result.parseoutcomes()["deselected"])
    (path,) = (project.path / "c").glob("*.json")
    cert = json.loads(path.read_text())
    assert cert["requested"] == ["causality"] and [e["property"] for e in cert["properties"]] == ["causality"]
    verified = project.run(sys.executable, "-m", "gramcheck", "verify", str(path))
    assert verified.ret == 0 and "reproduced" in verified.stdout.str()
