"""Targets: the attention functions gramcheck checks, behind one calling convention.

A target is a callable ``fn(q, k, v, *, causal, **extras) -> o`` on torch tensors of layout (B, H, N, d)
in one dtype and on one device (extras: ``g`` log-decays (B, H, N, d_k), ``projection`` (m, d_k)),
returning o of shape (B, H, N, d_v) in the same dtype. ``Target`` wraps it with the variant it claims to
implement (whose reference is the truth) and the hyperparameters it implements, and turns everything
the callable can do wrong into a ``TargetError`` with a kind (FAILURE_KINDS), which properties report as a
failing Finding.

Isolation: 'thread' runs the calls on one daemon worker thread of this process (a hung call is abandoned;
``os._exit`` in the target ends the whole run); 'process' runs them in a worker process (spawned once,
killed after a timeout and restarted, a crash is a "crashed" Finding and the run goes on). Calls whose
inputs require gradients run in this process either way: autograd graphs do not cross processes. The
target's backward runs as its forward does: on the worker thread, bounded by the timeout.
SystemExit raised by a target (forward or backward) is a "raised" Finding; KeyboardInterrupt is never
swallowed.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib
import pickle
import re
import threading
import warnings
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import variants as _variants
from .arith import SUBNORMALS
from .forms import CHUNK_SIZES
from .precision import dtype_name
from .validation import check_choice
from .variants.spec import Variant

ISOLATIONS = ("thread", "process")
# measured (benchmarks/RESULTS.md, "target isolation"): a worker process costs a spawn with a torch import
# per target and a pickle round trip per call; see the README for the figure that set this default
DEFAULT_ISOLATION = "thread"

FAILURE_KINDS = (
    "raised",  # raised an exception (SystemExit included; the type is named)
    "timeout",  # did not return within the timeout (its thread was abandoned or its process killed)
    "crashed",  # the worker process ended (os._exit, a signal, a segfault): exit code or signal named
    "wrong-type",
    "wrong-shape",
    "wrong-dtype",
    "wrong-device",
    "mutates-inputs",
    "nondeterministic",
)


# the characters of a target's exception message a Finding keeps (``bounded``): a message of megabytes
# made a certificate of megabytes
MESSAGE_LIMIT = 500
_ADDRESS = re.compile(r"\b(at) 0x[0-9a-fA-F]{4,}")


class TargetError(Exception):
    """The target misbehaved; ``kind`` is one of FAILURE_KINDS. The message is ``bounded`` (twice
    MESSAGE_LIMIT: the exception's own text is bounded where it is described, ``_describe``)."""

    def __init__(self, kind: str, message: str):
        message = bounded(message, 2 * MESSAGE_LIMIT)
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
    # how the target's arithmetic underflows: 'gradual' (IEEE 754) or 'flush' (arith.subnormals)
    subnormals: str = "gradual"
    # one persistent worker thread runs the calls (a new thread per call cost 4x the calls themselves:
    # torch sets up per-thread state each time; benchmarks/RESULTS.md); replaced after a timeout
    _executor: Any = field(default=None, init=False, repr=False, compare=False)
    # how a worker process re-creates fn: ("import", "module:attr"), ("builtin", kwargs) or ("pickle", bytes)
    rebuild: tuple[str, Any] | None = field(default=None, repr=False, compare=False)
    isolation: str = field(default="thread", compare=False)
    draw_seed: int = field(default=0, compare=False)  # seeds a target's own draws (``call_torch``)
    _own: tuple[Any, tuple[str, ...]] | None = field(default=None, init=False, repr=False, compare=False)
    _process: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.variant = _variants.get(self.variant)
        self.dtype = dtype_name(self.dtype)
        check_choice("subnormals", self.subnormals, SUBNORMALS)
        self.params = dict(self.variant.resolve_params(self.params))
        if not self.name:
            self.name = getattr(self.fn, "__qualname__", repr(self.fn))
        for spec in self.variant.inputs:
            if spec.name in self.own_draws and spec.size_param is not None:
                size = self.params.get(spec.size_param)
                if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                    raise ValueError(
                        f"{spec.size_param}: got {size!r}; {self.name} takes no {spec.name!r} keyword, so it draws "
                        f"its own {spec.layout} {spec.name} and is checked statistically: give the size of its "
                        f"draw as the hyperparameter {spec.size_param} (a positive integer, e.g. "
                        f"params={{{spec.size_param!r}: 256}})"
                    )

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

    def gradients(self, loss: Any, inputs: Sequence[Any]) -> tuple[Any, ...]:
        """torch.autograd.grad(loss, inputs, allow_unused=True) through the target's own backward. The
        target's backward runs as its forward does (``call_torch`` routes it through ``_guarded``): one
        that raises (SystemExit included; fla's ops without a backward raise NotImplementedError) is the
        target's failure 'raised', one that hangs 'timeout'; autograd's own refusal is 'raised' too."""
        torch = _torch()
        try:
            return torch.autograd.grad(loss, list(inputs), allow_unused=True)
        except TargetError:
            raise
        except Exception as exc:  # noqa: BLE001 - any exception of the user's backward is a finding
            raise TargetError("raised", f"the backward of {self.name} raised {_describe(exc)}") from exc

    def call_torch(self, q: Any, k: Any, v: Any, *, causal: bool, draw: int = 0, **extras: Any) -> Any:
        """Call fn on tensors; checks type, shape, dtype, device and input mutation; returns the tensor.
        A target drawing its own randomness (``own_draws``) draws it from the global torch and NumPy
        generators seeded by (``draw_seed``, the inputs, ``draw``): the same input gives the same draw
        (replays and certificates are reproducible), ``draw`` = 0, 1, ... independent ones."""
        torch = _torch()
        own = self.own_draws
        extras = {n: t for n, t in extras.items() if n not in own}
        inputs = {"q": q, "k": k, "v": v, **{n: t for n, t in extras.items() if isinstance(t, torch.Tensor)}}
        before = {n: t.detach().clone() for n, t in inputs.items()}
        if own:
            key = b"".join(t.detach().cpu().numpy().tobytes() for t in before.values()) + draw.to_bytes(8, "little")
            with seeded_generators(zlib.crc32(key, self.draw_seed & 0xFFFFFFFF)):  # torch's CPU generator: 32 bits
                out = self._call(q, k, v, causal, extras, inputs)
        else:
            out = self._call(q, k, v, causal, extras, inputs)
        for n, t in inputs.items():
            if not torch.equal(t.detach(), before[n]):
                raise TargetError("mutates-inputs", f"{self.name} changed its input {n!r} in place")
        return self._backward_guarded(self._checked(out, q, v, extras), inputs)

    def _call(self, q: Any, k: Any, v: Any, causal: bool, extras: dict[str, Any], inputs: dict[str, Any]) -> Any:
        grad = any(getattr(t, "requires_grad", False) for t in inputs.values())
        if self.isolation == "process" and not grad:
            return self._call_in_process(q, k, v, causal, extras)
        return self._guarded(lambda: self.fn(q, k, v, causal=causal, **extras), self.name)

    def _guarded(self, thunk: Callable[[], Any], what: str) -> Any:
        """Run ``thunk``, the target's own code (a call of fn, or its backward), as a call of the target:
        on the worker thread, abandoned after ``timeout`` (a 'timeout' TargetError); whatever it raises,
        SystemExit included, is a 'raised' TargetError naming ``what``; KeyboardInterrupt is re-raised.
        Without a timeout, and when already on the worker thread (a guarded call inside another), it runs
        on the calling thread."""
        if self.timeout is None or (self._executor is not None and self._executor.is_current()):
            try:
                return thunk()
            except TargetError:
                raise
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - everything the target raises is a finding
                raise TargetError("raised", f"{what} raised {_describe(exc)}") from exc
        if self._executor is None:
            self._executor = _Worker(f"gramcheck-target-{self.name}")
        done, box = self._executor.submit(thunk)
        if not done.wait(self.timeout):
            # the worker is stuck in the target: abandon it (a daemon thread, so it cannot keep the
            # process alive) and start a fresh one for the next call
            self._executor = None
            raise TargetError("timeout", f"{what} did not return within {self.timeout:g} s")
        if "interrupt" in box:
            raise box["interrupt"]  # never swallowed
        if "exc" in box:
            err = box["exc"]
            if isinstance(err, TargetError):
                raise err
            raise TargetError("raised", f"{what} raised {_describe(err)}") from err
        return box["out"]

    def _backward_guarded(self, res: Any, inputs: dict[str, Any]) -> Any:
        """``res`` (out, or (out, final_state)) with the target's backward behind ``_guarded``: each output
        that carries a graph to the inputs needing gradients is replaced by an equal tensor whose backward
        runs the target's one on the worker thread, bounded by ``timeout`` and with its exceptions (SystemExit
        included) turned into TargetErrors, as a forward call is. Every backward through a target output
        (``gradients``, gradcheck, Jacobians) passes there. Outputs without a graph are returned as they are."""
        torch = _torch()
        outs = list(res) if isinstance(res, tuple) else [res]
        leaves: list[Any] = []  # each tensor once: one tensor given as q, k and v (x, x, x) has one gradient
        for t in inputs.values():
            if isinstance(t, torch.Tensor) and t.requires_grad and not any(t is x for x in leaves):
                leaves.append(t)
        graph = [i for i, o in enumerate(outs) if o.grad_fn is not None]
        if not leaves or not graph:
            return res
        box = {"target": self, "outs": [outs[i] for i in graph], "leaves": leaves}
        guarded = _guarded_backward().apply(box, *leaves)
        for i, o in zip(graph, guarded, strict=True):
            outs[i] = o
        return tuple(outs) if isinstance(res, tuple) else outs[0]

    def _backward(self, outs: list[Any], leaves: list[Any], grads: tuple[Any, ...]) -> tuple[Any, ...]:
        """The gradients of ``outs`` (seeded with ``grads``) with respect to ``leaves`` through the
        target's backward, run by ``_guarded`` with this thread's torch thread count (and a graph of the
        backward itself where this backward records one: double backward)."""
        from . import threads as _threads

        torch = _torch()
        create = torch.is_grad_enabled()

        def run() -> tuple[Any, ...]:
            return torch.autograd.grad(outs, leaves, grads, allow_unused=True, retain_graph=True, create_graph=create)

        return self._guarded(_threads.pinned(run, torch.get_num_threads()), f"the backward of {self.name}")

    def _checked(self, out: Any, q: Any, v: Any, extras: dict[str, Any]) -> Any:
        """The output after the checks of type, shape, dtype and device ((out, state) with a state)."""
        torch = _torch()
        state = None
        if extras.get("output_final_state"):
            out, state = self._state_pair(out, q, v, extras)
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
        return out if state is None else (out, state)

    @property
    def own_draws(self) -> tuple[str, ...]:
        """The variant's random inputs (``InputSpec.size_param``) the callable draws itself: it takes no
        keyword of that name. Such a target is checked statistically (gramcheck.properties.statistical).
        Read off the signature once per callable (every call asks)."""
        if self._own is None or self._own[0] is not self.fn:
            self._own = (self.fn, _own_draws(self.fn, self.variant))
        return self._own[1]

    @property
    def passes_state(self) -> bool:
        """The callable declares state passing: it takes ``initial_state`` and ``output_final_state``
        keywords (or any keyword)."""
        return _takes_keywords(self.fn, ("initial_state", "output_final_state"))

    @property
    def packs(self) -> bool:
        """The callable declares packed sequences: it takes a ``cu_seqlens`` keyword (or any keyword)."""
        return _takes_keywords(self.fn, ("cu_seqlens",))

    def _state_pair(self, res: Any, q: Any, v: Any, extras: dict[str, Any]) -> tuple[Any, Any]:
        """(out, final_state) from a call with output_final_state=True; the state must be a tensor of shape
        (B, H, d_k, d_v) (S sequences for B with cu_seqlens) in the input dtype or float32 (fla's kernels
        keep states in float32), on the input's device."""
        torch = _torch()
        if not isinstance(res, (tuple, list)) or len(res) != 2:
            raise TargetError(
                "wrong-type",
                f"{self.name} returned {type(res).__name__} with output_final_state=True; expected (out, final_state)",
            )
        out, state = res
        if not isinstance(state, torch.Tensor):
            raise TargetError("wrong-type", f"{self.name} returned final_state of type {type(state).__name__}")
        cu = extras.get("cu_seqlens")
        b = q.shape[0] if cu is None else int(cu.numel()) - 1
        expected = (b, q.shape[1], q.shape[-1], v.shape[-1])
        if tuple(state.shape) != expected:
            raise TargetError(
                "wrong-shape",
                f"{self.name} returned final_state of shape {tuple(state.shape)}; expected {expected} (B, H, d_k, d_v)",
            )
        if state.dtype not in (q.dtype, torch.float32, torch.float64) or state.dtype.itemsize < q.dtype.itemsize:
            raise TargetError(
                "wrong-dtype", f"{self.name} returned final_state of dtype {state.dtype}; expected {q.dtype} or float32"
            )
        if state.device != q.device:
            raise TargetError(
                "wrong-device", f"{self.name} returned final_state on {state.device}; expected {q.device}"
            )
        return out, state

    # ------------------------------------------------------------------------------------------------
    def isolated(self) -> Target:
        """This target with process isolation where a worker process can re-create fn (``rebuild``);
        otherwise (a local callable that cannot be pickled) it stays on the thread, with a warning."""
        if self.rebuild is None:
            try:
                blob = pickle.dumps(self.fn)
            except Exception as exc:  # noqa: BLE001 - any pickling failure means: no worker process
                warnings.warn(
                    f"isolation: {self.name} cannot be sent to a worker process ({type(exc).__name__}: {exc}); "
                    "it runs on a worker thread instead (give it as 'module:attr' to isolate it)",
                    RuntimeWarning,
                    stacklevel=3,
                )
                return self
            self.rebuild = ("pickle", blob)
        self.isolation = "process"
        return self

    def close(self) -> None:
        """Stop the worker process, if any."""
        proc, self._process = self._process, None
        if proc is not None:
            proc.stop()

    def _call_in_process(self, q: Any, k: Any, v: Any, causal: bool, extras: dict[str, Any]) -> Any:
        if self._process is None:
            self._process = _ProcessWorker(self.rebuild, self.name)
        proc = self._process
        status, payload = proc.call((q, k, v), {"causal": causal, **extras}, self.timeout)
        if status in ("timeout", "crashed"):
            self._process = None  # killed or dead: the next call starts a fresh worker
        if status == "ok":
            out, mutated = payload
            if mutated:
                raise TargetError("mutates-inputs", f"{self.name} changed its input {mutated[0]!r} in place")
            return out
        if status == "interrupt":
            raise KeyboardInterrupt(payload)
        if status == "timeout":
            raise TargetError(
                "timeout", f"{self.name} did not return within {self.timeout:g} s (worker process killed)"
            )
        if status == "crashed":
            raise TargetError("crashed", f"{self.name} ended its worker process: {payload}")
        raise TargetError(status, f"{self.name} {payload}")

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, dtype: str | None = None, **extras: Any) -> np.ndarray:
        """Run on float64 arrays (representable in the dtype); returns float64 NumPy."""
        arrays = {"q": q, "k": k, "v": v, **extras}
        return taped(self, "call", (causal, dtype), arrays, lambda: self._numpy_call(arrays, causal, dtype))

    def _numpy_call(self, arrays: dict[str, Any], causal: bool, dtype: str | None) -> np.ndarray:
        t = self.tensors(arrays, dtype=dtype)
        out = self.call_torch(t.pop("q"), t.pop("k"), t.pop("v"), causal=causal, **t)
        return out.detach().to("cpu").double().numpy()

    def run(
        self,
        q: Any,
        k: Any,
        v: Any,
        *,
        causal: bool,
        initial_state: Any = None,
        output_final_state: bool = False,
        cu_seqlens: Any = None,
        **extras: Any,
    ) -> Any:
        """Like ``__call__`` with the call options: the state S_0 (float64, rounded to the dtype, passed in
        the dtype), and packed offsets ``cu_seqlens`` (int64). Returns out, or (out, final_state)."""
        arrays = {"q": q, "k": k, "v": v, **extras}
        if initial_state is not None:
            arrays["initial_state"] = initial_state
        run = lambda: self._numpy_run(arrays, causal, output_final_state, cu_seqlens)  # noqa: E731
        return taped(self, "run", (causal, output_final_state), arrays, run, {"cu_seqlens": cu_seqlens})

    def run_chain(
        self, segments: Sequence[Mapping[str, Any]], *, initial_state: Any = None
    ) -> tuple[np.ndarray, np.ndarray, str]:
        """A decode loop: causal calls on ``segments`` (consecutive token ranges, each q, k, v and the extras as
        float64 arrays of dtype values) in order, each after the first from the final state the call before
        returned, passed back as it came (its dtype and device: what a cache of the state holds). The first
        call starts from ``initial_state`` (float64) in the dtype the target's cache would hold it in: that of
        the state the first call returns when given none (one more call; a kernel may return a state in the
        dtype of the state it was given, and a cache of float32 never hands it a 16-bit one). Returns (the
        outputs concatenated along N, the last final state) as float64, and the dtype the last state came in."""
        arrays = {f"{i} {n}": x for i, seg in enumerate(segments) for n, x in seg.items()}
        if initial_state is not None:
            arrays["initial_state"] = initial_state

        def call(seg: Mapping[str, Any], state: Any) -> tuple[Any, Any]:
            t = self.tensors(seg)
            given = {} if state is None else {"initial_state": state}
            return self.call_torch(
                t.pop("q"), t.pop("k"), t.pop("v"), causal=True, output_final_state=True, **t, **given
            )

        def run() -> tuple[np.ndarray, np.ndarray, str]:
            state: Any = None
            if initial_state is not None:
                cache = dtype_name(call(segments[0], None)[1].dtype)
                state = self.tensors({"s": initial_state}, dtype=cache)["s"]
            outs = []
            for seg in segments:
                out, state = call(seg, state)
                outs.append(out.detach().to("cpu").double().numpy())
            return np.concatenate(outs, axis=2), state.detach().to("cpu").double().numpy(), dtype_name(state.dtype)

        return taped(self, "chain", (len(segments),), arrays, run)

    def _numpy_run(self, arrays: dict[str, Any], causal: bool, output_final_state: bool, cu_seqlens: Any) -> Any:
        torch = _torch()
        t = self.tensors(arrays)
        opts: dict[str, Any] = {}
        if output_final_state:
            opts["output_final_state"] = True
        if cu_seqlens is not None:
            opts["cu_seqlens"] = torch.as_tensor(np.asarray(cu_seqlens, dtype=np.int64), device=self.device)
        res = self.call_torch(t.pop("q"), t.pop("k"), t.pop("v"), causal=causal, **t, **opts)
        if output_final_state:
            return tuple(x.detach().to("cpu").double().numpy() for x in res)
        return res.detach().to("cpu").double().numpy()

    def reference(self, q: Any, k: Any, v: Any, *, causal: bool, **extras: Any) -> np.ndarray:
        """The variant's float64 reference with this target's hyperparameters."""
        return np.asarray(self.variant.reference(q, k, v, causal=causal, **self.params, **extras))


