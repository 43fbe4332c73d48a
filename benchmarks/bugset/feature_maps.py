"""Real bugs of feature-map / kernelised attention implementations (Performer / FAVOR+, xformers, efficientvit's
relu linear attention, QK-norm, softmax precision), each re-implemented in plain torch as a ``buggy`` target and
its upstream-fixed ``fixed`` twin that differ only by the bug (benchmarks/bugset/cases.py).

Every target follows gramcheck's convention ``fn(q, k, v, *, causal, **extras)`` on (B, H, N, d) tensors and
works in any float dtype on CPU. The shared, bug-free parts (feature maps, stabilisers, recurrences) are written
once below (those other modules use too in benchmarks/bugset/common.py) and used by both twins.
"""

from __future__ import annotations

import math

import torch

from benchmarks.bugset.cases import Case
from benchmarks.bugset.common import acc_dtype, causal_softmax, l2norm

# --------------------------------------------------------------------------------------------------
# shared helpers (identical in both twins of every case)
# --------------------------------------------------------------------------------------------------


def _w(projection, like):
    """The random matrix (m, d) in the data's dtype and device."""
    return projection.to(dtype=like.dtype, device=like.device)


def _favor_positive_log_parts(x, w, normalise_data=True):
    """(w.x', |x'|^2 / 2) with x' = x d^-1/4 (softmax logits q.k / sqrt(d)): the exponent of a positive FAVOR+
    feature is w.x' - |x'|^2/2 (Choromanski et al. 2021, Lemma 1)."""
    d = x.shape[-1]
    xs = x * d**-0.25 if normalise_data else x
    return xs @ w.transpose(-1, -2), (xs * xs).sum(-1, keepdim=True) / 2


def _favor_noncausal(fq, fk, v):
    """Non-causal normalised linear attention phi(Q) (phi(K)^T V) / phi(Q) (phi(K)^T 1) (performer-pytorch's
    ``linear_attention``)."""
    k_cumsum = fk.sum(dim=-2)
    d_inv = 1.0 / torch.einsum("...nd,...d->...n", fq, k_cumsum)
    context = torch.einsum("...nd,...ne->...de", fk, v)
    return torch.einsum("...de,...nd,...n->...ne", context, fq, d_inv)


def _performer_keys_queries(q, k, w, *, key_max_dims, eps=0.0, shift_projection=False):
    """FAVOR+ positive features as google-research's / performer-pytorch's ``softmax_kernel``: queries shifted by
    their own maximum (per token), keys by a maximum over ``key_max_dims`` of the keys' exponents (None: one
    maximum over the whole tensor, batch and heads included). ``eps`` is added to each feature before the
    1/sqrt(m) ratio (performer-pytorch: 1e-4); ``shift_projection``: the maximum is that of w.x alone
    (performer-pytorch), else of the whole exponent w.x - |x|^2/2 (google-research JAX). The maxima are not
    detached: with eps > 0 the shift does not cancel, and the gradient must follow it (performer-pytorch's later
    ``.detach()`` makes autograd disagree with the forward; gramcheck's gradcheck flags it)."""
    m = w.shape[0]
    ratio = m**-0.5
    pq, hq = _favor_positive_log_parts(q, w)
    pk, hk = _favor_positive_log_parts(k, w)
    base_q = pq if shift_projection else pq - hq
    base_k = pk if shift_projection else pk - hk
    fq = ratio * (torch.exp(pq - hq - base_q.amax(dim=-1, keepdim=True)) + eps)
    kmax = base_k.max() if key_max_dims is None else base_k.amax(dim=key_max_dims, keepdim=True)
    fk = ratio * (torch.exp(pk - hk - kmax) + eps)
    return fq, fk


