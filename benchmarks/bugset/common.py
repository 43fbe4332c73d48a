"""Bug-free pieces shared by several modules of the bug set: the accumulation dtype, fla's l2norm, a causal
softmax, the gated linear recurrence (Mamba2's SSD, simple GLA, GLA) and the gated delta rule token by token,
and the loop over packed sequences. Tensors are (B, H, N, d) as in gramcheck's calling convention; every
piece is used identically by both twins of a case, the code that switches a bug on stays in its module.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def acc_dtype(x: torch.Tensor) -> torch.dtype:
    """Accumulation dtype: float32 for low-precision inputs, the input dtype otherwise (float64 stays)."""
    return torch.promote_types(x.dtype, torch.float32)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """fla's l2norm over the last axis: x / sqrt(sum_i x_i^2 + eps), any shape (..., d)."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def l2norm_qk(
    q: torch.Tensor, k: torch.Tensor, norm: Callable[[torch.Tensor], torch.Tensor] = l2norm
) -> tuple[torch.Tensor, torch.Tensor]:
    """fla's use_qk_l2norm_in_kernel, in the accumulation dtype: (norm(q) d^-1/2, norm(k)) for q, k
    (B, H, N, d), ``norm`` (default ``l2norm``) applied to each token's d channels."""
    acc = acc_dtype(q)
    return norm(q.to(acc)) * q.shape[-1] ** -0.5, norm(k.to(acc))


def causal_softmax(logits: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """softmax(logits) v: logits (B, H, N, N), softmax over the last axis with the entries j > i set to -inf
    when ``causal``, times v (B, H, N, d_v)."""
    if causal:
        n = logits.shape[-1]
        logits = logits.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=logits.device).tril(), float("-inf"))
    return torch.softmax(logits, dim=-1) @ v


def gated_scan(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, s0: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated linear recurrence token by token, in the accumulation dtype (scale 1):
    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t, from S_0 = s0 (B, H, d_k, d_v) or 0.
    g: (B, H, N), one log-decay per head and token (Mamba2's SSD with C = q, B = k, x dt = v, dA = g, D = 0;
    simple GLA), or (B, H, N, d_k), one per key channel (GLA); exp(g) in float64, rounded to the accumulation
    dtype. Returns (o (B, H, N, d_v), S_N (B, H, d_k, d_v))."""
    B, H, N, dk = q.shape
    acc = acc_dtype(q)
    qa, ka, va = q.to(acc), k.to(acc), v.to(acc)
    alpha = torch.exp(g.to(torch.float64)).to(acc)
    if alpha.dim() == 3:  # a scalar decay per head: every key channel shares it
        alpha = alpha[..., None]
    state = q.new_zeros(B, H, dk, v.shape[-1], dtype=acc) if s0 is None else s0.to(acc)
    outs = []
    for t in range(N):
        state = alpha[:, :, t, :, None] * state + ka[:, :, t, :, None] * va[:, :, t, None, :]
        outs.append((qa[:, :, t, None, :] @ state)[:, :, 0, :])
    return torch.stack(outs, dim=2), state


def gdn_scan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    s0: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule token by token on q, k (B, H, N, d_k) already normalised, scaled and in the
    accumulation dtype (which v (B, H, N, d_v) and beta (B, H, N) are cast to):
    S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T, o_t = S_t^T q_t, a_t = exp(g_t) (g (B, H, N)
    log-decays, exp in float64), from S_0 = s0 (B, H, d_k, d_v) or 0. Returns (o, S_N) in q's dtype."""
    B, H, N, dk = q.shape
    acc = q.dtype
    va, ba = v.to(acc), beta.to(acc)
    alpha = torch.exp(g.to(torch.float64)).to(acc)
    state = q.new_zeros(B, H, dk, v.shape[-1]) if s0 is None else s0.to(acc)
    outs = []
    for t in range(N):
        state = alpha[:, :, t, None, None] * state
        kt = k[:, :, t]
        delta = ba[:, :, t, None] * (va[:, :, t] - (kt[:, :, None, :] @ state)[:, :, 0, :])
        state = state + kt[:, :, :, None] * delta[:, :, None, :]
        outs.append((q[:, :, t, None, :] @ state)[:, :, 0, :])
    return torch.stack(outs, dim=2), state


def per_sequence(
    run: Callable[[int, int, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor]],
    n: int,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed sequences run one at a time. ``run(s, e, s0)`` computes (o, S_N) of the tokens [s, e) from the
    initial state s0 (None: zeros). Without cu_seqlens: run(0, n, initial_state), the whole batch in one call.
    With cu_seqlens (0 = c_0 < ... < c_S = n, B = 1): sequence j runs on [c_j, c_{j+1}) from
    initial_state[j : j + 1] (initial_state (S, H, d_k, d_v)); returns (o_0 | ... | o_{S-1} concatenated along
    N, S_N of every sequence concatenated along the batch axis: (S, H, d_k, d_v))."""
    if cu_seqlens is None:
        return run(0, n, initial_state)
    cu = [int(c) for c in torch.as_tensor(cu_seqlens).tolist()]
    outs, finals = [], []
    for j, (s, e) in enumerate(zip(cu[:-1], cu[1:], strict=True)):
        out, state = run(s, e, None if initial_state is None else initial_state[j : j + 1])
        outs.append(out)
        finals.append(state)
    return torch.cat(outs, dim=2), torch.cat(finals, dim=0)


def as_output(
    out: torch.Tensor, state: torch.Tensor, dtype: torch.dtype, output_final_state: bool
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """A target's return value: o cast to the inputs' ``dtype``, with the final state S_N (left in the
    accumulation dtype) when ``output_final_state``."""
    out = out.to(dtype)
    return (out, state) if output_final_state else out
