"""``Report``: the Findings of one ``check`` run, with a summary and ``raise_for_failures``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .findings import Finding, passed_verdicts


def _num(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, (int, float)) else str(x)


def render_finding(f: Finding, *, width: int = 160) -> str:
    """One line for a Finding: verdict, the ratio against its bound, and where the details have them the
    error and the tolerance in their own units with the entry where it happened (worst_error,
    worst_bound, worst_index), the target's failure kind with its message (truncated to ``width``), and
    the counterexample's kind and shape, and the Finding's note (what its verdict does not cover). The CLI,
    the pytest plugin and ``Report.summary`` all use it."""
    d = f.details
    verdict = "FAIL" if f.verdict == "fail" else f.verdict
    parts = [f"{verdict} {f.name}: measured {_num(f.measured)} vs bound {_num(f.bound)}"]
    if "worst_error" in d and "worst_bound" in d:
        where = f" at entry {tuple(d['worst_index'])}" if d.get("worst_index") is not None else ""
        parts.append(f"(error {_num(d['worst_error'])} vs tolerance {_num(d['worst_bound'])}{where})")
    if f.failure:
        msg = str(d.get("error", ""))
        if len(msg) > width:
            msg = msg[: width - 3] + "..."
        parts.append(f"[{f.failure}: {msg}]" if msg else f"[{f.failure}]")
    if not f.passed and f.counterexample:
        ce = f.counterexample
        parts.append(f"counterexample {ce.get('kind', '')} shape {ce.get('shape', '')}")
    if d.get("note"):  # what the verdict does not cover, or why nothing was judged
        parts.append(f"[{_clip(str(d['note']), width)}]")
    return " ".join(parts)


def _clip(text: str, width: int) -> str:
    return text[: width - 3] + "..." if len(text) > width else text


def note(f: Finding, *, width: int = 80) -> str:
    """The table's note column: the failure kind and its message (truncated), or the error in its own
    units, and the counterexample's kind and shape."""
    d = f.details
    out = []
    if f.verdict == "skipped":
        return f"skipped: {_clip(str(f.skipped), width)}"
    if f.failure:
        out.append(f"{f.failure}: {_clip(str(d.get('error', '')), width)}")
    elif "worst_error" in d and "worst_bound" in d:
        where = f" at {tuple(d['worst_index'])}" if d.get("worst_index") is not None else ""
        out.append(f"err {_num(d['worst_error'])} tol {_num(d['worst_bound'])}{where}")
    if not f.passed and f.counterexample:
        ce = f.counterexample
        out.append(f"{ce.get('kind', '')} shape={ce.get('shape', '')}")
    if d.get("note"):  # what the verdict does not cover (entries or tensors it could not judge)
        out.append(_clip(str(d["note"]), width))
    return " ".join(out)


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
    # the target's underflow as the rounding bounds model it (arith.subnormals)
    subnormals: str = "gradual"
    # the run's limits: seconds per target call (None: none) and the memory budget in bytes (None: the default)
    limits: dict[str, Any] = field(default_factory=lambda: {"timeout": None, "memory_budget": None})

    @property
    def passed(self) -> bool:
        """No property failed and at least one was judged (``findings.passed_verdicts``)."""
        return passed_verdicts(f.verdict for f in self.findings)

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
        flush = ", flushing subnormals" if self.subnormals == "flush" else ""
        setting = f"{mode}, {self.dtype}{flush}, {self.device}, profile {self.profile}, seed {self.seed}"
        head = f"{self.target} as {self.variant} ({setting})"
        lines = [head]
        for f in self.findings:
            lines.append("  " + render_finding(f))
        lines += ["  " + line for line in self.tally()]
        return "\n".join(lines)

    def tally(self) -> list[str]:
        """The counts line ('7 passed, 0 failed, 2 skipped'), and a line saying so when nothing was judged."""
        skipped = sum(1 for f in self.findings if f.skipped)
        passed = len(self.findings) - len(self.failures) - skipped
        lines = [f"{passed} passed, {len(self.failures)} failed" + (f", {skipped} skipped" if skipped else "")]
        if not self.passed and not self.failures:
            lines.append("nothing was judged: every property was skipped (not a pass)")
        return lines

    def raise_for_failures(self) -> None:
        if self.passed:
            return
        parts = [self.summary()]
        for f in self.failures:
            parts.append("\n" + render_finding(f, width=2000))
            if f.counterexample:
                parts.append(f"  counterexample: {f.counterexample}")
        raise PropertyFailure("\n".join(parts))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (standard JSON: non-finite numbers as the strings "inf", "-inf", "nan", the
        certificate's convention)."""
        from .certificate import _plain

        return _plain({
            "target": self.target,
            "variant": self.variant,
            "causal": self.causal,
            "dtype": self.dtype,
            "device": self.device,
            "subnormals": self.subnormals,
            "profile": self.profile,
            "seed": self.seed,
            "domain": self.domain,
            "params": self.params,
            "passed": self.passed,
            "requested": self.requested,
            "findings": [f.to_dict() for f in self.findings],
        })
