"""Targets: the attention functions gramcheck checks, behind one calling convention.

A target is a callable ``fn(q, k, v, *, causal, **extras) -> o`` on torch tensors of layout (B, H, N, d)
in one dtype and on one device (extras: ``g`` log-decays (B, H, N, d_k), ``projection`` (m, d_k)),
returning o of shape (B, H, N, d_v) in the same dtype. ``Target`` wraps it with the variant it claims to
implement (whose reference is the truth) and the hyperparameters it implements, and turns everything
the callable can do wrong into a ``TargetError`` with a kind (raised, timeout, wrong-type, wrong-shape,
wrong-dtype, wrong-device, mutates-inputs), which properties report as a failing Finding.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import variants as _variants
from .precision import dtype_name
from .variants.spec import Variant

FAILURE_KINDS = (
    "raised",
    "timeout",
    "wrong-type",
    "wrong-shape",
    "wrong-dtype",
    "wrong-device",
    "mutates-inputs",
    "nondeterministic",
)


class TargetError(Exception):
    """The target misbehaved; ``kind`` is one of FAILURE_KINDS."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


def _torch() -> Any:
    import torch

    return torch


@dataclass
class Target:
    """``fn`` checked as an implementation of ``variant`` with hyperparameters ``params`` in ``dtype``
    on ``device``. ``timeout`` (seconds, or None) bounds one call."""

    fn: Callable[..., Any]
    variant: Variant
    dtype: str = "float32"
    device: str = "cpu"
    params: Mapping[str, Any] = field(default_factory=dict)
    name: str = ""
    timeout: float | None = 60.0
    # one persistent worker thread runs the calls (a new thread per call cost 4x the calls themselves:
    # torch sets up per-thread state each time; benchmarks/RESULTS.md); replaced after a timeout
    _executor: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.variant = _variants.get(self.variant)
        self.dtype = dtype_name(self.dtype)
        self.params = dict(self.variant.resolve_params(self.params))
        if not self.name:
            self.name = getattr(self.fn, "__qualname__", repr(self.fn))

    @property
    def overrides(self) -> dict[str, Any]:
        """The hyperparameters that differ from the variant's defaults (passed to the reference)."""
        return {k: v for k, v in self.params.items() if k not in self.variant.params or self.variant.params[k] != v}

    # ------------------------------------------------------------------------------------------------
    def tensors(
        self, arrays: Mapping[str, np.ndarray], *, requires_grad: bool = False, dtype: str | None = None
    ) -> dict:
        torch = _torch()
        dt = getattr(torch, dtype or self.dtype)
        out = {}
        for n, x in arrays.items():
            t = torch.as_tensor(np.asarray(x, dtype=np.float64)).to(dtype=dt, device=self.device)
            out[n] = t.requires_grad_(requires_grad and n in ("q", "k", "v"))
        return out

    def call_torch(self, q: Any, k: Any, v: Any, *, causal: bool, **extras: Any) -> Any:
        """Call fn on tensors; checks type, shape, dtype, device and input mutation; returns the tensor."""
        torch = _torch()
        inputs = {"q": q, "k": k, "v": v, **extras}
        before = {n: t.detach().clone() for n, t in inputs.items()}
        if self.timeout is None:
            try:
                out = self.fn(q, k, v, causal=causal, **extras)
            except Exception as exc:  # noqa: BLE001 - everything the target raises is a finding
                raise TargetError("raised", f"{self.name} raised {type(exc).__name__}: {exc}") from exc
        else:
            out = self._call_with_timeout(q, k, v, causal, extras)
        for n, t in inputs.items():
            if not torch.equal(t.detach(), before[n]):
                raise TargetError("mutates-inputs", f"{self.name} changed its input {n!r} in place")
        if not isinstance(out, torch.Tensor):
            raise TargetError("wrong-type", f"{self.name} returned {type(out).__name__}; expected a torch.Tensor")
        expected = (*q.shape[:3], v.shape[-1])
        if tuple(out.shape) != expected:
            raise TargetError(
                "wrong-shape", f"{self.name} returned shape {tuple(out.shape)}; expected {expected} (B, H, N, d_v)"
            )
        if out.dtype != q.dtype:
            raise TargetError("wrong-dtype", f"{self.name} returned dtype {out.dtype}; expected {q.dtype}")
        if out.device != q.device:
            raise TargetError("wrong-device", f"{self.name} returned a tensor on {out.device}; expected {q.device}")
        return out

    def _call_with_timeout(self, q: Any, k: Any, v: Any, causal: bool, extras: dict[str, Any]) -> Any:
        if self._executor is None:
            self._executor = _Worker(f"gramcheck-target-{self.name}")
        done, box = self._executor.submit(lambda: self.fn(q, k, v, causal=causal, **extras))
        if not done.wait(self.timeout):
            # the worker is stuck in the target: abandon it (a daemon thread, so it cannot keep the
            # process alive) and start a fresh one for the next call
            self._executor = None
            raise TargetError("timeout", f"{self.name} did not return within {self.timeout:g} s")
        if "exc" in box:
            exc = box["exc"]
            raise TargetError("raised", f"{self.name} raised {type(exc).__name__}: {exc}") from exc
        return box["out"]

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, dtype: str | None = None, **extras: Any) -> np.ndarray:
        """Run on float64 arrays (representable in the dtype); returns float64 NumPy."""
        t = self.tensors({"q": q, "k": k, "v": v, **extras}, dtype=dtype)
        out = self.call_torch(t.pop("q"), t.pop("k"), t.pop("v"), causal=causal, **t)
        return out.detach().to("cpu").double().numpy()

    def reference(self, q: Any, k: Any, v: Any, *, causal: bool, **extras: Any) -> np.ndarray:
        """The variant's float64 reference with this target's hyperparameters."""
        return np.asarray(self.variant.reference(q, k, v, causal=causal, **self.params, **extras))


