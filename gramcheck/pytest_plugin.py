"""pytest plugin (entry point ``pytest11``): one line per attention function in another library's tests.

    # tests/test_attention_numerics.py
    from gramcheck.pytest_plugin import attention_suite
    from mypkg.attention import linear_attention

    test_linear_attention = attention_suite(linear_attention, "linear-elu", causal=True)

gives one pytest test per applicable property (``test_linear_attention[agreement]``, ...); a failure's
message holds the shrunk counterexample, and a property that could not be judged here (its Finding's
verdict 'skipped') is reported SKIPPED with the Finding's reason. Options: ``--gramcheck-profile {ci,thorough}``,
``--gramcheck-seed N``, ``--gramcheck-certificates DIR`` (one certificate per suite, also under
pytest-xdist, where each worker writes a partial file and the controller merges them).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

_RESULTS_KEY = "_gramcheck_results"


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


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:120]


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
    key = json.dumps(
        [spec, t.variant.name, causal, t.dtype, device, subnormals, sorted((params or {}).items())], default=str
    )

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
        getattr(cfg, _RESULTS_KEY, {}).setdefault(
            key,
            {
                "spec": spec,
                "target": t,
                "causal": causal,
                "profile": prof,
                "seed": sd,
                "domain": dom,
                "findings": [],
                "order": names,
                "requested": requested,
            },
        )["findings"].append(finding)
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
    out = session.config.getoption("--gramcheck-certificates", default=None)
    if not out:
        return
    from .api import certificate_of
    from .certificate import canonical_json, content_hash
    from .report import Report

    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    results = getattr(session.config, _RESULTS_KEY, {})
    tag = getattr(session.config, "workerinput", {}).get("workerid", "main")
    for r in results.values():
        t = r["target"]
        flush = "-flush" if t.subnormals == "flush" else ""
        slug = _slug(f"{r['spec']}-{t.variant.name}-{'causal' if r['causal'] else 'full'}-{t.dtype}{flush}")
        findings = sorted(r["findings"], key=lambda f: r["order"].index(f.name))
        report = Report(
            t.name,
            t.variant.name,
            r["causal"],
            t.dtype,
            t.device,
            r["profile"],
            r["seed"],
            r["domain"].resolved(r["profile"]).to_dict(),
            findings,
            params=dict(t.overrides),
            requested=r["requested"],
            subnormals=t.subnormals,
        )
        cert = certificate_of(report, t, spec=r["spec"], stem=slug)
        for name, blob in cert.attachments.items():
            (directory / name).write_bytes(blob)
        (directory / f".{slug}~{tag}~{os.getpid()}.partial.json").write_text(canonical_json(cert.data))
    if hasattr(session.config, "workerinput"):
        return  # a pytest-xdist worker: the controller merges
    # merge the partial files (one per process that ran part of a suite) into one certificate per suite
    groups: dict[str, list[dict[str, Any]]] = {}
    for part in sorted(directory.glob(".*.partial.json")):
        slug = part.name[1:].split("~")[0]
        groups.setdefault(slug, []).append(json.loads(part.read_text()))
        part.unlink()
    for slug, parts in groups.items():
        merged = dict(parts[0])
        entries = {e["property"]: e for p in parts for e in p["properties"]}
        from . import properties as _properties

        # the order check runs them in: as requested, else the catalogue's
        order = {n: i for i, n in enumerate(merged.get("requested") or _properties.names())}
        merged["properties"] = [entries[k] for k in sorted(entries, key=lambda n: (order.get(n, len(order)), n))]
        merged["passed"] = all(e["verdict"] != "fail" for e in merged["properties"])
        merged.pop("content_hash", None)
        merged["content_hash"] = content_hash(merged)
        (directory / f"{slug}.json").write_text(canonical_json(merged), encoding="utf-8")