def _favor_causal_state_pass(q, k, v, w):
    """Causal FAVOR+ (positive features) without any future token entering a past output: the keys are
    stabilised feature by feature by their running maximum M_t (the state is rescaled by exp(M_{t-1} - M_t) when
    it grows), the query of token t by c_t = max_j (L^q_tj + M_tj). Yields per token (phi(q_t), S_t, z_t): the
    state S_t = sum_{s<=t} phi(k_s) v_s^T and the key sum z_t = sum_{s<=t} phi(k_s), both in the same scale as
    phi(q_t) (a factor per row, which cancels in num / den). Accumulates in at least float32."""
    acc = acc_dtype(q)
    m = w.shape[0]
    ratio = m**-0.5
    pq, hq = _favor_positive_log_parts(q.to(acc), w.to(acc))
    pk, hk = _favor_positive_log_parts(k.to(acc), w.to(acc))
    lq, lk = pq - hq, pk - hk  # (B, H, N, m) log-amplitudes
    run = torch.cummax(lk, dim=-2).values.detach()  # M_t, per feature
    va = v.to(acc)
    B, H, N, _ = q.shape
    state = va.new_zeros(B, H, m, v.shape[-1])
    zsum = va.new_zeros(B, H, m)
    prev = None
    for t in range(N):
        mt = run[:, :, t]
        if prev is not None:
            decay = torch.exp(prev - mt)
            state = state * decay[..., None]
            zsum = zsum * decay
        fk = ratio * torch.exp(lk[:, :, t] - mt)
        state = state + fk[..., None] * va[:, :, t, None, :]
        zsum = zsum + fk
        ct = (lq[:, :, t] + mt).amax(dim=-1, keepdim=True).detach()
        fq = ratio * torch.exp(lq[:, :, t] + mt - ct)
        prev = mt
        yield fq, state, zsum


# --------------------------------------------------------------------------------------------------
# 1. performer-pytorch #21: causal normalisation divided the state by the key cumsum per feature
# --------------------------------------------------------------------------------------------------


def pp21_per_feature_normaliser_buggy(q, k, v, *, causal, projection):
    """performer-pytorch <= 0.11.1 ``causal_linear_attention_noncuda``: context = cumsum(k v^T);
    context /= k_cumsum[..., None]; out = q . context -- each feature's value sum is divided by that feature's
    key sum, instead of dividing the whole row by q . k_cumsum."""
    w = _w(projection, q)
    outs = []
    for fq, state, zsum in _favor_causal_state_pass(q, k, v, w):
        outs.append(torch.einsum("bhm,bhme->bhe", fq, state / zsum[..., None]))
    return torch.stack(outs, dim=2).to(q.dtype)


def pp21_per_feature_normaliser_fixed(q, k, v, *, causal, projection):
    """performer-pytorch >= 0.11.2: D_inv = 1 / (q . k_cumsum); out = (q . context) * D_inv."""
    w = _w(projection, q)
    outs = []
    for fq, state, zsum in _favor_causal_state_pass(q, k, v, w):
        d_inv = 1.0 / torch.einsum("bhm,bhm->bh", fq, zsum)
        outs.append(torch.einsum("bhm,bhme,bh->bhe", fq, state, d_inv))
    return torch.stack(outs, dim=2).to(q.dtype)


# --------------------------------------------------------------------------------------------------
# 2. performer-pytorch #40: D_inv without the reciprocal (causal, non-CUDA path)
# --------------------------------------------------------------------------------------------------


def pp40_missing_reciprocal_buggy(q, k, v, *, causal, projection):
    """performer-pytorch 0.11.1 ``causal_linear_attention_noncuda``:
    D_inv = einsum('...nd,...nd->...n', q, k.cumsum(dim=-2)) -- the normaliser multiplies instead of divides."""
    w = _w(projection, q)
    outs = []
    for fq, state, zsum in _favor_causal_state_pass(q, k, v, w):
        d_inv = torch.einsum("bhm,bhm->bh", fq, zsum)
        outs.append(torch.einsum("bhm,bhme,bh->bhe", fq, state, d_inv))
    return torch.stack(outs, dim=2).to(q.dtype)