class _Tape:
    """The results of a target's calls (``Target.__call__`` and ``run``), by call, for one judgment that is
    made twice (``replayed_calls``): the first judgment records them, the second replays the same results,
    so that both judge one output (a target that answers otherwise on a second call would be judged on
    that one). Outside a judgment: every call runs."""

    def __init__(self) -> None:
        self.results: dict[bytes, list[Any]] = {}
        self.replaying = False
        self.used: dict[bytes, int] = {}

    def play(self, key: bytes, call: Callable[[], Any]) -> Any:
        if self.replaying:
            done = self.used.get(key, 0)
            kept = self.results.get(key, [])
            if done < len(kept):
                self.used[key] = done + 1
                return copy.deepcopy(kept[done])
        res = call()
        if not self.replaying:
            self.results.setdefault(key, []).append(copy.deepcopy(res))
        return res


_TAPE: ContextVar[_Tape | None] = ContextVar("gramcheck_target_tape", default=None)


@contextlib.contextmanager
def replayed_calls() -> Iterator[Callable[[], Any]]:
    """Record the target calls made inside; the yielded function returns a context in which the same calls
    (same target, inputs and options, in the same order per call) return the recorded results."""
    if _TAPE.get() is not None:  # inside another judgment's tape: its record and replay cover these calls
        yield contextlib.nullcontext
        return
    tape = _Tape()
    token = _TAPE.set(tape)

    @contextlib.contextmanager
    def replay() -> Iterator[None]:
        tape.replaying, tape.used = True, {}
        try:
            yield
        finally:
            tape.replaying = False

    try:
        yield replay
    finally:
        _TAPE.reset(token)


