"""Dropout (issue 15): flash_attn_func / flash_attn_backward / scaled_dot_product_attention
with dropout_p > 0 drop each attention weight with that probability after the softmax
(its row sums and LSE are without dropout) and scale the kept ones by 1 / (1 - p); which
ones is a Philox-4x32-7 draw of (dropout_seed, b, h, q_idx, kv_idx). The float64
reference (reference.py) draws the same elements with its own NumPy Philox. NumPy
inputs run on the emulator, torch ones on CUDA. Tolerances: outputs as
test_numpy_emulator.py (bf16 abs 3e-2, f16 4e-3), gradients within 1e-2 (f16) / 2e-2
(bf16) relative L2 of float64."""
import numpy as np
import pytest

import flashjit
from reference import attention, attention_grads, bf16_round, dropout_weights, scores

ARCH = "gfx1201"


def make(rng, shape, dtype):
    x = rng.uniform(-1, 1, size=shape).astype(np.float32)
    return x.astype(np.float16) if dtype == "f16" else bf16_round(x)


def rel(got, want):
    return np.linalg.norm(np.asarray(got, np.float64) - want) / np.linalg.norm(want)


@pytest.mark.parametrize("b,hq,hkv,sq,sk,d,p,causal,dtype", [
    (2, 4, 2, 40, 64, 64, 0.2, False, "bf16"),
    (1, 2, 1, 70, 50, 32, 0.5, True, "f16"),
])
def test_forward_and_gradients_match_float64(b, hq, hkv, sq, sk, d, p, causal, dtype):
    rng = np.random.default_rng(sq)
    q, k, v = make(rng, (b, sq, hq, d), dtype), make(rng, (b, sk, hkv, d), dtype), \
        make(rng, (b, sk, hkv, d), dtype)
    dout = make(rng, (b, sq, hq, d), dtype)
    z = dropout_weights(p, 12345, 0, b, hq, sq, sk)
    out, lse = flashjit.flash_attn_func(q, k, v, dropout_p=p, dropout_seed=12345, causal=causal,
                                        return_lse=True, arch=ARCH)
    ref, ref_lse = attention(q, k, v, causal=causal, dropout=z)
    tol = 3e-2 if dtype == "bf16" else 4e-3
    np.testing.assert_allclose(np.asarray(out, np.float64), ref, atol=tol, rtol=0)
    _, plain_lse = attention(q, k, v, causal=causal)  # the LSE is the one without dropout
    np.testing.assert_allclose(lse, plain_lse, atol=1e-3, rtol=0)
    grads = flashjit.flash_attn_backward(dout, q, k, v, out, lse, dropout_p=p, causal=causal,
                                         dropout_seed=12345, arch=ARCH)
    want = attention_grads(q, k, v, dout, causal=causal, dropout=z)
    for name, got, w in zip("qkv", grads, want):
        assert rel(got, w) < (2e-2 if dtype == "bf16" else 1e-2), f"d{name}"


def test_the_seed_picks_the_pattern():
    rng = np.random.default_rng(1)
    q = make(rng, (1, 32, 2, 64), "f16")
    run = lambda seed: flashjit.flash_attn_func(q, q, q, dropout_p=0.3, dropout_seed=seed,
                                                arch=ARCH)
    a, again, other = run(7), run(7), run(8)
    np.testing.assert_array_equal(a, again)
    assert np.abs(np.asarray(a, np.float64) - np.asarray(other, np.float64)).max() > 1e-2
    # A seed drawn per call (NumPy's generator) draws new patterns.
    np.random.seed(3)
    first = flashjit.flash_attn_func(q, q, q, dropout_p=0.3, arch=ARCH)
    second = flashjit.flash_attn_func(q, q, q, dropout_p=0.3, arch=ARCH)
    assert np.abs(np.asarray(first, np.float64) - np.asarray(second, np.float64)).max() > 1e-2


def test_bad_arguments_are_refused():
    q = np.zeros((1, 8, 1, 32), np.float16)
    with pytest.raises(ValueError, match=r"dropout_p \(1.0\) must be in \[0, 1\)"):
        flashjit.flash_attn_func(q, q, q, dropout_p=1.0, arch=ARCH)
    with pytest.raises(ValueError, match="dropout_seed"):
        flashjit.flash_attn_func(q, q, q, dropout_p=0.1, dropout_seed=-1, arch=ARCH)
    out, lse = flashjit.flash_attn_func(q, q, q, return_lse=True, arch=ARCH)
    with pytest.raises(ValueError, match="needs the forward's dropout_seed"):
        flashjit.flash_attn_backward(q, q, q, q, out, lse, dropout_p=0.1, arch=ARCH)


