"""Real bugs of chunked / fused linear-attention kernels (flash-linear-attention's RWKV-6 and simple-GLA
kernels, OpenNLPLab's Lightning Attention-2, FlashInfer's Gated DeltaNet prefill), each re-implemented in
plain torch as a ``buggy`` / ``fixed`` pair in gramcheck's calling convention ``fn(q, k, v, *, causal,
**extras)`` on (B, H, N, d) tensors.

Every pair shares one code path and differs only by the flag that switches the reported bug on. The twins
compute in at least float32 (log-decays and their cumulative sums in float64; each decay factor is rounded
to the accumulation dtype as a kernel's exp would produce it) and accept any float dtype, any B, H, N >= 1,
d >= 1. The sources of the other bug-set modules are not repeated here.
"""

from __future__ import annotations

import math

import torch

from benchmarks.bugset.cases import Case
from benchmarks.bugset.common import acc_dtype, as_output, gated_scan, gdn_scan, l2norm_qk
from gramcheck.properties import applicable
from gramcheck.search import GRADIENT_PROPERTIES
from gramcheck.variants.lightning import log_decays

RWKV6_BT, RWKV6_BC = 64, 16  # fla chunk_rwkv6: chunks of 64 tokens, intra-chunk sub-chunks of 16
LIGHTNING_BLOCK = 256  # lightning_attn2_parallel's BLOCK


# ======================================================================================================
# 1. RWKV-6, fla's chunk kernel: the inter-sub-chunk scores are factored around the *inclusive* cumulative
#    decay at the sub-chunk's first token, so its first row gets exp(-g) > 1 (fla#77, fixed in 0c1c0b6)
# ======================================================================================================
def _rwkv6_chunk(q, k, v, g, u, *, inclusive_reference: bool):
    """chunk_rwkv6 (scale d^-1/2): chunks of 64 carry the state S; inside a chunk the score of query t and
    key s < t is sum_c r_tc k_sc exp(be_tc - b_sc) (be exclusive, b inclusive cumulative log-decays from the
    chunk's start). Pairs in the same sub-chunk of 16 are formed directly (masked before the exp); pairs in
    sub-chunks i > j are factored as (r_t exp(be_t - b_n)) . (k_s exp(b_n - b_s)) around a reference b_n,
    which is b at the token before sub-chunk i (fixed: both exponents <= 0) or, with the bug, b at the
    sub-chunk's first token (its first row then has be_t - b_n = -g_t > 0). The bonus u enters the diagonal."""
    B, H, N, dk = q.shape
    acc = acc_dtype(q)
    r, ka, va, ua = q.to(acc) * dk**-0.5, k.to(acc), v.to(acc), u.to(acc)
    g64 = g.to(torch.float64)
    state = q.new_zeros(B, H, dk, v.shape[-1], dtype=acc)
    outs = []
    for c0 in range(0, N, RWKV6_BT):
        L = min(RWKV6_BT, N - c0)
        rc, kc, vc = r[:, :, c0 : c0 + L], ka[:, :, c0 : c0 + L], va[:, :, c0 : c0 + L]
        b = torch.cumsum(g64[:, :, c0 : c0 + L], dim=2)  # inclusive, (B, H, L, dk)
        be = b - g64[:, :, c0 : c0 + L]  # exclusive
        out = (rc * torch.exp(be).to(acc)) @ state  # the state enters with the decays before t
        scores = rc.new_zeros(B, H, L, L)
        for i0 in range(0, L, RWKV6_BC):
            i1 = min(i0 + RWKV6_BC, L)
            # the diagonal sub-chunk: exp(be_t - b_s) for s < t, masked before the exp
            diff = be[:, :, i0:i1, None, :] - b[:, :, None, i0:i1, :]  # (B, H, Li, Li, dk)
            strict = torch.ones(i1 - i0, i1 - i0, dtype=torch.bool).tril(-1)[..., None]
            decay = torch.exp(diff.masked_fill(~strict, -torch.inf)).to(acc)
            scores[:, :, i0:i1, i0:i1] = (rc[:, :, i0:i1, None, :] * kc[:, :, None, i0:i1, :] * decay).sum(-1)
            if i0 == 0:
                continue
            ref = b[:, :, i0 if inclusive_reference else i0 - 1, None, :]  # b_n, (B, H, 1, dk)
            qg = rc[:, :, i0:i1] * torch.exp(be[:, :, i0:i1] - ref).to(acc)
            kg = kc[:, :, :i0] * torch.exp(ref - b[:, :, :i0]).to(acc)
            scores[:, :, i0:i1, :i0] = qg @ kg.transpose(-1, -2)
        bonus = (rc * ua[None, :, None, :] * kc).sum(-1)  # (r_t * u) . k_t
        scores = scores + torch.diag_embed(bonus)
        outs.append(out + scores @ vc)
        to_end = torch.exp(b[:, :, -1:] - b).to(acc)  # decay of key s to the chunk's end
        state = torch.exp(b[:, :, -1]).to(acc)[..., None] * state + (kc * to_end).transpose(-1, -2) @ vc
    return torch.cat(outs, dim=2).to(q.dtype)