def pp40_missing_reciprocal_fixed(q, k, v, *, causal, projection):
    """performer-pytorch 0.11.2: D_inv = 1. / einsum('...nd,...nd->...n', q, k.cumsum(dim=-2))."""
    return pp21_per_feature_normaliser_fixed(q, k, v, causal=causal, projection=projection)


# --------------------------------------------------------------------------------------------------
# 3. google-research performer (TF) b09ac837: data_normalizer applied to |x|^2 but not to the projection
# --------------------------------------------------------------------------------------------------


_GR_EPS = 1e-6  # google-research's numerical_stabilizer of softmax_kernel_transformation


def _gr_softmax_kernel(x, w, *, is_query, normalise_projection):
    """google-research softmax_kernel_transformation: ratio * (exp(data_dash - diag_data - max(data_dash)) +
    numerical_stabilizer), max per token for queries, over tokens and features of one batch item and head for
    keys (the JAX reference's axes); ``normalise_projection``: data_dash = W (d^-1/4 x), else W x (the bug)."""
    d = x.shape[-1]
    m = w.shape[0]
    dn = d**-0.25
    dash = (x * dn if normalise_projection else x) @ w.transpose(-1, -2)
    diag = (x * x).sum(-1, keepdim=True) / 2 * dn * dn
    dims = -1 if is_query else (-1, -2)
    return m**-0.5 * (torch.exp(dash - diag - dash.amax(dim=dims, keepdim=True)) + _GR_EPS)


def gr_data_normalizer_buggy(q, k, v, *, causal, projection):
    """google-research performer/fast_attention/tensorflow before b09ac837: data_dash = W x (x not scaled by
    data_normalizer = d^-1/4) while diag_data = |x|^2/2 * data_normalizer^2: the features do not estimate
    exp(q.k / sqrt(d))."""
    w = _w(projection, q)
    fq = _gr_softmax_kernel(q, w, is_query=True, normalise_projection=False)
    fk = _gr_softmax_kernel(k, w, is_query=False, normalise_projection=False)
    return _favor_noncausal(fq, fk, v)


def gr_data_normalizer_fixed(q, k, v, *, causal, projection):
    """After b09ac837 (as the JAX version): data = data_normalizer * data before both the projection and
    diag_data."""
    w = _w(projection, q)
    fq = _gr_softmax_kernel(q, w, is_query=True, normalise_projection=True)
    fk = _gr_softmax_kernel(k, w, is_query=False, normalise_projection=True)
    return _favor_noncausal(fq, fk, v)


# --------------------------------------------------------------------------------------------------
# 4. performer-pytorch #76: key stabiliser torch.max(data_dash) over batch and heads
# --------------------------------------------------------------------------------------------------


def pp76_key_max_over_batch_buggy(q, k, v, *, causal, projection):
    """performer-pytorch ``softmax_kernel`` before #76: keys shifted by torch.max(data_dash), one maximum over
    every batch item and head; with eps = 1e-4 added to each feature that changes each head's kernel, and a
    head whose keys project far below another head's underflows to eps alone."""
    fq, fk = _performer_keys_queries(q, k, _w(projection, q), key_max_dims=None, eps=1e-4, shift_projection=True)
    return _favor_noncausal(fq, fk, v)


def pp76_key_max_over_batch_fixed(q, k, v, *, causal, projection):
    """After #76: torch.amax(data_dash, dim=(-1, -2), keepdim=True), one maximum per batch item and head (as
    the JAX reference's last_dims_t + attention_dims_t)."""
    fq, fk = _performer_keys_queries(q, k, _w(projection, q), key_max_dims=(-1, -2), eps=1e-4, shift_projection=True)
    return _favor_noncausal(fq, fk, v)


# --------------------------------------------------------------------------------------------------
# 5. xformers #96 / PR #98: FAVOR (hyperbolic features) computed in fp16 overflows / underflows
# --------------------------------------------------------------------------------------------------


