"""More real bugs of the state passing around delta-rule kernels (SGLang's NPU kernels, vLLM's TPU backend,
TensorRT-Model-Connect, Ollama's MLX runner) and of a chunkwise DeltaNet backward (TileOPs), each
re-implemented in plain torch as a ``buggy`` / ``fixed`` pair in gramcheck's calling convention
``fn(q, k, v, *, causal, **extras)`` on (B, H, N, d) tensors.

They live where the recurrent state leaves or enters a kernel: the memory layout of the state pool a decode
kernel indexes, whether a freshly allocated pool slot is read as a state, the dtype the state is stored in
between tokens or between calls, and the gradient that flows back through the state from one chunk to the
previous one (and to the initial state). Every pair shares one code path and differs only by the flag that
switches the reported bug on. The twins compute in at least float32 (log-decays exponentiated in float64) and
accept any float dtype, any B, H, N >= 1, d_k, d_v >= 1. The sources of the other modules of the bug set are
not repeated here.
"""

from __future__ import annotations

import torch

from benchmarks.bugset.cases import Case
from benchmarks.bugset.common import as_output, gdn_scan, l2norm_qk, per_sequence

WY_CHUNK = 64  # the chunk of TileOPs' DeltaNet chunkwise kernels (fla's BT)


# ======================================================================================================
# 1. SGLang's NPU fused_sigmoid_gating_delta_rule_update: the state pool is V-major [slot, HV, V, K], the
#    kernel loads and stores it K-major, so it reads and writes S^T (sgl-kernel-npu#640, fix #761)
# ======================================================================================================
def _pool_to_k_major(s0: torch.Tensor) -> torch.Tensor:
    """The logical state S (.., d_k, d_v) as the kernel reads it: the pool holds S V-major (the bytes of
    S^T, (.., d_v, d_k) contiguous) and the kernel offsets them as k * V + v, i.e. as a (d_k, d_v) array
    (S^T exactly when d_k = d_v, the models the issue names)."""
    *lead, dk, dv = s0.shape
    return s0.transpose(-1, -2).contiguous().reshape(*lead, dk, dv)


def _k_major_to_pool(state: torch.Tensor) -> torch.Tensor:
    """The logical state the caller reads back after the kernel stored ``state`` K-major (offset k * V + v)
    into a pool read V-major: the same bytes as a (d_v, d_k) array, transposed."""
    *lead, dk, dv = state.shape
    return state.contiguous().reshape(*lead, dv, dk).transpose(-1, -2)


def _gdn_npu_pool(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, *, k_major: bool):
    qn, kn = l2norm_qk(q, k)

    def run(s, e, s0):
        if s0 is not None and k_major:
            s0 = _pool_to_k_major(s0)
        out, state = gdn_scan(qn[:, :, s:e], kn[:, :, s:e], v[:, :, s:e], g[:, :, s:e], beta[:, :, s:e], s0)
        return out, (_k_major_to_pool(state) if k_major else state)

    out, state = per_sequence(run, q.shape[2], initial_state, cu_seqlens)
    return as_output(out, state, q.dtype, output_final_state)


