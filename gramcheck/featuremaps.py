"""Feature maps phi and the random matrices of FAVOR+, written once against the arithmetic shim.

Each map takes ``ar`` (an ``Arith``: F64, MP, ball, or ``TORCH``) and x of shape (B, H, N, d) and returns
phi(x) of shape (B, H, N, m). Formulas (proofs/favor-mse.md):

* elu+1:         phi(x) = elu(x) + 1 = x + 1 (x > 0), e^x (x <= 0)              (Katharopoulos et al. 2020)
* relu:          phi(x) = max(x, 0)
* FAVOR+ positive:   phi(x) = e^{-|x|^2/2} / sqrt(m) [e^{w_i.x}]_{i<=m}
* FAVOR+ hyperbolic: phi(x) = e^{-|x|^2/2} / sqrt(2m) [e^{w_i.x}, e^{-w_i.x}]_{i<=m}
* FAVOR+ trig:       phi(x) = e^{|x|^2/2} / sqrt(m) [sin(w_i.x), cos(w_i.x)]_{i<=m}
  so that E[phi(x).phi(y)] = exp(x.y) for w_i ~ N(0, I_d) (Choromanski et al. 2021, Lemma 1).
  The data are first scaled by sqrt(scale) so that phi(q).phi(k) estimates exp(scale q.k)
  (scale = 1/sqrt(d) gives softmax's logits).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .validation import check_choice, check_positive_int

FAVOR_KINDS = ("positive", "hyperbolic", "trig")
PROJECTIONS = ("iid", "orf")
ORF_SCALINGS = ("chi", "sqrt_d")
SHIFTS = ("log-amplitude", "projection")  # what FAVOR+'s stabiliser subtracts (``favor``)


def elu1(ar: Any, x: Any) -> Any:
    """elu(x) + 1: x + 1 for x > 0, exp(x) otherwise (continuous at 0, strictly positive)."""
    return ar.where_pos(x, x + 1.0, ar.exp(ar.minimum(x, 0.0)))


def relu(ar: Any, x: Any) -> Any:
    """max(x, 0): non-negative, zero on a half-space (denominators can vanish)."""
    return ar.maximum(x, 0.0)


def identity(ar: Any, x: Any) -> Any:
    """phi(x) = x (no feature map, as in fla's naive linear attention)."""
    return x


ELEMENTWISE = {"elu1": elu1, "relu": relu, "identity": identity}


def elementwise(name: str) -> Any:
    return ELEMENTWISE[check_choice("feature", name, tuple(ELEMENTWISE))]


def favor_parts(ar: Any, x: Any, projection: Any, kind: str, scale: float | None) -> tuple[Any, Any, int, Any]:
    """(L, F, count, W x) with phi(x) = exp(L) F / sqrt(count): the log-amplitude L (..., N, k), the bounded
    multiplier F ([sin, cos] for trig, None for the exponential kinds) and the projection W x (..., N, m)."""
    check_choice("kind", kind, FAVOR_KINDS)
    d = x.shape[-1]
    m = projection.shape[-2]
    if scale is None:
        xs = x / ar.sqrt(ar.sqrt(ar.const(d)))
    else:
        xs = x * ar.sqrt(ar.const(scale))
    proj = ar.matmul(xs, ar.mT(projection))  # (B, H, N, m): w_i . x
    half_sq = ar.sum(xs * xs, axis=-1, keepdims=True) / 2.0
    if kind == "trig":
        return half_sq, ar.concat([ar.sin(proj), ar.cos(proj)], axis=-1), m, proj
    if kind == "positive":
        return proj - half_sq, None, m, proj
    return ar.concat([proj - half_sq, -proj - half_sq], axis=-1), None, 2 * m, proj


def favor(
    ar: Any,
    x: Any,
    projection: Any,
    *,
    kind: str = "positive",
    is_query: bool,
    scale: float | None = None,
    stabilize: bool = True,
    feature_eps: float = 0.0,
    shift: str = "log-amplitude",
) -> Any:
    """FAVOR+ random features of x (B, H, N, d) with the random matrix ``projection`` W (m, d).

    Stabiliser (reference code's ``softmax_kernel_transformation``): subtract from the exponent its
    maximum, per token for queries and over all tokens and features for keys; with ``feature_eps == 0``
    it cancels exactly in the normalised output. ``feature_eps`` adds eps to every feature before the
    1/sqrt(m) factor, as performer-pytorch does (1e-4), which biases the kernel estimate; the bias then
    depends on the shift: ``shift='log-amplitude'`` subtracts the maximum of w.x - |x|^2/2 (google-research),
    ``'projection'`` the maximum of w.x alone (performer-pytorch's ``softmax_kernel``).
    """
    check_choice("shift", shift, SHIFTS)
    log_amp, mult, count, proj = favor_parts(ar, x, projection, kind, scale)
    if stabilize:
        base = log_amp  # the exponent itself; 'projection': its W x part (without -|x|^2/2)
        if shift == "projection" and mult is None:
            base = proj if kind == "positive" else ar.concat([proj, -proj], axis=-1)
        log_amp = log_amp - ar.stop_max(base, -1 if is_query else (-2, -1))
    feats = ar.exp(log_amp) if mult is None else ar.exp(log_amp) * mult
    if feature_eps:
        feats = feats + feature_eps
    return feats * (1.0 / ar.sqrt(ar.const(count)))  # one product per feature (a quotient costs several)


def favor_causal(
    ar: Any,
    q: Any,
    k: Any,
    projection: Any,
    *,
    kind: str = "positive",
    scale: float | None = None,
    causal: bool = True,
) -> tuple[Any, Any, Any]:
    """(phi(Q), phi(K), g) of causal FAVOR+, stabilised feature by feature with no future token entering.

    With L^k_sj and L^q_tj the log-amplitudes of feature j (``favor_parts``; one shared column for trig),
    M_tj = max_{s<=t} L^k_sj the keys' running maximum per feature and c_t = max_j (L^q_tj + M_tj), all
    exact constants (``running_max``, ``stop_max``):

        phi(k_s)_j = exp(L^k_sj - M_sj) F_sj / sqrt(count),  g_tj = M_{t-1,j} - M_tj <= 0  (g_1 = 0),
        phi(q_t)_j = exp(L^q_tj - (c_t - M_tj)) F_tj / sqrt(count),

    shapes (B, H, N, count) and g (B, H, N, count). Trigonometric features have one log-amplitude per
    token: M_t and c_t are factors of row t there, so g has one column and the query is shifted by its
    own L^q_t alone (exactly 0). The diagonal gated recurrence
    S_t = diag(e^{g_t}) S_{t-1} + phi(k_t) v_t^T holds S_tj = sum_{s<=t} e^{L^k_sj - M_tj} F_sj v_s / sqrt(count),
    and phi(q_t)^T S_t is e^{-c_t} times the unstabilised sum: a factor per row that cancels in the
    normalised output. Every feature of the state has a term of weight 1 (its maximising key) and the
    query's largest exponent is 0, so the denominator is at least 1 / count and no row's weights sink
    into the subnormals however the query and the keys are aligned (one shift per token, of queries by
    their own maximum, left rows of weights ~1e-41 in float32; proofs/invariants.md).

    ``causal=False``: M_j = max_s L^k_sj over every key (g = 0), the same guarantee for the non-causal
    quotient, whose reference-code stabiliser (a shift per query, one for all keys) let a denominator of
    1e-284 underflow to 0 / 0 in float32 where the output is v."""
    lq, mq, count, _ = favor_parts(ar, q, projection, kind, scale)
    lk, mk, _, _ = favor_parts(ar, k, projection, kind, scale)
    run = ar.running_max(lk, -2) if causal else ar.stop_max(lk, -2)
    g = ar.concat([run[..., :1, :], run[..., :-1, :]], axis=-2) - run if causal else None
    if run.shape[-1] == 1:  # one log-amplitude per token (trig): M_t is a factor of row t, which cancels
        fq = ar.exp(lq - ar.stop_max(lq, -1))
    else:
        fq = ar.exp(ar.shifted(lq, run, -1))
    fk = ar.exp(lk - run)
    if mk is not None:
        fk, fq = fk * mk, fq * mq
    norm = 1.0 / ar.sqrt(ar.const(count))
    return fq * norm, fk * norm, g


# --------------------------------------------------------------------------------------------------
# random matrices (NumPy, seeded): the same draw feeds the reference and every torch form
# --------------------------------------------------------------------------------------------------
def random_projection(
    m: int,
    d: int,
    *,
    kind: str = "iid",
    scaling: str = "chi",
    seed: int | np.random.Generator = 0,
) -> np.ndarray:
    """Random matrix W (m, d) float64 for FAVOR+.

    ``iid``: rows w_i ~ N(0, I_d). ``orf``: floor(m/d) independent blocks of d orthonormal rows (the
    Q factor of a d x d Gaussian matrix, sign-corrected so it is Haar distributed), plus the first
    m mod d rows of one more block; rows rescaled to chi(d)-distributed norms (``scaling='chi'``, rows
    marginally N(0, I_d)) or to sqrt(d) (``scaling='sqrt_d'``, Performer's SMREG).
    """
    m = check_positive_int("m", m)
    d = check_positive_int("d", d)
    check_choice("kind", kind, PROJECTIONS)
    check_choice("scaling", scaling, ORF_SCALINGS)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    if kind == "iid":
        return rng.standard_normal((m, d))
    blocks = []
    for _ in range(-(-m // d)):
        qf, rf = np.linalg.qr(rng.standard_normal((d, d)))
        qf = qf * np.sign(np.where(np.diag(rf) == 0, 1.0, np.diag(rf)))  # Haar: fix column signs
        blocks.append(qf.T)
    rows = np.concatenate(blocks, axis=0)[:m]
    if scaling == "chi":
        norms = np.linalg.norm(rng.standard_normal((m, d)), axis=1)
    else:
        norms = np.full(m, np.sqrt(d))
    return rows * norms[:, None]


def as_torch(w: np.ndarray, like: Any) -> Any:
    """The float64 draw ``w`` as a tensor of ``like``'s dtype and device."""
    import torch

    return torch.as_tensor(np.asarray(w, dtype=np.float64)).to(dtype=like.dtype, device=like.device)