def test_autograd_on_cuda_matches_float64():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    rng = np.random.default_rng(5)
    b, hq, hkv, sq, sk, d, p = 2, 8, 2, 200, 300, 64, 0.25
    arrays = [make(rng, s, "f16") for s in ((b, sq, hq, d), (b, sk, hkv, d), (b, sk, hkv, d),
                                             (b, sq, hq, d))]
    q, k, v = (torch.from_numpy(x).cuda().requires_grad_() for x in arrays[:3])
    dout = torch.from_numpy(arrays[3]).cuda()
    out = flashjit.flash_attn_func(q, k, v, dropout_p=p, dropout_seed=99, causal=True)
    out.backward(dout)
    z = dropout_weights(p, 99, 0, b, hq, sq, sk)
    ref, _ = attention(*arrays[:3], causal=True, dropout=z)
    assert np.abs(out.detach().cpu().double().numpy() - ref).max() < 4e-3
    want = attention_grads(*arrays, causal=True, dropout=z)
    for name, x, w in zip("qkv", (q, k, v), want):
        assert rel(x.grad.cpu().double().numpy(), w) < 1e-2, f"d{name}"
    # Without a seed, each call draws its own from torch's generator.
    torch.manual_seed(0)
    with torch.no_grad():
        a = flashjit.scaled_dot_product_attention(q.transpose(1, 2), q.transpose(1, 2),
                                                  q.transpose(1, 2), dropout_p=0.5)
        c = flashjit.scaled_dot_product_attention(q.transpose(1, 2), q.transpose(1, 2),
                                                  q.transpose(1, 2), dropout_p=0.5)
    assert (a - c).abs().max().item() > 1e-2


