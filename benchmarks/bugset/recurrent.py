"""Real bugs of recurrent / chunked linear-attention kernels (flash-linear-attention, Mamba2 in vLLM, RetNet
ports, RWKV-6, Gated DeltaNet ports), each re-implemented in plain torch as a ``buggy`` / ``fixed`` pair in
gramcheck's calling convention ``fn(q, k, v, *, causal, **extras)`` on (B, H, N, d) tensors.

Every pair shares one code path and differs only by the flag that switches the reported bug on. The fixed
twins compute in at least float32 (decays and cumulative log-decays in float64, as careful kernels do) and
accept any float dtype, any B, H, N >= 1, d >= 1. The pieces the bug-set modules share (the gated scan, the
l2norm, the packed-sequence loop) are in benchmarks/bugset/common.py.
"""

from __future__ import annotations

import math

import torch

from benchmarks.bugset.cases import Case
from benchmarks.bugset.common import acc_dtype, as_output, gated_scan, l2norm_qk, per_sequence

CHUNK = 64  # the chunk size of every chunked kernel here (fla's BT, vLLM's mamba chunk in the tests)


# ======================================================================================================
# 1. RetNet chunkwise retention: the cross-chunk term reads R_i instead of R_{i-1} (paper's Eq. 7)
# ======================================================================================================
def _retention_chunkwise(q, k, v, *, cross_reads_current: bool):
    """Chunkwise retention (chunks of 64): O_[i] = (Q K^T * D) V + (Q R_{i-1}) * xi,
    R_i = K^T (V * zeta) + gamma^L R_{i-1}, gamma_h = 1 - 2^(-5-h), Q scaled by d^-1/2."""
    B, H, N, d = q.shape
    acc = acc_dtype(q)
    s = d**-0.5
    lg = torch.log1p(-torch.exp2(-5.0 - torch.arange(H, dtype=torch.float64)))  # log gamma_h, (H,)
    qa, ka, va = q.to(acc) * s, k.to(acc), v.to(acc)
    state = q.new_zeros(B, H, d, v.shape[-1], dtype=acc)
    outs = []
    for c0 in range(0, N, CHUNK):
        L = min(CHUNK, N - c0)
        qc, kc, vc = qa[:, :, c0 : c0 + L], ka[:, :, c0 : c0 + L], va[:, :, c0 : c0 + L]
        idx = torch.arange(L, dtype=torch.float64)
        lag = idx[:, None] - idx[None, :]
        decay = torch.where(lag >= 0, torch.exp(lg[:, None, None] * lag.clamp(min=0)), 0.0).to(acc)  # (H, L, L)
        xi = torch.exp(lg[:, None] * (idx + 1)).to(acc)[..., None]  # gamma^(j+1), (H, L, 1)
        zeta = torch.exp(lg[:, None] * (L - 1 - idx)).to(acc)[..., None]  # gamma^(L-1-j)
        inner = ((qc @ kc.transpose(-1, -2)) * decay) @ vc
        new_state = torch.exp(lg * L).to(acc)[:, None, None] * state + kc.transpose(-1, -2) @ (vc * zeta)
        cross = (qc @ (new_state if cross_reads_current else state)) * xi
        outs.append(inner + cross)
        state = new_state
    return torch.cat(outs, dim=2).to(q.dtype)


def retnet_eq7_current_chunk_state(q, k, v, *, causal):
    """Chunkwise retention whose cross-chunk term is Q_[i] R_i * xi (Eq. 7 as first printed)."""
    return _retention_chunkwise(q, k, v, cross_reads_current=True)


def retnet_eq7_previous_chunk_state(q, k, v, *, causal):
    """Chunkwise retention with the corrected cross-chunk term Q_[i] R_{i-1} * xi."""
    return _retention_chunkwise(q, k, v, cross_reads_current=False)


