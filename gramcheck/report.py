"""``Report``: the Findings of one ``check`` run, with a summary and ``raise_for_failures``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .findings import Finding


class PropertyFailure(AssertionError):
    """Raised by ``Report.raise_for_failures``; the message lists each failing Finding with its
    counterexample."""


@dataclass
class Report:
    target: str
    variant: str
    causal: bool
    dtype: str
    device: str
    profile: str
    seed: int
    domain: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    # the property names asked for; None: every applicable property
    requested: list[str] | None = None

    @property
    def passed(self) -> bool:
        return all(f.passed for f in self.findings)

    @property
    def failures(self) -> list[Finding]:
        return [f for f in self.findings if not f.passed]

    def __getitem__(self, name: str) -> Finding:
        for f in self.findings:
            if f.name == name:
                return f
        raise KeyError(f"property {name!r} is not in this report; it has {[f.name for f in self.findings]}")

    def summary(self) -> str:
        mode = "causal" if self.causal else "non-causal"
        setting = f"{mode}, {self.dtype}, {self.device}, profile {self.profile}, seed {self.seed}"
        head = f"{self.target} as {self.variant} ({setting})"
        lines = [head]
        for f in self.findings:
            verdict = "pass" if f.passed else "FAIL"
            kind = f" [{f.failure}]" if f.failure else ""
            lines.append(f"  {verdict:4s} {f.name:26s} measured {f.measured:.3g} bound {f.bound:.3g}{kind}")
        lines.append(f"  {len(self.findings) - len(self.failures)} passed, {len(self.failures)} failed")
        return "\n".join(lines)

    def raise_for_failures(self) -> None:
        if self.passed:
            return
        parts = [self.summary()]
        for f in self.failures:
            parts.append(f"\n{f.name}: measured {f.measured:.6g} > bound {f.bound:.6g}")
            if f.failure:
                parts.append(f"  target failure: {f.failure}: {f.details.get('error', '')}")
            if f.counterexample:
                parts.append(f"  counterexample: {f.counterexample}")
        raise PropertyFailure("\n".join(parts))

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "variant": self.variant,
            "causal": self.causal,
            "dtype": self.dtype,
            "device": self.device,
            "profile": self.profile,
            "seed": self.seed,
            "domain": self.domain,
            "params": self.params,
            "passed": self.passed,
            "findings": [f.to_dict() for f in self.findings],
        }
