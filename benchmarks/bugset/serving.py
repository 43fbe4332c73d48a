"""Real bugs of the serving and model-port code paths around linear-attention / SSM kernels (vLLM, vLLM-Ascend,
SGLang, transformers' pure-torch fallbacks, a CUDA prefill kernel, an MLX training VJP), each re-implemented
in plain torch as a ``buggy`` / ``fixed`` pair in gramcheck's calling convention ``fn(q, k, v, *, causal,
**extras)`` on (B, H, N, d) tensors.

Most of them live where a kernel meets the serving machinery: which initial state a prefill starts from
(batch size one, short extends under a prefix cache), how a context-parallel prefill stitches its ranks'
final states, what final state a chunked prefill hands to decode when the prompt ends mid-chunk, how a
model port normalises q and k, and which batch row a backward's scatter reads. Every pair shares one code
path and differs only by the flag that switches the reported bug on. The twins compute in at least float32
(cumulative log-decays in float64) and accept any float dtype, any B, H, N >= 1, d >= 1. The sources of the
other modules of the bug set are not repeated here.
"""

from __future__ import annotations

import torch

from benchmarks.bugset.cases import Case
from benchmarks.bugset.common import as_output, gated_scan, gdn_scan, l2norm_qk, per_sequence

TRACK_CHUNK = 64  # SGLang's mamba_cache_chunk_size as this re-implementation takes it (the track-mask threshold)
HF_CHUNK = 64  # transformers' torch_chunk_gated_delta_rule chunk_size
PREFILL_CHUNK = 32  # the chunk C of the CUDA prefill kernel (sparkinfer's pf_gdnc_scan_kernel)


def _fla_l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """fla's l2norm (and transformers' after the fix): x * rsqrt(sum x^2 + eps) over the last axis."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _gdn_qk(q, k):
    """fla's use_qk_l2norm_in_kernel in at least float32 with this module's rsqrt l2norm, q scaled by d^-1/2."""
    return l2norm_qk(q, k, _fla_l2norm)


# ======================================================================================================
# 1. vLLM Mamba2 mixer: a prefill batch of one sequence drops its initial state (vllm#22034)
# ======================================================================================================
def _mamba2_vllm_batch(q, k, v, g, initial_state, output_final_state, cu_seqlens, *, single_drops_state: bool):
    if single_drops_state and initial_state is not None and initial_state.shape[0] == 1:
        # "no in this case no point to use initial states": one prefill sequence is run from zeros
        initial_state = None
    out, state = per_sequence(
        lambda s, e, s0: gated_scan(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], g[:, :, s:e], s0),
        q.shape[2], initial_state, cu_seqlens,
    )
    return as_output(out, state, q.dtype, output_final_state)


def mamba2_vllm_single_prefill_drops_initial_state(
    q, k, v, *, causal, g, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """vLLM mamba_chunk_scan_combined caller that sets initial_states = None when it holds one sequence."""
    return _mamba2_vllm_batch(q, k, v, g, initial_state, output_final_state, cu_seqlens, single_drops_state=True)


def mamba2_vllm_single_prefill_keeps_initial_state(
    q, k, v, *, causal, g, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """The same caller passing every sequence's initial state, however many there are."""
    return _mamba2_vllm_batch(q, k, v, g, initial_state, output_final_state, cu_seqlens, single_drops_state=False)


# ======================================================================================================
# 2. SGLang Mamba2 metadata: has_initial_states &= mamba_track_mask, so an extend shorter than the
#    track chunk (a prefix-cache hit prefilling a short suffix) runs from a blank state (sglang#29368)
# ======================================================================================================
def _mamba2_sglang_extend(q, k, v, g, initial_state, output_final_state, cu_seqlens, *, gate_on_track: bool):
    def seeded(s0, length):
        tracked = length >= TRACK_CHUNK  # mamba_track_mask: the extend is long enough to snapshot a state
        return None if s0 is None or (gate_on_track and not tracked) else s0

    out, state = per_sequence(
        lambda s, e, s0: gated_scan(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], g[:, :, s:e], seeded(s0, e - s)),
        q.shape[2], initial_state, cu_seqlens,
    )
    return as_output(out, state, q.dtype, output_final_state)


