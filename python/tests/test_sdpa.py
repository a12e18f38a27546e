"""flashjit.scaled_dot_product_attention: PyTorch SDPA's signature and semantics (BHSD,
top-left is_causal, enable_gqa, bool and additive attn_mask tensors), on NumPy arrays through the emulator against the float64
reference, and on CUDA against torch.nn.functional.scaled_dot_product_attention (forward
and gradients). Inputs fresh random in [-1, 1); tolerances as test_numpy_emulator.py
(bf16 abs 3e-2, f16 4e-3) and test_torch_grad.py (gradients within 2e-2 / 1e-2 relative
L2 of float64)."""
import math

import numpy as np
import pytest

import flashjit
from reference import attention, attention_grads, bf16_round

ARCH = "gfx1201"


def make(rng, shape, dtype):
    x = rng.uniform(-1, 1, size=shape).astype(np.float32)
    return x.astype(np.float16) if dtype == "f16" else bf16_round(x)


@pytest.mark.parametrize("b,hq,hkv,sq,sk,d,dtype,causal", [
    (1, 2, 2, 40, 72, 64, "f16", True),    # top-left: query i sees keys 0..i
    (2, 4, 2, 70, 30, 32, "bf16", True),   # sq > sk, GQA
    (1, 2, 1, 33, 33, 48, "f16", False),
])
def test_matches_float64_with_sdpa_semantics(b, hq, hkv, sq, sk, d, dtype, causal):
    rng = np.random.default_rng(sq + sk)
    q, k, v = make(rng, (b, hq, sq, d), dtype), make(rng, (b, hkv, sk, d), dtype), \
        make(rng, (b, hkv, sk, d), dtype)
    out = flashjit.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                enable_gqa=hq != hkv, arch=ARCH)
    assert out.shape == (b, hq, sq, d)
    mask = np.tril(np.ones((sq, sk), dtype=bool)) if causal else None  # top-left
    t = (lambda x: x.transpose(0, 2, 1, 3))
    ref, _ = attention(t(q), t(k), t(v), mask=mask)
    tol = 3e-2 if dtype == "bf16" else 4e-3
    np.testing.assert_allclose(np.asarray(out, np.float64), t(ref), atol=tol, rtol=0)


def test_three_d_inputs_scale_and_refusals():
    rng = np.random.default_rng(5)
    q = make(rng, (2, 24, 32), "f16")
    out = flashjit.scaled_dot_product_attention(q, q, q, scale=0.3, arch=ARCH)
    ref, _ = attention(q[None].transpose(0, 2, 1, 3), q[None].transpose(0, 2, 1, 3),
                       q[None].transpose(0, 2, 1, 3), softmax_scale=0.3)
    np.testing.assert_allclose(np.asarray(out, np.float64), ref[0].transpose(1, 0, 2),
                               atol=4e-3, rtol=0)
    kv = make(rng, (1, 1, 24, 32), "f16")
    with pytest.raises(ValueError, match="enable_gqa=True"):
        flashjit.scaled_dot_product_attention(q[None], kv, kv, arch=ARCH)
    with pytest.raises(ValueError, match=r"attn_mask of shape \(23, 24\) does not broadcast"):
        flashjit.scaled_dot_product_attention(q, q, q, attn_mask=np.ones((23, 24), bool),
                                              arch=ARCH)
    with pytest.raises(TypeError, match="attn_mask must be bool"):
        flashjit.scaled_dot_product_attention(q, q, q, attn_mask=np.ones((24, 24), np.int32),
                                              arch=ARCH)
    with pytest.raises(ValueError, match="dropout_p"):
        flashjit.scaled_dot_product_attention(q, q, q, dropout_p=1.5, arch=ARCH)