def taped(
    target: Target,
    kind: str,
    options: tuple[Any, ...],
    inputs: Mapping[str, Any],
    call: Callable[[], Any],
    others: Mapping[str, Any] | None = None,
) -> Any:
    """``call()``, a computation through ``target`` (its call, its backward) whose NumPy result (arrays, or tuples,
    lists and dicts of them) depends only on ``options``, the target's ``inputs`` and the ``others`` arrays (loss
    weights, packed offsets); inside a judgment made twice (``replayed_calls``), recorded in the first and replayed
    in the second. Inputs are keyed apart from the others, so that an input named like one (fla's ``w``, RWKV's
    decay) cannot share another call's key."""
    tape = _TAPE.get()
    if tape is None:
        return call()
    arrays = {**{f"input {n}": x for n, x in inputs.items()}, **(others or {})}
    return tape.play(_call_key(target, kind, options, arrays), call)


def _call_key(target: Target, kind: str, options: tuple[Any, ...], arrays: Mapping[str, Any]) -> bytes:
    """A digest of one call: the target, the entry point, the options and every array's dtype, shape and bytes."""
    h = hashlib.sha256(f"{id(target)}:{kind}:{options!r}".encode())
    for name, x in sorted(arrays.items()):
        h.update(name.encode())
        if x is None:
            h.update(b"none")
            continue
        a = np.ascontiguousarray(np.asarray(x))
        h.update(f"{a.dtype}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.digest()


def _own_draws(fn: Callable[..., Any], variant: Variant) -> tuple[str, ...]:
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return ()  # no signature to read: the calling convention is assumed
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return ()
    return tuple(s.name for s in variant.inputs if s.size_param and s.name not in sig.parameters)


@contextlib.contextmanager
def seeded_generators(seed: int) -> Iterator[None]:
    """The global torch and NumPy generators seeded, and restored afterwards: a target that draws from
    them (its own random features) then gives the same draws, hence the same certificate, for the same
    seed."""
    gen = _torch().default_generator  # the CPU generator alone (torch.manual_seed also queues CUDA seeding)
    saved = gen.get_state(), np.random.get_state()
    gen.manual_seed(seed)
    np.random.seed(seed % 2**32)
    try:
        yield
    finally:
        gen.set_state(saved[0])
        np.random.set_state(saved[1])


def _takes_keywords(fn: Any, names: tuple[str, ...]) -> bool:
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    ps = sig.parameters.values()
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in ps) or all(n in sig.parameters for n in names)