class _Worker:
    """One daemon thread that runs submitted calls in order (reused across calls: starting a thread per
    call made torch set up per-thread state every time)."""

    def __init__(self, name: str):
        import queue

        self._tasks: Any = queue.Queue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        while True:
            fn, done, box = self._tasks.get()
            try:
                box["out"] = fn()
            except Exception as exc:  # noqa: BLE001 - reported by the caller as a finding
                box["exc"] = exc
            done.set()

    def submit(self, fn: Callable[[], Any]) -> tuple[threading.Event, dict[str, Any]]:
        done, box = threading.Event(), dict[str, Any]()
        self._tasks.put((fn, done, box))
        return done, box


def builtin(
    variant: Any, *, form: str | None = None, chunk_size: int = 16, dtype: Any = "float32", **params: Any
) -> Target:
    """gramcheck's own torch form of ``variant`` as a Target (``builtin:NAME`` on the command line)."""
    var = _variants.get(variant)

    def fn(q: Any, k: Any, v: Any, *, causal: bool, **extras: Any) -> Any:
        f = form if form is None or form in var.forms_for(causal) else None
        use = f or var.forms_for(causal)[0]
        return var.torch(q, k, v, causal=causal, form=use, chunk_size=chunk_size, **params, **extras)

    fn.__qualname__ = f"builtin:{var.name}" + (f"[{form}]" if form else "")
    return Target(fn, var, dtype=dtype_name(dtype), params=params, name=fn.__qualname__)


def resolve(spec: Any) -> tuple[Callable[..., Any], str | None]:
    """A callable, 'module:attr', 'builtin:NAME' or 'fla:OP' -> (callable or None for builtin, builtin
    name). 'fla:OP' is flash-linear-attention's Triton op OP through ``gramcheck.adapters.fla_kernels``
    (the adapter before its hyperparameters are bound; ``api.make_target`` binds them)."""
    if callable(spec):
        return spec, None
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"target: got {spec!r}; expected a callable, 'module:attr', 'builtin:NAME' or 'fla:OP'")
    mod, attr = spec.split(":", 1)
    if mod == "builtin":
        _variants.get(attr)  # validates the name
        return None, attr  # type: ignore[return-value]
    if mod == "fla":
        from .adapters import fla_kernels

        return fla_kernels.get(attr).fn, None
    try:
        obj: Any = importlib.import_module(mod)
    except ImportError as exc:
        raise ValueError(f"target: cannot import module {mod!r} ({exc})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"target: module {mod!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"target: {spec!r} is a {type(obj).__name__}; expected a callable")
    return obj, None
