"""Causal linear attention with elu+1 features, written the way a library would (layout (B, H, N, d))."""

import torch
import torch.nn.functional as F


def elu_plus_one(x):
    """elu(x) + 1 = x + 1 (x > 0), exp(x) (x <= 0), without computing (exp(x) - 1) + 1, which cancels to 0
    in float32 for x < -17 (gramcheck found that: see naive_linear_attention)."""
    return torch.where(x > 0, x + 1, torch.exp(torch.clamp(x, max=0)))


def linear_attention(q, k, v, *, causal=True):
    """o_t = phi(q_t)^T S_t / phi(q_t)^T z_t, S_t = sum_{s<=t} phi(k_s) v_s^T, z_t = sum_{s<=t} phi(k_s)."""
    fq, fk = elu_plus_one(q), elu_plus_one(k)
    if not causal:
        kv = fk.transpose(-1, -2) @ v
        return (fq @ kv) / (fq @ fk.sum(-2, keepdim=True).transpose(-1, -2))
    kv = torch.einsum("bhnd,bhne->bhnde", fk, v).cumsum(2)
    num = torch.einsum("bhnd,bhnde->bhne", fq, kv)
    den = (fq * fk.cumsum(2)).sum(-1, keepdim=True)
    return num / den


def leaky_linear_attention(q, k, v, *, causal=True):
    """The same with an off-by-one cumulative sum: token t sees token t + 1 (a causality bug)."""
    fq, fk = elu_plus_one(q), elu_plus_one(k)
    kv = torch.einsum("bhnd,bhne->bhnde", fk, v).cumsum(2)
    z = fk.cumsum(2)
    kv = torch.cat([kv[:, :, 1:], kv[:, :, -1:]], dim=2)
    z = torch.cat([z[:, :, 1:], z[:, :, -1:]], dim=2)
    return torch.einsum("bhnd,bhnde->bhne", fq, kv) / (fq * z).sum(-1, keepdim=True)


def naive_linear_attention(q, k, v, *, causal=True):
    """The common idiom phi = F.elu(x) + 1: for x < -17 (float32) elu(x) = exp(x) - 1 rounds to -1 and the
    feature to 0, so a row whose keys are all very negative becomes 0/0 (gramcheck's agreement finds it
    with outlier tokens)."""
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    kv = torch.einsum("bhnd,bhne->bhnde", fk, v).cumsum(2)
    return torch.einsum("bhnd,bhnde->bhne", fq, kv) / (fq * fk.cumsum(2)).sum(-1, keepdim=True)