class _Worker:
    """One daemon thread that runs submitted calls in order (reused across calls: starting a thread per
    call made torch set up per-thread state every time)."""

    def __init__(self, name: str):
        import queue

        self._tasks: Any = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def is_current(self) -> bool:
        """Whether the calling thread is this worker's thread."""
        return threading.current_thread() is self._thread

    def _run(self) -> None:
        while True:
            fn, done, box = self._tasks.get()
            try:
                box["out"] = fn()
            except KeyboardInterrupt as exc:  # handed back to the caller, who re-raises it
                box["interrupt"] = exc
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported by the caller as a finding
                box["exc"] = exc
            done.set()

    def submit(self, fn: Callable[[], Any]) -> tuple[threading.Event, dict[str, Any]]:
        done, box = threading.Event(), dict[str, Any]()
        self._tasks.put((fn, done, box))
        return done, box


_GUARDED_BACKWARD: Any = None


def _guarded_backward() -> Any:
    """The autograd Function behind ``Target._backward_guarded`` (made once, on first use: torch is
    imported lazily): forward returns copies of the target's outputs, backward asks the target for the
    gradients of its own outputs (``Target._backward``)."""
    global _GUARDED_BACKWARD
    if _GUARDED_BACKWARD is None:
        import torch

        class GuardedBackward(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, box: dict[str, Any], *leaves: Any) -> tuple[Any, ...]:
                ctx.box = box
                return tuple(o.detach().clone() for o in box["outs"])

            @staticmethod
            def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
                box = ctx.box
                return (None, *box["target"]._backward(box["outs"], box["leaves"], grads))

        _GUARDED_BACKWARD = GuardedBackward
    return _GUARDED_BACKWARD


