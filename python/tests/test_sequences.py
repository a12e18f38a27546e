"""flash_attn_varlen_func and flash_attn_with_kvcache on NumPy inputs (the CPU emulator),
each sequence checked against the float64 reference of reference.py run on that
sequence alone. Outputs start as NaN (the package fills them). Tolerances: bf16 abs
3e-2, f16 abs 4e-3; LSE 1e-3."""
import re

import numpy as np
import pytest

import flashjit
from flashjit import _lib, api
from reference import attention, bf16_round

TOL = {"bf16": 3e-2, "f16": 4e-3}


def make(rng, shape, dtype):
    x = rng.uniform(-1, 1, size=shape).astype(np.float32)
    return x.astype(np.float16) if dtype == "f16" else bf16_round(x)


@pytest.mark.parametrize("arch", ["gfx1201", "gfx942"])
@pytest.mark.parametrize("lens_q,lens_k,causal,window,dtype,hq,hkv", [
    ([5, 0, 37, 1], [5, 0, 37, 1], True, (-1, -1), "bf16", 8, 2),
    ([3, 40, 1], [100, 7, 65], False, (16, 3), "f16", 4, 1),
])
def test_varlen_matches_each_sequence(arch, lens_q, lens_k, causal, window, dtype, hq, hkv):
    rng = np.random.default_rng(sum(lens_q))
    d = 64
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = make(rng, (cu_q[-1], hq, d), dtype)
    k = make(rng, (cu_k[-1], hkv, d), dtype)
    v = make(rng, (cu_k[-1], hkv, d), dtype)
    out, lse, _ = flashjit.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, window_size=window,
        return_attn_probs=True, arch=arch)
    assert out.shape == q.shape[:2] + (d,) and lse.shape == (hq, cu_q[-1])
    for b in range(len(lens_q)):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if lens_q[b] == 0:
            continue
        ref, ref_lse = attention(q[None, qs], k[None, ks], v[None, ks], causal=causal,
                                 window_size=window)
        assert np.abs(out[qs].astype(np.float64) - ref[0]).max() <= TOL[dtype]
        want = np.where(np.isneginf(ref_lse[0]), np.inf, ref_lse[0])  # FA: +inf when empty
        got = lse[:, qs]
        assert np.array_equal(np.isinf(got), np.isinf(want))
        assert np.abs(got[np.isfinite(want)] - want[np.isfinite(want)]).max(initial=0) <= 1e-3


@pytest.mark.parametrize("page", [16, 64, 256])
def test_varlen_over_a_paged_cache(page):
    rng = np.random.default_rng(page)
    lens_q, lens_k, hq, hkv, d = [1, 16, 4], [600, 16, 300], 4, 2, 64
    per_seq = (max(lens_k) + page - 1) // page
    blocks = len(lens_q) * per_seq + 3
    table = rng.permutation(blocks)[:len(lens_q) * per_seq].reshape(len(lens_q), per_seq)
    table = table.astype(np.int32)
    kc, vc = make(rng, (blocks, page, hkv, d), "bf16"), make(rng, (blocks, page, hkv, d), "bf16")
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = make(rng, (cu_q[-1], hq, d), "bf16")
    out = flashjit.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, max(lens_q), per_seq * page,
                                          causal=True, block_table=table, arch="gfx1201")
    for b in range(3):
        rows = table[b].repeat(page) * page + np.tile(np.arange(page), per_seq)
        keys = rows[:lens_k[b]]
        kb = kc.reshape(-1, hkv, d)[keys][None]
        vb = vc.reshape(-1, hkv, d)[keys][None]
        ref, _ = attention(q[None, cu_q[b]:cu_q[b + 1]], kb, vb, causal=True)
        assert np.abs(out[cu_q[b]:cu_q[b + 1]].astype(np.float64) - ref[0]).max() <= TOL["bf16"]