def _xformers_favor(q, k, v, w):
    """xformers FavorAttention (non-causal) with SMHyperbolic-style features: x' = x d^-1/4,
    offset = -|x'|^2/2 - log sqrt(2m) + 1e-6, phi(x) = [exp(W x' + offset), exp(-W x' + offset)],
    att = q' (k'^T v) / q' (k'^T 1). Shared by both twins, and not xformers': the exponents are shifted by
    their maximum (per token for queries, per batch item and head for keys; the shift cancels exactly), without
    which even the fp32 fix underflows to 0/0 once |x'|^2 / 2 > ~100 (gramcheck's outlier inputs)."""
    d = q.shape[-1]
    m2 = 2 * w.shape[0]
    feats = []
    for x, is_query in ((q, True), (k, False)):
        xs = x * d**-0.25
        offset = -0.5 * (xs * xs).sum(-1, keepdim=True) - math.log(math.sqrt(m2)) + 1e-6
        proj = xs @ w.transpose(-1, -2)
        expo = torch.cat([proj + offset, -proj + offset], dim=-1)
        expo = expo - expo.detach().amax(dim=-1 if is_query else (-1, -2), keepdim=True)
        feats.append(torch.exp(expo))
    qp, kp = feats
    att_norm = qp @ (kp.transpose(-2, -1) @ torch.ones_like(v))
    att_raw = qp @ (kp.transpose(-2, -1) @ v)
    return att_raw / att_norm


def xf96_favor_fp16_buggy(q, k, v, *, causal, projection):
    """xformers before PR #98: the feature maps and both products run in the inputs' fp16."""
    return _xformers_favor(q, k, v, _w(projection, q))


def xf96_favor_fp16_fixed(q, k, v, *, causal, projection):
    """xformers PR #98: fp16 inputs are promoted to fp32 for the feature maps and the attention, and the
    result is cast back (bfloat16 is left alone)."""
    dtype = q.dtype
    if dtype == torch.float16:
        q, k, v = q.float(), k.float(), v.float()
    return _xformers_favor(q, k, v, _w(projection, q)).to(dtype)


# --------------------------------------------------------------------------------------------------
# 6. xformers #103: the causal mask is skipped when no att_mask is passed
# --------------------------------------------------------------------------------------------------


def _sdp(q, k, v, mask):
    att = (q / math.sqrt(k.shape[-1])) @ k.transpose(-2, -1)
    if mask is not None:
        att = att.masked_fill(~mask, float("-inf"))
    return torch.softmax(att, dim=-1) @ v


def xf103_causal_mask_skipped_buggy(q, k, v, *, causal):
    """xformers ScaledDotProduct before the fix: ``if att_mask is not None and self.causal:`` -- with no
    att_mask the causal mask is never built, so a causal layer attends to the future."""
    att_mask = None  # the user passes no attention mask; causal=True is the layer's setting
    mask = None
    if att_mask is not None and causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    return _sdp(q, k, v, mask)


def xf103_causal_mask_skipped_fixed(q, k, v, *, causal):
    """Fixed: the causal mask is applied whenever the layer is causal (combined with att_mask if given)."""
    mask = None
    if causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    return _sdp(q, k, v, mask)


# --------------------------------------------------------------------------------------------------
# 7. ultralytics PR #24990: softmax scale applied after the QK^T product overflows fp16
# --------------------------------------------------------------------------------------------------


def ul24990_scale_after_matmul_buggy(q, k, v, *, causal):
    """Before PR #24990: attn = (q @ k^T) * scale -- the raw dot product (up to d |q| |k|) overflows fp16's
    65504 to inf before the scale brings it back into range; softmax of inf is NaN."""
    scale = q.shape[-1] ** -0.5
    return causal_softmax((q @ k.transpose(-2, -1)) * scale, v, causal)


def ul24990_scale_after_matmul_fixed(q, k, v, *, causal):
    """PR #24990: attn = (q * scale) @ k^T (the scale applied to the query before the product)."""
    scale = q.shape[-1] ** -0.5
    return causal_softmax((q * scale) @ k.transpose(-2, -1), v, causal)


