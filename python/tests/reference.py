"""A float64 NumPy reference with FlashAttention's conventions (BSHD, bottom-right causal)."""
import math

import numpy as np


def attention(q, k, v, causal=False, window_size=(-1, -1), softmax_scale=None, softcap=0.0,
              alibi_slopes=None, mask=None, sinks=None, bias=None):
    """mask: bool, broadcast to [b, h, sq, sk] (False hides); bias: added to the scaled
    scores after ALiBi, broadcast likewise (SDPA's float attn_mask); alibi_slopes [h] or
    [b, h]; sinks [h] (a logit per head in the denominator, without a value)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    b, sq, hq, d = q.shape
    _, sk, hkv, dv = v.shape
    g = hq // hkv
    k = np.repeat(k, g, axis=2)
    v = np.repeat(v, g, axis=2)
    scale = 1 / math.sqrt(d) if softmax_scale is None else softmax_scale
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    diag = i + sk - sq
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if alibi_slopes is not None:
        slopes = np.asarray(alibi_slopes, dtype=np.float64)
        slopes = np.broadcast_to(slopes, (b, hq)) if slopes.ndim == 1 else slopes
        s = s - slopes[:, :, None, None] * np.abs(diag - j)[None, None]
    if bias is not None:
        s = s + np.asarray(bias, dtype=np.float64)
    visible = np.ones((sq, sk), dtype=bool)
    if causal:
        visible &= j <= diag
    if window_size[0] >= 0:
        visible &= j >= diag - window_size[0]
    if window_size[1] >= 0:
        visible &= j <= diag + window_size[1]
    if mask is not None:
        visible = visible & mask
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    if sinks is not None:
        sink = np.asarray(sinks, dtype=np.float64)[None, :, None, None]
        m = np.maximum(m, sink)
    m = np.where(np.isinf(m), 0.0, m)
    p = np.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    if sinks is not None:
        l = l + np.exp(sink - m)
    o = np.einsum("bhqk,bkhd->bhqd", p, v)
    o = np.where(l > 0, o / np.where(l > 0, l, 1), 0.0)
    lse = np.where(l[..., 0] > 0, (m + np.log(np.where(l > 0, l, 1)))[..., 0], -np.inf)
    return o.transpose(0, 2, 1, 3), lse


def bf16_round(a):
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def attention_grads(q, k, v, dout, causal=False, window_size=(-1, -1), softmax_scale=None,
                    softcap=0.0, alibi_slopes=None, mask=None, bias=None):
    """float64 (dq, dk, dv) of attention(q, k, v, ...)'s output against dout, by the
    analytic formulas: P = softmax(S), dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO o
    O)), through softcap (times 1 - tanh^2), dQ = scale dS K, dK = scale dS^T Q; a kv
    head's gradient sums its group of query heads. mask and bias as attention()."""
    q, k, v, dout = (np.asarray(x, dtype=np.float64) for x in (q, k, v, dout))
    b, sq, hq, d = q.shape
    _, sk, hkv, dv = v.shape
    g = hq // hkv
    scale = 1 / math.sqrt(d) if softmax_scale is None else softmax_scale
    kr, vr = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, kr) * scale
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    diag = i + sk - sq
    cap_grad = 1.0
    if softcap:
        cap_grad = 1.0 - np.tanh(s / softcap) ** 2
        s = softcap * np.tanh(s / softcap)
    if alibi_slopes is not None:
        slopes = np.asarray(alibi_slopes, dtype=np.float64)
        slopes = np.broadcast_to(slopes, (b, hq)) if slopes.ndim == 1 else slopes
        s = s - slopes[:, :, None, None] * np.abs(diag - j)[None, None]
    if bias is not None:
        s = s + np.asarray(bias, dtype=np.float64)
    visible = np.ones((sq, sk), dtype=bool)
    if causal:
        visible &= j <= diag
    if window_size[0] >= 0:
        visible &= j >= diag - window_size[0]
    if window_size[1] >= 0:
        visible &= j <= diag + window_size[1]
    if mask is not None:
        visible = visible & mask
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isinf(m), 0.0, m)
    p = np.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    p = np.where(l > 0, p / np.where(l > 0, l, 1), 0.0)  # rows that see no key: P = 0
    do = dout.transpose(0, 2, 1, 3)  # b h q d
    o = np.einsum("bhqk,bkhd->bhqd", p, vr)
    dvr = np.einsum("bhqk,bhqd->bkhd", p, do)
    dp = np.einsum("bhqd,bkhd->bhqk", do, vr)
    ds = p * (dp - (do * o).sum(axis=-1, keepdims=True)) * cap_grad
    dq = np.einsum("bhqk,bkhd->bqhd", ds, kr) * scale
    dkr = np.einsum("bhqk,bqhd->bkhd", ds, q) * scale
    dk = dkr.reshape(b, sk, hkv, g, d).sum(axis=3)
    dvv = dvr.reshape(b, sk, hkv, g, dv).sum(axis=3)
    return dq, dk, dvv
