"""Random cases through the Python entry points on the emulator, against float64.

Each seed draws an arch, a dtype, heads and GQA, a head dim (1..160), lengths and the
modifiers (causal, windows, softcap, ALiBi, a softmax scale; SDPA's mask tensors; varlen
batches with empty sequences; a KV cache with a split count), so combinations that the
focused tests leave out run too. The seeds are fixed: a failure names its case.
"""
import random

import numpy as np
import pytest

import flashjit
from reference import attention, bf16_round

TOL = {"bf16": 3e-2, "f16": 5e-3}
ARCHS = ["gfx1201", "gfx1100", "gfx1151", "gfx942", "gfx950", "gfx90a"]


def draw(seed):
    r = random.Random(seed)
    rng = np.random.default_rng(seed)
    dtype = r.choice(["bf16", "f16"])
    hq, hkv = r.choice([(1, 1), (4, 1), (4, 2), (6, 3), (8, 2)])
    d = r.choice([r.randint(1, 160), 64, 72, 80, 128])

    def make(shape):
        x = rng.uniform(-2, 2, size=shape).astype(np.float32)
        return x.astype(np.float16) if dtype == "f16" else bf16_round(x)
    return r, rng, r.choice(ARCHS), dtype, hq, hkv, d, make


def check(out, lse, ref, ref_lse, dtype, case):
    """out against ref; lse (-inf or FlashAttention's +inf where a query sees no key)."""
    assert not np.isnan(out).any(), case
    err = np.abs(out.astype(np.float64) - ref).max() if ref.size else 0.0
    assert err <= TOL[dtype], (case, err)
    if lse is None:
        return
    lse = np.where(np.isposinf(lse), -np.inf, lse)
    seen = np.isfinite(ref_lse)
    assert np.array_equal(np.isneginf(lse), ~seen), case
    if seen.any():
        assert np.abs(lse[seen] - ref_lse[seen]).max() <= 2e-2, case


def modifiers(r, rng, b, hq):
    window = (-1, -1)
    if r.random() < 0.3:
        window = (r.choice([-1, r.randint(0, 40)]), r.choice([-1, r.randint(0, 40)]))
    alibi = None
    if r.random() < 0.25:
        alibi = rng.uniform(0, 1, size=(hq,) if r.random() < 0.5 else (b, hq)).astype(np.float32)
    return dict(causal=r.random() < 0.5, window_size=window,
                softcap=r.choice([0.0, 0.0, 0.0, r.uniform(0.5, 30)]),
                softmax_scale=r.choice([None, r.uniform(0.05, 1.0)]), alibi_slopes=alibi)


@pytest.mark.parametrize("seed", range(100, 112))
def test_flash_attn_func(seed):
    r, rng, arch, dtype, hq, hkv, d, make = draw(seed)
    b, sq = r.choice([1, 2, 3]), r.choice([1, r.randint(1, 80)])
    sk = r.choice([r.randint(1, 160), sq])
    mods = modifiers(r, rng, b, hq)
    q, k, v = make((b, sq, hq, d)), make((b, sk, hkv, d)), make((b, sk, hkv, d))
    out, lse, _ = flashjit.flash_attn_func(q, k, v, return_attn_probs=True, arch=arch, **mods)
    ref, ref_lse = attention(q, k, v, **mods)
    check(out, lse, ref, ref_lse, dtype, (arch, dtype, b, sq, sk, hq, hkv, d, mods))


@pytest.mark.parametrize("seed", range(200, 208))
def test_flash_attn_with_kvcache(seed):
    r, rng, arch, dtype, hq, hkv, d, make = draw(seed)
    b, sq, cap = r.choice([1, 2, 3]), r.randint(1, 16), r.randint(1, 150)
    mods = modifiers(r, rng, b, hq)
    seqlens = np.array([r.randint(0, cap) for _ in range(b)], dtype=np.int32)
    splits = r.choice([0, 1, 3, 16])
    q, kc, vc = make((b, sq, hq, d)), make((b, cap, hkv, d)), make((b, cap, hkv, d))
    out, lse = flashjit.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens,
                                                num_splits=splits, return_softmax_lse=True,
                                                arch=arch, **mods)
    case = (arch, dtype, sq, seqlens.tolist(), hq, hkv, d, splits, mods)
    for i, n in enumerate(seqlens):
        if n == 0:  # no key: output 0
            assert not np.abs(out[i]).any() and np.isinf(lse[i]).all(), case
            continue
        alibi = mods["alibi_slopes"]
        one = dict(mods, alibi_slopes=alibi if alibi is None or alibi.ndim == 1 else alibi[i:i + 1])
        ref, ref_lse = attention(q[i:i + 1], kc[i:i + 1, :n], vc[i:i + 1, :n], **one)
        check(out[i:i + 1], lse[i:i + 1], ref, ref_lse, dtype, case)