# ======================================================================================================
# 2. Mamba2 SSD, packed sequences with initial states: the initial state's decay at the first chunk
#    boundary is taken from the chunk's start instead of the sequence's start (vLLM)
# ======================================================================================================
def _mamba2(q, k, v, g, initial_state, output_final_state, cu_seqlens, *, chunk_start_decay: bool):
    """Packed Mamba2 SSD (scale 1, D = 0), each sequence from its own initial state (gated_scan)."""
    g64 = g.to(torch.float64)

    def one(s, e, s0):  # tokens [s, e) of the pack (a whole batch: s = 0, which no chunk boundary moves)
        out, state = gated_scan(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], g[:, :, s:e], s0)
        first_boundary = (s // CHUNK + 1) * CHUNK
        if chunk_start_decay and s0 is not None and s % CHUNK and e > first_boundary:
            # the state-passing step at the chunk boundary decays S_0 by exp(dA_cumsum[last]) measured from the
            # chunk's first token: the tokens of the previous sequence in the shared chunk decay it again
            extra = torch.exp(g64[:, :, (s // CHUNK) * CHUNK : s].sum(-1))  # (1, H)
            acc = out.dtype
            b = torch.cumsum(g64[:, :, s:e], dim=-1)  # decay of S_0 through each token of the sequence
            readout = (q[:, :, s:e].to(acc) * torch.exp(b).to(acc)[..., None]) @ s0.to(acc)
            late = (torch.arange(s, e) >= first_boundary).to(acc)[None, None, :, None]
            out = out + late * (extra.to(acc)[..., None, None] - 1) * readout
            state = state + ((extra - 1) * torch.exp(b[..., -1])).to(acc)[..., None, None] * s0.to(acc)
        return out, state

    out, state = per_sequence(one, q.shape[2], initial_state, cu_seqlens)
    return as_output(out, state, q.dtype, output_final_state)


def mamba2_varlen_decay_from_chunk_start(
    q, k, v, *, causal, g, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """Packed Mamba2 whose initial-state decay at a sequence's first chunk boundary counts the whole chunk."""
    return _mamba2(q, k, v, g, initial_state, output_final_state, cu_seqlens, chunk_start_decay=True)


def mamba2_varlen_decay_from_sequence_start(
    q, k, v, *, causal, g, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """Packed Mamba2 whose initial-state decay starts at the sequence's first token."""
    return _mamba2(q, k, v, g, initial_state, output_final_state, cu_seqlens, chunk_start_decay=False)


# ======================================================================================================
# 3. RWKV-6 with a state input: the kernel indexes the state without the batch offset (RWKV-LM)
# ======================================================================================================
def _rwkv6(q, k, v, g, u, initial_state, output_final_state, *, batch_offset: bool):
    B, H, N, dk = q.shape
    acc = acc_dtype(q)
    r, ka, va = q.to(acc) * dk**-0.5, k.to(acc), v.to(acc)
    alpha = torch.exp(g.to(torch.float64)).to(acc)
    bonus = u.to(acc)[None, :, :, None]
    if initial_state is None:
        state = q.new_zeros(B, H, dk, v.shape[-1], dtype=acc)
    elif batch_offset:
        state = initial_state.to(acc)
    else:  # _state += h*N*N + i*N: every sequence of the batch reads the state of batch row 0
        state = initial_state[:1].to(acc).expand(B, -1, -1, -1)
    outs = []
    for t in range(N):
        kv = ka[:, :, t, :, None] * va[:, :, t, None, :]
        outs.append((r[:, :, t, None, :] @ (state + bonus * kv))[:, :, 0, :])
        state = alpha[:, :, t, :, None] * state + kv
    return as_output(torch.stack(outs, dim=2), state, q.dtype, output_final_state)


def rwkv6_state_without_batch_offset(q, k, v, *, causal, g, u, initial_state=None, output_final_state=False):
    """RWKV-6 that reads initial_state[0] for every batch row."""
    return _rwkv6(q, k, v, g, u, initial_state, output_final_state, batch_offset=False)


def rwkv6_state_with_batch_offset(q, k, v, *, causal, g, u, initial_state=None, output_final_state=False):
    """RWKV-6 that reads each batch row's own initial state."""
    return _rwkv6(q, k, v, g, u, initial_state, output_final_state, batch_offset=True)


# ======================================================================================================
# 4. GLA: fused_chunk_gla kept the (B, H, T, D) layout after callers moved to (B, T, H, D) (fla)
# ======================================================================================================
def _gla_recurrent(q, k, v, g):
    """S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t (scale 1.0, gate_tau 1) from S_0 = 0."""
    return gated_scan(q, k, v, g)[0].to(q.dtype)


def _gla_layout(q, k, v, g, *, time_and_heads_swapped: bool):
    if not time_and_heads_swapped:
        return _gla_recurrent(q, k, v, g)
    t = [x.transpose(1, 2) for x in (q, k, v, g)]  # the kernel reads axis 1 as time, axis 2 as heads
    return _gla_recurrent(*t).transpose(1, 2)


def gla_fused_chunk_head_first_layout(q, k, v, *, causal, g):
    """GLA that reads (B, H, T, D) tensors as (B, T, H, D): heads and tokens exchanged."""
    return _gla_layout(q, k, v, g, time_and_heads_swapped=True)


def gla_fused_chunk_matching_layout(q, k, v, *, causal, g):
    """GLA reading the layout it is given."""
    return _gla_layout(q, k, v, g, time_and_heads_swapped=False)


# ======================================================================================================
# 5. DeltaNet through the gated WY kernels with g = None: the WY backward drops the k-side terms (fla)
# ======================================================================================================
def _delta_wy(q, k, v, beta, *, drop_wy_key_grad: bool):
    """Chunked WY / UT delta rule (chunks of 64), l2-normalised q, k, scale d^-1/2:
    (I + tril_-1(diag(beta) K K^T)) [U, W] = diag(beta) [V, K], Delta = U - W S,
    O = Q S + tril(Q K^T) Delta, S <- S + K^T Delta."""
    B, H, N, dk = q.shape
    acc = acc_dtype(q)
    qa, ka = l2norm_qk(q, k)
    va, ba = v.to(acc), beta.to(acc)
    state = q.new_zeros(B, H, dk, v.shape[-1], dtype=acc)
    outs = []
    for c0 in range(0, N, CHUNK):
        L = min(CHUNK, N - c0)
        qc, kc, vc, bc = qa[:, :, c0 : c0 + L], ka[:, :, c0 : c0 + L], va[:, :, c0 : c0 + L], ba[:, :, c0 : c0 + L]
        eye = torch.eye(L, dtype=acc)
        system = eye + torch.tril(bc[..., None] * (kc @ kc.transpose(-1, -2)), diagonal=-1)
        k_beta = bc[..., None] * kc
        if drop_wy_key_grad:  # USE_G=False branch missing: no dk (and no dk-side db) from w = T diag(beta) K
            k_beta = k_beta.detach()
        w = torch.linalg.solve_triangular(system, k_beta, upper=False, unitriangular=True)
        u = torch.linalg.solve_triangular(system, bc[..., None] * vc, upper=False, unitriangular=True)
        delta = u - w @ state
        outs.append(qc @ state + torch.tril(qc @ kc.transpose(-1, -2)) @ delta)
        state = state + kc.transpose(-1, -2) @ delta
    return torch.cat(outs, dim=2).to(q.dtype)


def deltanet_wy_backward_missing_key_term(q, k, v, *, causal, beta):
    """Delta rule whose backward drops the gradient through w = T diag(beta) K (forward unchanged)."""
    return _delta_wy(q, k, v, beta, drop_wy_key_grad=True)


def deltanet_wy_backward_complete(q, k, v, *, causal, beta):
    """Delta rule with the full WY backward."""
    return _delta_wy(q, k, v, beta, drop_wy_key_grad=False)


# ======================================================================================================
# 6. Gated DeltaNet: the intra-chunk gate exp(g_i - g_j) evaluated above the diagonal, then masked by a
#    multiply (tilelang-ascend's chunk_gated_delta_rule)
# ======================================================================================================
def _gated_delta_wy(q, k, v, beta, g, *, multiply_mask: bool):
    B, H, N, dk = q.shape
    acc = acc_dtype(q)
    qa, ka = l2norm_qk(q, k)
    va, ba = v.to(acc), beta.to(acc)
    g64 = g.to(torch.float64)
    state = q.new_zeros(B, H, dk, v.shape[-1], dtype=acc)
    outs = []
    for c0 in range(0, N, CHUNK):
        L = min(CHUNK, N - c0)
        qc, kc, vc, bc = qa[:, :, c0 : c0 + L], ka[:, :, c0 : c0 + L], va[:, :, c0 : c0 + L], ba[:, :, c0 : c0 + L]
        b = torch.cumsum(g64[:, :, c0 : c0 + L], dim=-1)  # cumulative log-decay inside the chunk
        diff = (b[..., :, None] - b[..., None, :]).to(acc)  # g_i - g_j, positive above the diagonal
        lower = torch.ones(L, L, dtype=torch.bool).tril()

        def gate(keep, diff=diff):  # exp(g_i - g_j) on ``keep``, 0 elsewhere: the chunk's causal mask
            if multiply_mask:  # exp(+large) = inf above the diagonal, and inf * 0 = NaN
                return torch.exp(diff) * keep.to(acc)
            return torch.exp(diff.masked_fill(~keep, -math.inf))

        gamma, gamma_strict = gate(lower), gate(lower.tril(-1))
        p_in = torch.exp(b).to(acc)[..., None]  # decay from the chunk's start through token t
        p_out = torch.exp(b[..., -1:] - b).to(acc)[..., None]  # decay from token s to the chunk's end
        eye = torch.eye(L, dtype=acc)
        system = eye + bc[..., None] * (kc @ kc.transpose(-1, -2)) * gamma_strict
        w = torch.linalg.solve_triangular(system, bc[..., None] * kc * p_in, upper=False, unitriangular=True)
        u = torch.linalg.solve_triangular(system, bc[..., None] * vc, upper=False, unitriangular=True)
        delta = u - w @ state
        outs.append((qc * p_in) @ state + (qc @ kc.transpose(-1, -2) * gamma) @ delta)
        state = torch.exp(b[..., -1]).to(acc)[..., None, None] * state + (kc * p_out).transpose(-1, -2) @ delta
    return torch.cat(outs, dim=2).to(q.dtype)


def gated_deltanet_gate_masked_by_multiply(q, k, v, *, causal, g, beta):
    """Gated delta rule whose intra-chunk decays exp(g_i - g_j) are masked after the exp, by a multiply."""
    return _gated_delta_wy(q, k, v, beta, g, multiply_mask=True)


def gated_deltanet_gate_masked_before_exp(q, k, v, *, causal, g, beta):
    """Gated delta rule whose intra-chunk decays are masked (select) before the exp."""
    return _gated_delta_wy(q, k, v, beta, g, multiply_mask=False)


# ======================================================================================================
# 7. Unnormalised linear attention, fused chunk kernel: the backward mishandles scale != 1 (fla)
# ======================================================================================================
LINEAR_SCALE = 0.25  # the kernel's scale; gramcheck's linear-unnormalised with divisor 1 / scale = 4


def _linear_chunked(q, k, v, s):
    """o = tril((s Q) K^T) V by chunks of 64 with the state K^T V carried between chunks."""
    B, H, N, dk = q.shape
    acc = acc_dtype(q)
    qa, ka, va = q.to(acc) * s, k.to(acc), v.to(acc)
    state = q.new_zeros(B, H, dk, v.shape[-1], dtype=acc)
    outs = []
    for c0 in range(0, N, CHUNK):
        qc, kc, vc = qa[:, :, c0 : c0 + CHUNK], ka[:, :, c0 : c0 + CHUNK], va[:, :, c0 : c0 + CHUNK]
        outs.append(qc @ state + torch.tril(qc @ kc.transpose(-1, -2)) @ vc)
        state = state + kc.transpose(-1, -2) @ vc
    return torch.cat(outs, dim=2).to(q.dtype)


class _FusedChunkLinearUnscaledGrad(torch.autograd.Function):
    """Forward right; backward forms dk and dv from the unscaled q (off by the factor 1 / scale)."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return _linear_chunked(q, k, v, LINEAR_SCALE)

    @staticmethod
    def backward(ctx, do):
        q, k, v = ctx.saved_tensors
        with torch.enable_grad():
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            dq, dk, dv = torch.autograd.grad(_linear_chunked(*leaves, LINEAR_SCALE), leaves, do)
        return dq, dk / LINEAR_SCALE, dv / LINEAR_SCALE


def linear_fused_chunk_grad_ignores_scale(q, k, v, *, causal):
    """fused_chunk_linear_attn (scale 1/4): right outputs, dk and dv computed without the scale."""
    return _FusedChunkLinearUnscaledGrad.apply(q, k, v)


def linear_fused_chunk_grad_with_scale(q, k, v, *, causal):
    """fused_chunk_linear_attn (scale 1/4) with autograd's backward."""
    return _linear_chunked(q, k, v, LINEAR_SCALE)


# ======================================================================================================
CASES = [
    Case(
        id="retnet-eq7-cross-chunk-reads-current-state",
        source="https://github.com/microsoft/unilm/issues/1213",
        summary=(
            "The RetNet paper's chunkwise Eq. (7) wrote the cross-chunk term as Q_[i] R_i * xi (the state that "
            "already contains the current chunk); Jamie-Stirling/RetNet's chunkwise implementation followed it "
            "and disagreed with the parallel and recurrent forms (Jamie-Stirling/RetNet#10). The authors confirmed "
            "an index mistake: the term is Q_[i] R_{i-1} * xi."
        ),
        kind="chunk-boundary",
        variant="retnet",
        buggy=retnet_eq7_current_chunk_state,
        fixed=retnet_eq7_previous_chunk_state,
        # trigger: any N >= 1 (even the first chunk reads its own keys through R_1: future tokens leak in)
    ),
    Case(
        id="mamba2-varlen-initial-state-decay-from-chunk-start",
        source="https://github.com/vllm-project/vllm/pull/23279",
        summary=(
            "vLLM's Mamba2 state-passing kernel with initial states computed dA_cumsum from the start of the "
            "mamba chunk instead of the start of the current sequence when a packed sequence begins mid-chunk, "
            "so the initial state was also decayed by the previous sequence's tokens in that chunk. Fixed by "
            "measuring the decay from the sequence's first token."
        ),
        kind="varlen",
        variant="mamba2",
        buggy=mamba2_varlen_decay_from_chunk_start,
        fixed=mamba2_varlen_decay_from_sequence_start,
        # trigger: cu_seqlens with a sequence starting off a multiple of 64, a nonzero initial state, and the
        # sequence crossing the next chunk boundary (outputs past it and its final state)
    ),
    Case(
        id="rwkv6-state-kernel-missing-batch-offset",
        source="https://github.com/BlinkDL/RWKV-LM/issues/241",
        summary=(
            "RWKV-LM's wkv6state CUDA kernel offset the state pointer by h*N*N + i*N only, missing b*H*N*N, so "
            "every sequence of the batch started from batch row 0's state (why state BPTT did not work). The fix "
            "adds the batch offset."
        ),
        kind="state",
        variant="rwkv6",
        buggy=rwkv6_state_without_batch_offset,
        fixed=rwkv6_state_with_batch_offset,
        # trigger: B >= 2 with different initial states per batch row
    ),
    Case(
        id="gla-fused-chunk-head-first-layout",
        source="https://github.com/fla-org/flash-linear-attention/issues/547",
        summary=(
            "After fla moved its kernels to the (B, T, H, D) layout, fused_chunk_gla still read (B, H, T, D), "
            "giving outputs inconsistent with naive_recurrent_gla (and NaNs): tokens and heads are exchanged. "
            "Maintainers deprecated it and fixed the layout."
        ),
        kind="layout",
        variant="gla",
        buggy=gla_fused_chunk_head_first_layout,
        fixed=gla_fused_chunk_matching_layout,
        # trigger: any input with H >= 2 or N >= 2
    ),
    Case(
        id="deltanet-gdn-wy-backward-without-gate",
        source="https://github.com/fla-org/flash-linear-attention/pull/863",
        summary=(
            "With g = None (plain delta rule through the gated kernels) the GDN WY backward kernel never assigned "
            "b_dk and skipped the dk-side contribution to db, so dk was garbage and db missed a term (issue #862). "
            "Re-implemented as the backward dropping the gradient through w = T diag(beta) K; fixed by the "
            "missing else branch."
        ),
        kind="backward",
        variant="deltanet",
        buggy=deltanet_wy_backward_missing_key_term,
        fixed=deltanet_wy_backward_complete,
        # trigger: any loss differentiated w.r.t. k or beta with N >= 2 and beta != 0
    ),
    Case(
        id="gated-deltanet-gate-exp-above-diagonal",
        source="https://github.com/tile-ai/tilelang-ascend/pull/1460",
        summary=(
            "tilelang-ascend's chunk_gated_delta_rule computed the intra-chunk gate exp(g_i - g_j) for every "
            "pair, including above the diagonal where g_i - g_j > 0, and masked afterwards; the PR ports a "
            "compare+select mask so positive exponents are never exponentiated. Re-implemented with a "
            "multiplicative mask: exp overflows to inf and inf * 0 = NaN."
        ),
        kind="decay",
        variant="gated-deltanet",
        buggy=gated_deltanet_gate_masked_by_multiply,
        fixed=gated_deltanet_gate_masked_before_exp,
        # trigger: a cumulative decay of more than ~88 nats inside one chunk in float32 (g = -2 per token over
        # 45 tokens, or one extreme gate)
    ),
    Case(
        id="linear-fused-chunk-scale-in-backward",
        source="https://github.com/fla-org/flash-linear-attention/issues/47",
        summary=(
            "fused_chunk_linear_attn gave wrong results with scale != 1 (d^-1/2) while scale = 1 and "
            "chunk_linear_attn were right; the maintainer fixed the gradient. Re-implemented as a backward that "
            "forms dk and dv from the unscaled q (the thread does not show the diff: the exact term is inferred)."
        ),
        kind="backward",
        variant="linear-unnormalised",
        buggy=linear_fused_chunk_grad_ignores_scale,
        fixed=linear_fused_chunk_grad_with_scale,
        params={"feature": "identity", "divisor": 1.0 / LINEAR_SCALE},
        # trigger: any gradient with scale != 1
    ),
]
