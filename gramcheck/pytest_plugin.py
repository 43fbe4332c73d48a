"""pytest plugin (entry point ``pytest11``): one line per attention function in another library's tests.

    # tests/test_attention_numerics.py
    from gramcheck.pytest_plugin import attention_suite
    from mypkg.attention import linear_attention

    test_linear_attention = attention_suite(linear_attention, "linear-elu", causal=True)

gives one pytest test per applicable property (``test_linear_attention[agreement]``, ...); a failure's
message holds the shrunk counterexample, and a property that could not be judged here (its Finding's
verdict 'skipped') is reported SKIPPED with the Finding's reason. Options: ``--gramcheck-profile
{ci,thorough}``, ``--gramcheck-seed N``, ``--gramcheck-certificates DIR``.

Certificates: one per suite (at the profile and seed it ran), named ``SPEC-VARIANT-MODE-DTYPE-DIGEST.json``
where DIGEST is a hash of every setting the certificate records, so that two suites of one target never
share a file. A certificate records exactly the properties that ran: when only some of a suite's tests ran
(``-k``, a deselection, an error before the Finding), ``requested`` lists the ones that did, so the file
still verifies (``gramcheck verify`` re-runs what it records). Under pytest-xdist each process writes a
partial file named with the session's id and the controller merges that session's partial files only
(identical bytes with and without xdist); partial files of another session are ignored.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from .findings import passed_verdicts

_RESULTS_KEY = "_gramcheck_results"
_SESSION_KEY = "_gramcheck_session"  # the controller's session id (config attribute and workerinput key)


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("gramcheck", "gramcheck numerical property tests")
    group.addoption(
        "--gramcheck-profile",
        choices=["ci", "thorough"],
        default=None,
        help="Hypothesis profile of gramcheck suites (default: the suite's, else ci)",
    )
    group.addoption("--gramcheck-seed", type=int, default=None, help="seed of gramcheck suites (default 0)")
    group.addoption(
        "--gramcheck-certificates",
        default=None,
        metavar="DIR",
        help="write one stability certificate per gramcheck suite to DIR",
    )


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "gramcheck: a gramcheck property test (one property of one suite)")
    setattr(config, _RESULTS_KEY, {})
    setattr(config, _SESSION_KEY, uuid.uuid4().hex)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist: a worker names its partial certificates with the controller's session id."""
    node.workerinput[_SESSION_KEY] = getattr(node.config, _SESSION_KEY)


def _session_id(config: Any) -> str:
    """The id shared by the controller and the pytest-xdist workers of this session."""
    worker: dict[str, Any] = getattr(config, "workerinput", {})
    return str(worker.get(_SESSION_KEY) or getattr(config, _SESSION_KEY))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:120]


def _stem(spec: str, t: Any, causal: bool, settings: list[Any]) -> str:
    """The certificate's file stem: readable (target, variant, mode, dtype) and, after it, a digest of
    every setting that changes what the certificate records, so that two suites never share a file."""
    flush = "-flush" if t.subnormals == "flush" else ""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return _slug(f"{spec}-{t.variant.name}-{'causal' if causal else 'full'}-{t.dtype}{flush}") + f"-{digest}"


