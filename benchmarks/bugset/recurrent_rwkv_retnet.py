"""More real bugs of recurrent linear-attention kernels for the RWKV-6 / RetNet / Lightning family and Mamba2
(ggml's CPU ``rwkv_wkv6`` op in llama.cpp, yet-another-retnet's parallel retention, vLLM's varlen Mamba2 SSD
chunk scan), each re-implemented in plain
torch as a ``buggy`` / ``fixed`` pair in gramcheck's calling convention ``fn(q, k, v, *, causal, **extras)`` on
(B, H, N, d) tensors.

Every pair shares one code path and differs only by the flag that switches the reported bug on. The twins
compute in at least float32 (decays and cumulative log-decays in float64, each decay factor rounded to the
accumulation dtype) and accept any float dtype, any B, H, N >= 1, d >= 1. The ggml and vLLM ops are
forward-only (inference kernels without a backward), so their cases are checked with the forward properties.
The sources of the other bug-set modules are not repeated here; the searches behind this module found no new
Lightning-Attention bug with a fix and a mechanism precise enough to re-implement.
"""

from __future__ import annotations

import torch

from benchmarks.bugset.cases import Case
from benchmarks.bugset.common import acc_dtype, as_output, gated_scan, per_sequence
from gramcheck.properties import applicable
from gramcheck.search import GRADIENT_PROPERTIES

GGML_THREADS = 4  # GGML_DEFAULT_N_THREADS (ggml.h): the CPU backend's thread count unless the caller sets one
YARN_GAMMA = 1 - 1 / 512  # yet-another-retnet's slowest head: 1 - exp(linspace(log 1/32, log 1/512, H))[-1]
SSD_CHUNK = 128  # vLLM's Mamba2 chunk_size in the failing test of vllm#21783 (768 tokens, chunk_size 128)
SSD_BLOCK_M = 64  # a BLOCK_SIZE_M of _chunk_scan_fwd_kernel's autotune configs (the bug needs BLOCK_SIZE_M < chunk)

RWKV6_FORWARD = tuple(p.name for p in applicable("rwkv6", True) if p.name not in GRADIENT_PROPERTIES)
MAMBA2_FORWARD = tuple(p.name for p in applicable("mamba2", True) if p.name not in GRADIENT_PROPERTIES)


