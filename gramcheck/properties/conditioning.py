"""Conditioning and growth: the Gram spectrum's energy share (a diagnostic), the normaliser margin, the
unnormalised variant's growth with N, and the state bound of gated recurrences."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..bounds import gated_state_bound, unnormalised_output_bound
from ..findings import Finding
from ..precision import gamma, overflow_threshold
from ..spectra import gram_spectra, normaliser_margin
from ..strategies import AttentionInputs
from ..targets import Target
from .base import guarded, ratio_finding, with_counterexample

ENERGY_SHARE_THRESHOLD = 0.99


@guarded("energy-share")
def energy_share(
    target: Target, ex: AttentionInputs, *, causal: bool, threshold: float = ENERGY_SHARE_THRESHOLD
) -> Finding | None:
    """Diagnostic: flags a Gram matrix phi(Q) phi(K)^T (or the dense weight matrix) whose top singular
    value holds more than ``threshold`` of the energy sum s_i^2, i.e. attention close to rank one."""
    sps = gram_spectra(target.variant, ex.q, ex.k, causal=causal, **target.params, **ex.extras)
    worst = max(sps, key=lambda s: s.energy_share)
    f = Finding("energy-share", float(worst.energy_share), threshold, details={"spectrum": worst.to_dict()})
    return with_counterexample(f, ex)


@guarded("normaliser-margin")
def margin(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """Every denominator phi(q_i) . sum_j phi(k_j) is positive and free of cancellation: margin
    min_i den_i / (|phi(q_i)| . sum_j |phi(k_j)|) > 0 (it is 1 for non-negative features). A zero or
    negative margin means an undefined or sign-flipped row (relu's empty overlap, trig features)."""
    with np.errstate(all="ignore"):
        fq, fk = target.variant.features(ex.q, ex.k, **target.params, **ex.extras)
    if not (np.all(np.isfinite(fq)) and np.all(np.isfinite(fk))):
        return None  # unstabilised features overflow float64: outside this diagnostic's domain
    mg = normaliser_margin(fq, fk, causal=causal)
    # measured > 0 passes; a 0/0 row has margin 0 (or -0.0) and fails with margin 0, never inf
    return with_counterexample(Finding("normaliser-margin", float(mg["margin"]), 0.0, sense=">", details=mg), ex)


@guarded("unnormalised-growth")
def unnormalised_growth(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """max_k |o_ik| <= n_i max_j |A_ij| max|v| / c (proofs/unnormalised-growth.md), the output's linear
    growth with the number of keys, with a relative rounding slack gamma_{N+m}(dtype)."""
    fq, fk = target.variant.features(ex.q, ex.k, **target.params, **ex.extras)
    o = target(ex.q, ex.k, ex.v, causal=causal, **ex.extras)
    divisor = float(target.params.get("divisor", 1.0))
    n, m = fq.shape[-2], fq.shape[-1]
    slack = 1 + 2 * gamma(n + m + 2, target.dtype)
    bound = np.stack(
        [
            unnormalised_output_bound(fq[b, h], fk[b, h], ex.v[b, h], divisor, causal=causal)
            for b, h in np.ndindex(*fq.shape[:2])
        ]
    ).reshape(fq.shape[:3])
    size = np.max(read_magnitude(o, target.dtype), axis=-1)
    return ratio_finding("unnormalised-growth", size, bound * slack + 1e-300, ex, n=n)


def read_magnitude(out: np.ndarray, dtype: Any) -> np.ndarray:
    """|out|, an infinite entry read as the least magnitude it may stand for, the dtype's overflow threshold (an
    exact value past the range is returned as inf by every correct form; float64: inf stays inf); NaN stays."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isinf(out), overflow_threshold(dtype), np.abs(out))


@guarded("state-bound")
def state_bound(target: Target, ex: AttentionInputs, *, causal: bool) -> Finding | None:
    """|S_t| <= max_s |k_s||v_s|^T / (1 - alpha_max) for every t (proofs/gated-state-bound.md). The
    state is read through the target: with q_t = e_c for all t, o_t = s S_t^T e_c is row c of s S_t."""
    B, H, N, dk = ex.q.shape
    alpha_max = target.variant.decay_bound(target.params, ex.extras, H)
    if alpha_max is None or alpha_max >= 1:
        return None  # no decay: the bound is vacuous
    s = target.variant.scale(target.params, dk)
    rows = []
    for c in range(dk):
        qc = np.zeros_like(ex.q)
        qc[..., c] = 1.0
        rows.append(target(qc, ex.k, ex.v, causal=True, **ex.extras))  # (B, H, N, d_v): row c of s S_t
    read = np.stack(rows, axis=-2)  # (B, H, N, d_k, d_v)
    # an infinite readout says only that |s S| reached the dtype's overflow threshold T: |S| >= T / s, the least
    # value it may stand for (an exact state past the range is returned as inf by every correct form)
    state = read_magnitude(read, target.dtype) / abs(s)
    bound = gated_state_bound(ex.k, ex.v, alpha_max)[..., None, :, :]
    slack = 1 + 2 * gamma(N + 2, target.dtype)
    return ratio_finding("state-bound", state, bound * slack, ex, alpha_max=alpha_max)
