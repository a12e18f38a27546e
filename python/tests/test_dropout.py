"""Dropout (issue 15): flash_attn_func / flash_attn_backward / scaled_dot_product_attention
with dropout_p > 0 drop each attention weight with that probability after the softmax
(its row sums and LSE are without dropout) and scale the kept ones by 1 / (1 - p); which
ones is a Philox-4x32-10 draw of (dropout_seed, b, h, q_idx, kv_idx). The float64
reference (reference.py) draws the same elements with its own NumPy Philox. NumPy
inputs run on the emulator, torch ones on CUDA. Tolerances: outputs as
test_numpy_emulator.py (bf16 abs 3e-2, f16 4e-3), gradients within 1e-2 (f16) / 2e-2
(bf16) relative L2 of float64."""
import numpy as np
import pytest

import flashjit
from reference import attention, attention_grads, bf16_round, dropout_weights

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