def rotate(x, cos, sin, pos, interleaved):
    """The float64 rotary embedding of the reference."""
    rd = 2 * cos.shape[1]
    x = x.astype(np.float64).copy()
    c, s = cos[pos][:, :, None, :].astype(np.float64), sin[pos][:, :, None, :].astype(np.float64)
    if interleaved:
        a, b = x[..., 0:rd:2].copy(), x[..., 1:rd:2].copy()
        x[..., 0:rd:2], x[..., 1:rd:2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., :rd // 2].copy(), x[..., rd // 2:rd].copy()
        x[..., :rd // 2], x[..., rd // 2:rd] = a * c - b * s, a * s + b * c
    return x


@pytest.mark.parametrize("paged,rotary,interleaved,splits,sq", [
    (False, False, True, 0, 2), (True, False, True, 1, 2), (False, True, True, 0, 2),
    (True, True, False, 3, 2), (True, False, True, 1, 1), (False, True, False, 1, 1)])
def test_kvcache_append_then_attend(paged, rotary, interleaved, splits, sq):
    """Append new keys (rotated or not) into a cache (paged or not), then attend. One query
    token with num_splits=1 is GQA-packed decode over one split: the decode kernel alone."""
    rng = np.random.default_rng(11)
    batch, hq, hkv, d, cap, new = 3, 8, 2, 64, 128, 2
    seqlens = np.array([0, 50, 125], dtype=np.int32)
    if paged:
        page = 16
        per_seq = cap // page
        table = rng.permutation(batch * per_seq).reshape(batch, per_seq).astype(np.int32)
        kc = make(rng, (batch * per_seq, page, hkv, d), "bf16")
        vc = make(rng, (batch * per_seq, page, hkv, d), "bf16")
        dense = lambda c: c[table.reshape(-1)].reshape(batch, cap, hkv, d)  # noqa: E731
    else:
        table = None
        kc, vc = make(rng, (batch, cap, hkv, d), "bf16"), make(rng, (batch, cap, hkv, d), "bf16")
        dense = lambda c: c  # noqa: E731
    q = make(rng, (batch, sq, hq, d), "bf16")
    k, v = make(rng, (batch, new, hkv, d), "bf16"), make(rng, (batch, new, hkv, d), "bf16")
    cos = sin = None
    if rotary:
        angles = rng.uniform(0, 3, size=(cap, 16)).astype(np.float32)
        cos, sin = np.cos(angles), np.sin(angles)
    before_k = dense(kc).copy()
    out, lse = flashjit.flash_attn_with_kvcache(
        q, kc, vc, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
        block_table=table, causal=True, rotary_interleaved=interleaved, num_splits=splits,
        return_softmax_lse=True, arch="gfx942")
    pos = seqlens[:, None] + np.arange(new)[None]
    k_ref = rotate(k, cos, sin, pos, interleaved) if rotary else k.astype(np.float64)
    q_ref = rotate(q, cos, sin, pos[:, :sq], interleaved) if rotary else q.astype(np.float64)
    for b in range(batch):  # the new keys were written in place, the rest left alone
        s = seqlens[b]
        assert np.abs(dense(kc)[b, s:s + new] - k_ref[b]).max() <= 1e-2
        assert np.array_equal(dense(kc)[b, :s], before_k[b, :s])
        n = s + new
        ref, ref_lse = attention(q_ref[b:b + 1], dense(kc)[b:b + 1, :n], dense(vc)[b:b + 1, :n],
                                 causal=True)
        assert np.abs(out[b].astype(np.float64) - ref[0]).max() <= TOL["bf16"]
        assert np.abs(lse[b] - ref_lse[0]).max() <= 1e-2
    if sq == 1 and splits == 1:
        plans = [(_lib.lib.fj_attention_explain(h) or b"").decode()
                 for h in api._ATTENTIONS.values()]
        assert any(re.search(r"[1-9][0-9]* ran the decode kernel", p) for p in plans), plans


def test_cache_batch_idx_picks_the_rows():
    rng = np.random.default_rng(12)
    kc, vc = make(rng, (5, 40, 2, 32, ), "f16"), make(rng, (5, 40, 2, 32), "f16")
    q = make(rng, (2, 1, 4, 32), "f16")
    idx = np.array([4, 1], dtype=np.int32)
    out = flashjit.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=np.array([40, 7], np.int32),
                                           cache_batch_idx=idx, arch="gfx1201")
    for b, n in ((0, 40), (1, 7)):
        ref, _ = attention(q[b:b + 1], kc[idx[b]:idx[b] + 1, :n], vc[idx[b]:idx[b] + 1, :n])
        assert np.abs(out[b].astype(np.float64) - ref[0]).max() <= TOL["f16"]


@pytest.mark.parametrize("mutate,error,message", [
    (lambda a: a.update(cu_q=a["cu_q"].astype(np.int64)), TypeError, "cu_seqlens_q must be int32"),
    (lambda a: a.update(cu_q=np.array([0, 4, 2, 10], np.int32)), flashjit.FlashJitError,
     "not nondecreasing"),
    (lambda a: a.update(max_q=2), flashjit.FlashJitError, "max_seqlen_q"),
])
def test_bad_varlen_arguments_are_refused(mutate, error, message):
    a = dict(cu_q=np.array([0, 4, 6, 10], np.int32), max_q=4)
    mutate(a)
    q = np.ones((10, 2, 16), np.float16)
    with pytest.raises(error, match=message):
        flashjit.flash_attn_varlen_func(q, q, q, a["cu_q"], a["cu_q"], a["max_q"], 4,
                                        arch="gfx1201")


def test_block_table_entry_outside_the_cache_is_refused():
    kc = np.ones((4, 16, 1, 16), np.float16)
    q = np.ones((2, 1, 2, 16), np.float16)
    table = np.array([[0], [9]], np.int32)
    with pytest.raises(flashjit.FlashJitError, match=r"block_table\[1\]\[0\] is 9"):
        flashjit.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=np.array([3, 5], np.int32),
                                         block_table=table, arch="gfx1201")