def ul24990_fixed_scores_overflow() -> bool:
    """The fix's flaw: its scaled scores are still float16, so a scaled logit below -65504 is -inf, and a row
    of them is 0/0 where the exact output is finite (q = -k = 1000 at N = 1, d = 1: the output is v = 3, and
    float32 scores compute it)."""
    q = torch.full((1, 1, 1, 1), 1000.0, dtype=torch.float16)
    v = torch.full((1, 1, 1, 1), 3.0, dtype=torch.float16)
    return bool(torch.isnan(ul24990_scale_after_matmul_fixed(q, -q, v, causal=True)).all())


# --------------------------------------------------------------------------------------------------
# 8. vllm #16311: llama4 QK norm shared across heads (normalised over H * d instead of per head)
# --------------------------------------------------------------------------------------------------

_QKN_EPS = 1e-6
_QKN_TAU = 1.0


def _qk_l2(x, per_head):
    """sqrt(tau) x / sqrt(|x|^2 + eps), the norm taken per head over d (per_head) or over each token's
    concatenated heads (B, N, H * d)."""
    y = x.to(acc_dtype(x))
    if per_head:
        n = l2norm(y, _QKN_EPS)
    else:
        B, H, N, d = y.shape
        flat = y.transpose(1, 2).reshape(B, N, H * d)  # the projection's output before the head split
        n = l2norm(flat, _QKN_EPS).reshape(B, N, H, d).transpose(1, 2)
    return (n * math.sqrt(_QKN_TAU)).to(x.dtype)


def _softmax_unit_scale(qn, kn, v, causal):
    return causal_softmax(qn @ kn.transpose(-2, -1), v, causal)


def vllm16311_qknorm_across_heads_buggy(q, k, v, *, causal):
    """vllm llama4 before #16311: the QK norm is applied to the (tokens, heads * head_dim) projection, so one
    norm is shared by all heads of a token."""
    return _softmax_unit_scale(_qk_l2(q, per_head=False), _qk_l2(k, per_head=False), v, causal)


def vllm16311_qknorm_across_heads_fixed(q, k, v, *, causal):
    """#16311: q and k are reshaped to (..., heads, head_dim) and normalised per head."""
    return _softmax_unit_scale(_qk_l2(q, per_head=True), _qk_l2(k, per_head=True), v, causal)


# --------------------------------------------------------------------------------------------------
# 9. efficientvit #110: relu linear attention in fp16 without the fp32 cast
# --------------------------------------------------------------------------------------------------

_EVIT_EPS = 1e-15


def _relu_linear_att(q, k, v):
    """efficientvit LiteMLA.relu_linear_att (non-causal): v padded with a row of ones, vk = v_pad k^T,
    out = vk q, out[:-1] / (out[-1] + eps); here in (B, H, N, d) layout."""
    q, k = torch.relu(q), torch.relu(k)
    v_pad = torch.nn.functional.pad(v, (0, 1), mode="constant", value=1.0)
    vk = k.transpose(-1, -2) @ v_pad  # (d_k, d_v + 1)
    out = q @ vk
    return out[..., :-1] / (out[..., -1:] + _EVIT_EPS)


def evit110_relu_linear_fp16_buggy(q, k, v, *, causal):
    """efficientvit after the cast was removed: q, k, v stay fp16; the key-value sums over all tokens and the
    denominator overflow fp16 (NaN output)."""
    return _relu_linear_att(q, k, v)


def evit110_relu_linear_fp16_fixed(q, k, v, *, causal):
    """The fix the maintainers gave in #110 (the code that had been removed): ``if qkv.dtype == torch.float16:
    qkv = qkv.float()``; the result is cast back to the input dtype."""
    dtype = q.dtype
    if dtype == torch.float16:
        q, k, v = q.float(), k.float(), v.float()
    return _relu_linear_att(q, k, v).to(dtype)


# --------------------------------------------------------------------------------------------------
# 10. performer-pytorch PR #41: the CUDA causal path returned the un-normalised numerator
# --------------------------------------------------------------------------------------------------


