"""The seed demonstration (proofs/seed-claims.md): at random initialisation with head dimension d = 16,
how conditioned is unnormalised linear attention's Gram matrix phi(Q) phi(K)^T, how much energy does its
top singular value hold, and what does softmax do to the weights? Run ``python -m gramcheck.seed_claims``.

Inputs: token embeddings X ~ N(0, 1) (N x d_model, d_model = 64), projections W_Q, W_K ~ N(0, 1/d_model)
(d_model x d), so q, k have unit-variance entries, as at a standard initialisation."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import spectra
from . import variants as _variants

D, D_MODEL = 16, 64


def init_qk(n: int, seed: int, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """q, k (1, 1, n, D) at initialisation; ``scale`` multiplies the projections' standard deviation."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, D_MODEL))
    wq, wk = rng.standard_normal((2, D_MODEL, D)) * (scale / np.sqrt(D_MODEL))
    return (x @ wq)[None, None], (x @ wk)[None, None]


def measure(n: int, seed: int, scale: float = 1.0) -> dict[str, Any]:
    q, k = init_qk(n, seed, scale)
    lin = spectra.gram_spectra("linear-unnormalised", q, k)[0]  # A = phi(Q) phi(K)^T, elu+1, from factors
    fq, fk = _variants.get("linear-elu").features(q, k)
    feat = spectra.feature_gram_spectrum(fk[0, 0])
    p_lin = spectra.gram_spectra("linear-elu", q, k, normalised=True)[0]  # row-normalised linear weights
    p_sm = spectra.gram_spectra("softmax", q, k)[0]  # softmax weights, dense
    w_sm = np.asarray(spectra.attention_matrix("softmax", q, k))[0, 0]
    w_lin = np.asarray(spectra.attention_matrix("linear-elu", q, k))[0, 0]
    return {
        "n": n,
        "scale": scale,
        "seed": seed,
        "gram_condition": lin.condition,
        "gram_energy_share": lin.energy_share,
        "gram_effective_rank": lin.effective_rank,
        "feature_gram_condition": feat.condition,
        "linear_weights_energy_share": p_lin.energy_share,
        "softmax_energy_share": p_sm.energy_share,
        "softmax_effective_rank": p_sm.effective_rank,
        "linear_max_weight_x_n": float(w_lin.max(1).mean() * n),
        "softmax_max_weight_x_n": float(w_sm.max(1).mean() * n),
    }


def table(
    ns: tuple[int, ...] = (64, 256, 1024), scales: tuple[float, ...] = (1.0,), seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
) -> list[dict[str, Any]]:
    """Median over seeds of each measure, per (N, scale)."""
    rows = []
    for scale in scales:
        for n in ns:
            ms = [measure(n, s, scale) for s in seeds]
            rows.append(
                {
                    key: (float(np.median([m[key] for m in ms])) if key not in ("n", "scale") else m0)
                    for key, m0 in ms[0].items()
                    if key != "seed"
                }
            )
    return rows


def _print(rows: list[dict[str, Any]]) -> None:  # pragma: no cover
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(f"{r[k]:.4g}" if isinstance(r[k], float) else str(r[k]) for k in keys) + " |")


def main() -> None:  # pragma: no cover - prints the tables for proofs/seed-claims.md
    _print(table())
    print()
    _print(table(ns=(256,), scales=(0.03, 0.1, 0.3, 1.0, 3.0, 8.0)))


if __name__ == "__main__":  # pragma: no cover
    main()