def rwkv6_chunk_subchunk_reference_inclusive(q, k, v, *, causal, g, u):
    """chunk_rwkv6 before the fix: inter-sub-chunk factors referenced to the sub-chunk's first token."""
    return _rwkv6_chunk(q, k, v, g, u, inclusive_reference=True)


def rwkv6_chunk_subchunk_reference_exclusive(q, k, v, *, causal, g, u):
    """chunk_rwkv6 after the fix: factors referenced to the token before the sub-chunk (both decays <= 1)."""
    return _rwkv6_chunk(q, k, v, g, u, inclusive_reference=False)


# ======================================================================================================
# 2. Simple GLA (scalar decay), fla's fused_recurrent backward: dg ignores the final-state gradient dht
#    (fla PR #459: b_dg must start from sum(h_T * dht))
# ======================================================================================================
def _simple_gla_recurrent(q, k, v, g, initial_state, output_final_state, *, dg_drops_dht: bool):
    """S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t (scale 1, g (B, H, N)): Mamba2 with D = 0.
    With the bug, the gradient of a loss on the final state S_N reaches g only through the keys' decays:
    dg_t misses sum(S_N * dS_N), the term of b_N = sum_t g_t, for every t (forward unchanged)."""
    out, state = gated_scan(q, k, v, g, initial_state)
    if output_final_state and dg_drops_dht:
        # adds 0 to S_N; its gradient subtracts sum(dS_N * S_N) from dg_t at every t: the kernel's missing
        # initialisation of b_dg from the final-state gradient
        total = g.to(acc_dtype(q)).sum(-1)[..., None, None]  # b_N per (batch, head)
        state = state + (total.detach() - total) * state.detach()
    return as_output(out, state, q.dtype, output_final_state)


def simple_gla_dg_without_dht(q, k, v, *, causal, g, initial_state=None, output_final_state=False):
    """fused_recurrent_simple_gla whose dg ignores the gradient arriving through the final state."""
    return _simple_gla_recurrent(q, k, v, g, initial_state, output_final_state, dg_drops_dht=True)


def simple_gla_dg_with_dht(q, k, v, *, causal, g, initial_state=None, output_final_state=False):
    """fused_recurrent_simple_gla with dg initialised from sum(h_T * dht)."""
    return _simple_gla_recurrent(q, k, v, g, initial_state, output_final_state, dg_drops_dht=False)


# ======================================================================================================
# 3. Lightning Attention-2, lightning_attn2_parallel: the grid covers n // 256 blocks only, outputs are
#    allocated uninitialised (OpenNLPLab/lightning-attention#27, PR #28)
# ======================================================================================================
def _lightning_blocked(q, k, v, *, floor_blocks: bool):
    """o_t = sum_{s<=t} lambda_h^{t-s} (s q_t . k_s) v_s (fla's slope schedule, layer 0 of 2, scale d^-1/2),
    by blocks of 256: the masked intra-block product plus the state of the previous blocks. With the bug
    only the first n // 256 blocks are computed; the rows after them keep the output buffer's contents
    (torch.empty there; zeros here, for a deterministic twin)."""
    B, H, N, dk = q.shape
    acc = acc_dtype(q)
    lg = torch.as_tensor(log_decays(H, 0, 2), dtype=torch.float64)[:, None, None]  # (H, 1, 1)
    qa, ka, va = q.to(acc) * dk**-0.5, k.to(acc), v.to(acc)
    out = q.new_zeros(B, H, N, v.shape[-1], dtype=acc)
    state = q.new_zeros(B, H, dk, v.shape[-1], dtype=acc)
    n_blocks = N // LIGHTNING_BLOCK if floor_blocks else -(-N // LIGHTNING_BLOCK)
    for blk in range(n_blocks):
        c0 = blk * LIGHTNING_BLOCK
        L = min(LIGHTNING_BLOCK, N - c0)
        qc, kc, vc = qa[:, :, c0 : c0 + L], ka[:, :, c0 : c0 + L], va[:, :, c0 : c0 + L]
        idx = torch.arange(L, dtype=torch.float64)
        lag = idx[:, None] - idx[None, :]
        decay = torch.exp((lg * lag).masked_fill(lag < 0, -torch.inf)).to(acc)  # (H, L, L)
        into = torch.exp(lg * (idx[:, None] + 1)).to(acc)  # lambda^(t+1) from the block's start, (H, L, 1)
        out[:, :, c0 : c0 + L] = ((qc @ kc.transpose(-1, -2)) * decay) @ vc + (qc * into) @ state
        to_end = torch.exp(lg * (L - 1 - idx[:, None])).to(acc)  # lambda^(L-1-s), (H, L, 1)
        state = torch.exp(lg * L).to(acc) * state + (kc * to_end).transpose(-1, -2) @ vc
    return out.to(q.dtype)