def pp41_causal_unnormalised_buggy(q, k, v, *, causal, projection):
    """performer-pytorch before PR #41: causal_linear_attention returned CausalDotProduct(q, k, v), the causal
    numerator q . cumsum(k v^T), with no division by q . cumsum(k) (fast-transformers keeps the normaliser
    outside its CUDA kernel)."""
    w = _w(projection, q)
    outs = [torch.einsum("bhm,bhme->bhe", fq, state) for fq, state, _ in _favor_causal_state_pass(q, k, v, w)]
    return torch.stack(outs, dim=2).to(q.dtype)


def pp41_causal_unnormalised_fixed(q, k, v, *, causal, projection):
    """PR #41: D_inv = 1 / (q . k.cumsum(-2)) and out = CausalDotProduct(q, k, v) * D_inv."""
    return pp21_per_feature_normaliser_fixed(q, k, v, causal=causal, projection=projection)


# --------------------------------------------------------------------------------------------------
# 11. xformers #1185: BlockDiagonalCausalMask.to(device) returned a (non-causal) BlockDiagonalMask
# --------------------------------------------------------------------------------------------------


def _block_mask(n, cu_seqlens, causal, device):
    """(n, n) boolean: same packed sequence (one sequence when cu_seqlens is None), and j <= i when causal."""
    seq = torch.zeros(n, dtype=torch.long, device=device)
    if cu_seqlens is not None:
        bounds = cu_seqlens.to(device=device, dtype=torch.long)
        seq = torch.bucketize(torch.arange(n, device=device), bounds[1:], right=True)
    keep = seq[:, None] == seq[None, :]
    if causal:
        keep = keep & torch.ones(n, n, dtype=torch.bool, device=device).tril()
    return keep


def xf1185_block_causal_mask_to_buggy(q, k, v, *, causal, cu_seqlens=None):
    """xformers 0.0.28: BlockDiagonalCausalMask.from_seqlens(...).to(device) went through
    BlockDiagonalMask.to and came back as a BlockDiagonalMask: sequences stay isolated, but every token of a
    sequence sees the whole sequence, its future included."""
    keep = _block_mask(q.shape[-2], cu_seqlens, False, q.device)  # the causal flag lost by .to()
    return _sdp(q, k, v, keep)


def xf1185_block_causal_mask_to_fixed(q, k, v, *, causal, cu_seqlens=None):
    """xformers a8746f3: BlockDiagonalCausalMask.to keeps its class (block diagonal and causal)."""
    keep = _block_mask(q.shape[-2], cu_seqlens, causal, q.device)
    return _sdp(q, k, v, keep)


CASES: list[Case] = []