def test_any_leading_dims_as_in_pytorch():
    """[..., heads, seqlen, head_dim]: 2-D (no batch or heads) and 5-D inputs, a mask over
    the leading dims, against float64 on the same data as 4-D; bad dims refused by name."""
    rng = np.random.default_rng(8)
    q, k, v = (make(rng, (2, 3, 2, 20, 32), "bf16") for _ in range(3))
    mask = rng.uniform(size=(3, 1, 20, 20)) < 0.8  # broadcast over the first dim and heads
    out = flashjit.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True,
                                                arch=ARCH)
    assert out.shape == (2, 3, 2, 20, 32)
    t = (lambda x: x.reshape(6, 2, 20, 32).transpose(0, 2, 1, 3))
    full = np.broadcast_to(mask, (2, 3, 2, 20, 20)).reshape(6, 2, 20, 20) & np.tril(
        np.ones((20, 20), bool))
    ref, _ = attention(t(q), t(k), t(v), mask=full)
    np.testing.assert_allclose(np.asarray(out, np.float64).reshape(6, 2, 20, 32),
                               ref.transpose(0, 2, 1, 3), atol=3e-2, rtol=0)
    out2 = flashjit.scaled_dot_product_attention(q[0, 0, 0], k[0, 0, 0], v[0, 0, 0], arch=ARCH)
    ref2, _ = attention(*(x[0, 0, 0][None, :, None] for x in (q, k, v)))
    assert out2.shape == (20, 32)
    np.testing.assert_allclose(np.asarray(out2, np.float64), ref2[0, :, 0], atol=3e-2, rtol=0)
    with pytest.raises(ValueError, match="one number of dims, at least 2"):
        flashjit.scaled_dot_product_attention(q[0, 0, 0, 0], k[0, 0, 0, 0], v[0, 0, 0, 0],
                                              arch=ARCH)
    with pytest.raises(ValueError, match="must share their leading dims"):
        flashjit.scaled_dot_product_attention(q, k[:1], v[:1], arch=ARCH)
    with pytest.raises(ValueError, match="more dims than the inputs"):
        flashjit.scaled_dot_product_attention(q[0], k[0], v[0], attn_mask=mask[None], arch=ARCH)


