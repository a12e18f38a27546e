"""flash_attn_varlen_func, flash_attn_with_kvcache and the score modifiers on torch CUDA
tensors (GPU machines), each sequence against SDPA in float64 on that sequence alone.
Tolerances: bf16 abs 3e-2, f16 abs 4e-3."""
import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
import torch.nn.functional as F  # noqa: E402

import flashjit  # noqa: E402

TOL = {torch.bfloat16: 3e-2, torch.float16: 4e-3}


def reference(q, k, v, causal, extra=None):
    """q [sq, hq, d], k/v [sk, hkv, d] of one sequence; extra(s, i, j) edits the scores."""
    sq, hq, d = q.shape
    sk, hkv = k.shape[0], k.shape[1]
    q, k, v = (x.double().transpose(0, 1) for x in (q, k, v))
    k, v = k.repeat_interleave(hq // hkv, 0), v.repeat_interleave(hq // hkv, 0)
    s = q @ k.transpose(1, 2) / math.sqrt(d)
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    if extra is not None:
        s = extra(s, i, j)
    if causal:
        s = s.masked_fill(j > i + sk - sq, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return (p @ v).transpose(0, 1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_varlen(dtype):
    lens = [1, 700, 0, 129, 64]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    total = int(cu[-1])
    q = torch.randn(total, 16, 128, device="cuda", dtype=dtype)
    k = torch.randn(total, 4, 128, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    with torch.no_grad():
        out = flashjit.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    for b in range(len(lens)):
        s = slice(int(cu[b]), int(cu[b + 1]))
        if lens[b]:
            ref = reference(q[s], k[s], v[s], True)
            assert (out[s].double() - ref).abs().max().item() <= TOL[dtype]


@pytest.mark.parametrize("page", [16, 256])
def test_kvcache_paged_append(page):
    batch, cap, hkv, hq, d = 4, 1024, 2, 16, 64
    per_seq = cap // page
    table = torch.randperm(batch * per_seq, device="cuda").to(torch.int32).view(batch, per_seq)
    kc = torch.randn(batch * per_seq, page, hkv, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    seqlens = torch.tensor([0, 500, 1000, 17], dtype=torch.int32, device="cuda")
    q = torch.randn(batch, 1, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, 1, hkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out = flashjit.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens,
                                           block_table=table, causal=True)
    dense_k = kc[table.view(-1).long()].view(batch, cap, hkv, d)
    dense_v = vc[table.view(-1).long()].view(batch, cap, hkv, d)
    for b in range(batch):
        n = int(seqlens[b]) + 1
        assert torch.equal(dense_k[b, n - 1], k[b, 0])
        ref = reference(q[b], dense_k[b, :n], dense_v[b, :n], True)
        assert (out[b].double() - ref).abs().max().item() <= TOL[torch.bfloat16]


def test_softcap_alibi_and_mask_mod():
    q = torch.randn(2, 200, 8, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 300, 2, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    slopes = torch.rand(8, device="cuda", dtype=torch.float32)
    out = flashjit.flash_attn_func(q, k, v, causal=True, softcap=10.0, alibi_slopes=slopes,
                                   mask_mod="kv_idx % 7 != 3")

    def extra(s, i, j):
        s = 10.0 * torch.tanh(s / 10.0)
        s = s - slopes.double()[:, None, None] * (i + 100 - j).abs()
        return s.masked_fill(j % 7 == 3, float("-inf"))
    for b in range(2):
        ref = reference(q[b], k[b], v[b], True, extra)
        assert (out[b].double() - ref).abs().max().item() <= TOL[torch.bfloat16]


def test_repeated_decode_steps_take_the_fast_path_and_see_new_data(monkeypatch):
    """A decode step through flash_attn_with_kvcache that appends and rotates nothing,
    repeated with the same shapes and arguments, skips the Python argument work
    (_kv_fast_forward), yet reads each call's cache_seqlens, q and block table; an int
    count, a paged cache and a call with LSE each get their own entry."""
    from flashjit import sequences
    full = []
    real = sequences._modifiers
    monkeypatch.setattr(sequences, "_modifiers", lambda *a, **kw: full.append(1) or real(*a, **kw))
    torch.manual_seed(11)
    batch, cap, hkv, hq, d = 3, 640, 2, 8, 128
    kc = torch.randn(batch, cap, hkv, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    for step, counts in enumerate(([10, 300, 599], [11, 301, 600], [0, 1, 2])):
        q = torch.randn(batch, 1, hq, d, device="cuda", dtype=torch.bfloat16)
        seqlens = torch.tensor(counts, dtype=torch.int32, device="cuda")
        out = flashjit.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens)
        out2, lse = flashjit.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens,
                                                     return_softmax_lse=True)
        fixed = flashjit.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=250)
        for b in range(batch):
            for o, n in ((out, counts[b]), (out2, counts[b]), (fixed, 250)):
                if n:
                    ref = reference(q[b], kc[b, :n], vc[b, :n], False)
                    assert (o[b].double() - ref).abs().max().item() <= TOL[torch.bfloat16]
                else:
                    assert (o[b] == 0).all()
        assert lse.shape == (batch, hq, 1)
    assert len(full) == 3, "each kind of call took the full path once, then repeated"
    # A paged cache: each step's block table is read.
    page = 64
    pages = batch * cap // page
    kp, vp = kc.view(pages, page, hkv, d), vc.view(pages, page, hkv, d)
    q = torch.randn(batch, 1, hq, d, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.tensor([200, 5, 320], dtype=torch.int32, device="cuda")
    for _ in range(2):
        table = torch.randperm(pages, device="cuda").to(torch.int32).view(batch, -1)[:, :5]
        table = table.contiguous()
        out = flashjit.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=seqlens,
                                               block_table=table)
        dense_k, dense_v = (x[table.view(-1).long()].view(batch, 5 * page, hkv, d)
                            for x in (kp, vp))
        for b in range(batch):
            n = int(seqlens[b])
            ref = reference(q[b], dense_k[b, :n], dense_v[b, :n], False)
            assert (out[b].double() - ref).abs().max().item() <= TOL[torch.bfloat16]
    assert len(full) == 4
    # Appending steps, dense and paged: each step's new k and v land at its counts.
    for paged in (False, True):
        seqlens = torch.tensor([3, 100, 0], dtype=torch.int32, device="cuda")
        kd, vd = kc.clone(), vc.clone()
        table = torch.arange(pages, device="cuda", dtype=torch.int32).flip(0).view(batch, -1)
        caches = (kd.view(pages, page, hkv, d), vd.view(pages, page, hkv, d)) if paged \
            else (kd, vd)
        for step in range(3):
            q = torch.randn(batch, 1, hq, d, device="cuda", dtype=torch.bfloat16)
            k1, v1 = (torch.randn(batch, 1, hkv, d, device="cuda", dtype=torch.bfloat16)
                      for _ in "kv")
            out = flashjit.flash_attn_with_kvcache(
                q, *caches, k=k1, v=v1, cache_seqlens=seqlens,
                block_table=table if paged else None)
            dense_k, dense_v = ((x[table.view(-1).long()].view(batch, cap, hkv, d)
                                 for x in caches) if paged else caches)
            for b in range(batch):
                n = int(seqlens[b]) + 1
                assert torch.equal(dense_k[b, n - 1], k1[b, 0])
                assert torch.equal(dense_v[b, n - 1], v1[b, 0])
                ref = reference(q[b], dense_k[b, :n], dense_v[b, :n], False)
                assert (out[b].double() - ref).abs().max().item() <= TOL[torch.bfloat16]
            seqlens += 1
    assert len(full) == 6, "each appending kind of call took the full path once"