CASES += [
    # trigger: any causal input with N >= 1 (even N = 1: sum_j q_j s_j / z_j is not the row's normalised value)
    Case(
        id="performer-pytorch-21-causal-per-feature-normaliser",
        source="https://github.com/lucidrains/performer-pytorch/issues/21",
        summary=(
            "causal_linear_attention_noncuda divided the cumulated key-value context by the key cumsum feature by "
            "feature (context /= k_cumsum[..., None]) before contracting with q, instead of dividing each row by "
            "q . k_cumsum (Katharopoulos et al. eq. 10-11); fixed by computing D_inv from q . k.cumsum and "
            "scaling the output rows."
        ),
        kind="normaliser",
        variant="performer-positive",
        buggy=pp21_per_feature_normaliser_buggy,
        fixed=pp21_per_feature_normaliser_fixed,
        causal=True,
    ),
    # trigger: any causal input (the output is num * den instead of num / den)
    Case(
        id="performer-pytorch-40-causal-dinv-missing-reciprocal",
        source="https://github.com/lucidrains/performer-pytorch/issues/40",
        summary=(
            "The non-CUDA causal path computed D_inv = einsum(q, k.cumsum(dim=-2)) without the '1. /', so every "
            "output row was multiplied by its normaliser instead of divided; fixed in release 0.11.2 by adding "
            "the reciprocal."
        ),
        kind="normaliser",
        variant="performer-positive",
        buggy=pp40_missing_reciprocal_buggy,
        fixed=pp40_missing_reciprocal_fixed,
        causal=True,
    ),
    # trigger: d >= 2 (at d = 1 the data_normalizer d^-1/4 is 1 and the twins agree)
    Case(
        id="google-research-performer-tf-data-normalizer",
        source="https://github.com/lucidrains/performer-pytorch/issues/50",
        summary=(
            "google-research's TensorFlow softmax_kernel_transformation projected the raw data (W x) while "
            "diag_data used data_normalizer^2 |x|^2 / 2, so the features did not estimate exp(q.k / sqrt(d)); "
            "fixed in google-research commit b09ac837 by scaling the data by data_normalizer = d^-1/4 before both "
            "(as the JAX version), reported to performer-pytorch in #50."
        ),
        kind="scale",
        variant="performer-positive",
        buggy=gr_data_normalizer_buggy,
        fixed=gr_data_normalizer_fixed,
        causal=False,
        params={"feature_eps": _GR_EPS, "shift": "projection"},
    ),
    # trigger: B * H >= 2 with heads whose keys' maxima differ (eps = 1e-4 then weighs differently per head)
    Case(
        id="performer-pytorch-76-key-max-over-batch-and-heads",
        source="https://github.com/lucidrains/performer-pytorch/issues/76",
        summary=(
            "softmax_kernel stabilised the key features with torch.max(data_dash), one maximum over every batch "
            "item and head, where the JAX reference takes it per batch item and head; with the 1e-4 feature eps "
            "this changes each head's kernel estimate and can sink a head's features to eps. Fixed by "
            "torch.amax(data_dash, dim=(-1, -2), keepdim=True)."
        ),
        kind="features",
        variant="performer-positive",
        buggy=pp76_key_max_over_batch_buggy,
        fixed=pp76_key_max_over_batch_fixed,
        causal=False,
        params={"feature_eps": 1e-4, "shift": "projection"},
    ),
    # trigger: float16: exp of the features and the sums over N underflow/overflow fp16 (gradients inf/NaN;
    # caught by backward-agreement, anti-aligned [1, 1, 1, 4]); xformers' own features had no max shift, which
    # both twins here add so that the fp32 fix is correct on gramcheck's whole domain (see _xformers_favor)
    Case(
        id="xformers-96-favor-fp16-overflow",
        source="https://github.com/facebookresearch/xformers/pull/98",
        summary=(
            "FavorAttention computed its unstabilised hyperbolic softmax features and the normalisation in "
            "fp16, which overflows/underflows (loss NaN immediately, issue #96); PR #98 promotes fp16 q, k, v to "
            "fp32 for the feature maps and the attention and casts the result back."
        ),
        kind="precision",
        variant="performer-hyperbolic",
        buggy=xf96_favor_fp16_buggy,
        fixed=xf96_favor_fp16_fixed,
        causal=False,
        dtype="float16",
    ),
    # trigger: any causal input with N >= 2 (token i sees tokens j > i)
    Case(
        id="xformers-103-causal-mask-skipped",
        source="https://github.com/facebookresearch/xformers/issues/103",
        summary=(
            "ScaledDotProduct only built its causal mask inside 'if att_mask is not None', so a causal layer "
            "called without an attention mask attended to future tokens; fixed by applying the causal mask "
            "whenever the layer is causal."
        ),
        kind="causal-mask",
        variant="softmax",
        buggy=xf103_causal_mask_skipped_buggy,
        fixed=xf103_causal_mask_skipped_fixed,
        causal=True,
    ),
    # trigger: float16 with |q.k| > 65504 before scaling (|q|, |k| ~ 30+ at d = 64), finite after scaling
    Case(
        id="ultralytics-24990-fp16-scale-after-matmul",
        source="https://github.com/ultralytics/ultralytics/pull/24990",
        summary=(
            "Attention computed (q^T k) * scale, so the unscaled dot product overflowed fp16's 65504 to inf "
            "under AMP and the softmax turned NaN; the PR scales the query before the product, (q * scale)^T k, "
            "exact in fp32 and in range in fp16."
        ),
        kind="precision",
        variant="softmax",
        buggy=ul24990_scale_after_matmul_buggy,
        fixed=ul24990_scale_after_matmul_fixed,
        causal=True,
        dtype="float16",
        flaw=(
            "agreement: the scaled scores are still float16, so logits below -65504 are -inf and a row of them is "
            "0/0 where the exact output is finite and float32 scores compute it (ul24990_fixed_scores_overflow)"
        ),
        shows_flaw=ul24990_fixed_scores_overflow,
        flaw_properties=("agreement",),
    ),
    # trigger: H >= 2 (with one head the flattened and per-head norms coincide)
    Case(
        id="vllm-16311-qknorm-shared-across-heads",
        source="https://github.com/vllm-project/vllm/pull/16311",
        summary=(
            "vLLM's Llama 4 applied its QK norm to the flattened (heads * head_dim) projection, one norm shared by "
            "all heads of a token, instead of per head (MMLU-Pro 0.686 -> 0.715 after the fix); fixed by "
            "reshaping q and k to (..., heads, head_dim) before the norm."
        ),
        kind="normaliser",
        variant="qknorm-softmax",
        buggy=vllm16311_qknorm_across_heads_buggy,
        fixed=vllm16311_qknorm_across_heads_fixed,
        causal=True,
        params={"norm": "l2", "tau": _QKN_TAU, "norm_eps": _QKN_EPS},
    ),
    # trigger: float16 with large-magnitude values or long N (k^T [v, 1] sums over N overflow 65504)
    Case(
        id="efficientvit-110-relu-linear-fp16",
        source="https://github.com/mit-han-lab/efficientvit/issues/110",
        summary=(
            "relu_linear_att lost its 'if qkv.dtype == torch.float16: qkv = qkv.float()' cast, so the ReLU "
            "linear attention's key-value products and denominator ran in fp16 and overflowed to NaN in fp16 "
            "training; the maintainers' fix is to restore the fp32 cast (done for fp16 only)."
        ),
        kind="precision",
        variant="linear-relu",
        buggy=evit110_relu_linear_fp16_buggy,
        fixed=evit110_relu_linear_fp16_fixed,
        causal=False,
        dtype="float16",
        params={"eps": _EVIT_EPS},
    ),
]

