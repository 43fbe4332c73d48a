"""The README's main job: check every built-in variant's torch forms against the oracle (one table row per
form, mode and dtype), then certify every built-in variant with the default catalogue and write the
certificates to ./certificates/."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from . import variants as _variants
from .agreement import check_agreement
from .findings import Finding
from .inputs import draw_extras
from .precision import round_to

# real failure modes of built-in variants that the catalogue reports (proofs/invariants.md): the demo
# shows them as failures and does not count them against its exit status
KNOWN_FINDINGS = {
    ("linear-relu", "normaliser-margin"): "relu features: a row with no positive overlap has den = 0 (0/0)",
    ("performer-trig", "normaliser-margin"): "trig features: denominators can be negative",
}
# FAVOR+ features underflow for |x|^2 / (2 sqrt d) beyond the exponent range, in every dtype: random-feature
# variants are certified on bounded-norm kinds (the domain is recorded in each certificate)
BOUNDED_KINDS = (
    "gaussian",
    "spectrum",
    "low-rank",
    "near-duplicate",
    "heavy-tail",
    "anti-aligned",
    "degenerate",
    "long",
)
DEMO_DOMAIN = {"max_n": 16, "max_d": 4, "examples": 10}


def demo_inputs(
    variant: Any, *, dtype: str, B: int = 1, H: int = 2, N: int = 32, d: int = 8, m: int = 16, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Seeded Gaussian q, k, v (B, H, N, d) representable in ``dtype``, plus the variant's extra inputs
    drawn in their specs' benign regimes (log-decays in [-0.5, 0), an orthogonal random matrix (m, d))."""
    var = _variants.get(variant)
    rng = np.random.default_rng(seed)
    q, k, v = (round_to(rng.standard_normal((B, H, N, d)), dtype) for _ in range(3))
    if "vanishing-denominator" in var.tags():  # keep denominators away from zero for the agreement check
        q, k = np.abs(q) + round_to(np.full_like(q, 0.25), dtype), np.abs(k) + round_to(np.full_like(k, 0.25), dtype)
    dims = {"B": B, "H": H, "N": N, "dk": d, "dv": d, "m": m}
    extras = draw_extras(var.inputs, dims, dtype=dtype, seed=seed + 1)
    return q, k, v, extras


def form_findings(
    dtypes: tuple[str, ...] = ("float32", "float64"), seed: int = 0, chunk_size: int = 8
) -> Iterator[Finding]:
    """One reference-agreement Finding per (variant, form, causal mode, dtype)."""
    import torch

    for var in _variants.list():
        modes = [True] if "causal-only" in var.declares else [False, True]
        for dtype in dtypes:
            q, k, v, ex = demo_inputs(var, dtype=dtype, seed=seed)
            tt = {n: torch.as_tensor(x).to(getattr(torch, dtype)) for n, x in ex.items()}
            args = [torch.as_tensor(x).to(getattr(torch, dtype)) for x in (q, k, v)]
            for causal in modes:
                for form in var.forms_for(causal):
                    out = var.torch(*args, causal=causal, form=form, chunk_size=chunk_size, **tt)
                    name = f"agreement[{var.name}/{form}/{'causal' if causal else 'full'}/{dtype}]"
                    f = check_agreement(name, out.double().numpy(), var, q, k, v, causal=causal, dtype=dtype, **ex)
                    f.details.update(variant=var.name, form=form, causal=causal)
                    yield f


def run_demo(
    seed: int = 0, out: Path = Path("certificates"), on_finding: Callable[[Finding, int, int], None] | None = None
) -> tuple[Any, Any, int]:
    """(forms table, certificates table, number of unexpected failures); ``on_finding(finding, done,
    total)`` is called as each form check and each certified property finishes (progress)."""
    from rich.markup import escape
    from rich.table import Table

    from .api import certify

    forms = Table(title="built-in torch forms against the oracle (error / gamma-bound, <= 1 passes)")
    for col in ("variant", "form", "mode", "dtype", "oracle", "max err", "err/bound", "verdict"):
        forms.add_column(col, justify="right" if col in ("max err", "err/bound") else "left")
    failed = 0
    for f in form_findings(seed=seed):
        if on_finding is not None:
            on_finding(f, 0, 0)
        d = f.details
        failed += not f.passed
        forms.add_row(
            d["variant"],
            d["form"],
            "causal" if d["causal"] else "full",
            d["dtype"],
            d["oracle"],
            f"{d.get('max_abs_error', float('nan')):.2e}",
            f"{f.measured:.3f}",
            "[green]pass[/green]" if f.passed else "[red]FAIL[/red]",
        )

    certs = Table(title=f"certificates ({escape(str(out))}/): default properties, profile ci, seed {seed}")
    for col in ("variant", "mode", "properties", "failed", "worst margin", "file"):
        certs.add_column(col)
    out.mkdir(parents=True, exist_ok=True)
    for var in _variants.list():
        causal = "causal-only" in var.declares
        kinds = BOUNDED_KINDS if "random-features" in var.declares else None
        path = out / f"{var.name}.json"
        cert = certify(
            f"builtin:{var.name}",
            causal=causal,
            seed=seed,
            domain={**DEMO_DOMAIN, "kinds": kinds},
            out=str(path),
            on_finding=None if on_finding is None else _prefixed(on_finding, var.name),
        )
        entries = cert.data["properties"]
        bad = [e["property"] for e in entries if e["verdict"] == "fail"]
        unexpected = [p for p in bad if (var.name, p) not in KNOWN_FINDINGS]
        failed += len(unexpected)
        margins = [e["margin"] for e in entries if isinstance(e["margin"], float)]
        label = (
            ", ".join(
                f"{p} (known: {KNOWN_FINDINGS[(var.name, p)]})"
                if (var.name, p) in KNOWN_FINDINGS
                else f"[red]{p}[/red]"
                for p in bad
            )
            or "-"
        )
        certs.add_row(
            var.name,
            "causal" if causal else "full",
            str(len(entries)),
            label,
            f"{min(margins):.3g}" if margins else "-",
            escape(str(path)),
        )
    return forms, certs, failed


def _prefixed(on_finding: Callable[[Finding, int, int], None], label: str) -> Callable[[Finding, int, int], None]:
    def call(f: Finding, done: int, total: int) -> None:
        on_finding(replace(f, name=f"{label}: {f.name}"), done, total)

    return call
