"""The ``Variant`` record: one attention variant's hyperparameters, forms, declared properties, its
reference (arithmetic-generic) and its torch implementation."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..arith import F64
from ..validation import check_choice, check_positive_int, check_qkv

# property tags a variant may declare (the property catalogue keys on them)
TAGS = (
    "causal",  # supports causal masking: future tokens cannot change past outputs
    "causal-only",  # has no non-causal mode
    "normalised-rows",  # attention rows are non-negative and sum to one
    "convex-hull",  # each output lies in the convex hull of the values
    "permutation-equivariant",  # non-causal: permuting (K, V) rows together changes nothing
    "bounded-state",  # gated recurrence with |S_t| <= max|k v^T| / (1 - alpha_max)
    "qk-scale-invariant",  # output unchanged when q or k rows are scaled by positive constants
    "v-scale-invariant",  # output unchanged when v is scaled by a positive constant (output norm)
    "random-features",  # takes a random matrix ``projection`` (m, d_k)
    "gated",  # takes log-decays ``g``
    "materialises-nxn",  # the production form is quadratic in N by definition
    "denominator",  # normalised by a data-dependent denominator phi(q_i) . sum_j phi(k_j)
    "causal-rounding",  # causal in exact arithmetic; a global stabiliser lets future tokens move past
    #                     outputs by rounding (performer's key maximum over all tokens)
    "state-passing",  # recurrent state S (B, H, d_k, d_v): takes initial_state, returns (out, final_state)
)

# call options every variant's reference and torch form accept besides hyperparameters and inputs: the
# state (variants tagged state-passing) and packed sequences (handled here, in gramcheck.packing)
CALL_OPTIONS = ("initial_state", "output_final_state", "cu_seqlens")


@dataclass(frozen=True)
class Variant:
    """An attention variant. ``reference(ar, q, k, v, causal=..., **params)`` evaluates the definition
    in arithmetic ``ar`` on lifted arrays; ``torch_fn(q, k, v, causal=..., form=..., chunk_size=...,
    **params)`` is the production form. Both take the extra inputs named in ``inputs`` as keywords."""

    name: str
    family: str
    summary: str
    source: str
    params: Mapping[str, Any]
    forms: tuple[str, ...]
    declares: frozenset[str]
    reference_fn: Callable[..., Any] = field(repr=False)
    torch_fn: Callable[..., Any] = field(repr=False)
    inputs: tuple[str, ...] = ()
    noncausal_only: tuple[str, ...] = ()  # forms that exist only without the causal mask
    # (ar, q, k, **params, **extras) -> (phi(Q), phi(K)): the Gram factors, for variants that have them
    features_fn: Callable[..., Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        unknown = set(self.declares) - set(TAGS)
        if unknown:
            raise ValueError(f"declares: unknown tags {sorted(unknown)}; expected a subset of {TAGS}")

    # --------------------------------------------------------------------------------------------
    def resolve_params(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults updated by ``overrides``; an unknown name is a ValueError naming it."""
        unknown = set(overrides) - set(self.params)
        if unknown:
            raise ValueError(
                f"{sorted(unknown)[0]}: not a hyperparameter of variant {self.name!r}; "
                f"expected one of {sorted(self.params) or '(none)'}"
            )
        return {**self.params, **overrides}

    def _split(self, kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        kwargs = {k: v for k, v in kwargs.items() if k not in CALL_OPTIONS}
        extras = {k: kwargs[k] for k in self.inputs if k in kwargs}
        missing = [k for k in self.inputs if extras.get(k) is None]
        if missing:
            raise ValueError(f"{missing[0]}: required by variant {self.name!r} and missing")
        params = self.resolve_params({k: v for k, v in kwargs.items() if k not in self.inputs})
        return params, extras

    def forms_for(self, causal: bool) -> tuple[str, ...]:
        """The torch forms available in this mode."""
        return tuple(f for f in self.forms if not (causal and f in self.noncausal_only))

    def check_causal(self, causal: bool) -> None:
        if not causal and "causal-only" in self.declares:
            raise ValueError(f"causal: got False; variant {self.name!r} is causal-only")

    def reference(self, q: Any, k: Any, v: Any, *, causal: bool = False, arith: Any = F64, **kwargs: Any) -> Any:
        """Evaluate the definition on float64 NumPy inputs in arithmetic ``arith``; returns that
        arithmetic's array (an ndarray for F64 and MP, a Ball for the ball arithmetics)."""
        params, extras = self._split(kwargs)
        self.check_causal(causal)
        check_qkv(q, k, v, **extras)
        opts = self._options(kwargs, causal, q, v)
        if opts.get("cu_seqlens") is not None:
            from ..packing import run_packed

            def one(*a: Any, **kw: Any) -> Any:
                return self.reference(*a, causal=causal, arith=arith, **kw)

            cat = lambda xs, axis: arith.concat(xs, axis=axis)  # noqa: E731
            return run_packed(one, q, k, v, opts, {**params, **extras}, concat=cat)
        state = {k: opts[k] for k in ("initial_state", "output_final_state") if k in opts}
        return _evaluate(self.reference_fn, arith, (q, k, v), params, extras, causal=causal, **state)

    def _options(self, kwargs: Mapping[str, Any], causal: bool, q: Any, v: Any) -> dict[str, Any]:
        """The call options given (not None / False); state passing only where the variant declares it."""
        opts = {k: kwargs[k] for k in CALL_OPTIONS if kwargs.get(k) is not None and kwargs.get(k) is not False}
        if ("initial_state" in opts or "output_final_state" in opts) and "state-passing" not in self.declares:
            raise ValueError(f"initial_state: variant {self.name!r} has no recurrent state (not tagged state-passing)")
        if opts and not causal and set(opts) & {"initial_state", "output_final_state"}:
            raise ValueError("initial_state: got a state with causal=False; expected causal=True (states are causal)")
        s0 = opts.get("initial_state")
        if s0 is not None and "cu_seqlens" not in opts:  # packed: one state per sequence (gramcheck.packing)
            B, H, _, dk = q.shape
            expected = (B, H, dk, v.shape[-1])
            if tuple(s0.shape) != expected:
                raise ValueError(f"initial_state: got shape {tuple(s0.shape)}; expected {expected} (B, H, d_k, d_v)")
        return opts

    def features(self, q: Any, k: Any, *, arith: Any = F64, **kwargs: Any) -> tuple[Any, Any]:
        """(phi(Q), phi(K)), each (B, H, N, m), whose product phi(Q) phi(K)^T is the variant's
        (unmasked, unnormalised) Gram matrix, evaluated in ``arith`` on float64 inputs."""
        if self.features_fn is None:
            raise ValueError(f"variant: {self.name!r} has no feature map (its Gram matrix has no rank-m factors)")
        params, extras = self._split(kwargs)
        check_qkv(q, k, k, **extras)
        return _evaluate(self.features_fn, arith, (q, k), params, extras)

    def torch(
        self,
        q: Any,
        k: Any,
        v: Any,
        *,
        causal: bool = False,
        form: str | None = None,
        chunk_size: int = 64,
        **kwargs: Any,
    ) -> Any:
        """The torch form ``form`` (default: the first listed) in the inputs' dtype and device."""
        params, extras = self._split(kwargs)
        self.check_causal(causal)
        form = self.forms[0] if form is None else check_choice("form", form, self.forms)
        if form not in self.forms_for(causal):
            raise ValueError(
                f"form: {form!r} of variant {self.name!r} is non-causal only (it would materialise N x N); "
                f"expected one of {self.forms_for(causal)} with causal=True"
            )
        check_positive_int("chunk_size", chunk_size)
        check_qkv(q, k, v, **extras)
        opts = self._options(kwargs, causal, q, v)
        if opts.get("cu_seqlens") is not None:
            from ..packing import run_packed

            def one(*a: Any, **kw: Any) -> Any:
                return self.torch(*a, causal=causal, form=form, chunk_size=chunk_size, **kw)

            return run_packed(one, q, k, v, opts, {**params, **extras})
        return self.torch_fn(q, k, v, causal=causal, form=form, chunk_size=chunk_size, **params, **extras, **opts)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "family": self.family,
            "summary": self.summary,
            "source": self.source,
            "params": dict(self.params),
            "forms": list(self.forms),
            "declares": sorted(self.declares),
            "inputs": list(self.inputs),
        }


def _evaluate(
    fn: Callable[..., Any],
    arith: Any,
    arrays: tuple[Any, ...],
    params: dict[str, Any],
    extras: dict[str, Any],
    **kw: Any,
) -> Any:
    """fn(arith, *arrays, **kw, **params, **extras) with every array lifted into ``arith`` from float64."""
    import numpy as np

    with arith.context():
        lift = [arith.asarray(np.asarray(x, dtype=np.float64)) for x in arrays]
        lifted = {n: arith.asarray(np.asarray(x, dtype=np.float64)) for n, x in extras.items()}
        if kw.get("initial_state") is not None:
            kw["initial_state"] = arith.asarray(np.asarray(kw["initial_state"], dtype=np.float64))
        return fn(arith, *lift, **kw, **params, **lifted)