CASES += [
    # trigger: any causal input (the output is the unnormalised numerator)
    Case(
        id="performer-pytorch-41-causal-cuda-unnormalised",
        source="https://github.com/lucidrains/performer-pytorch/pull/41",
        summary=(
            "The fast CUDA causal path returned fast-transformers' CausalDotProduct(q, k, v), the causal "
            "numerator only, without dividing by q . cumsum(k) (reported in #40); PR #41 computes D_inv from "
            "q and k.cumsum and scales the output rows by it."
        ),
        kind="normaliser",
        variant="performer-positive",
        buggy=pp41_causal_unnormalised_buggy,
        fixed=pp41_causal_unnormalised_fixed,
        causal=True,
    ),
    # trigger: causal, N >= 2 in any packed sequence (with or without cu_seqlens: the mask built for one
    # sequence is moved to the device too)
    Case(
        id="xformers-1185-block-diagonal-causal-mask-to",
        source="https://github.com/facebookresearch/xformers/issues/1185",
        summary=(
            "BlockDiagonalCausalMask.to(device) called BlockDiagonalMask.to and returned a BlockDiagonalMask, so "
            "packed sequences moved to the GPU lost their causal mask inside each block (each token attended to "
            "its sequence's future); fixed in xformers a8746f3 by keeping the causal class in .to()."
        ),
        kind="causal-mask",
        variant="softmax",
        buggy=xf1185_block_causal_mask_to_buggy,
        fixed=xf1185_block_causal_mask_to_fixed,
        causal=True,
    ),
]
