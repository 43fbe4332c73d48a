"""The ``Variant`` record: one attention variant's hyperparameters, forms, declared properties, its
reference (arithmetic-generic) and its torch implementation."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..arith import F64
from ..hyperparams import check_scale, scale_value
from ..inputs import InputSpec, check_extras, draw_extras
from ..validation import check_bool, check_choice, check_positive_int, check_qkv

# property tags a variant may declare (the property catalogue keys on them)
TAGS = (
    "causal",  # supports causal masking: future tokens cannot change past outputs
    "causal-only",  # has no non-causal mode
    "normalised-rows",  # attention rows are non-negative and sum to one
    "convex-hull",  # each output lies in the convex hull of the values
    "permutation-equivariant",  # non-causal: permuting (K, V) rows together changes nothing
    "bounded-state",  # diagonal gated recurrence with |S_t| <= max|k v^T| / (1 - alpha_max) (decay_bound)
    "qk-scale-invariant",  # output unchanged when q or k rows are scaled by positive constants
    "v-scale-invariant",  # output unchanged when v is scaled by a positive constant (output norm)
    "random-features",  # takes a random matrix ``projection`` (m, d_k)
    "gated",  # takes per-token decays
    "materialises-nxn",  # the production form is quadratic in N by definition
    "denominator",  # normalised by a data-dependent denominator phi(q_i) . sum_j phi(k_j)
    "vanishing-denominator",  # that denominator can vanish or change sign in exact arithmetic
    "feature-denominator",  # the definition divides by phi(q_i) . sum_j phi(k_j) + eps with phi = Variant.features
    #                         (up to a positive factor per row) and eps the parameter ``eps``
    "causal-rounding",  # causal in exact arithmetic; a global stabiliser lets future tokens move past
    #                     outputs by rounding (performer's key maximum over all tokens)
    "linear-in-v",  # O = M V with M independent of V (M is the attention matrix of the spectra)
    "jacobian-v",  # an analytic bound on ||dO/dV||_2 (jacobian_bounds)
    "jacobian-qk",  # analytic bounds on ||dO/dQ||_2 and ||dO/dK||_2 as well
    "weight-range",  # softmax weights of normalised q, k lie in a range set by the temperature
    "row-normalisation",  # positive random-feature kernel estimates: row-normalisation error bound
    "unnormalised-growth",  # no denominator: |o_i| grows at most linearly with the number of keys
    "state-passing",  # recurrent state S (B, H, d_k, d_v): takes initial_state, returns (out, final_state)
    "contracting-transitions",  # state transitions are contractions with signed entries (I - beta k k^T):
    #                             they damp roundings while the chain rule's term sizes grow exponentially
)
RECURRENCES = (
    "none",  # no recurrent state (softmax, blocked softmax)
    "diagonal",  # S_t = diag(alpha_t) S_{t-1} + k_t v_t^T (gramcheck.forms)
    "delta",  # S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T (gramcheck.delta_forms)
)


# hyperparameters that must be > 0 wherever a variant has them
_ORDERS_TAKEN: dict[tuple[str, bool, int], tuple[str, ...]] = {}  # Variant.orders_for, per definition and mode
_POSITIVE_PARAMS = ("scale", "tau", "gate_tau", "divisor", "gain", "block_size", "temperature", "gamma", "features")

# call options every variant's reference and torch form accept besides hyperparameters and inputs: the
# state (variants tagged state-passing) and packed sequences (handled here, in gramcheck.packing)
CALL_OPTIONS = ("initial_state", "output_final_state", "cu_seqlens")


@dataclass(frozen=True)
class AmplitudeRounding:
    """How the roundings of a variant's shared feature steps move its keys, per unit roundoff and to first order
    under independent uniform roundings (proofs/low-precision-rule.md, "The keys' amplitudes"): ``keys``
    (B, H, N), sigma_s, the root mean square of the relative move of phi(k_s) as a whole; ``decays`` (B, H, N) or
    None, tau_t, that of the move a causal state's decay into token t gives every earlier key alike; ``groups``
    (B, H, N) labels or None, keys whose moves are one and the same (equal labels; None: every key its own)."""

    keys: np.ndarray
    decays: np.ndarray | None = None
    groups: np.ndarray | None = None


@dataclass(frozen=True)
class Variant:
    """An attention variant: its hyperparameters, its extra inputs, its reference and torch forms, and
    the answers to every per-variant question the properties ask.

    ``reference_fn(ar, q, k, v, *, causal, **params, **extras)`` evaluates the definition in arithmetic
    ``ar`` on lifted arrays; ``torch_fn(q, k, v, *, causal, form, chunk_size, **params, **extras)`` is the
    production form. ``inputs`` describe the extra inputs (``gramcheck.inputs.InputSpec``).
    ``declares`` are the property tags that always hold; ``tags_fn(params)`` adds those that depend on
    the hyperparameters (e.g. no GroupNorm, no eps). ``decay_fn(params, extras, H)`` is the largest
    decay alpha_max of a bounded-state recurrence; ``jacobian_fn(variant, q, k, v, *, causal, params,
    extras)`` the analytic Jacobian bounds of one (b, h) slice."""

    name: str
    family: str
    summary: str
    source: str
    params: Mapping[str, Any]
    forms: tuple[str, ...]
    declares: frozenset[str]
    reference_fn: Callable[..., Any] = field(repr=False)
    torch_fn: Callable[..., Any] = field(repr=False)
    inputs: tuple[InputSpec, ...] = ()
    noncausal_only: tuple[str, ...] = ()  # forms that exist only without the causal mask
    # (ar, q, k, **params, **extras) -> (phi(Q), phi(K)): the Gram factors, for variants that have them
    features_fn: Callable[..., Any] | None = field(default=None, repr=False)
    # (ar, q, k, *, causal, **params, **extras) -> (phi(Q), phi(K), g) as the definition divides by them, where
    # they are ``features_fn``'s up to positive factors (``quotient_features``)
    quotient_features_fn: Callable[..., Any] | None = field(default=None, repr=False)
    # (q, k, *, causal, **params, **extras) -> AmplitudeRounding or None: how much each key's features share in
    # rounding (``amplitude_rounding``)
    amplitude_rounding_fn: Callable[..., Any] | None = field(default=None, repr=False)
    # (ar, k, **params, **extras) -> the keys as the recurrence writes them into its state (``written_keys``)
    written_keys_fn: Callable[..., Any] | None = field(default=None, repr=False)
    recurrence: str = "none"
    tags_fn: Callable[[Mapping[str, Any]], frozenset[str]] | None = field(default=None, repr=False)
    decay_fn: Callable[[Mapping[str, Any], Mapping[str, Any], int], float] | None = field(default=None, repr=False)
    jacobian_fn: Callable[..., dict[str, float]] | None = field(default=None, repr=False)
    # a certified float64 evaluation cheaper than ball arithmetic: (value, bound) (``enclosure``)
    enclosure_fn: Callable[..., tuple[Any, Any] | None] | None = field(default=None, repr=False)
    # other standard algorithms for the same output, signature of reference_fn (``algorithms``), and more
    # that differ from those in the causal mode only (FAVOR+'s linear form at another chunk size)
    algorithms_fn: tuple[Callable[..., Any], ...] = field(default=(), repr=False)
    causal_algorithms_fn: tuple[Callable[..., Any], ...] = field(default=(), repr=False)
    # the values each string hyperparameter takes (every string hyperparameter has an entry)
    param_choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.declares) - set(TAGS)
        if unknown:
            raise ValueError(f"declares: unknown tags {sorted(unknown)}; expected a subset of {TAGS}")
        check_choice("recurrence", self.recurrence, RECURRENCES)
        for name, default in self.params.items():
            if isinstance(default, str) and default not in self.param_choices.get(name, ()):
                raise ValueError(
                    f"param_choices: variant {self.name!r} lists no choices for its string hyperparameter "
                    f"{name!r} that include its default {default!r}"
                )
        if "scale" in self.params:
            check_scale(self.params["scale"])

    # --------------------------------------------------------------------------------------------
    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.inputs)

    def input(self, name: str) -> InputSpec:
        """The spec of extra input ``name``."""
        for s in self.inputs:
            if s.name == name:
                return s
        raise ValueError(f"input: got {name!r}; variant {self.name!r} takes {self.input_names or '(none)'}")

    def resolve_params(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults updated by ``overrides``; an unknown name is a ValueError naming it."""
        unknown = set(overrides) - set(self.params)
        if unknown:
            raise ValueError(
                f"{sorted(unknown)[0]}: not a hyperparameter of variant {self.name!r}; "
                f"expected one of {sorted(self.params) or '(none)'}"
            )
        if "scale" in overrides:
            check_scale(overrides["scale"])
        self.validate_params({k: v for k, v in overrides.items() if k != "scale"})
        return {**self.params, **overrides}

    def validate_params(self, overrides: Mapping[str, Any]) -> None:
        """Each override has the kind of its default (bool, string, number); numbers are finite, names
        ending in 'eps' are >= 0 and the scale-like ones (_POSITIVE_PARAMS) > 0. A string for a number
        is refused (the scale's rules in d are checked by ``hyperparams.check_scale``); None-default
        parameters also take None; numbers may be given per head as a list. A wrong kind is a TypeError, a wrong value a
        ValueError, both naming the parameter."""
        import math

        for name, value in overrides.items():
            default = self.params.get(name)
            where = f"{name}: got {value!r} for variant {self.name!r}"
            if isinstance(default, bool):
                if not isinstance(value, bool):
                    raise TypeError(f"{where}; expected true or false")
                continue
            if isinstance(default, str):
                listed = ", ".join(map(repr, self.param_choices[name]))
                if not isinstance(value, str):
                    raise TypeError(f"{where} ({type(value).__name__}); expected one of {listed}")
                if value not in self.param_choices[name]:
                    raise ValueError(f"{where}; expected one of {listed}")
                continue
            if default is not None and not isinstance(default, (int, float)):
                continue
            if value is None and default is None:
                continue
            # a per-head list: each entry obeys the scalar's rules, its length is checked by the forms
            for x in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(x, bool) or not isinstance(x, (int, float)):
                    raise TypeError(
                        f"{where} ({type(x).__name__}); expected a number or a per-head list (default {default!r})"
                    )
                if not math.isfinite(x):
                    raise ValueError(f"{where}; expected a finite number")
                if name.endswith("eps") and x < 0:
                    raise ValueError(f"{where}; expected a number >= 0")
                if name in _POSITIVE_PARAMS and x <= 0:
                    raise ValueError(f"{where}; expected a number > 0")


    def tags(self, params: Mapping[str, Any] | None = None) -> frozenset[str]:
        """The property tags that hold with hyperparameters ``params`` (defaults where not given)."""
        p = self.resolve_params(params or {})
        extra = self.tags_fn(p) if self.tags_fn is not None else frozenset()
        unknown = set(extra) - set(TAGS)
        if unknown:
            raise ValueError(f"tags_fn: unknown tags {sorted(unknown)}; expected a subset of {TAGS}")
        tags = self.declares | extra
        return tags | {"jacobian-v"} if "linear-in-v" in tags else tags

    def scale(self, params: Mapping[str, Any], d: int) -> float:
        """The value of the ``scale`` hyperparameter for head dimension d (1 when the variant has none)."""
        return float(scale_value(F64, params.get("scale", 1.0), d))

    def decay_bound(self, params: Mapping[str, Any], extras: Mapping[str, Any], n_heads: int) -> float | None:
        """alpha_max, the largest decay of a bounded-state recurrence on these inputs (None: no decay)."""
        return None if self.decay_fn is None else float(self.decay_fn(self.resolve_params(params), extras, n_heads))

    def jacobian_bounds(
        self, q: Any, k: Any, v: Any, *, causal: bool, params: Mapping[str, Any], extras: Mapping[str, Any]
    ) -> dict[str, float]:
        """Analytic bounds on ||dO/dX||_2 (X in q, k, v) for one (b, h) slice of shape (1, 1, N, d)
        (proofs/jacobian-bounds.md); only the inputs with a derived bound appear."""
        p = self.resolve_params(params)
        if self.jacobian_fn is not None:
            return self.jacobian_fn(self, q, k, v, causal=causal, params=p, extras=extras)
        if "linear-in-v" not in self.tags(p):
            return {}
        from ..bounds import jacobian_v_bound
        from .common import attention_matrix

        return {"v": jacobian_v_bound(attention_matrix(self, q, k, causal=causal, params=p, extras=extras)[0, 0])}

    def split_kwargs(self, kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(hyperparameters, extra inputs) of a call's keywords (call options such as initial_state and
        cu_seqlens are neither)."""
        kwargs = {k: v for k, v in kwargs.items() if k not in CALL_OPTIONS}
        names = self.input_names
        extras = {k: kwargs[k] for k in names if k in kwargs}
        missing = [k for k in names if extras.get(k) is None]
        if missing:
            raise ValueError(f"{missing[0]}: required by variant {self.name!r} and missing")
        params = self.resolve_params({k: v for k, v in kwargs.items() if k not in names})
        return params, extras

    def _check(self, q: Any, k: Any, v: Any, extras: Mapping[str, Any], m: int | None = None) -> None:
        B, H, N, dk, dv = check_qkv(q, k, v)
        dims = {"B": B, "H": H, "N": N, "dk": dk, "dv": dv}
        check_extras(self.inputs, extras, dims, like=q)

    def forms_for(self, causal: bool) -> tuple[str, ...]:
        """The torch forms available in this mode."""
        return tuple(f for f in self.forms if not (causal and f in self.noncausal_only))

    def check_causal(self, causal: bool) -> bool:
        """``causal`` as a bool: a TypeError naming it where it is not one, a ValueError where it is False for a
        causal-only variant."""
        causal = check_bool("causal", causal)
        if not causal and "causal-only" in self.declares:
            raise ValueError(f"causal: got False; variant {self.name!r} is causal-only")
        return causal

    def reference(
        self,
        q: Any,
        k: Any,
        v: Any,
        *,
        causal: bool = False,
        arith: Any = F64,
        input_radii: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        """Evaluate the definition on float64 NumPy inputs in arithmetic ``arith``; returns that
        arithmetic's array (an ndarray for F64 and MP, a Ball for the ball arithmetics). ``input_radii``
        (ball arithmetics only) widens inputs by name (q, k, v and the extras): the definition over every
        input within those radii (``BallArith.widened``)."""
        return self._run(self.reference_fn, q, k, v, causal, arith, kwargs, input_radii)

    def algorithms(self, q: Any, k: Any, v: Any, *, causal: bool = False, arith: Any = F64, **kwargs: Any) -> list[Any]:
        """The same output by each of the variant's other standard algorithms (``algorithms_fn``; equal to
        the definition in exact arithmetic, e.g. the delta rule's chunked WY / UT solve), in ``arith``, as
        ``reference`` evaluates the definition; [] for most variants. The low-precision rules take the
        least accurate of them and the definition, in the dtype, as their yardstick."""
        return [self._run(fn, q, k, v, causal, arith, kwargs) for fn in self.algorithms_for(causal)]

    def algorithms_for(self, causal: bool) -> tuple[Callable[..., Any], ...]:
        """The other standard algorithms of a mode: ``algorithms_fn``, and ``causal_algorithms_fn`` when
        causal (without the mask they compute what ``algorithms_fn`` does)."""
        return self.algorithms_fn + (self.causal_algorithms_fn if causal else ())

    def standard_evaluations(
        self, q: Any, k: Any, v: Any, *, causal: bool = False, arith: Any = F64, **kwargs: Any
    ) -> list[Any]:
        """The output by each other standard algorithm (``algorithms``), then by each production order the
        definition reaches on this call (``orders_for``), in ``arith``: the algorithms of the underflow
        share (``algorithm_underflow``)."""
        from .common import evaluation_order

        runs = self.algorithms(q, k, v, causal=causal, arith=arith, **kwargs)
        for order in self.orders_for(causal):
            with evaluation_order(order) as used:
                run = self.reference(q, k, v, causal=causal, arith=arith, **kwargs)
            if used[0]:
                runs.append(run)
        return runs

    def orders_for(self, causal: bool) -> tuple[str, ...]:
        """The production algorithms (``common.evaluation_order``: recurrent, chunked) that evaluating the
        definition in an evaluation order reaches besides the definition's own, found once per mode by
        evaluating it on a small input; () for a definition that uses none of the shared products, and
        for a variant that lists its own other algorithms (``algorithms_for``: they are its production
        algorithms, FAVOR+'s linear form the same orders)."""
        if self.algorithms_for(causal):
            return ()
        key = (self.name, causal, id(self.reference_fn))
        if key not in _ORDERS_TAKEN:
            from .common import ORDERS, evaluation_order

            B, H, N, d = 1, 1, 3, 2
            q, k, v = (np.full((B, H, N, d), x) for x in (0.5, 0.25, 1.0))
            dims = {"B": B, "H": H, "N": N, "dk": d, "dv": d, "m": 4}
            extras: dict[str, Any] = draw_extras(self.inputs, dims, dtype="float64", seed=0)
            taken = []
            for order in ORDERS:
                with evaluation_order(order) as used, np.errstate(all="ignore"):
                    self.reference(q, k, v, causal=causal, **extras)
                if used[0]:
                    taken.append(order)
            _ORDERS_TAKEN[key] = tuple(taken)
        return _ORDERS_TAKEN[key]

    def _run(
        self,
        fn: Callable[..., Any],
        q: Any,
        k: Any,
        v: Any,
        causal: bool,
        arith: Any,
        kwargs: Mapping[str, Any],
        input_radii: Mapping[str, Any] | None = None,
    ) -> Any:
        params, extras, opts = self._call(q, k, v, causal, kwargs)
        if input_radii and opts.get("cu_seqlens") is not None:
            raise ValueError("input_radii: not supported with cu_seqlens (the radii are not split per sequence)")
        if opts.get("cu_seqlens") is not None:
            from ..packing import run_packed

            def one(q1: Any, k1: Any, v1: Any, **kw: Any) -> Any:
                return self._run(fn, q1, k1, v1, causal, arith, kw)

            cat = lambda xs, axis: arith.concat(xs, axis=axis)  # noqa: E731
            return run_packed(one, q, k, v, opts, {**params, **extras}, concat=cat)
        state = {k: opts[k] for k in ("initial_state", "output_final_state") if k in opts}
        return _evaluate(fn, arith, (q, k, v), params, extras, radii=input_radii, causal=causal, **state)

    def enclosure(self, q: Any, k: Any, v: Any, *, causal: bool = False, **kwargs: Any) -> tuple[Any, Any] | None:
        """The output on float64 inputs as (value, bound), float64 arrays with |value - exact| <= bound
        componentwise, from the variant's own certified float64 evaluation (``enclosure_fn``); with
        ``output_final_state``, ((out, S_N), (their bounds)); None where it has none for this call (the
        oracle then evaluates the definition in ball arithmetic)."""
        if self.enclosure_fn is None:
            return None
        params, extras, opts = self._call(q, k, v, causal, kwargs)
        if set(opts) - {"initial_state", "output_final_state"}:
            return None  # packed sequences: the ball arithmetic
        final = {"output_final_state": True} if opts.pop("output_final_state", False) else {}
        arrays = {n: np.asarray(x, dtype=np.float64) for n, x in {**extras, **opts}.items()}
        qkv = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
        return self.enclosure_fn(*qkv, causal=causal, **params, **arrays, **final)

    def _call(
        self, q: Any, k: Any, v: Any, causal: bool, kwargs: Mapping[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """(hyperparameters, extra inputs, call options) of a call on the definition, each checked."""
        params, extras = self.split_kwargs(kwargs)
        self.check_causal(causal)
        self._check(q, k, v, extras)
        return params, extras, self._options(kwargs, causal, q, v)

    def _options(self, kwargs: Mapping[str, Any], causal: bool, q: Any, v: Any) -> dict[str, Any]:
        """The call options given (not None / False); state passing only where the variant declares it."""
        opts = {k: kwargs[k] for k in CALL_OPTIONS if kwargs.get(k) is not None and kwargs.get(k) is not False}
        if ("initial_state" in opts or "output_final_state" in opts) and "state-passing" not in self.tags():
            raise ValueError(f"initial_state: variant {self.name!r} has no recurrent state (not tagged state-passing)")
        if opts and not causal and set(opts) & {"initial_state", "output_final_state"}:
            raise ValueError("initial_state: got a state with causal=False; expected causal=True (states are causal)")
        s0 = opts.get("initial_state")
        if s0 is not None and "cu_seqlens" not in opts:  # packed: one state per sequence (gramcheck.packing)
            from ..state import check_initial_state

            B, H, _, dk = q.shape
            check_initial_state(s0, B, H, dk, v.shape[-1])
        return opts

    def features(self, q: Any, k: Any, *, arith: Any = F64, **kwargs: Any) -> tuple[Any, Any]:
        """(phi(Q), phi(K)), each (B, H, N, m), whose product phi(Q) phi(K)^T is the variant's
        (unmasked, unnormalised) Gram matrix, evaluated in ``arith`` on float64 inputs."""
        if self.features_fn is None:
            raise ValueError(f"variant: {self.name!r} has no feature map (its Gram matrix has no rank-m factors)")
        params, extras = self.split_kwargs(kwargs)
        self._check(q, k, k, extras)
        return _evaluate(self.features_fn, arith, (q, k), params, extras)

    def quotient_features(
        self, q: Any, k: Any, *, causal: bool = False, arith: Any = F64, **kwargs: Any
    ) -> tuple[Any, Any, Any]:
        """(phi(Q), phi(K), g): ``features`` as the definition computes them for its quotient, the same up to a
        positive factor per row of phi(Q) and one of phi(K), which a quotient without eps does not see, but in
        range where the Gram factors overflow (FAVOR+'s stabilised features); g (B, H, N, 1 or m), or None, the
        log decays of a causal definition that stabilises keys by a running shift: key s enters row i >= s with
        phi(k_s) exp(sum_{s<t<=i} g_t) (``featuremaps.favor_causal``)."""
        if self.quotient_features_fn is None:
            return (*self.features(q, k, arith=arith, **kwargs), None)
        params, extras = self.split_kwargs(kwargs)
        self._check(q, k, k, extras)
        return _evaluate(self.quotient_features_fn, arith, (q, k), params, extras, causal=causal)

    def written_keys(self, k: Any, **kwargs: Any) -> np.ndarray:
        """The keys (B, H, N, d_k) as the recurrence writes them into its state, k_t in S_t = ... + k_t v_t^T, in
        float64: the keys as given unless the variant transforms them first (the delta rule's l2-normalised
        keys). The size of the state the inputs build is set by these, not by the raw keys."""
        if self.written_keys_fn is None:
            return np.asarray(k, dtype=np.float64)
        params, extras = self.split_kwargs(kwargs)
        return np.asarray(_evaluate(self.written_keys_fn, F64, (k,), params, extras), dtype=np.float64)

    def amplitude_rounding(self, q: Any, k: Any, *, causal: bool, **kwargs: Any) -> AmplitudeRounding | None:
        """How the roundings of the keys' shared steps move them (``AmplitudeRounding``); None where the features
        share no rounded step (relu) or where the variant has no feature map."""
        if self.amplitude_rounding_fn is None:
            return None
        params, extras = self.split_kwargs(kwargs)
        self._check(q, k, k, extras)
        result: AmplitudeRounding | None = self.amplitude_rounding_fn(q, k, causal=causal, **params, **extras)
        return result

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
        params, extras = self.split_kwargs(kwargs)
        self.check_causal(causal)
        form = self.forms[0] if form is None else check_choice("form", form, self.forms)
        if form not in self.forms_for(causal):
            raise ValueError(
                f"form: {form!r} of variant {self.name!r} is non-causal only (it would materialise N x N); "
                f"expected one of {self.forms_for(causal)} with causal=True"
            )
        check_positive_int("chunk_size", chunk_size)
        self._check(q, k, v, extras)
        opts = self._options(kwargs, causal, q, v)
        if opts.get("cu_seqlens") is not None:
            from ..forms import accumulation_dtype
            from ..packing import per_token, run_packed

            # an input every sequence shares (rwkv6's bonus u) reaches each sequence as one float32 copy, so its
            # gradient is summed over the sequences in float32, as a kernel that loads it once sums it: in the
            # dtype, one sequence's part (-84562) or a partial sum overflowed where the whole (-55374) is in range.
            # The sequences were checked as the packed call was: the forms take the copy as it is.
            shared = {
                n: x.to(accumulation_dtype(x))
                for n, x in extras.items()
                if x.is_floating_point() and not per_token(x, *q.shape[:3])
            }

            def one(*a: Any, **kw: Any) -> Any:
                return self.torch_fn(*a, causal=causal, form=form, chunk_size=chunk_size, **kw)

            return run_packed(one, q, k, v, opts, {**params, **extras, **shared})
        return self.torch_fn(q, k, v, causal=causal, form=form, chunk_size=chunk_size, **params, **extras, **opts)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "family": self.family,
            "summary": self.summary,
            "source": self.source,
            "params": dict(self.params),
            "forms": list(self.forms),
            "declares": sorted(self.tags()),
            "inputs": [f"{s.name} {s.layout}" for s in self.inputs],
            "recurrence": self.recurrence,
        }


def _evaluate(
    fn: Callable[..., Any],
    arith: Any,
    arrays: tuple[Any, ...],
    params: dict[str, Any],
    extras: dict[str, Any],
    *,
    radii: Mapping[str, Any] | None = None,
    **kw: Any,
) -> Any:
    """fn(arith, *arrays, **kw, **params, **extras) with every array lifted into ``arith`` from float64, the
    inputs named in ``radii`` (q, k, v: the arrays in that order; extras by name) widened by them."""
    import numpy as np

    with arith.context():
        lifted = {n: arith.asarray(np.asarray(x, dtype=np.float64)) for n, x in extras.items()}
        names = "qkv"[: len(arrays)]
        lifted.update({n: arith.asarray(np.asarray(x, dtype=np.float64)) for n, x in zip(names, arrays, strict=True)})
        for n, rad in (radii or {}).items():
            lifted[n] = arith.widened(lifted[n], rad)
        lift = [lifted.pop(n) for n in names]
        if kw.get("initial_state") is not None:
            kw["initial_state"] = arith.asarray(np.asarray(kw["initial_state"], dtype=np.float64))
        return fn(arith, *lift, **kw, **params, **lifted)