@pytest.mark.parametrize("append", [False, True])
def test_keys_past_the_block_table_are_refused_as_flashattention_does(append):
    """cache_seqlens (+ the appended keys) past the rows block_table's pages address: an
    InputError naming block_table, which is a ValueError and, as FlashAttention's check
    raises, a RuntimeError; the caches are left as they were."""
    rng = np.random.default_rng(23)
    kc, vc = make(rng, (4, 16, 1, 32), "f16"), make(rng, (4, 16, 1, 32), "f16")
    before = kc.copy(), vc.copy()
    q = make(rng, (1, 1, 1, 32), "f16")
    new = make(rng, (1, 1, 1, 32), "f16") if append else None
    seqlens = np.array([16 if append else 17], np.int32)  # one row past the table's page
    for error in (RuntimeError, ValueError, flashjit.InputError):
        with pytest.raises(error, match=r"block_table's pages address .*block_table more"):
            flashjit.flash_attn_with_kvcache(q, kc, vc, k=new, v=new, cache_seqlens=seqlens,
                                             block_table=np.zeros((1, 1), np.int32),
                                             arch="gfx1201")
    assert np.array_equal(kc, before[0]) and np.array_equal(vc, before[1])


@pytest.mark.parametrize("lens_q,lens_k,causal,window,dtype,hq,hkv,d,dv,p", [
    ([5, 0, 37, 1], [5, 0, 37, 1], True, (-1, -1), "bf16", 4, 2, 64, 64, 0.0),
    ([3, 24, 9], [40, 7, 30], False, (10, 3), "f16", 3, 1, 40, 24, 0.0),
    ([1, 130, 0, 77], [64, 130, 5, 200], True, (-1, -1), "bf16", 8, 2, 64, 64, 0.0),
    ([7, 40, 0, 19], [33, 40, 9, 70], True, (-1, -1), "f16", 4, 2, 32, 32, 0.3),
])
def test_varlen_gradients_match_each_sequence(lens_q, lens_k, causal, window, dtype, hq, hkv,
                                              d, dv, p):
    """flash_attn_varlen_backward: each sequence's rows of dq, dk and dv against the float64
    gradients of that sequence alone (reference.attention_grads); rows past the last
    sequence get 0. With dropout, the forward too, and the reference draws sequence b's
    pattern with b as the batch index and positions within the sequence. Tolerance as
    test_backward.py: relative L2 2e-2 (bf16) / 1e-2 (f16), every element within 4e-2 /
    2e-2 of the largest reference magnitude."""
    from reference import attention_grads, dropout_weights
    from test_backward import check
    rng = np.random.default_rng(3 + sum(lens_k))
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    spare = 2  # rows past the last sequence
    q = make(rng, (cu_q[-1] + spare, hq, d), dtype)
    k = make(rng, (cu_k[-1] + spare, hkv, d), dtype)
    v = make(rng, (cu_k[-1] + spare, hkv, dv), dtype)
    dout = make(rng, (cu_q[-1] + spare, hq, dv), dtype)
    out, lse = flashjit.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, window_size=window,
        return_lse=True, arch="gfx1201", dropout_p=p, dropout_seed=41)
    dq, dk, dv_ = flashjit.flash_attn_varlen_backward(
        dout, q, k, v, out, lse, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
        window_size=window, arch="gfx1201", dropout_p=p, dropout_seed=41)
    assert dq.shape == q.shape and dk.shape == k.shape and dv_.shape == v.shape
    z = dropout_weights(p, 41, 0, len(lens_q), hq, max(lens_q), max(lens_k)) if p else None
    for b in range(len(lens_q)):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if lens_q[b] == 0 or lens_k[b] == 0:
            continue
        drop = None if z is None else z[b:b + 1, :, :lens_q[b], :lens_k[b]]
        if p:
            ref, _ = attention(q[None, qs], k[None, ks], v[None, ks], causal=causal,
                               window_size=window, dropout=drop)
            assert np.abs(out[qs].astype(np.float64) - ref[0]).max() <= TOL[dtype]
        want = attention_grads(q[None, qs], k[None, ks], v[None, ks], dout[None, qs],
                               causal=causal, window_size=window, dropout=drop)
        for name, got, ref in zip(("dq", "dk", "dv"), (dq[qs], dk[ks], dv_[ks]), want):
            check(f"{name} of sequence {b}", got, ref[0], dtype)
    assert not np.any(dk[cu_k[-1]:]) and not np.any(dv_[cu_k[-1]:])
    assert not np.any(dq[cu_q[-1]:])