def attention_suite(
    target: Callable[..., Any] | str,
    variant: str | None = None,
    *,
    causal: bool = False,
    dtype: str = "float32",
    device: str = "cpu",
    subnormals: str = "gradual",
    params: dict[str, Any] | None = None,
    properties: Sequence[str] | None = None,
    domain: dict[str, Any] | None = None,
    profile: str | None = None,
    seed: int | None = None,
    timeout: float | None = 60.0,
    memory_budget: float | None = None,
) -> Callable[..., None]:
    """A pytest test function, parametrized over the properties gramcheck checks for ``target`` as an
    implementation of ``variant`` (the same arguments as ``gramcheck.check``, validated as ``check``
    validates them when the suite is defined, i.e. at collection). ``--gramcheck-profile`` and
    ``--gramcheck-seed`` override ``profile`` and ``seed``, which default to 'ci' and 0."""
    from . import properties as _properties
    from .api import check_domain, check_seed, make_target, select_properties, target_spec
    from .strategies import PROFILES
    from .validation import check_choice

    if profile is not None:
        check_choice("profile", profile, tuple(PROFILES))
    if seed is not None:
        check_seed(seed)
    t = make_target(
        target, variant, dtype=dtype, device=device, params=params, timeout=timeout, subnormals=subnormals
    )
    t.variant.check_causal(causal)
    check_domain(t.variant, domain, profile or "ci", memory_budget=memory_budget)
    # the same selection, order and record as ``check``, so the certificate has the CLI's bytes
    names = [p.name for p in select_properties(
        t.variant, causal, dict(t.params), t.dtype, properties or None, own_draws=bool(t.own_draws)
    )]
    requested = list(names) if properties else None
    spec = target_spec(target)

    @pytest.mark.gramcheck
    @pytest.mark.parametrize("gramcheck_property", names)
    def test(gramcheck_property: str, request: Any) -> None:
        from .search import run_property

        cfg = request.config
        prof = cfg.getoption("--gramcheck-profile") or profile or "ci"
        sd = cfg.getoption("--gramcheck-seed")
        sd = seed if sd is None else sd
        sd = 0 if sd is None else sd
        dom = check_domain(t.variant, domain, prof, memory_budget=memory_budget)  # the option's profile too
        finding = run_property(
            _properties.get(gramcheck_property), t, causal=causal, domain=dom, profile_name=prof, seed=sd
        )
        settings = [spec, t.variant.name, dict(t.overrides), causal, t.dtype, t.device, t.subnormals, t.timeout]
        settings += [memory_budget]
        settings += [names, requested, dom.resolved(prof).to_dict(), prof, sd]
        getattr(cfg, _RESULTS_KEY, {}).setdefault(
            _stem(spec, t, causal, settings),
            {
                "spec": spec,
                "target": t,
                "causal": causal,
                "profile": prof,
                "seed": sd,
                "domain": dom,
                "findings": {},
                "order": names,
                "requested": requested,
                "limits": {"timeout": t.timeout, "memory_budget": memory_budget},
            },
        )["findings"][finding.name] = finding
        if not finding.passed:
            from .report import render_finding

            msg = [
                f"gramcheck: {gramcheck_property} failed for {t.name} as {t.variant.name} "
                f"({'causal' if causal else 'non-causal'}, {t.dtype}, profile {prof}, seed {sd})",
                render_finding(finding, width=2000),
            ]
            if finding.counterexample:
                msg.append(f"shrunk counterexample: {finding.counterexample}")
            pytest.fail("\n".join(msg), pytrace=False)
        if finding.skipped:
            pytest.skip(f"gramcheck: {gramcheck_property} not judged: {finding.skipped}")

    test.__doc__ = f"gramcheck properties of {spec} as {t.variant.name}"
    return test


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """Each process writes a partial certificate per suite; the controller (or the only process) merges
    this session's partial files into one certificate per suite."""
    out = session.config.getoption("--gramcheck-certificates", default=None)
    if not out:
        return
    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    session_id = _session_id(session.config)
    _write_partials(getattr(session.config, _RESULTS_KEY, {}), directory, session_id, session.config)
    if not hasattr(session.config, "workerinput"):  # a pytest-xdist worker leaves the merge to the controller
        _merge_partials(directory, session_id)


def _write_partials(results: dict[str, dict[str, Any]], directory: Path, session_id: str, config: Any) -> None:
    """One ``.STEM~SESSION~WORKER~PID.partial.json`` per suite this process ran tests of (the certificate
    of its Findings, with the suite's property order), counterexample files beside it."""
    from .api import certificate_of
    from .certificate import canonical_json
    from .report import Report

    tag = getattr(config, "workerinput", {}).get("workerid", "main")
    for stem, r in results.items():
        t = r["target"]
        report = Report(
            t.name,
            t.variant.name,
            r["causal"],
            t.dtype,
            t.device,
            r["profile"],
            r["seed"],
            r["domain"].resolved(r["profile"]).to_dict(),
            [r["findings"][n] for n in r["order"] if n in r["findings"]],
            params=dict(t.overrides),
            requested=r["requested"],
            subnormals=t.subnormals,
            limits=r["limits"],
        )
        cert = certificate_of(report, t, spec=r["spec"], stem=stem)
        for name, blob in cert.attachments.items():
            (directory / name).write_bytes(blob)
        part = {"stem": stem, "order": r["order"], "certificate": cert.data}
        (directory / f".{stem}~{session_id}~{tag}~{os.getpid()}.partial.json").write_text(canonical_json(part))


def _merge_partials(directory: Path, session_id: str) -> None:
    """Merge the partial files of session ``session_id`` (one per process that ran part of a suite) into
    ``STEM.json``, removing them. The properties are in the suite's order; when only some of them ran,
    ``requested`` names those, so the certificate claims (and ``verify`` re-runs) exactly what ran."""
    from .certificate import canonical_json, content_hash

    groups: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(directory.glob(f".*~{session_id}~*.partial.json")):
        part = json.loads(path.read_text())
        groups.setdefault(part["stem"], []).append(part)
        path.unlink()
    for stem, parts in groups.items():
        order = parts[0]["order"]
        entries = {e["property"]: e for p in parts for e in p["certificate"]["properties"]}
        merged = dict(parts[0]["certificate"])
        merged["properties"] = [entries[n] for n in order if n in entries]
        if len(merged["properties"]) < len(order):
            merged["requested"] = [e["property"] for e in merged["properties"]]
        merged["passed"] = passed_verdicts(e["verdict"] for e in merged["properties"])
        merged.pop("content_hash", None)
        merged["content_hash"] = content_hash(merged)
        (directory / f"{stem}.json").write_text(canonical_json(merged), encoding="utf-8")