def mamba2_sglang_short_extend_blank_state(
    q, k, v, *, causal, g, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """SGLang hybrid-Mamba extend whose initial-state restore is gated on the prefix-cache track mask."""
    return _mamba2_sglang_extend(q, k, v, g, initial_state, output_final_state, cu_seqlens, gate_on_track=True)


def mamba2_sglang_extend_restores_state(
    q, k, v, *, causal, g, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """The same extend restoring the cached state whenever the request has a cached context."""
    return _mamba2_sglang_extend(q, k, v, g, initial_state, output_final_state, cu_seqlens, gate_on_track=False)


# ======================================================================================================
# 3. vLLM-Ascend Gated DeltaNet under prefill context parallelism (PCP = 2): the ranks' final states are
#    stitched as all_final[i] + Phi_i correct_{i-1}, counting Phi_i s0 twice (vllm-ascend#11508)
# ======================================================================================================
def _gdn_pcp_one(qn, kn, v, g, beta, s0, *, double_counts_s0: bool):
    """One sequence (rows of a batch) split over two context-parallel ranks, [0, m) and [m, N)."""
    N = qn.shape[2]
    acc = qn.dtype
    va = v.to(acc)
    s0a = None if s0 is None else s0.to(acc)
    if N < 2:  # one rank holds every token: nothing to stitch
        return gdn_scan(qn, kn, va, g, beta, s0a)
    m = (N + 1) // 2
    parts = [slice(0, m), slice(m, N)]
    # every rank runs its tokens from the request's cached state s0: all_final[i] = Phi_i s0 + p_i
    all_final = [gdn_scan(qn[:, :, p], kn[:, :, p], va[:, :, p], g[:, :, p], beta[:, :, p], s0a)[1] for p in parts]
    base = torch.zeros_like(all_final[0]) if s0a is None else s0a

    def h_update(p, x):  # Phi_i x: the rank's transition product applied to x (the homogeneous recurrence)
        return gdn_scan(qn[:, :, p], kn[:, :, p], torch.zeros_like(va[:, :, p]), g[:, :, p], beta[:, :, p], x)[1]

    correct0 = all_final[0]
    carried = correct0 if double_counts_s0 else correct0 - base
    final = all_final[1] + h_update(parts[1], carried)
    # rank 1 reruns its tokens from updated_state[0] = correct0 for its outputs (right for two ranks)
    out0, _ = gdn_scan(qn[:, :, parts[0]], kn[:, :, parts[0]], va[:, :, parts[0]], g[:, :, parts[0]],
                        beta[:, :, parts[0]], s0a)
    out1, _ = gdn_scan(qn[:, :, parts[1]], kn[:, :, parts[1]], va[:, :, parts[1]], g[:, :, parts[1]],
                        beta[:, :, parts[1]], correct0)
    return torch.cat([out0, out1], dim=2), final


def _gdn_pcp(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, *, double_counts_s0: bool):
    qn, kn = _gdn_qk(q, k)
    out, state = per_sequence(
        lambda s, e, s0: _gdn_pcp_one(qn[:, :, s:e], kn[:, :, s:e], v[:, :, s:e], g[:, :, s:e], beta[:, :, s:e], s0,
                                      double_counts_s0=double_counts_s0),
        q.shape[2], initial_state, cu_seqlens,
    )
    return as_output(out, state, q.dtype, output_final_state)


def stitching_cancels(log_decay: float = -10.0) -> float:
    """The fixed stitching's relative error in the final state (float32, against the float64 definition): N = 2,
    d = 4, zero keys (no writes), rank 0's log-decay ``log_decay``, rank 1's -0.5. The exact state is
    e^(log_decay - 0.5) s0; the stitching forms e^-0.5 s0 and cancels it: 0.15% at -10, 12% at -15, 8e-8
    (about u) at -1."""
    from gramcheck import variants

    gen = torch.Generator().manual_seed(0)
    q, v = torch.randn(1, 1, 2, 4, generator=gen), torch.randn(1, 1, 2, 4, generator=gen)
    k = torch.zeros(1, 1, 2, 4)
    g, beta = torch.tensor([[[log_decay, -0.5]]]), torch.rand(1, 1, 2, generator=gen)
    s0 = torch.randn(1, 1, 4, 4, generator=gen)
    _, state = gdn_pcp_final_state_subtracts_s0(q, k, v, causal=True, g=g, beta=beta, initial_state=s0,
                                                output_final_state=True)
    exact = variants.get("gated-deltanet").reference(
        *(x.double().numpy() for x in (q, k, v)), causal=True, g=g.double().numpy(), beta=beta.double().numpy(),
        initial_state=s0.double().numpy(), output_final_state=True,
    )[1]
    return float(abs(state.double().numpy() - exact).max() / abs(exact).max())


def gdn_pcp_final_state_counts_s0_twice(
    q, k, v, *, causal, g, beta, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """Context-parallel GDN prefill stitching final states as all_final[i] + Phi_i updated[i-1]."""
    return _gdn_pcp(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, double_counts_s0=True)


def gdn_pcp_final_state_subtracts_s0(
    q, k, v, *, causal, g, beta, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """The same prefill stitching all_final[i] + Phi_i (updated[i-1] - s0)."""
    return _gdn_pcp(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, double_counts_s0=False)


# ======================================================================================================
# transformers' torch_chunk_gated_delta_rule (the pure-torch fallback of Qwen3-Next / Qwen3.5), on
# (B, H, N, d) inputs already normalised and scaled; used by cases 4 and 5
# ======================================================================================================
def _chunk_gated_delta(q, k, v, g, beta, s0, chunk, *, tail_glast_zero: bool = False):
    """The chunked WY form as transformers writes it: pad to chunks (k, v, beta, g = 0), per-chunk cumulative
    log-decays, the row-by-row inverse of (I + strictly_lower(diag(beta) K K^T * Gamma)), then per chunk
    v_new = U - W S, o = (Q * e^G) S + (Q K^T * Gamma) v_new, S <- e^{G_last} S + (K * e^{G_last - G})^T v_new.
    ``tail_glast_zero``: a short final chunk reads G_last from a tail staged as 0 (sparkinfer#604)."""
    B, H, N, dk = q.shape
    dv = v.shape[-1]
    acc = q.dtype
    L = chunk
    pad = (L - N % L) % L
    tail = N % L  # real tokens of the last chunk when it is short, 0 when N is a multiple of L
    qa, ka, va = (torch.nn.functional.pad(x.to(acc), (0, 0, 0, pad)) for x in (q, k, v))
    ba = torch.nn.functional.pad(beta.to(acc), (0, pad))
    g64 = torch.nn.functional.pad(g.to(torch.float64), (0, pad))
    C = (N + pad) // L
    qc, kc, vc = (x.reshape(B, H, C, L, x.shape[-1]) for x in (qa, ka, va))
    bc = ba.reshape(B, H, C, L)
    G = torch.cumsum(g64.reshape(B, H, C, L), dim=-1)  # cumulative log-decay inside each chunk
    lower = torch.ones(L, L, dtype=torch.bool).tril()
    decay = torch.exp((G[..., :, None] - G[..., None, :]).masked_fill(~lower, -torch.inf)).to(acc)
    k_beta, v_beta = kc * bc[..., None], vc * bc[..., None]
    attn = -((k_beta @ kc.transpose(-1, -2)) * decay).masked_fill(~lower.tril(-1), 0)
    for i in range(1, L):  # (I + A)^{-1} - I, row by row
        row = attn[..., i, :i].clone()
        sub = attn[..., :i, :i].clone()
        attn[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)
    attn = attn + torch.eye(L, dtype=acc)
    u = attn @ v_beta
    w = attn @ (k_beta * torch.exp(G).to(acc)[..., None])
    state = q.new_zeros(B, H, dk, dv, dtype=acc) if s0 is None else s0.to(acc)
    outs = []
    for c in range(C):
        v_new = u[:, :, c] - w[:, :, c] @ state
        inter = (qc[:, :, c] * torch.exp(G[:, :, c]).to(acc)[..., None]) @ state
        outs.append(inter + ((qc[:, :, c] @ kc[:, :, c].transpose(-1, -2)) * decay[:, :, c]) @ v_new)
        g_last = G[:, :, c, -1]
        if tail_glast_zero and c == C - 1 and tail:
            g_last = torch.zeros_like(g_last)  # s_g[C - 1] of a tail staged as 0, not G of the last real token
        k_out = kc[:, :, c] * torch.exp(g_last[..., None] - G[:, :, c]).to(acc)[..., None]
        state = torch.exp(g_last).to(acc)[..., None, None] * state + k_out.transpose(-1, -2) @ v_new
    out = torch.stack(outs, dim=2).reshape(B, H, C * L, dv)[:, :, :N]
    return out, state


# ======================================================================================================
# 4. transformers Qwen3-Next GatedDeltaNet torch fallback: q, k normalised by F.normalize instead of fla's
#    l2norm x * rsqrt(sum x^2 + 1e-6) (transformers#40842)
# ======================================================================================================
def _hf_gdn(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, *, torch_normalize: bool):
    if torch_normalize:  # x / max(|x|, 1e-12): no epsilon under the root
        qn, kn = l2norm_qk(q, k, lambda x: torch.nn.functional.normalize(x, p=2, dim=-1))
    else:
        qn, kn = l2norm_qk(q, k, _fla_l2norm)
    out, state = per_sequence(
        lambda s, e, s0: _chunk_gated_delta(qn[:, :, s:e], kn[:, :, s:e], v[:, :, s:e], g[:, :, s:e],
                                            beta[:, :, s:e], s0, HF_CHUNK),
        q.shape[2], initial_state, cu_seqlens,
    )
    return as_output(out, state, q.dtype, output_final_state)


def qwen3_next_torch_gdn_f_normalize(
    q, k, v, *, causal, g, beta, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """torch_chunk_gated_delta_rule normalising q and k with F.normalize (eps 1e-12 as a clamp on |x|)."""
    return _hf_gdn(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, torch_normalize=True)


def qwen3_next_torch_gdn_fla_l2norm(
    q, k, v, *, causal, g, beta, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """torch_chunk_gated_delta_rule normalising q and k as fla does, x * rsqrt(sum x^2 + 1e-6)."""
    return _hf_gdn(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, torch_normalize=False)


# ======================================================================================================
# 5. A CUDA GDN chunk-parallel prefill scan: the final state of a prompt whose length is not a multiple of
#    the chunk reads G_last from a tail staged as 0 (gittensor-ai-lab/sparkinfer#604)
# ======================================================================================================
def _gdn_prefill(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, *, tail_glast_zero: bool):
    qn, kn = _gdn_qk(q, k)
    out, state = per_sequence(
        lambda s, e, s0: _chunk_gated_delta(qn[:, :, s:e], kn[:, :, s:e], v[:, :, s:e], g[:, :, s:e],
                                            beta[:, :, s:e], s0, PREFILL_CHUNK, tail_glast_zero=tail_glast_zero),
        q.shape[2], initial_state, cu_seqlens,
    )
    return as_output(out, state, q.dtype, output_final_state)


def gdn_prefill_tail_chunk_glast_zero(
    q, k, v, *, causal, g, beta, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """GDN chunked prefill (C = 32) whose short last chunk updates the state with G_last = 0."""
    return _gdn_prefill(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, tail_glast_zero=True)


def gdn_prefill_tail_chunk_glast_real(
    q, k, v, *, causal, g, beta, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """The same prefill reading G_last at the last real token of the chunk."""
    return _gdn_prefill(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, tail_glast_zero=False)


# ======================================================================================================
# 6. unsloth-zoo's MLX gated-delta VJP: the per-step scatter-add d_x.at[:, t].add(upd) reads the update
#    with a wrong batch stride, corrupting every gradient of batch rows past the first (unsloth-zoo#776)
# ======================================================================================================
def _gdn_plain(q, k, v, g, beta):
    qn, kn = _gdn_qk(q, k)
    out, _ = gdn_scan(qn, kn, v.to(qn.dtype), g, beta, None)
    return out.to(q.dtype)


class _ScatterStrideVJP(torch.autograd.Function):
    """Forward right; backward forms every per-step gradient update, then scatters it with batch stride 0:
    each batch row receives row 0's update (the MLX 0.31.2 .at[].add regression, as this model takes it)."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta):
        ctx.save_for_backward(q, k, v, g, beta)
        return _gdn_plain(q, k, v, g, beta)

    @staticmethod
    def backward(ctx, do):
        with torch.enable_grad():
            leaves = [x.detach().requires_grad_() for x in ctx.saved_tensors]
            grads = torch.autograd.grad(_gdn_plain(*leaves), leaves, do, allow_unused=True)
        out = []
        for x, gx in zip(leaves, grads, strict=True):
            gx = torch.zeros_like(x) if gx is None else gx
            out.append(gx[:1].expand_as(gx).clone())  # rows b >= 1 read row 0's updates
        return tuple(out)


def gdn_mlx_vjp_scatter_wrong_batch_stride(q, k, v, *, causal, g, beta):
    """Gated delta rule whose backward gives every batch row the gradients of batch row 0."""
    return _ScatterStrideVJP.apply(q, k, v, g, beta)


def gdn_mlx_vjp_list_stack(q, k, v, *, causal, g, beta):
    """The same gated delta rule with per-step gradients collected and stacked (autograd's backward)."""
    return _gdn_plain(q, k, v, g, beta)


# ======================================================================================================
CASES = [
    Case(
        id="vllm-22034-mamba2-single-prefill-drops-initial-state",
        source="https://github.com/vllm-project/vllm/pull/22034",
        summary=(
            "vLLM's Mamba2 mixer set initial_states = None when initial_states.shape[0] == 1 ('no point to use "
            "initial states'), so a prefill batch holding one sequence (a long prompt split by chunked prefill, "
            "whose second and later chunks have a valid state) ran from a zero SSM state. Fixed by removing the "
            "condition."
        ),
        kind="state",
        variant="mamba2",
        buggy=mamba2_vllm_single_prefill_drops_initial_state,
        fixed=mamba2_vllm_single_prefill_keeps_initial_state,
        # trigger: a nonzero initial state with exactly one sequence: B = 1 without cu_seqlens, or cu_seqlens
        # holding a single sequence (two or more sequences keep their states)
    ),
    Case(
        id="sglang-29368-mamba2-short-extend-blank-state",
        source="https://github.com/sgl-project/sglang/pull/29368",
        summary=(
            "SGLang's Mamba2Metadata gated has_initial_states on mamba_track_mask (has_initial_states & "
            "track_mask), which marks extends long enough to snapshot a prefix-cache state; a prefix-cache hit "
            "prefilling a short suffix therefore ran its conv/SSM scan from a blank state (GSM8K collapsed with "
            "20-shot prompts, #29330). Fixed by dropping the track-mask gate. Re-implemented for the SSM part, with "
            "the track threshold at 64 tokens."
        ),
        kind="state",
        variant="mamba2",
        buggy=mamba2_sglang_short_extend_blank_state,
        fixed=mamba2_sglang_extend_restores_state,
        # trigger: a nonzero initial state for a sequence shorter than 64 tokens (the whole input, one packed
        # sequence, or the second part of a split run)
    ),
    Case(
        id="vllm-ascend-11508-gdn-pcp-final-state-s0-twice",
        source="https://github.com/vllm-project/vllm-ascend/pull/11508",
        summary=(
            "vLLM-Ascend's chunk_gated_delta_rule under prefill context parallelism stitched the ranks' final states "
            "as updated[i] = all_final[i] + Phi_i updated[i-1], where every rank's all_final[i] = Phi_i s0 + p_i "
            "already contains the cached state, so Phi_i s0 was counted twice in the state written back for decode "
            "(only with a nonzero s0: the second and later chunks of a chunked prefill). Fixed by "
            "all_final[i] + Phi_i (updated[i-1] - s0). Re-implemented with two ranks splitting each sequence in "
            "halves; the outputs (rank 1 reruns from updated[0]) are right."
        ),
        kind="state",
        variant="gated-deltanet",
        buggy=gdn_pcp_final_state_counts_s0_twice,
        fixed=gdn_pcp_final_state_subtracts_s0,
        flaw=(
            "state-agreement: all_final[1] + Phi_1 (updated[0] - s0) adds Phi_1 s0 and subtracts it again, so where "
            "rank 0 decays s0 strongly the final state errs u |Phi_1 s0|, far beyond its own size "
            "(stitching_cancels)"
        ),
        shows_flaw=lambda: stitching_cancels() > 1e-4,
        flaw_properties=("state-agreement", "state-split"),
        # trigger: output_final_state with a nonzero initial state and N >= 2 (the final state only)
    ),
    Case(
        id="transformers-40842-qwen3-next-gdn-l2norm-eps",
        source="https://github.com/huggingface/transformers/pull/40842",
        summary=(
            "transformers' Qwen3-Next GatedDeltaNet torch fallback normalised q and k differently from fla's kernel "
            "(use_qk_l2norm_in_kernel: x * rsqrt(sum x^2 + 1e-6)); the PR aligned it by adding fla's l2norm. "
            "Re-implemented with F.normalize (x / max(|x|, 1e-12)) as the misaligned normalisation (the PR page "
            "shows the title only: the exact old expression is inferred), in the fallback's chunked WY form."
        ),
        kind="normaliser",
        variant="gated-deltanet",
        buggy=qwen3_next_torch_gdn_f_normalize,
        fixed=qwen3_next_torch_gdn_fla_l2norm,
        # trigger: q or k rows of small norm, |x|^2 not >> 1e-6 (|x| <~ 1e-2: the two differ by the factor
        # sqrt(1 + 1e-6 / |x|^2)); zero rows give 0 in both
    ),
    Case(
        id="sparkinfer-604-gdn-prefill-tail-chunk-glast",
        source="https://github.com/gittensor-ai-lab/sparkinfer/pull/604",
        summary=(
            "sparkinfer's chunk-parallel Gated DeltaNet prefill scan read g_last = s_g[C - 1] for the chunk's final "
            "cumulative log-gate, but staged the tail of a short final chunk as 0, so for a prompt length not a "
            "multiple of C = 32 the final state handed to decode used S_out = S_in + K^T (e^{-G_p} U_p) instead of "
            "e^{G_last} S_in + K^T (e^{G_last - G_p} U_p). Fixed by reading G at the last real token."
        ),
        kind="chunk-boundary",
        variant="gated-deltanet",
        buggy=gdn_prefill_tail_chunk_glast_zero,
        fixed=gdn_prefill_tail_chunk_glast_real,
        # trigger: output_final_state with N % 32 != 0 (per packed sequence) and nonzero log-decays g in the last
        # chunk (the outputs are right)
    ),
    Case(
        id="unsloth-zoo-776-gdn-vjp-batch-stride",
        source="https://github.com/unslothai/unsloth-zoo/pull/776",
        summary=(
            "unsloth-zoo's MLX gated-delta VJP accumulated per-step gradients with d_x.at[:, t].add(upd); MLX "
            "0.31.2's scatter-add read the update with a wrong batch stride, silently corrupting d_q, d_k, d_v, "
            "d_g, d_beta of every batch row but the first (B = 1 was right). Fixed by collecting per-step gradients "
            "in lists and stacking them. Re-implemented as a backward whose rows b >= 1 receive row 0's gradients "
            "(the exact garbage of the wrong stride is not reproduced)."
        ),
        kind="backward",
        variant="gated-deltanet",
        buggy=gdn_mlx_vjp_scatter_wrong_batch_stride,
        fixed=gdn_mlx_vjp_list_stack,
        # trigger: any gradient with B >= 2 (the forward and batch row 0 are right)
    ),
]