def gdn_npu_update_state_pool_k_major(
    q, k, v, *, causal, g, beta, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """Fused gated-delta update whose load and store offsets index the V-major pool as o_k * V + o_v."""
    return _gdn_npu_pool(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, k_major=True)


def gdn_npu_update_state_pool_v_major(
    q, k, v, *, causal, g, beta, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """The same update indexing the pool as o_v * K + o_k, its real layout."""
    return _gdn_npu_pool(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, k_major=False)


# ======================================================================================================
# 2. vLLM TPU fused GDN Pallas kernel: has_initial_state ignored, so a new prefill on a reused (freed) mamba
#    slot starts from the previous tenant's state instead of zeros (vllm-project/tpu-inference#2431)
# ======================================================================================================
# The state pool: slot i (batch row i, or packed sequence i) keeps the final state its last request wrote,
# across calls, as the serving pool does across requests (keyed by slot and state shape).
_SLOT_POOL: dict[tuple[int, ...], torch.Tensor] = {}


def _gdn_slots(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, *, honor_has_initial_state: bool):
    qn, kn = l2norm_qk(q, k)
    B, H, N, dk = q.shape
    dv = v.shape[-1]
    if cu_seqlens is None:
        bounds, rows = [(0, N)], list(range(B))
    else:
        cu = [int(c) for c in torch.as_tensor(cu_seqlens).tolist()]
        bounds, rows = list(zip(cu[:-1], cu[1:], strict=True)), [0]
    outs, finals = [], []
    for j, (s, e) in enumerate(bounds):
        for b in rows:
            slot = b if cu_seqlens is None else j
            key = (slot, H, dk, dv)
            if initial_state is not None:  # has_initial_state: the request's cached state sits in its slot
                s0 = initial_state[slot : slot + 1]
            elif honor_has_initial_state:  # a new sequence: the kernel zeroes the slot's buffer
                s0 = None
            else:  # the DMA-loaded slot, stale from the slot's previous tenant (zeros if never used)
                stale = _SLOT_POOL.get(key)
                s0 = None if stale is None else stale
            out, state = gdn_scan(qn[b : b + 1, :, s:e], kn[b : b + 1, :, s:e], v[b : b + 1, :, s:e],
                                  g[b : b + 1, :, s:e], beta[b : b + 1, :, s:e], s0)
            _SLOT_POOL[key] = state.detach().clone()  # the final state is written back to the slot
            outs.append(out)
            finals.append(state)
    if cu_seqlens is None:
        out, state = torch.cat(outs, dim=0), torch.cat(finals, dim=0)
    else:
        out, state = torch.cat(outs, dim=2), torch.cat(finals, dim=0)
    return as_output(out, state, q.dtype, output_final_state)


def gdn_tpu_fused_ignores_has_initial_state(
    q, k, v, *, causal, g, beta, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """Fused GDN prefill that always runs from the slot's contents: a new sequence inherits a stale state."""
    return _gdn_slots(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, honor_has_initial_state=False)


def gdn_tpu_fused_honors_has_initial_state(
    q, k, v, *, causal, g, beta, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """The same prefill zeroing the slot's buffer for a sequence without an initial state."""
    return _gdn_slots(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, honor_has_initial_state=True)


# ======================================================================================================
# 3. TensorRT-Model-Connect's Qwen3.5 DeltaNet: the persistent SSM state and every step of the recurrent
#    update cast to the model storage dtype (float16), quantising the state again on every token (TRTMC#725)
# ======================================================================================================
def _gdn_stored_state(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, *, store_in_input_dtype):
    """The gated delta rule token by token (l2-normalised q, k, scale d^-1/2), the state held in ``store``:
    the inputs' dtype (the bug: every decay and every update of S rounded to float16) or the accumulation
    dtype (the fix: float32, or float64 for float64 inputs)."""
    qn, kn = l2norm_qk(q, k)
    acc = qn.dtype
    store = q.dtype if store_in_input_dtype else acc

    def keep(x):
        return x.to(store).to(acc)

    def run(s, e, s0):
        qs, ks, vs = qn[:, :, s:e], kn[:, :, s:e], v[:, :, s:e].to(acc)
        bs = beta[:, :, s:e].to(acc)
        alpha = torch.exp(g[:, :, s:e].to(torch.float64)).to(acc)
        state = qs.new_zeros(qs.shape[0], qs.shape[1], qs.shape[-1], v.shape[-1]) if s0 is None else keep(s0.to(acc))
        outs = []
        for t in range(e - s):
            state = keep(alpha[:, :, t, None, None] * state)
            kt = ks[:, :, t]
            delta = bs[:, :, t, None] * (vs[:, :, t] - (kt[:, :, None, :] @ state)[:, :, 0, :])
            state = keep(state + kt[:, :, :, None] * delta[:, :, None, :])
            outs.append((qs[:, :, t, None, :] @ state)[:, :, 0, :])
        out = torch.stack(outs, dim=2) if outs else qs.new_zeros(*qs.shape[:3], v.shape[-1])
        return out, state.to(store)

    out, state = per_sequence(run, q.shape[2], initial_state, cu_seqlens)
    return as_output(out, state, q.dtype, output_final_state)


def gdn_trtmc_state_in_storage_dtype(
    q, k, v, *, causal, g, beta, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """Qwen3.5 DeltaNet runtime that rounds the recurrent state to the model's float16 on every step."""
    return _gdn_stored_state(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens,
                             store_in_input_dtype=True)


def gdn_trtmc_state_in_float32(
    q, k, v, *, causal, g, beta, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """The same runtime keeping the state and the recurrent update in float32."""
    return _gdn_stored_state(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens,
                             store_in_input_dtype=False)


# ======================================================================================================
# 4. Ollama's MLX runner gated_delta_step kernel: the state is carried in float inside one call but written
#    back as InT (bfloat16), and the recurrent cache holding it is allocated in bfloat16 (ollama#15865)
# ======================================================================================================
def _gdn_state_io(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, *, state_io_input_dtype):
    """One kernel call: the state read from the cache, the recurrence in the accumulation dtype, the final
    state written back in ``io``: the inputs' dtype (the bug: InT, bfloat16) or the accumulation dtype (the
    fix: StT, float32)."""
    qn, kn = l2norm_qk(q, k)
    io = q.dtype if state_io_input_dtype else qn.dtype

    def run(s, e, s0):
        s0 = None if s0 is None else s0.to(io).to(qn.dtype)  # the cache holds the state in ``io``
        out, state = gdn_scan(qn[:, :, s:e], kn[:, :, s:e], v[:, :, s:e], g[:, :, s:e], beta[:, :, s:e], s0)
        return out, state.to(io)  # o_state[s_idx] = static_cast<InT | StT>(state[i])

    out, state = per_sequence(run, q.shape[2], initial_state, cu_seqlens)
    return as_output(out, state, q.dtype, output_final_state)


def gdn_mlxrunner_state_written_as_input_dtype(
    q, k, v, *, causal, g, beta, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """gated_delta_step writing the recurrent state in the inputs' dtype (bfloat16) at the end of each call."""
    return _gdn_state_io(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, state_io_input_dtype=True)


def gdn_mlxrunner_state_written_as_float32(
    q, k, v, *, causal, g, beta, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """The same kernel with a separate state dtype StT = float32 for the cache and the write."""
    return _gdn_state_io(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, state_io_input_dtype=False)


# ======================================================================================================
# 5. TileOPs' ungated DeltaNet chunkwise backward: the state gradient is carried to the previous chunk as
#    dh = dh_local + dh_future instead of dh_local + (I - W^T K) dh_future (TileOPs#632, fixed in #633)
# ======================================================================================================
def _delta_chunkwise(q, k, v, beta, initial_state, output_final_state, cu_seqlens, *, identity_carry: bool):
    """The chunkwise WY delta rule (chunks of 64, l2-normalised q, k, scale d^-1/2):
    (I + tril_-1(diag(beta) K K^T)) [U, W] = diag(beta) [V, K], Delta = U - W S,
    O = Q S + tril(Q K^T) Delta, S <- S + K^T Delta. ``identity_carry``: the backward takes the chunk's
    transition dS_next/dS as the identity: S <- S + K^T (U - W stopgrad(S)) (forward unchanged; the output's
    own dependence on S, through Q S and Delta, keeps its gradient)."""
    qa, ka = l2norm_qk(q, k)
    acc = qa.dtype
    va, ba = v.to(acc), beta.to(acc)

    def run(s, e, s0):
        Bq, H = qa.shape[:2]
        state = qa.new_zeros(Bq, H, qa.shape[-1], va.shape[-1]) if s0 is None else s0.to(acc)
        outs = []
        for c0 in range(s, e, WY_CHUNK):
            c1 = min(c0 + WY_CHUNK, e)
            qc, kc, vc, bc = qa[:, :, c0:c1], ka[:, :, c0:c1], va[:, :, c0:c1], ba[:, :, c0:c1]
            eye = torch.eye(c1 - c0, dtype=acc)
            system = eye + torch.tril(bc[..., None] * (kc @ kc.transpose(-1, -2)), diagonal=-1)
            w = torch.linalg.solve_triangular(system, bc[..., None] * kc, upper=False, unitriangular=True)
            u = torch.linalg.solve_triangular(system, bc[..., None] * vc, upper=False, unitriangular=True)
            delta = u - w @ state
            outs.append(qc @ state + torch.tril(qc @ kc.transpose(-1, -2)) @ delta)
            carried = u - w @ state.detach() if identity_carry else delta
            state = state + kc.transpose(-1, -2) @ carried
        return torch.cat(outs, dim=2), state

    out, state = per_sequence(run, q.shape[2], initial_state, cu_seqlens)
    return as_output(out, state, q.dtype, output_final_state)


def deltanet_tileops_bwd_identity_state_carry(
    q, k, v, *, causal, beta, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """DeltaNet chunkwise op whose backward carries dh across chunks (and to dh0) through the identity."""
    return _delta_chunkwise(q, k, v, beta, initial_state, output_final_state, cu_seqlens, identity_carry=True)


def deltanet_tileops_bwd_full_state_carry(
    q, k, v, *, causal, beta, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """The same op with the transition's own gradient, dh = dh_local + (I - W^T K) dh_future."""
    return _delta_chunkwise(q, k, v, beta, initial_state, output_final_state, cu_seqlens, identity_carry=False)


# ======================================================================================================
CASES = [
    Case(
        id="sgl-kernel-npu-640-gdn-state-pool-k-major",
        source="https://github.com/sgl-project/sgl-kernel-npu/issues/640",
        summary=(
            "sgl-kernel-npu's fused_sigmoid_gating_delta_rule_update_npu (the gated-delta decode/update kernel) "
            "loaded and stored the SSM state pool with K-major offsets (o_k * V + o_v) while SGLang's pool is "
            "V-major [slot, HV, V, K]; with K == V (Kimi-Linear, 128) nothing crashed and the kernel silently read "
            "and wrote S^T: a zero initial state gave right outputs and a transposed final state, a cached one "
            "wrong outputs too. Fixed in PR #761 (open at the time) by v * K + k in both pointers."
        ),
        kind="state",
        variant="gated-deltanet",
        buggy=gdn_npu_update_state_pool_k_major,
        fixed=gdn_npu_update_state_pool_v_major,
        # trigger: output_final_state (any S_N that is not symmetric), or a nonzero initial state (outputs too);
        # d_k != d_v reinterprets the bytes instead of transposing
    ),
    Case(
        id="tpu-inference-2431-fused-gdn-stale-slot-state",
        source="https://github.com/vllm-project/tpu-inference/pull/2431",
        summary=(
            "vLLM's TPU backend threaded has_initial_state through the chunked and reference GDN paths but not "
            "through the fused Pallas kernel, which always DMA-loaded the request's mamba slot; with slots reused "
            "after a request finishes, a brand-new prefill silently started from the previous tenant's recurrent "
            "state. Fixed by zeroing the loaded buffer when the sequence is new and has no initial state. "
            "Re-implemented with a slot pool that outlives the call (slot = batch row or packed sequence), "
            "written back with each final state as the serving pool is."
        ),
        kind="state",
        variant="gated-deltanet",
        buggy=gdn_tpu_fused_ignores_has_initial_state,
        fixed=gdn_tpu_fused_honors_has_initial_state,
        # trigger: a call without initial_state after any earlier call of the same state shape left a nonzero
        # state in the slot (the first call of a process is right)
    ),
    Case(
        id="trtmc-725-gdn-state-quantised-every-step",
        source="https://github.com/NVIDIA/TensorRT-Model-Connect/pull/725",
        summary=(
            "TensorRT-Model-Connect's Qwen3.5 DeltaNet path cast its persistent SSM state and every step of the "
            "recurrent update to the model storage dtype, so a float16 bundle re-quantised the state on every "
            "token; Qwen3.5-9B MMLU fell from 0.45 (HF) to 0.15 on long five-shot prompts. Fixed by keeping the "
            "input state, the decays, q/k/v and the recurrent update in float32 and casting only the output back. "
            "Re-implemented as the state rounded to float16 after the decay and after the update of each token."
        ),
        kind="precision",
        variant="gated-deltanet",
        buggy=gdn_trtmc_state_in_storage_dtype,
        fixed=gdn_trtmc_state_in_float32,
        dtype="float16",
        # trigger: float16 inputs, any N >= 1; the error grows with N where the decays are near 1
    ),
    Case(
        id="ollama-15865-gdn-state-written-as-bf16",
        source="https://github.com/ollama/ollama/issues/15865",
        summary=(
            "Ollama's MLX runner gated_delta_step Metal/CUDA kernel carried the state in float inside a call but "
            "wrote it back with static_cast<InT> (bfloat16), into a recurrent cache allocated in the activation "
            "dtype, so the state lost 16 mantissa bits at every decode step and Qwen3.5/3.6 degenerated into "
            "repetition after a few tokens. Fixed (PR #15870) with a separate StT = float32 template argument for "
            "the state and a float32 cache."
        ),
        kind="precision",
        variant="gated-deltanet",
        buggy=gdn_mlxrunner_state_written_as_input_dtype,
        fixed=gdn_mlxrunner_state_written_as_float32,
        dtype="bfloat16",
        # trigger: bfloat16 inputs with output_final_state or a float32 initial state (rounded on read); the
        # outputs of one call are right, the damage compounds over calls (decode: one call per token)
    ),
    Case(
        id="tileops-632-deltanet-bwd-identity-state-carry",
        source="https://github.com/tile-ai/TileOPs/pull/633",
        summary=(
            "TileOPs' ungated DeltaNet chunkwise backward, ported from its gated DeltaNet by removing the gate, "
            "propagated the state gradient to the previous chunk as dh = dh_local + dh_future although the "
            "chunk's update h' = h + K^T (U - W h) has dh'/dh = I - K^T W (issue #632 lists it with two other "
            "missing paths, dw's cross-chunk correction and the A_inv backward; #633 fixed all three). "
            "Re-implemented for the first path only: the state carried to the next chunk stops the gradient "
            "through -W S; forward unchanged."
        ),
        kind="backward",
        variant="deltanet",
        buggy=deltanet_tileops_bwd_identity_state_carry,
        fixed=deltanet_tileops_bwd_full_state_carry,
        # trigger: a gradient with N > 64 (dq, dk, dv, dbeta of every chunk but the last), or d initial_state
        # from a loss on the outputs or the final state (any N)
    ),
]