def lightning_parallel_floor_blocks(q, k, v, *, causal):
    """lightning_attn2_parallel: NUM_BLOCK = n // 256, the tail rows never written."""
    return _lightning_blocked(q, k, v, floor_blocks=True)


def lightning_parallel_padded_blocks(q, k, v, *, causal):
    """lightning_attn2_parallel padded to whole blocks (cdiv): every row computed."""
    return _lightning_blocked(q, k, v, floor_blocks=False)


# ======================================================================================================
# 4. Gated DeltaNet prefill that reads g as a linear-space gate while callers pass log-space g (FlashInfer)
# ======================================================================================================
def _gdn(q, k, v, g, beta, *, gate_is_linear: bool):
    """S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T, o_t = S_t^T (d^-1/2 q_t), l2-normalised q,
    k (eps 1e-6). The kernel forms log a_t itself: from g = log a_t (fixed) or as log(g), reading g as a_t
    (the bug: log of a negative log-decay is NaN, of 0 is -inf)."""
    g64 = g.to(torch.float64)
    log_a = torch.log(g64) if gate_is_linear else g64
    qa, ka = l2norm_qk(q, k)
    return gdn_scan(qa, ka, v, log_a, beta)[0].to(q.dtype)


def gdn_gate_read_as_linear(q, k, v, *, causal, g, beta):
    """chunk_gated_delta_rule that takes the log of g (expects alpha in (0, 1]) while given log-decays."""
    return _gdn(q, k, v, g, beta, gate_is_linear=True)


def gdn_gate_read_as_log(q, k, v, *, causal, g, beta):
    """chunk_gated_delta_rule with g_space='ln': g used as the log-decay it is."""
    return _gdn(q, k, v, g, beta, gate_is_linear=False)


# ======================================================================================================
# 5. Channel-wise gated delta rule, executorch's chunked prefill: the intra-chunk decays factored as
#    exp(gc_i) * exp(-gc_j), exp(-gc) overflowing (executorch#21417)
# ======================================================================================================
GDN_CHUNK = 32  # executorch's CHUNK_SIZE (its regression test, executorch#21439)
EXP_LIMIT = math.log(float(torch.finfo(torch.float32).max))  # 88.72: expf overflows past it
# an inference op (a CPU custom op without a backward): its users run the forward properties
FORWARD_PROPERTIES = tuple(p.name for p in applicable("gated-deltanet", True) if p.name not in GRADIENT_PROPERTIES)


