"""``Finding``: the result of checking one property on one configuration. Assertions, pytest failures,
CLI tables and certificates are all views of Findings.

The verdict is derived in one place (``Finding.passed``) from ``measured``, ``bound`` and the direction
of the inequality the property declares (``sense``): no construction site sets it by hand."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

# sampled: checked on drawn inputs against a worst-case bound; proved: a statement about the checked
# object itself; enclosed: certified by ball arithmetic; probabilistic: a bound that holds with a stated
# probability under the probabilistic rounding model (proofs/probabilistic-rounding.md)
RIGOURS = ("sampled", "proved", "enclosed", "probabilistic", "statistical")

# measured SENSE bound passes
SENSES: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
}
VERDICTS = ("pass", "fail", "skipped")


def passed_verdicts(verdicts: Iterable[str]) -> bool:
    """Whether a check whose properties have these verdicts passed: none failed and at least one was judged (a
    check whose every property was skipped, or that ran none, checked nothing, and says so by not passing)."""
    seen = list(verdicts)
    return "fail" not in seen and "pass" in seen


def error_ratios(err: Any, bound: Any) -> np.ndarray:
    """err / bound entrywise (float64, bound broadcast to err's shape): 0 where the error is 0, a zero
    bound included (an exact entry computed exactly), inf where the error is NaN or exceeds a zero bound."""
    err = np.asarray(err, dtype=np.float64)
    bound = np.broadcast_to(np.asarray(bound, dtype=np.float64), err.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(err == 0, 0.0, err / bound)
    return np.where(np.isnan(r), np.inf, r)


@dataclass
class Finding:
    """``measured`` is compared with ``bound`` by ``sense`` (``measured <= bound`` by default).

    Derived, never set: ``passed`` (False when measured or bound is NaN, when an upper-bounded measured
    is +inf, a lower-bounded one -inf, and whenever the target itself failed: ``details["failure"]``);
    ``margin`` (bound / measured for upper bounds, measured / bound for lower bounds: >= 1 exactly when
    the Finding passes, inf for a pass with nothing measured, below 1 on failure); ``verdict`` ('pass',
    'fail', or 'skipped' for a property that did not apply, with its reason in ``details["skipped"]``).
    ``counterexample`` holds the worst input's summary."""

    name: str
    measured: float
    bound: float
    sense: str = "<="
    rigour: str = "sampled"
    counterexample: dict[str, Any] | None = None
    details: dict[str, Any] = field(default_factory=dict)
    # the worst input's arrays (saved beside a certificate as .npz); not part of the JSON view
    arrays: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.rigour not in RIGOURS:
            raise ValueError(f"rigour: got {self.rigour!r}; expected one of {RIGOURS}")
        if self.sense not in SENSES:
            raise ValueError(f"sense: got {self.sense!r}; expected one of {tuple(SENSES)}")
        for arg in ("measured", "bound"):
            value = getattr(self, arg)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                try:
                    value = float(value)  # numpy scalars
                except (TypeError, ValueError):
                    raise TypeError(f"{arg}: got {value!r}; expected a real number") from None
            setattr(self, arg, float(value))

    @classmethod
    def skip(cls, name: str, reason: str, **details: Any) -> Finding:
        """A property that does not apply here, listed with its reason (verdict 'skipped', not failing)."""
        return cls(name, math.nan, math.nan, details={**details, "skipped": reason})

    @property
    def skipped(self) -> str | None:
        """The reason the property was not checked, or None."""
        return self.details.get("skipped")

    @property
    def passed(self) -> bool:
        if self.failure:
            return False
        if self.skipped:
            return True
        m, b = self.measured, self.bound
        if math.isnan(m) or math.isnan(b):
            return False
        upper = self.sense in ("<=", "<")
        if (upper and m == math.inf) or (not upper and m == -math.inf):
            return False
        return bool(SENSES[self.sense](m, b))

    @property
    def verdict(self) -> str:
        return "skipped" if self.skipped and not self.failure else ("pass" if self.passed else "fail")

    @property
    def margin(self) -> float:
        if self.skipped and not self.failure:
            return math.nan
        passed = self.passed
        m, b = self.measured, self.bound
        num, den = (b, m) if self.sense in ("<=", "<") else (m, b)
        with_ratio = not (math.isnan(num) or math.isnan(den)) and num >= 0 and den > 0
        r = num / den if with_ratio else (math.inf if passed else 0.0)
        if passed:
            return r if r >= 1 else math.inf  # signed quantities: no meaningful ratio, only the verdict
        return r if r < 1 else 0.0  # a target failure, or a strict sense failing at equality

    @property
    def failure(self) -> str | None:
        """The kind of target misbehaviour (targets.FAILURE_KINDS) when the target itself failed."""
        return self.details.get("failure")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("arrays")
        d["passed"] = self.passed
        d["verdict"] = self.verdict
        d["margin"] = self.margin
        return d


def add_note(details: dict[str, Any], text: str) -> None:
    """Append ``text`` to a Finding's note (what its verdict does not cover)."""
    details["note"] = "; ".join(filter(None, (details.get("note"), text)))