def bounded(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` with object addresses (``at 0x7f...``, which differ from run to run) written as ``at 0x...``,
    cut to its first ``limit`` characters with the number left out noted (a certificate keeps the text)."""
    text = _ADDRESS.sub(r"\1 0x...", text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def _describe(exc: BaseException) -> str:
    """The exception's type and its message, ``bounded`` (a message that cannot be read is said to be so)."""
    try:
        text = f"exit code {exc.code!r}" if isinstance(exc, SystemExit) else str(exc)
    except Exception as err:  # noqa: BLE001 - a __str__ or __repr__ of the target's own that raises
        text = f"its message could not be read: {type(err).__name__}"
    if isinstance(exc, SystemExit):
        return f"SystemExit ({bounded(text)})"
    return f"{type(exc).__name__}: {bounded(text)}"


def _rebuild_fn(rebuild: tuple[str, Any]) -> Callable[..., Any]:
    how, what = rebuild
    if how == "import":
        return resolve(what)[0]
    if how == "builtin":
        return builtin(**what).fn
    return pickle.loads(what)


def _worker_main(conn: Any, rebuild: tuple[str, Any]) -> None:
    """The worker process: re-create fn, then answer calls until told to stop (None)."""
    import torch

    torch.set_num_threads(1)
    try:
        fn = _rebuild_fn(rebuild)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which falls back to a thread
        conn.send(("error", _describe(exc)))
        return
    conn.send(("ready", None))
    while True:
        msg = conn.recv()
        if msg is None:
            return
        args, kwargs = msg
        tensors = dict(zip("qkv", args, strict=True))
        tensors.update({n: t for n, t in kwargs.items() if isinstance(t, torch.Tensor)})
        before = {n: t.clone() for n, t in tensors.items()}
        try:
            out = fn(*args, **kwargs)
        except KeyboardInterrupt as exc:
            conn.send(("interrupt", str(exc)))
            continue
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - a finding
            conn.send(("raised", f"raised {_describe(exc)}"))
            continue
        mutated = [n for n, t in tensors.items() if not torch.equal(t, before[n])]
        try:
            conn.send(("ok", (out, mutated)))
        except Exception as exc:  # noqa: BLE001 - an output that cannot be sent back
            conn.send(("wrong-type", f"returned a {type(out).__name__} that cannot be sent back ({exc})"))


class _Pipe:
    """One end of two OS pipes carrying plain pickles (not multiprocessing's, whose torch reductions
    pass shared-memory handles that a separate interpreter cannot open)."""

    def __init__(self, read_fd: int | None, write_fd: int | None):
        from multiprocessing.connection import Connection

        self._r = None if read_fd is None else Connection(read_fd, writable=False)
        self._w = None if write_fd is None else Connection(write_fd, readable=False)

    def send(self, obj: Any) -> None:
        self._w.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))  # type: ignore[union-attr]

    def recv(self) -> Any:
        return pickle.loads(self._r.recv_bytes())  # type: ignore[union-attr]

    def poll(self, timeout: float | None) -> bool:
        return self._r.poll(timeout)  # type: ignore[union-attr]

    def close(self) -> None:
        for c in (self._r, self._w):
            if c is not None:
                c.close()


def _worker_entry(read_fd: int, write_fd: int) -> None:
    """Entry point of a worker process started by ``_ProcessWorker`` (a fresh interpreter: the parent's
    ``__main__`` is not re-run, unlike multiprocessing's spawn)."""
    import sys

    conn = _Pipe(read_fd, write_fd)
    path, rebuild = conn.recv()
    sys.path[:] = path
    _worker_main(conn, rebuild)


class _ProcessWorker:
    """A worker interpreter (``python -c``) running ``_worker_main``; ``call`` returns (status, payload)."""

    def __init__(self, rebuild: tuple[str, Any] | None, name: str):
        import os
        import subprocess
        import sys

        if rebuild is None:
            raise ValueError(f"isolation: {name} has no way to be re-created in a worker process")
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        code = f"from gramcheck.targets import _worker_entry; _worker_entry({to_child_r}, {from_child_w})"
        self._proc = subprocess.Popen(
            [sys.executable, "-c", code], pass_fds=(to_child_r, from_child_w), env=env, stdin=subprocess.DEVNULL
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._send = _Pipe(None, to_child_w)
        self._conn = _Pipe(from_child_r, None)
        self._send.send((list(sys.path), rebuild))
        try:
            status, payload = self._conn.recv()
        except EOFError:
            code_ = self._proc.wait(5)
            raise ValueError(
                f"isolation: the worker process for {name} ended while starting (exit code {code_})"
            ) from None
        if status != "ready":
            self.stop()
            raise ValueError(f"isolation: the worker process cannot re-create {name}: {payload}")

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None) -> tuple[str, Any]:
        try:
            self._send.send((args, kwargs))
            if not self._conn.poll(timeout):
                self.stop(kill=True)
                return "timeout", None
            return self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            try:
                code = self._proc.wait(5)
            except Exception:  # noqa: BLE001 - still alive after closing its pipe: killed below
                code = None
            self.stop(kill=True)
            if code is not None and code < 0:
                import signal

                return "crashed", f"killed by signal {signal.Signals(-code).name}"
            return "crashed", f"exited with code {code}"

    def stop(self, kill: bool = False) -> None:
        import subprocess

        if self._proc.poll() is None and not kill:
            try:
                self._send.send(None)
                self._proc.wait(2)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                pass
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(5)
        self._send.close()
        self._conn.close()


def builtin(
    variant: Any, *, form: str | None = None, chunk_size: int = CHUNK_SIZES[0], dtype: Any = "float32", **params: Any
) -> Target:
    """gramcheck's own torch form of ``variant`` as a Target (``builtin:NAME`` on the command line)."""
    var = _variants.get(variant)

    def fn(q: Any, k: Any, v: Any, *, causal: bool, **extras: Any) -> Any:
        f = form if form is None or form in var.forms_for(causal) else None
        use = f or var.forms_for(causal)[0]
        return var.torch(q, k, v, causal=causal, form=use, chunk_size=chunk_size, **params, **extras)

    fn.__qualname__ = f"builtin:{var.name}" + (f"[{form}]" if form else "")
    t = Target(fn, var, dtype=dtype_name(dtype), params=params, name=fn.__qualname__)
    t.rebuild = (
        "builtin",
        {"variant": var.name, "form": form, "chunk_size": chunk_size, "dtype": t.dtype, **params},
    )
    return t


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