def _gdn_factored(q, k, v, g, beta, *, guard: bool):
    """Chunked (WY / UT) gated delta rule, chunks of 32, l2-normalised q, k, scale d^-1/2, with every
    intra-chunk decay exp(gc_i - gc_j) formed as exp(gc_i) * exp(-gc_j) (gc the cumulative log-decay from
    the chunk's start). Without the guard, exp(-gc) overflows to inf once a chunk decays by more than ~88
    nats and exp(gc) * exp(-gc) = 0 * inf = NaN; the fix routes such inputs (any chunk of any head past the
    limit: the whole call) to the exact recurrence."""
    B, H, N, dk = q.shape
    g64 = g.to(torch.float64)
    if guard and N > 0:
        starts = range(0, N, GDN_CHUNK)
        chunk_decay = torch.cat([-torch.cumsum(g64[:, :, c0 : c0 + GDN_CHUNK], -1) for c0 in starts], -1)
        if float(chunk_decay.max()) > EXP_LIMIT:
            return _gdn(q, k, v, g, beta, gate_is_linear=False)
    acc = acc_dtype(q)
    qa, ka = l2norm_qk(q, k)
    va, ba = v.to(acc), beta.to(acc)
    state = q.new_zeros(B, H, dk, v.shape[-1], dtype=acc)
    outs = []
    for c0 in range(0, N, GDN_CHUNK):
        L = min(GDN_CHUNK, N - c0)
        qc, kc, vc, bc = qa[:, :, c0 : c0 + L], ka[:, :, c0 : c0 + L], va[:, :, c0 : c0 + L], ba[:, :, c0 : c0 + L]
        gc = torch.cumsum(g64[:, :, c0 : c0 + L], dim=-1)
        eg, eg_inv = torch.exp(gc).to(acc), torch.exp(-gc).to(acc)  # the factored decays, as the kernel stores them
        pair = eg[..., :, None] * eg_inv[..., None, :]  # exp(gc_i) exp(-gc_j)
        lower = torch.ones(L, L, dtype=torch.bool).tril()
        gamma = torch.where(lower, pair, torch.zeros((), dtype=acc))
        gamma_strict = torch.where(lower.tril(-1), pair, torch.zeros((), dtype=acc))
        eye = torch.eye(L, dtype=acc)
        system = eye + bc[..., None] * (kc @ kc.transpose(-1, -2)) * gamma_strict
        w = torch.linalg.solve_triangular(system, bc[..., None] * kc * eg[..., None], upper=False, unitriangular=True)
        u = torch.linalg.solve_triangular(system, bc[..., None] * vc, upper=False, unitriangular=True)
        delta = u - w @ state
        outs.append((qc * eg[..., None]) @ state + (qc @ kc.transpose(-1, -2) * gamma) @ delta)
        to_end = (eg[..., -1:] * eg_inv)[..., None]  # exp(gc_L) exp(-gc_s)
        state = eg[..., -1, None, None] * state + (kc * to_end).transpose(-1, -2) @ delta
    return torch.cat(outs, dim=2).to(q.dtype)


def gdn_chunked_prefill_factored_unguarded(q, k, v, *, causal, g, beta):
    """Chunked gated delta rule with exp(-gc) factors for every input."""
    return _gdn_factored(q, k, v, g, beta, guard=False)


def gdn_chunked_prefill_factored_guarded(q, k, v, *, causal, g, beta):
    """The same, falling back to the exact recurrence when a chunk decays past expf's limit."""
    return _gdn_factored(q, k, v, g, beta, guard=True)