def test_varlen_gradients_with_sinks():
    """flash_attn_varlen_backward with attention sinks: each sequence's dq, dk, dv against
    the float64 reference of that sequence, and dsinks against the sum of the sequences'
    (a head's sink gradient sums over every row of every sequence). Tolerance as
    test_varlen_gradients_match_each_sequence (bf16)."""
    from reference import attention_grads
    from test_backward import check
    rng = np.random.default_rng(29)
    lens_q, lens_k, hq, hkv, d = [17, 0, 40], [30, 6, 40], 4, 2, 32
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = make(rng, (cu_q[-1], hq, d), "bf16")
    k, v = make(rng, (cu_k[-1], hkv, d), "bf16"), make(rng, (cu_k[-1], hkv, d), "bf16")
    dout = make(rng, (cu_q[-1], hq, d), "bf16")
    sinks = rng.uniform(-1, 2, hq).astype(np.float32)
    out, lse, _ = flashjit.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True, sinks=sinks,
        return_attn_probs=True, arch="gfx1201")
    dq, dk, dv, dsinks = flashjit.flash_attn_varlen_backward(
        dout, q, k, v, out, lse, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
        sinks=sinks, arch="gfx1201")
    want_dsinks = np.zeros(hq)
    for b in range(len(lens_q)):
        if lens_q[b] == 0:
            continue
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        want = attention_grads(q[None, qs], k[None, ks], v[None, ks], dout[None, qs],
                               causal=True, sinks=sinks)
        for name, got, ref in zip(("dq", "dk", "dv"), (dq[qs], dk[ks], dv[ks]), want):
            check(f"{name} of sequence {b}", got, ref[0], "bf16")
        want_dsinks += want[3]
    check("dsinks", dsinks, want_dsinks, "bf16")


@pytest.mark.parametrize("append,batch_idx,causal,splits", [
    (False, False, True, 0), (True, False, True, 3), (True, True, False, 1)])
def test_kvcache_leftpad_starts_each_sequence_late(append, batch_idx, causal, splits):
    """cache_leftpad: batch b attends to its cache rows leftpad[b] .. cache_seqlens[b] + new
    - 1, as FlashAttention's test builds its key padding mask; each against the reference
    on those rows alone."""
    rng = np.random.default_rng(21)
    batch, sq, hq, hkv, d, cap = 3, 2, 4, 2, 32, 96
    new = 2 if append else 0
    seqlens = np.array([40, 9, 90], dtype=np.int32)
    leftpad = np.array([13, 0, 89], dtype=np.int32)
    rows = 5 if batch_idx else batch
    kc, vc = make(rng, (rows, cap, hkv, d), "f16"), make(rng, (rows, cap, hkv, d), "f16")
    idx = np.array([3, 0, 4], dtype=np.int32) if batch_idx else None
    q = make(rng, (batch, sq, hq, d), "f16")
    k = make(rng, (batch, new, hkv, d), "f16") if append else None
    v = make(rng, (batch, new, hkv, d), "f16") if append else None
    out = flashjit.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens,
                                           cache_batch_idx=idx, cache_leftpad=leftpad,
                                           causal=causal, num_splits=splits, arch="gfx1201")
    for b in range(batch):
        r = idx[b] if batch_idx else b
        lo, hi = leftpad[b], seqlens[b] + new
        ref, _ = attention(q[b:b + 1], kc[r:r + 1, lo:hi], vc[r:r + 1, lo:hi], causal=causal)
        assert np.abs(out[b].astype(np.float64) - ref[0]).max() <= TOL["f16"], b


def test_kvcache_leftpad_is_checked():
    rng = np.random.default_rng(22)
    kc = make(rng, (2, 16, 1, 32), "f16")
    q = make(rng, (2, 1, 1, 32), "f16")
    with pytest.raises(ValueError, match="cache_leftpad must be within"):
        flashjit.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=np.array([4, 4], np.int32),
                                         cache_leftpad=np.array([0, 5], np.int32),
                                         arch="gfx1201")
    with pytest.raises(NotImplementedError, match="cache_leftpad with a block_table"):
        flashjit.flash_attn_with_kvcache(q, kc, kc, cache_leftpad=np.array([0, 0], np.int32),
                                         block_table=np.zeros((2, 1), np.int32), arch="gfx1201")