@pytest.mark.parametrize("sq,sk,d,causal,window,alibi", [
    (200, 333, 64, False, (-1, -1), False),
    (333, 200, 128, True, (-1, -1), False),
    (130, 257, 80, False, (40, 7), True),
])
def test_attn_probs_are_flash_attention_s_dmask_on_cuda(sq, sk, d, causal, window, alibi):
    """return_attn_probs with dropout gives FlashAttention-2's S_dmask: its sign is the
    kernels' pattern (the NumPy reference's draws), and FlashAttention's test recipe (a
    block-wise running max, then the LSE) turns its magnitude back into the softmax."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    rng = np.random.default_rng(11)
    b, hq, hkv, p, seed = 2, 4, 2, 0.17, 1234
    arrays = [make(rng, s, "bf16") for s in ((b, sq, hq, d), (b, sk, hkv, d), (b, sk, hkv, d))]
    q, k, v = (torch.from_numpy(x).cuda().to(torch.bfloat16) for x in arrays)
    slopes = torch.rand(b, hq, device="cuda") * 0.3 if alibi else None
    out, lse, s_dmask = flashjit.flash_attn_func(
        q, k, v, dropout_p=p, causal=causal, window_size=window, alibi_slopes=slopes,
        return_attn_probs=True, dropout_seed=seed)
    assert s_dmask.shape == (b, hq, -(-sq // 128) * 128, -(-sk // 128) * 128)
    assert s_dmask.dtype == torch.bfloat16
    s = s_dmask[..., :sq, :sk].float().cpu().numpy()
    # The visible pairs (bottom-right causal / window), as FlashAttention masks them.
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    diag = i + sk - sq
    right = 0 if causal else window[1]
    visible = np.ones((sq, sk), bool)
    if right >= 0:
        visible &= j <= diag + right
    if window[0] >= 0:
        visible &= j >= diag - window[0]
    z = dropout_weights(p, seed, 0, b, hq, sq, sk)
    keep = s >= 0
    assert (keep == (z > 0))[:, :, visible].all(), "the sign is not the kernels' pattern"
    dropped = 1 - keep[:, :, visible].mean()
    assert abs(dropped - p) < 0.01
    # FlashAttention-2's normalization: block-wise running max from the last block.
    kwargs = dict(causal=causal, window_size=window,
                  alibi_slopes=None if slopes is None else slopes.cpu().numpy())
    ref, _ = attention(*arrays, dropout=z, **kwargs)
    s_ref = scores(*arrays[:2], **kwargs)
    width = 128 if d <= 32 else 64 if d <= 96 else 32 if d <= 128 else 64
    blocks = -(-sk // width)
    padded = np.pad(s_ref, ((0, 0),) * 3 + ((0, blocks * width - sk),), constant_values=-np.inf)
    running = np.maximum.accumulate(padded.reshape(*s_ref.shape[:3], blocks, width)
                                    .max(-1)[..., ::-1], axis=-1)[..., ::-1]
    m = np.repeat(running, width, axis=-1)[..., :sk]
    with np.errstate(divide="ignore", invalid="ignore"):  # rows that see no key: NaN, unused
        lse_ref = np.log(np.exp(s_ref).sum(-1, keepdims=True))
        attn = np.abs(s) * np.where(np.isfinite(m), np.exp(m - lse_ref), 0.0)
        probs = np.exp(s_ref - lse_ref)
    assert np.abs(attn - probs)[:, :, visible].max() < 1e-2
    assert np.abs(out.float().cpu().numpy() - ref).max() < 2e-2


def test_varlen_dropout_through_autograd_and_s_dmask_on_cuda():
    """flash_attn_varlen_func with dropout on torch tensors that require grad: each
    sequence's out and gradients against the float64 reference drawing that sequence's
    pattern (b its index), and S_dmask's sign is that pattern."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from reference import attention_grads
    rng = np.random.default_rng(8)
    lens_q, lens_k, hq, hkv, d, p, seed = [9, 0, 130, 33], [20, 4, 130, 90], 4, 2, 64, 0.2, 5
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    arrays = [make(rng, s, "f16") for s in ((cu_q[-1], hq, d), (cu_k[-1], hkv, d),
                                             (cu_k[-1], hkv, d), (cu_q[-1], hq, d))]
    q, k, v = (torch.from_numpy(x).cuda().requires_grad_() for x in arrays[:3])
    out, lse, s_dmask = flashjit.flash_attn_varlen_func(
        q, k, v, torch.from_numpy(cu_q).cuda(), torch.from_numpy(cu_k).cuda(), max(lens_q),
        max(lens_k), dropout_p=p, causal=True, return_attn_probs=True, dropout_seed=seed)
    out.backward(torch.from_numpy(arrays[3]).cuda())
    assert s_dmask.shape == (len(lens_q), hq, 256, 256)
    z = dropout_weights(p, seed, 0, len(lens_q), hq, max(lens_q), max(lens_k))
    for b in range(len(lens_q)):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if lens_q[b] == 0:
            continue
        drop = z[b:b + 1, :, :lens_q[b], :lens_k[b]]
        x = [a[None, s] for a, s in zip(arrays, (qs, ks, ks, qs))]
        ref, _ = attention(*x[:3], causal=True, dropout=drop)
        assert np.abs(out[qs].detach().cpu().double().numpy() - ref[0]).max() < 4e-3
        want = attention_grads(*x, causal=True, dropout=drop)
        for name, t, s, w in zip("qkv", (q, k, v), (qs, ks, ks), want):
            assert rel(t.grad[s].cpu().double().numpy(), w[0]) < 1e-2, f"d{name} of {b}"
        i, j = np.arange(lens_q[b])[:, None], np.arange(lens_k[b])[None, :]
        visible = j <= i + lens_k[b] - lens_q[b]
        sign = s_dmask[b, :, :lens_q[b], :lens_k[b]].float().cpu().numpy() >= 0
        assert (sign == (drop[0] > 0))[:, visible].all()


def test_varlen_dropout_is_refused_over_a_paged_cache():
    q = np.zeros((2, 2, 32), np.float32)
    cache = np.zeros((1, 16, 2, 32), np.float32)
    cu = np.array([0, 2], np.int32)
    with pytest.raises(NotImplementedError, match="paged KV cache"):
        flashjit.flash_attn_varlen_func(q, cache, cache, cu, cu, 2, 2, dropout_p=0.1,
                                        block_table=np.zeros((1, 1), np.int32), arch=ARCH)
