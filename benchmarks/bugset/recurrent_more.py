"""More real bugs of recurrent / chunked linear-attention code (Mamba2's pure-PyTorch SSD path in transformers,
fla's normalised linear attention), each re-implemented in plain torch as a ``buggy`` / ``fixed`` pair in
gramcheck's calling convention ``fn(q, k, v, *, causal, **extras)`` on (B, H, N, d) tensors.

Every pair shares one code path and differs only by the flag that switches the reported bug on. The twins
compute in at least float32 (cumulative log-decays in float64) and accept any float dtype, any B, H, N >= 1,
d >= 1. The sources of benchmarks/bugset/recurrent.py are not repeated here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.bugset.cases import Case
from benchmarks.bugset.common import acc_dtype, as_output, gdn_scan, l2norm_qk, per_sequence

SSD_CHUNK = 256  # transformers' Mamba2Config / BambaConfig default ``chunk_size``
LINEAR_CHUNK = 64  # fla's BT
MAMBA2_D = 1.0  # Mamba2's D skip (initialised to ones)


# ======================================================================================================
# 1-2. Mamba2 SSD, transformers' ``torch_forward`` (the no-kernel path), chunks of 256:
#      (1) the inter-chunk recurrence reduces over the wrong axis (transformers#34817, fixed in #35154);
#      (2) a multi-token call with a cached state starts from a zero SSM state (transformers#46741)
# ======================================================================================================
def _ssd_torch_forward(q, k, v, g, initial_state, output_final_state, *, wrong_axis: bool, drop_cache: bool):
    """Mamba2's chunked SSD as transformers' torch_forward writes it (C = q, B = k, x * dt = v, dA = g,
    scale 1, D skip): pad to chunks, intra-chunk masked product (Y_diag), per-chunk states, the inter-chunk
    recurrence over the chunk-boundary states (with the cached state as state 0), Y_off, + D x."""
    B, H, N, dk = q.shape
    dv = v.shape[-1]
    acc = acc_dtype(q)
    L = SSD_CHUNK
    C = -(-N // L)
    pad = C * L - N
    qa, ka, va = (F.pad(x.to(acc), (0, 0, 0, pad)) for x in (q, k, v))
    g64 = F.pad(g.to(torch.float64), (0, pad))  # padded tokens: dA = 0, B = C = x = 0
    qc, kc, vc = (x.reshape(B, H, C, L, x.shape[-1]) for x in (qa, ka, va))
    a_cs = torch.cumsum(g64.reshape(B, H, C, L), dim=-1)  # A_cumsum within each chunk

    # 1. intra-chunk (diagonal blocks): exp(segsum) masked before the exp
    lower = torch.ones(L, L, dtype=torch.bool).tril()
    seg = (a_cs[..., :, None] - a_cs[..., None, :]).masked_fill(~lower, -torch.inf)
    y_diag = ((qc @ kc.transpose(-1, -2)) * torch.exp(seg).to(acc)) @ vc

    # 2. per-chunk states: K^T (V * exp(A_cs[-1] - A_cs))
    decay_states = torch.exp(a_cs[..., -1:] - a_cs).to(acc)[..., None]
    states = kc.transpose(-1, -2) @ (vc * decay_states)  # (B, H, C, dk, dv)

    # 3. inter-chunk recurrence: new_states[z] = sum_c decay_chunk[z, c] states[c]
    use_cache = initial_state is not None and not (drop_cache and N > 1)
    prev = initial_state.to(acc) if use_cache else states.new_zeros(B, H, dk, dv)
    states = torch.cat([prev[:, :, None], states], dim=2)  # (B, H, C + 1, dk, dv)
    totals = F.pad(a_cs[..., -1], (1, 0))  # (B, H, C + 1)
    cum = torch.cumsum(totals, dim=-1)
    keep = torch.ones(C + 1, C + 1, dtype=torch.bool).tril()
    decay_chunk = torch.exp((cum[..., :, None] - cum[..., None, :]).masked_fill(~keep, -torch.inf)).to(acc)
    if wrong_axis:
        # (decay_chunk[..., None, None] * states_permuted[:, :, None, ...]).sum(dim=2): summed over the target
        # chunk while the states broadcast over it, so new_state[z] = state[z] * sum_p decay_chunk[p, z]
        new_states = states * decay_chunk.sum(dim=-2)[..., None, None]
    else:
        new_states = torch.einsum("bhzc,bhcpn->bhzpn", decay_chunk, states)
    entering, final = new_states[:, :, :-1], new_states[:, :, -1]

    # 4. state -> output (off-diagonal blocks), then the D skip
    y_off = (qc * torch.exp(a_cs).to(acc)[..., None]) @ entering
    y = (y_diag + y_off).reshape(B, H, C * L, dv)[:, :, :N] + MAMBA2_D * va[:, :, :N]
    return as_output(y, final, q.dtype, output_final_state)


def mamba2_torch_forward_inter_chunk_wrong_axis(q, k, v, *, causal, g, initial_state=None, output_final_state=False):
    """Mamba2 torch_forward whose inter-chunk recurrence sums over the target-chunk axis."""
    return _ssd_torch_forward(q, k, v, g, initial_state, output_final_state, wrong_axis=True, drop_cache=False)


def mamba2_torch_forward_inter_chunk_einsum(q, k, v, *, causal, g, initial_state=None, output_final_state=False):
    """Mamba2 torch_forward with the ssd_minimal contraction bhzc,bchpn->bzhpn."""
    return _ssd_torch_forward(q, k, v, g, initial_state, output_final_state, wrong_axis=False, drop_cache=False)


def mamba2_cached_multi_token_zero_state(q, k, v, *, causal, g, initial_state=None, output_final_state=False):
    """Bamba/FalconH1-style Mamba2 mixer: a multi-token call with a cached state runs the SSD from zeros."""
    return _ssd_torch_forward(q, k, v, g, initial_state, output_final_state, wrong_axis=False, drop_cache=True)


def mamba2_cached_multi_token_seeded_state(q, k, v, *, causal, g, initial_state=None, output_final_state=False):
    """The same mixer seeding the multi-token SSD with the cached recurrent state (initial_states)."""
    return _ssd_torch_forward(q, k, v, g, initial_state, output_final_state, wrong_axis=False, drop_cache=False)


# ======================================================================================================
# 3. Gated DeltaNet in a packed batch: the layer does not forward ``cu_seqlens`` to the kernel, so the
#    recurrent state runs across the packed samples (NVIDIA-NeMo/Automodel, Qwen3.5 GatedDeltaNet)
# ======================================================================================================
def _gdn_recurrent(q, k, v, g, beta, s0):
    """fla's fused_recurrent_gated_delta_rule with use_qk_l2norm_in_kernel (eps 1e-6) and scale d^-1/2, one
    batch of sequences: S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T, o_t = S_t^T q_t."""
    qa, ka = l2norm_qk(q, k)
    return gdn_scan(qa, ka, v, g, beta, s0)


def _gdn_layer(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, *, forward_cu_seqlens: bool):
    if cu_seqlens is None or not forward_cu_seqlens:
        # without cu_seqlens the kernel sees one sequence of B = 1 rows (the whole pack) and one state
        cu_seqlens = None
        initial_state = None if initial_state is None else initial_state[: q.shape[0]]
    out, state = per_sequence(
        lambda s, e, s0: _gdn_recurrent(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], g[:, :, s:e], beta[:, :, s:e], s0),
        q.shape[2], initial_state, cu_seqlens,
    )
    return as_output(out, state, q.dtype, output_final_state)


def gdn_packed_without_cu_seqlens(
    q, k, v, *, causal, g, beta, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """Gated DeltaNet layer that takes packed-sample boundaries but calls the kernel without them."""
    return _gdn_layer(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, forward_cu_seqlens=False)


def gdn_packed_with_cu_seqlens(
    q, k, v, *, causal, g, beta, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """Gated DeltaNet layer that forwards cu_seqlens: the state restarts at every packed sample."""
    return _gdn_layer(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, forward_cu_seqlens=True)


# ======================================================================================================
CASES = [
    Case(
        id="mamba2-torch-forward-inter-chunk-wrong-axis",
        source="https://github.com/huggingface/transformers/issues/34817",
        summary=(
            "transformers' Mamba2 torch_forward (the path without mamba_ssm kernels) computed the inter-chunk "
            "recurrence as (decay_chunk[..., None, None] * states_permuted[:, :, None, ...]).sum(dim=2), summing "
            "over the target-chunk axis, so chunk states were not propagated across chunk boundaries (new_state[z] "
            "= state[z] * sum_p decay_chunk[p, z]). Fixed in #35154 with the ssd_minimal contraction "
            "bhzc,bchpn->bzhpn (the same bug in Zamba2/Nemotron-H: #47246)."
        ),
        kind="chunk-boundary",
        variant="mamba2",
        buggy=mamba2_torch_forward_inter_chunk_wrong_axis,
        fixed=mamba2_torch_forward_inter_chunk_einsum,
        params={"D": MAMBA2_D},
        # trigger: N > 256 (a second SSD chunk: its outputs miss the first chunk's state), or any N with a
        # nonzero initial state (scaled by sum_p decay_chunk[p, 0] instead of decayed), or the final state
    ),
    Case(
        id="mamba2-cached-multi-token-zero-ssm-state",
        source="https://github.com/huggingface/transformers/pull/46741",
        summary=(
            "In the Mamba2 mixers of Bamba / FalconH1 / GraniteMoeHybrid (and Zamba2 / Nemotron-H), a forward "
            "with seq_len > 1 and a non-empty cache (chunked prefill, speculative verification) ran the SSD from "
            "a zero SSM state, ignoring the cached recurrent state (single-token decode was right). Fixed by "
            "passing the cached state as initial_states (the same fix as Mamba2's #46084 for issue #46032)."
        ),
        kind="state",
        variant="mamba2",
        buggy=mamba2_cached_multi_token_zero_state,
        fixed=mamba2_cached_multi_token_seeded_state,
        params={"D": MAMBA2_D},
        # trigger: a nonzero initial state with N >= 2 (N = 1 takes the single-step path, which is right)
    ),
    Case(
        id="gdn-packed-cu-seqlens-not-forwarded",
        source="https://github.com/NVIDIA-NeMo/Automodel/pull/2147",
        summary=(
            "Automodel's Qwen3.5 GatedDeltaNet called fla's chunk_gated_delta_rule without cu_seqlens (and the "
            "short conv without seq_idx), so in packed-sequence training the recurrent state ran continuously "
            "across sample boundaries (issue #2131). Fixed by deriving cu_seqlens from the packed attention mask "
            "and passing it to the kernel. Re-implemented for the delta-rule part only (no conv)."
        ),
        kind="varlen",
        variant="gated-deltanet",
        buggy=gdn_packed_without_cu_seqlens,
        fixed=gdn_packed_with_cu_seqlens,
        # trigger: cu_seqlens with >= 2 sequences (every sample after the first reads its predecessors' state)
    ),
]
