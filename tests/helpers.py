from __future__ import annotations

import numpy as np

from gramcheck import variants as V
from gramcheck.inputs import draw_extras
from gramcheck.precision import round_to


def make_inputs(variant, *, B=1, H=2, N=24, d=8, dtype="float64", seed=0, m=16):
    """Seeded Gaussian inputs rounded to ``dtype`` (returned as float64) plus the variant's extras."""
    rng = np.random.default_rng(seed)
    q, k, v = (round_to(rng.standard_normal((B, H, N, d)), dtype) for _ in range(3))
    dims = {"B": B, "H": H, "N": N, "dk": d, "dv": d, "m": m}
    return q, k, v, draw_extras(V.get(variant).inputs, dims, dtype=dtype, seed=seed + 1)


def causal_modes(variant):
    return [True] if "causal-only" in V.get(variant).declares else [False, True]


def to_torch(x, dtype):
    import torch

    return torch.as_tensor(x).to(getattr(torch, dtype))


def raw_key_initial_state(target, ex, salt="state"):
    """S_0 scaled by the raw keys, max|k| max|v|, not by the keys the recurrence writes: for the delta rule's
    l2-normalised keys of ~1000, a carried state far larger than any its writes build (a user's S_0 may be)."""
    from gramcheck.properties.state import initial_state_at

    return initial_state_at(ex, float(np.max(np.abs(ex.k))) * float(np.max(np.abs(ex.v))), salt)


def with_raw_key_initial_states(monkeypatch):
    """The state properties draw S_0 by ``raw_key_initial_state`` (the inputs saved with such states)."""
    from gramcheck.properties import state

    monkeypatch.setattr(state, "initial_state_of", raw_key_initial_state)
