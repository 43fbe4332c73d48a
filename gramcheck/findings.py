"""``Finding``: the result of checking one property on one configuration. Assertions, pytest failures,
CLI tables and certificates are all views of Findings."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

RIGOURS = ("sampled", "proved", "enclosed")


@dataclass
class Finding:
    """``measured`` is compared with ``bound`` (measured <= bound passes); ``margin`` = bound / measured
    (inf when measured is 0, below 1 on failure). ``counterexample`` holds the worst input's summary."""

    name: str
    passed: bool
    measured: float
    bound: float
    rigour: str = "sampled"
    counterexample: dict[str, Any] | None = None
    details: dict[str, Any] = field(default_factory=dict)
    # the worst input's arrays (saved beside a certificate as .npz); not part of the JSON view
    arrays: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.rigour not in RIGOURS:
            raise ValueError(f"rigour: got {self.rigour!r}; expected one of {RIGOURS}")

    @property
    def margin(self) -> float:
        if self.measured == 0 or math.isnan(self.measured):
            return math.inf if self.measured == 0 else 0.0
        return self.bound / self.measured

    @property
    def failure(self) -> str | None:
        """The kind of target misbehaviour (targets.FAILURE_KINDS) when the target itself failed."""
        return self.details.get("failure")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("arrays")
        d["margin"] = self.margin
        return d