@pytest.mark.parametrize("sq,sk,gqa", [(128, 300, False), (200, 90, True), (256, 256, False)])
def test_matches_torch_sdpa_forward_and_backward(sq, sk, gqa):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    F = torch.nn.functional
    torch.manual_seed(sq)
    b, hq, hkv, d = 2, 8, 2 if gqa else 8, 64
    q = (torch.rand(b, hq, sq, d, device="cuda") * 2 - 1).bfloat16().requires_grad_()
    k = (torch.rand(b, hkv, sk, d, device="cuda") * 2 - 1).bfloat16().requires_grad_()
    v = (torch.rand(b, hkv, sk, d, device="cuda") * 2 - 1).bfloat16().requires_grad_()
    dout = (torch.rand(b, hq, sq, d, device="cuda") * 2 - 1).bfloat16()
    out = flashjit.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    out.backward(dout)
    mine = [x.grad.double() for x in (q, k, v)]
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    kr = k64.repeat_interleave(hq // hkv, dim=1)
    vr = v64.repeat_interleave(hq // hkv, dim=1)
    ref = F.scaled_dot_product_attention(q64, kr, vr, is_causal=True)  # top-left, math
    ref.backward(dout.double())
    assert (out.double() - ref).abs().max().item() < 3e-2
    for name, got, want in zip("qkv", mine, (q64.grad, k64.grad, v64.grad)):
        err = ((got - want).norm() / want.norm()).item()
        assert err < 2e-2, f"d{name}: relative L2 error {err:.3g}"
    assert math.isfinite(out.float().sum().item())


def mask_case(rng, kind, shape, dtype):
    """An SDPA attn_mask of `shape`: bool with 1 in 4 False, or values in [-2, 1) with
    1 in 5 -inf, every query keeping its first key (PyTorch's math backend gives NaN
    for a query whose keys are all masked; flashjit gives 0)."""
    u = rng.uniform(size=shape)
    if kind == "bool":
        m = u >= 0.25
        m[..., 0] = True
        return m
    m = np.where(u < 0.2, -np.inf, 3 * u - 2).astype(np.float32)
    m[..., 0] = 0.5
    return m.astype(dtype)


@pytest.mark.parametrize("kind,mshape,causal,dtype", [
    ("bool", (2, 4, 40, 72), False, "bf16"),         # full [b, h, sq, sk]
    ("bool", (2, 1, 1, 72), True, "f16"),            # key padding, with is_causal
    ("float32", (40, 72), False, "bf16"),            # [sq, sk], broadcast over b and h
    ("float16", (1, 4, 40, 72), False, "f16"),       # per head
])
def test_attn_mask_matches_float64(kind, mshape, causal, dtype):
    rng = np.random.default_rng(len(mshape) * 7 + causal)
    b, hq, hkv, sq, sk, d = 2, 4, 2, 40, 72, 64
    q, k, v = make(rng, (b, hq, sq, d), dtype), make(rng, (b, hkv, sk, d), dtype), \
        make(rng, (b, hkv, sk, d), dtype)
    mask = mask_case(rng, kind, mshape, kind if kind != "bool" else None)
    out = flashjit.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                enable_gqa=True, arch=ARCH)
    t = (lambda x: x.transpose(0, 2, 1, 3))
    top_left = np.tril(np.ones((sq, sk), dtype=bool)) if causal else np.ones((sq, sk), bool)
    if kind == "bool":
        ref, _ = attention(t(q), t(k), t(v), mask=top_left & mask)
    else:
        ref, _ = attention(t(q), t(k), t(v), mask=top_left,
                           bias=np.asarray(mask, np.float64))
    tol = 3e-2 if dtype == "bf16" else 4e-3
    np.testing.assert_allclose(np.asarray(out, np.float64), t(ref), atol=tol, rtol=0)


@pytest.mark.parametrize("arch", ["gfx1201", "gfx942", "gfx1100"])
@pytest.mark.parametrize("kind,view", [
    ("float32", "transposed"),  # key stride sq: one element per load
    ("float16", "offset"),      # a view one element into its rows (odd row stride 73)
    ("bool", "offset"),
])
def test_attn_mask_views_match_float64(arch, kind, view):
    """Masks whose rows a kernel cannot read a run at a time (the key stride is not 1, or
    a row starts off the run's alignment) give the same results, element by element."""
    rng = np.random.default_rng(len(kind) + len(view))
    b, hq, sq, sk, d = 1, 2, 40, 72, 32
    q, k, v = (make(rng, (b, hq, s, d), "f16") for s in (sq, sk, sk))
    keep = True if kind == "bool" else 0.5  # key 0 of every query (mask_case's rule)
    if view == "transposed":
        stored = mask_case(rng, kind, (sk, sq), np.float32)
        stored[0, :] = keep
        mask = stored.T
        assert mask.strides[1] != mask.itemsize
    else:
        stored = mask_case(rng, kind, (sq, sk + 1), np.float16)
        stored[:, 1] = keep
        mask = stored[:, 1:]
        assert mask.ctypes.data % 4 != 0 or mask.dtype == bool
    out = flashjit.scaled_dot_product_attention(q, k, v, attn_mask=mask, arch=arch)
    t = (lambda x: x.transpose(0, 2, 1, 3))
    if kind == "bool":
        ref, _ = attention(t(q), t(k), t(v), mask=mask)
    else:
        ref, _ = attention(t(q), t(k), t(v), bias=np.asarray(mask, np.float64))
    np.testing.assert_allclose(np.asarray(out, np.float64), t(ref), atol=4e-3, rtol=0)


@pytest.mark.parametrize("view", ["dense", "transposed", "offset"])
def test_attn_mask_gradients_match_float64(view):
    """The backward reads the mask in dQ's tiles (rows of queries) and dK/dV's transposed
    ones (rows of keys): a run at a time along whichever axis has stride 1, else element by
    element (a transposed mask; one a f16 element into rows of odd stride)."""
    rng = np.random.default_rng(11)
    b, hq, hkv, sq, sk, d = 1, 4, 2, 48, 40, 32
    q, k, v, dout = (make(rng, (b, s, h, d), "f16") for s, h in
                     ((sq, hq), (sk, hkv), (sk, hkv), (sq, hq)))
    if view == "dense":
        bias = mask_case(rng, "float32", (b, 1, sq, sk), np.float32)
    elif view == "transposed":
        bias = mask_case(rng, "float32", (sk, sq), np.float32).T
        bias[:, 0] = 0.5
    else:
        stored = mask_case(rng, "float16", (sq, sk + 1), np.float16)
        stored[:, 1] = 0.5
        bias = stored[:, 1:]
    out, lse = flashjit.flash_attn_func(q, k, v, attn_mask=bias, return_lse=True, arch=ARCH)
    dq, dk, dv = flashjit.flash_attn_backward(dout, q, k, v, out, lse, attn_mask=bias, arch=ARCH)
    want = attention_grads(q, k, v, dout, bias=np.asarray(bias, np.float64))
    for name, got, ref in zip("qkv", (dq, dk, dv), want):
        err = np.linalg.norm(np.asarray(got, np.float64) - ref) / np.linalg.norm(ref)
        assert err < 1e-2, f"d{name}: relative L2 error {err:.3g}"


def expect_torch_sdpa_float64(torch, q, k, v, dout, mask):
    """flashjit's SDPA forward and backward with `mask` (bool, or added) against PyTorch's
    SDPA in float64: O within 3e-2, each gradient within 2e-2 relative L2."""
    out = flashjit.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.backward(dout)
    mine = [x.grad.double() for x in (q, k, v)]
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(
        q64, k64, v64, attn_mask=mask if mask.dtype == torch.bool else mask.double())
    ref.backward(dout.double())
    assert (out.double() - ref).abs().max().item() < 3e-2
    for name, got, want in zip("qkv", mine, (q64.grad, k64.grad, v64.grad)):
        err = ((got - want).norm() / want.norm()).item()
        assert err < 2e-2, f"d{name}: relative L2 error {err:.3g}"


@pytest.mark.parametrize("kind", ["bool", "float32", "bfloat16"])
def test_attn_mask_matches_torch_sdpa_forward_and_backward(kind):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    torch.manual_seed(3)
    b, hq, sq, sk, d = 2, 8, 200, 333, 128
    q = (torch.rand(b, hq, sq, d, device="cuda") * 2 - 1).bfloat16().requires_grad_()
    k = (torch.rand(b, hq, sk, d, device="cuda") * 2 - 1).bfloat16().requires_grad_()
    v = (torch.rand(b, hq, sk, d, device="cuda") * 2 - 1).bfloat16().requires_grad_()
    dout = (torch.rand(b, hq, sq, d, device="cuda") * 2 - 1).bfloat16()
    rng = np.random.default_rng(4)
    shape = (b, 1, sq, sk) if kind == "bool" else (sq, sk)
    m = mask_case(rng, "bool" if kind == "bool" else "float32", shape, np.float32)
    mask = torch.from_numpy(m).cuda()
    if kind == "bfloat16":
        mask = mask.bfloat16()
    expect_torch_sdpa_float64(torch, q, k, v, dout, mask)
    with pytest.raises(NotImplementedError, match="attn_mask requires grad"):
        flashjit.scaled_dot_product_attention(
            q, k, v, attn_mask=torch.zeros(sq, sk, device="cuda", requires_grad=True))


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("kind", ["bool", "bfloat16"])
def test_padded_causal_masks_match_torch_sdpa(kind, d):
    """The mask transformers builds for a right-padded batch in a causal model: [B, 1, S, S],
    causal and each batch's keys past its length hidden (additive: 0 kept, -inf hidden, 0.5
    on a stripe), so the block summary has empty, full and mixed blocks. Forward and backward
    against SDPA in float64 on the GPU."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    torch.manual_seed(5)
    b, h, s = 3, 4, 700
    lens = torch.tensor([700, 450, 129], device="cuda")
    i = torch.arange(s, device="cuda")[:, None]
    j = torch.arange(s, device="cuda")[None, :]
    keep = ((j <= i)[None] & (j[None] < lens[:, None, None]))[:, None]
    if kind == "bool":
        mask = keep
    else:
        stripe = torch.where(((j // 32 + i // 16) % 7 == 0), 0.5, 0.0)
        mask = torch.where(keep, stripe[None, None], float("-inf")).bfloat16()
    q, k, v = ((torch.rand(b, h, s, d, device="cuda") * 2 - 1).bfloat16().requires_grad_()
               for _ in range(3))
    dout = (torch.rand(b, h, s, d, device="cuda") * 2 - 1).bfloat16()
    expect_torch_sdpa_float64(torch, q, k, v, dout, mask)