@pytest.mark.parametrize("seed", range(300, 308))
def test_sdpa_with_masks(seed):
    r, rng, arch, dtype, hq, hkv, d, make = draw(seed)
    b, sq, sk = r.choice([1, 2]), r.randint(1, 70), r.randint(1, 90)
    q, k, v = make((b, hq, sq, d)), make((b, hkv, sk, d)), make((b, hkv, sk, d))
    kind = r.choice(["none", "bool", "float"])
    shape = (r.choice([1, b]), r.choice([1, hq]), r.choice([1, sq]), sk)
    mask = None
    if kind == "bool":
        mask = rng.uniform(size=shape) < r.choice([0.3, 0.8, 0.97])
    elif kind == "float":
        mask = rng.normal(size=shape).astype(np.float32) * 2
        mask[rng.uniform(size=shape) < 0.2] = -np.inf
    is_causal = mask is None and r.random() < 0.5
    scale = r.choice([None, r.uniform(0.05, 1.0)])
    out = flashjit.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                                scale=scale, enable_gqa=hq != hkv, arch=arch)
    full = (b, hq, sq, sk)
    keep = np.broadcast_to(mask, full) if kind == "bool" else (
        np.tril(np.ones((sq, sk), dtype=bool)) if is_causal else None)
    bias = np.broadcast_to(mask, full) if kind == "float" else None
    bshd = [x.transpose(0, 2, 1, 3) for x in (q, k, v)]
    ref, _ = attention(*bshd, softmax_scale=scale, mask=keep, bias=bias)
    check(out, None, ref.transpose(0, 2, 1, 3), None, dtype,
          (arch, dtype, b, sq, sk, hq, hkv, d, kind, shape, is_causal, scale))


@pytest.mark.parametrize("seed", range(400, 408))
def test_varlen(seed):
    r, rng, arch, dtype, hq, hkv, d, make = draw(seed)
    b = r.randint(1, 4)
    lq = [r.choice([0, 1, r.randint(0, 40)]) for _ in range(b)]
    lk = [r.choice([0, 1, r.randint(0, 60), lq[i]]) for i in range(b)]
    lq[0], lk[0] = max(lq[0], 1), max(lk[0], 1)  # max_seqlen 0 is refused (checked below)
    cu_q = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    mods = modifiers(r, rng, b, hq)
    mods["alibi_slopes"] = None
    q, k, v = make((cu_q[-1], hq, d)), make((cu_k[-1], hkv, d)), make((cu_k[-1], hkv, d))
    out, lse, _ = flashjit.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk),
                                                  return_attn_probs=True, arch=arch, **mods)
    case = (arch, dtype, lq, lk, hq, hkv, d, mods)
    for i in range(b):
        o, rows = out[cu_q[i]:cu_q[i + 1]], lse[:, cu_q[i]:cu_q[i + 1]]
        if lk[i] == 0:  # a sequence without keys: output 0
            assert not np.abs(o).any() and np.isinf(rows).all(), case
            continue
        ref, ref_lse = attention(q[None, cu_q[i]:cu_q[i + 1]], k[None, cu_k[i]:cu_k[i + 1]],
                                 v[None, cu_k[i]:cu_k[i + 1]], **mods)
        check(o, rows, ref[0], ref_lse[0], dtype, case)


def test_varlen_max_seqlen_below_a_sequence_is_refused_by_name():
    # (max_seqlen 0 is valid where every sequence is empty: test_api_arguments.py)
    q = np.zeros((2, 1, 16), np.float16)
    cu = np.array([0, 2], np.int32)
    for max_q, max_k, name in ((0, 2, "max_seqlen_q"), (2, 0, "max_seqlen_k")):
        with pytest.raises(flashjit.InputError, match=name):
            flashjit.flash_attn_varlen_func(q, q, q, cu, cu, max_q, max_k, arch="gfx1201")