def guard_reads_the_future() -> bool:
    """The fix's flaw: its guard looks at every chunk of the call, so a strong decay after token t switches
    the whole call to the recurrence and moves outputs at or before t (by rounding): N = 40, d = 4, g = -0.5,
    then g = -100 from token 30 on; whether any of outputs 0-29 changes."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 40, 4, generator=gen) for _ in range(3))
    beta = torch.rand(1, 1, 40, generator=gen)
    g = torch.full((1, 1, 40), -0.5)
    future = g.clone()
    future[..., 30:] = -100.0
    before, after = (gdn_chunked_prefill_factored_guarded(q, k, v, causal=True, g=x, beta=beta) for x in (g, future))
    return not torch.equal(before[..., :30, :], after[..., :30, :])


# ======================================================================================================
CASES = [
    Case(
        id="rwkv6-chunk-subchunk-inclusive-reference-overflow",
        source="https://github.com/fla-org/flash-linear-attention/issues/77",
        summary=(
            "fla's chunk_rwkv6 factored the inter-sub-chunk scores exp(be_t - b_s) as exp(b_gq - b_gn) * "
            "exp(b_gn - b_gk) with b_gn the inclusive cumulative decay at the sub-chunk's first token; b_gq is "
            "exclusive, so the first row's exponent is -g_t > 0 and exp overflows once a log-decay is below "
            "about -88 (float32), giving inf / NaN outputs and NaN gradients in RWKV6 and GSA training. Fixed "
            "(commit 0c1c0b6) by referencing the token before the sub-chunk, so both exponents are <= 0."
        ),
        kind="decay",
        variant="rwkv6",
        buggy=rwkv6_chunk_subchunk_reference_inclusive,
        fixed=rwkv6_chunk_subchunk_reference_exclusive,
        # trigger: N > 16 (a second sub-chunk) and a log-decay below -88.7 at the first token of a sub-chunk
        # (tokens 16, 32, 48 of a chunk) in float32: exp(-g) = inf times a subnormal key factor
    ),
    Case(
        id="simple-gla-fused-recurrent-dg-ignores-dht",
        source="https://github.com/fla-org/flash-linear-attention/pull/459",
        summary=(
            "fla's fused_recurrent backward for simple GLA (scalar gate g) started the running gate gradient "
            "b_dg at zero, so when a final-state gradient dht was passed, dg missed the term sum(h_T * dht) "
            "that S_T = exp(sum g) ... contributes to every token's gate. The PR initialises b_dg (and b_dgk, "
            "b_dgv) from sum(h_T * dht), as fla 0.6.0's common fused_recurrent kernel does. Re-implemented on "
            "the mamba2 variant with D = 0 (scalar decay, scale 1)."
        ),
        kind="backward",
        variant="mamba2",
        buggy=simple_gla_dg_without_dht,
        fixed=simple_gla_dg_with_dht,
        params={"D": 0.0},
        # trigger: a loss on the final state (output_final_state) differentiated w.r.t. g; forward, dq, dk, dv
        # and dh0 are right
    ),
    Case(
        id="lightning-parallel-ragged-length-unwritten-tail",
        source="https://github.com/OpenNLPLab/lightning-attention/pull/28",
        summary=(
            "lightning_attn2_parallel sized its forward and backward grids from NUM_BLOCK = n // 256 (floor, "
            "no divisibility check) while allocating outputs with torch.empty, so rows past the last whole "
            "256-token block were never written and n < 256 launched nothing (issue #27). Fixed by padding the "
            "sequence to whole blocks and slicing back. Re-implemented with the unwritten rows left at zero "
            "(deterministic) and fla's slope schedule for the decays."
        ),
        kind="chunk-boundary",
        variant="lightning",
        buggy=lightning_parallel_floor_blocks,
        fixed=lightning_parallel_padded_blocks,
        # trigger: any N not a multiple of 256 (N < 256: the whole output)
    ),
    Case(
        id="gdn-prefill-log-space-gate-read-as-linear",
        source="https://github.com/flashinfer-ai/flashinfer/issues/2490",
        summary=(
            "FlashInfer's chunk_gated_delta_rule expects the forget gate g in linear space (it takes the log "
            "and cumsum inside the fused kernel) while callers such as vLLM pass g = logsigmoid(.) in log "
            "space, producing all-NaN prefill outputs; the kernel author's workaround is g=torch.exp(g) and "
            "PR #3680 adds a g_space flag. Re-implemented as the recurrence reading the log-decay g as alpha."
        ),
        kind="decay",
        variant="gated-deltanet",
        buggy=gdn_gate_read_as_linear,
        fixed=gdn_gate_read_as_log,
        # trigger: any g < 0 (NaN) or g = 0 (alpha = 0: the state is wiped every token)
    ),
    Case(
        id="gdn-chunked-prefill-inverse-decay-overflow",
        source="https://github.com/pytorch/executorch/pull/21417",
        summary=(
            "executorch's channelwise_gated_delta_rule chunked CPU prefill computed gc = cumsum(log decay) per "
            "chunk and the factored inverse eg_inv = exp(-gc); for tiny decays (6.5e-12 observed) the "
            "within-chunk -gc passes expf's limit (~88.7), eg_inv = inf and eg * eg_inv = 0 * inf = NaN, which "
            "poisoned the logits. Fixed with a guard routing such inputs to the exact recurrence. "
            "Re-implemented with a scalar (channel-shared) decay on gated-deltanet, chunks of 32 (CHUNK_SIZE in "
            "the regression test of executorch#21439), checked with the forward properties (the op has no "
            "backward)."
        ),
        kind="decay",
        variant="gated-deltanet",
        buggy=gdn_chunked_prefill_factored_unguarded,
        fixed=gdn_chunked_prefill_factored_guarded,
        properties=FORWARD_PROPERTIES,
        flaw=(
            "causality: the guard reads every chunk of the call, so a strong future decay switches the whole call "
            "to the recurrence and past outputs move by rounding (guard_reads_the_future)"
        ),
        shows_flaw=guard_reads_the_future,
        flaw_properties=("causality",),
        # trigger: a cumulative log-decay below -88.7 inside one chunk of 32 in float32 (e.g. g = -3 per
        # token over 30 tokens, or one extreme gate)
    ),
]
