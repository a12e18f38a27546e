"""A float64 NumPy reference with FlashAttention's conventions (BSHD, bottom-right causal)."""
import math

import numpy as np


def _philox(c, k0, k1, rounds):
    """Philox-4x32 with `rounds` rounds (Random123) of counters c (4 uint64 arrays holding
    uint32 values) under key (k0, k1), vectorized."""
    M = np.uint64(0xFFFFFFFF)
    c = [np.asarray(x, dtype=np.uint64) & M for x in c]
    k0, k1 = np.uint64(k0) & M, np.uint64(k1) & M
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + np.uint64(0x9E3779B9)) & M, (k1 + np.uint64(0xBB67AE85)) & M
        p0 = np.uint64(0xD2511F53) * c[0]
        p1 = np.uint64(0xCD9E8D57) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & M, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & M]
    return c


def dropout_weights(p, seed, offset, b, h, sq, sk):
    """[b, h, sq, sk] float64: 0 where flashjit drops P[b, h, i, j], 1 / (1 - p) where it
    keeps it, as ir::philox_uniform draws: Philox-4x32-10 of (seed, offset) gives the key,
    Philox-4x32-7 of (j // 8, i, h, b) 4 words, and key j takes 16-bit half j % 2 of word j % 8 // 2 over
    2^16, compared in float32 with p."""
    key = _philox([seed & 0xFFFFFFFF, seed >> 32, offset & 0xFFFFFFFF, offset >> 32],
                  0x2545F491, 0x9E3779B9, 10)
    B, H, I, J = np.meshgrid(np.arange(b), np.arange(h), np.arange(sq), np.arange(sk),
                             indexing="ij")
    words = _philox([J // 8, I, H, B], int(key[0]), int(key[1]), 7)
    slot = (J % 8).astype(np.uint64)
    word = np.choose((slot // np.uint64(2)).astype(np.intp), words)
    bits = (word >> (np.uint64(16) * (slot % np.uint64(2)))) & np.uint64(0xFFFF)
    u = bits.astype(np.float64) * 2.0 ** -16
    return np.where(u >= float(np.float32(p)), 1.0 / (1.0 - p), 0.0)


def scores(q, k, causal=False, window_size=(-1, -1), softmax_scale=None, softcap=0.0,
           alibi_slopes=None, mask=None, bias=None):
    """[b, h, sq, sk] float64: the scaled scores after softcap, ALiBi and bias, -inf where
    hidden (attention()'s arguments)."""
    q, k = (np.asarray(x, dtype=np.float64) for x in (q, k))
    b, sq, hq, d = q.shape
    _, sk, hkv, _ = k.shape
    k = np.repeat(k, hq // hkv, axis=2)
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
    return np.where(visible, s, -np.inf)


def attention(q, k, v, causal=False, window_size=(-1, -1), softmax_scale=None, softcap=0.0,
              alibi_slopes=None, mask=None, sinks=None, bias=None, dropout=None):
    """mask: bool, broadcast to [b, h, sq, sk] (False hides); bias: added to the scaled
    scores after ALiBi, broadcast likewise (SDPA's float attn_mask); alibi_slopes [h] or
    [b, h]; sinks [h] (a logit per head in the denominator, without a value); dropout:
    dropout_weights() applied to P after the row sums (the LSE is without it)."""
    v = np.asarray(v, dtype=np.float64)
    hq, hkv = np.shape(q)[2], v.shape[2]
    v = np.repeat(v, hq // hkv, axis=2)
    s = scores(q, k, causal, window_size, softmax_scale, softcap, alibi_slopes, mask, bias)
    m = s.max(axis=-1, keepdims=True)
    if sinks is not None:
        sink = np.asarray(sinks, dtype=np.float64)[None, :, None, None]
        m = np.maximum(m, sink)
    m = np.where(np.isinf(m), 0.0, m)
    p = np.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    if sinks is not None:
        l = l + np.exp(sink - m)
    o = np.einsum("bhqk,bkhd->bhqd", p * (1.0 if dropout is None else dropout), v)
    o = np.where(l > 0, o / np.where(l > 0, l, 1), 0.0)
    lse = np.where(l[..., 0] > 0, (m + np.log(np.where(l > 0, l, 1)))[..., 0], -np.inf)
    return o.transpose(0, 2, 1, 3), lse


def bf16_round(a):
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def attention_grads(q, k, v, dout, causal=False, window_size=(-1, -1), softmax_scale=None,
                    softcap=0.0, alibi_slopes=None, mask=None, bias=None, dropout=None,
                    sinks=None):
    """float64 (dq, dk, dv) of attention(q, k, v, ...)'s output against dout, by the
    analytic formulas: P = softmax(S), dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO o
    O)), through softcap (times 1 - tanh^2), dQ = scale dS K, dK = scale dS^T Q; a kv
    head's gradient sums its group of query heads. mask, bias and dropout as attention():
    with dropout weights Z, O = (P o Z) V, dV = (P o Z)^T dO, dS = P (dP o Z - rowsum(dO o
    O)). With sinks [h] (a logit per head in the denominator, no value) the result is
    (dq, dk, dv, dsinks): dsink_h = -sum over the head's rows of P_sink rowsum(dO o O)."""
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
    if sinks is not None:
        sink = np.asarray(sinks, dtype=np.float64)[None, :, None, None]
        m = np.maximum(m, sink)
    m = np.where(np.isinf(m), 0.0, m)
    p = np.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    if sinks is not None:
        l = l + np.exp(sink - m)
        p_sink = np.where(l > 0, np.exp(sink - m) / np.where(l > 0, l, 1), 0.0)
    p = np.where(l > 0, p / np.where(l > 0, l, 1), 0.0)  # rows that see no key: P = 0
    do = dout.transpose(0, 2, 1, 3)  # b h q d
    z = 1.0 if dropout is None else dropout
    o = np.einsum("bhqk,bkhd->bhqd", p * z, vr)
    dvr = np.einsum("bhqk,bhqd->bkhd", p * z, do)
    dp = np.einsum("bhqd,bkhd->bhqk", do, vr) * z
    ds = p * (dp - (do * o).sum(axis=-1, keepdims=True)) * cap_grad
    dq = np.einsum("bhqk,bkhd->bqhd", ds, kr) * scale
    dkr = np.einsum("bhqk,bqhd->bkhd", ds, q) * scale
    dk = dkr.reshape(b, sk, hkv, g, d).sum(axis=3)
    dvv = dvr.reshape(b, sk, hkv, g, dv).sum(axis=3)
    if sinks is None:
        return dq, dk, dvv
    dsinks = -(p_sink[..., 0] * (do * o).sum(axis=-1)).sum(axis=(0, 2))
    return dq, dk, dvv, dsinks