# ======================================================================================================
# 1. RWKV-6, ggml's CPU rwkv_wkv6 op (llama.cpp): threads past the head count return before the head split,
#    so with more threads than heads some heads are never computed (llama.cpp#21226, ggml#1450)
# ======================================================================================================
def ggml_heads_computed(n_heads: int, n_threads: int, *, early_return: bool) -> list[int]:
    """The heads some thread computes: thread ith takes [H ith / nth, min(H (ith + 1) / nth, H)), integer
    division; with ``early_return`` the threads ith >= H leave first (`if (ith >= HEADS) return;`), which loses
    the heads of the ranges they held when nth > H (H = 1, nth = 4: none; H = 2, nth = 4: head 0 only)."""
    heads: set[int] = set()
    for ith in range(n_threads):
        if early_return and ith >= n_heads:
            continue
        heads.update(range(n_heads * ith // n_threads, min(n_heads * (ith + 1) // n_threads, n_heads)))
    return sorted(heads)


def _wkv6_cpu(q, k, v, g, u, initial_state, output_final_state, *, early_return: bool):
    """ggml_compute_forward_rwkv_wkv6_f32: dst zeroed by thread 0, then per head and token
    y_t = r_t (u . k_t v_t^T + S_{t-1}), S_t = diag(w_t) S_{t-1} + k_t v_t^T (no scale: r = q, w = exp(g)),
    the n_seqs sequences of the op as the batch rows, each from its own state. The heads no thread owns keep
    the zeroed output; their final state is left as allocated (modelled as zeros: ggml's buffer is not
    initialised)."""
    B, H, N, dk = q.shape
    acc = acc_dtype(q)
    r, ka, va = q.to(acc), k.to(acc), v.to(acc)
    alpha = torch.exp(g.to(torch.float64)).to(acc)
    bonus = u.to(acc)[None, :, :, None]
    state = q.new_zeros(B, H, dk, v.shape[-1], dtype=acc) if initial_state is None else initial_state.to(acc)
    outs = []
    for t in range(N):
        kv = ka[:, :, t, :, None] * va[:, :, t, None, :]
        outs.append((r[:, :, t, None, :] @ (state + bonus * kv))[:, :, 0, :])
        state = alpha[:, :, t, :, None] * state + kv
    owned = torch.zeros(H, dtype=acc, device=q.device)
    owned[ggml_heads_computed(H, GGML_THREADS, early_return=early_return)] = 1.0
    out = torch.stack(outs, dim=2) * owned[None, :, None, None]
    return as_output(out, state * owned[None, :, None, None], q.dtype, output_final_state)


def rwkv6_ggml_cpu_threads_past_heads_return(
    q, k, v, *, causal, g, u, initial_state=None, output_final_state=False
):
    """ggml's CPU wkv6 on 4 threads whose threads ith >= H return before the head split."""
    return _wkv6_cpu(q, k, v, g, u, initial_state, output_final_state, early_return=True)


def rwkv6_ggml_cpu_every_thread_takes_its_range(
    q, k, v, *, causal, g, u, initial_state=None, output_final_state=False
):
    """ggml's CPU wkv6 on 4 threads, every thread taking its (possibly empty) head range."""
    return _wkv6_cpu(q, k, v, g, u, initial_state, output_final_state, early_return=False)


# ======================================================================================================
# 2. RetNet, yet-another-retnet's parallel retention: the decay mask is built in the input dtype as
#    gamma ** distance with +inf distances above the diagonal; a gamma that rounds to 1 gives 1 ** inf = 1
#    (fkodom/yet-another-retnet#24, fixed in #25)
# ======================================================================================================
def _retention_parallel(q, k, v, *, mask_in_input_dtype: bool):
    """O = ((s Q K^T) * D) V, D_nm = gamma_h^(n - m) for n >= m, else 0, s = d^-1/2, products in the
    accumulation dtype. As reported, D is built in q's dtype (positions, gammas and powers) with the
    upper-triangular distances set to +inf, relying on gamma^inf = 0: in bfloat16 gamma = 1 - 1/512 rounds to
    1.0, so the head has no decay and its upper triangle is 1 ** inf = 1 (future keys leak), and positions past
    256 round too. Fixed: D built in float64 and its upper triangle zeroed after the power."""
    B, H, N, d = q.shape
    acc = acc_dtype(q)
    mdt = q.dtype if mask_in_input_dtype else torch.float64
    gammas = torch.full((H,), YARN_GAMMA, dtype=torch.float64).to(mdt)[:, None, None]
    pos = torch.arange(N, dtype=mdt)
    distance = (pos[:, None] - pos[None, :]).abs()
    future = torch.ones(N, N, dtype=torch.bool).triu(diagonal=1)
    if mask_in_input_dtype:
        decay = gammas ** distance.masked_fill(future, float("inf"))
    else:
        decay = (gammas**distance).masked_fill(future, 0.0)
    scores = (q.to(acc) * d**-0.5) @ k.to(acc).transpose(-1, -2)
    return ((scores * decay.to(acc)) @ v.to(acc)).to(q.dtype)


def retnet_parallel_decay_mask_inf_distance_in_input_dtype(q, k, v, *, causal):
    """yet-another-retnet's retention_parallel with the decay mask built in the input dtype via inf distances."""
    return _retention_parallel(q, k, v, mask_in_input_dtype=True)


def retnet_parallel_decay_mask_zeroed_after_power(q, k, v, *, causal):
    """The same retention with the decay mask built in float64 and masked after the power."""
    return _retention_parallel(q, k, v, mask_in_input_dtype=False)


# ======================================================================================================
# 3. Mamba2 SSD, packed sequences with initial states: the chunk-scan kernel reads the initial state's decay
#    boundary dA_cs_m_boundary with the M-block offset added, so later M-blocks decay it too little (vLLM)
# ======================================================================================================
def _mamba2_chunk_scan(q, k, v, g, initial_state, output_final_state, cu_seqlens, *, block_offset: bool):
    """Packed Mamba2 SSD (scale 1, D = 0), each sequence from its own initial state (gated_scan). In vLLM's
    _chunk_scan_fwd_kernel a sequence that starts mid-chunk (offset c_off in its first chunk) reads S_0
    through C_m exp(dA_cs[m] - dA_cs_m_boundary) S_0 for the tokens m of that chunk, with dA_cs the chunk's
    inclusive cumulative log-decay and the boundary dA_cs[c_off - 1] (0 when c_off = 0). The bug loads the
    boundary at c_off - 1 + pid_m * BLOCK_SIZE_M (pid_m: token m's M-block in the chunk; a load past the
    chunk is masked to 0), a later position for every M-block but the first: less decay, S_0 weighs too much.
    Outputs only: the final state comes from the state-passing kernel, which this fix does not touch."""
    g64 = g.to(torch.float64)

    def one(s, e, s0):
        out, state = gated_scan(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], g[:, :, s:e], s0)
        c_off = s % SSD_CHUNK
        if block_offset and s0 is not None and c_off:
            c0 = s - c_off  # first token of the chunk the sequence starts in
            end = min(e, c0 + SSD_CHUNK)  # the sequence's tokens in that chunk
            a_cs = torch.cumsum(g64[:, :, c0 : c0 + SSD_CHUNK], dim=-1)  # (1, H, <= L), from the chunk's start
            right = a_cs[..., c_off - 1]  # dA_cs_m_boundary as fixed
            pos = torch.arange(c_off, end - c0)  # chunk offsets of the tokens [s, end)
            read = c_off - 1 + (pos // SSD_BLOCK_M) * SSD_BLOCK_M  # as loaded by the bug
            wrong = torch.where(read < a_cs.shape[-1], a_cs[..., read.clamp(max=a_cs.shape[-1] - 1)], 0.0)
            acc = out.dtype
            b = torch.cumsum(g64[:, :, s:end], dim=-1)  # decay of S_0 from the sequence's start through token m
            readout = (q[:, :, s:end].to(acc) * torch.exp(b).to(acc)[..., None]) @ s0.to(acc)
            factor = (torch.exp(right[..., None] - wrong) - 1).to(acc)[..., None]  # (1, H, end - s, 1)
            out = torch.cat([out[:, :, : end - s] + factor * readout, out[:, :, end - s :]], dim=2)
        return out, state

    out, state = per_sequence(one, q.shape[2], initial_state, cu_seqlens)
    return as_output(out, state, q.dtype, output_final_state)


def mamba2_chunk_scan_boundary_read_with_block_offset(
    q, k, v, *, causal, g, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """Packed Mamba2 whose mid-chunk initial-state decay boundary is read at c_off - 1 + pid_m BLOCK_SIZE_M."""
    return _mamba2_chunk_scan(q, k, v, g, initial_state, output_final_state, cu_seqlens, block_offset=True)


def mamba2_chunk_scan_boundary_read_at_sequence_start(
    q, k, v, *, causal, g, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """Packed Mamba2 whose mid-chunk initial-state decay boundary is the token before the sequence."""
    return _mamba2_chunk_scan(q, k, v, g, initial_state, output_final_state, cu_seqlens, block_offset=False)


# ======================================================================================================
CASES = [
    Case(
        id="rwkv6-ggml-cpu-wkv6-threads-past-heads",
        source="https://github.com/ggml-org/llama.cpp/pull/21226",
        summary=(
            "ggml's CPU rwkv_wkv6 op (llama.cpp's RWKV-6) split the heads over threads as [H ith / nth, "
            "H (ith + 1) / nth) but returned first for every thread ith >= H, so with more threads than heads the "
            "heads of those threads' ranges were never computed (H = 1 on 2 threads: none), leaving the zeroed "
            "output (and skipping the op's barrier). The fix (ggml#1450) drops the early return, so every thread "
            "takes its possibly empty range. Re-implemented on 4 threads (GGML_DEFAULT_N_THREADS), no scale, the "
            "lost heads' final state modelled as zeros; the op has no backward."
        ),
        kind="forward",
        variant="rwkv6",
        buggy=rwkv6_ggml_cpu_threads_past_heads_return,
        fixed=rwkv6_ggml_cpu_every_thread_takes_its_range,
        params={"scale": 1.0},
        properties=RWKV6_FORWARD,
        # trigger: H < 4 threads (H = 1: the whole output is zero; H = 2: head 1 is zero)
    ),
    Case(
        id="retnet-parallel-decay-mask-bf16-one-pow-inf",
        source="https://github.com/fkodom/yet-another-retnet/issues/24",
        summary=(
            "yet-another-retnet's _build_decay_mask formed gamma ** distance with the upper-triangular distances "
            "set to +inf (gamma^inf = 0 for |gamma| < 1), in the input dtype; a gamma equal to 1 gives 1 ** inf = 1 "
            "and leaks future tokens (the issue; its suggestion: masked_fill the upper triangle with 0 after the "
            "power). In bfloat16 the slowest head's gamma 1 - 1/512 rounds to 1.0. Fixed in PR #25 ('decay mask "
            "for bf16'); the thread does not show the diff, the fix here builds the mask in float64 and zeroes "
            "the upper triangle after the power. Checked with gamma = 1 - 1/512 on every head."
        ),
        kind="precision",
        variant="retnet",
        buggy=retnet_parallel_decay_mask_inf_distance_in_input_dtype,
        fixed=retnet_parallel_decay_mask_zeroed_after_power,
        dtype="bfloat16",
        params={"gamma": YARN_GAMMA},
        # trigger: bfloat16 and N >= 2 (gamma rounds to 1: no decay, and every future key enters every output)
    ),
    Case(
        id="mamba2-varlen-chunk-scan-boundary-block-offset",
        source="https://github.com/vllm-project/vllm/pull/21783",
        summary=(
            "vLLM's varlen Mamba2 SSD chunk scan, for a sequence starting mid-chunk with an initial state, read "
            "dA_cs_m_boundary with an unnecessary M-block offset, so when BLOCK_SIZE_M < chunk_size the tokens "
            "past the chunk's first M-block took a later (more decayed) boundary: too little decay, and the "
            "initial state weighed too much on their outputs (tests needed 50% rtol; 768 tokens with chunk_size "
            "128 failed). Fixed by reading the boundary at the token before the sequence. Re-implemented with "
            "chunks of 128 and BLOCK_SIZE_M = 64; the state-passing part (vllm#23279) is right here."
        ),
        kind="varlen",
        variant="mamba2",
        buggy=mamba2_chunk_scan_boundary_read_with_block_offset,
        fixed=mamba2_chunk_scan_boundary_read_at_sequence_start,
        properties=MAMBA2_FORWARD,
        # trigger: cu_seqlens with a sequence starting off a multiple of 128 with a nonzero initial state and
        # tokens at chunk offsets >= 64 of its first chunk (e.g. a cut at 63 or 65 of N >= 66)
    ),
]
