"""FlashAttention's packed entry points (flash_attn_qkvpacked_func, flash_attn_kvpacked_func
and their varlen forms) on NumPy arrays: the emitted AMD kernel on the CPU emulator, against
the float64 reference, from views of one packed array (no copy). Inputs are fresh random
values in [-1, 1); tolerances as test_numpy_emulator.py: bf16 abs 3e-2, f16 abs 4e-3, LSE
abs 1e-3."""
import numpy as np
import pytest

import flashjit
from reference import attention, bf16_round

TOL = {"bf16": 3e-2, "f16": 4e-3}
ARCH = "gfx1201"


def make(rng, shape, dtype):
    x = rng.uniform(-1, 1, size=shape).astype(np.float32)
    return x.astype(np.float16) if dtype == "f16" else bf16_round(x)


def close(out, ref, dtype):
    assert not np.isnan(out).any()
    assert np.abs(out.astype(np.float64) - ref).max() <= TOL[dtype]


@pytest.mark.parametrize("dtype,causal", [("f16", True), ("bf16", False)])
def test_qkvpacked_matches_the_reference(dtype, causal):
    rng = np.random.default_rng(11)
    qkv = make(rng, (2, 37, 3, 4, 64), dtype)
    out, lse, none = flashjit.flash_attn_qkvpacked_func(qkv, causal=causal,
                                                        return_attn_probs=True, arch=ARCH)
    q, k, v = (qkv[:, :, i] for i in range(3))
    ref, ref_lse = attention(q, k, v, causal=causal)
    assert out.shape == (2, 37, 4, 64) and none is None
    close(out, ref, dtype)
    assert np.abs(lse - ref_lse).max() <= 1e-3


def test_kvpacked_with_gqa_and_a_window_matches_the_reference():
    rng = np.random.default_rng(12)
    q = make(rng, (1, 20, 6, 80), "bf16")
    kv = make(rng, (1, 50, 2, 2, 80), "bf16")
    out = flashjit.flash_attn_kvpacked_func(q, kv, window_size=(8, 2), arch=ARCH)
    ref, _ = attention(q, kv[:, :, 0], kv[:, :, 1], window_size=(8, 2))
    close(out, ref, "bf16")


def test_varlen_packed_forms_match_each_sequence():
    rng = np.random.default_rng(13)
    lens = [7, 0, 30]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    qkv = make(rng, (cu[-1], 3, 2, 48), "f16")
    out = flashjit.flash_attn_varlen_qkvpacked_func(qkv, cu, max(lens), causal=True, arch=ARCH)
    lens_k = [12, 5, 30]
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = qkv[:, 0]
    kv = make(rng, (cu_k[-1], 2, 1, 48), "f16")
    out_kv = flashjit.flash_attn_varlen_kvpacked_func(q, kv, cu, cu_k, max(lens), max(lens_k),
                                                      causal=True, arch=ARCH)
    for b in range(len(lens)):
        if lens[b] == 0:
            continue
        s, sk = slice(cu[b], cu[b + 1]), slice(cu_k[b], cu_k[b + 1])
        ref, _ = attention(qkv[None, s, 0], qkv[None, s, 1], qkv[None, s, 2], causal=True)
        close(out[s], ref[0], "f16")
        ref, _ = attention(q[None, s], kv[None, sk, 0], kv[None, sk, 1], causal=True)
        close(out_kv[s], ref[0], "f16")


@pytest.mark.parametrize("call,shape,message", [
    (lambda x: flashjit.flash_attn_qkvpacked_func(x, arch=ARCH), (1, 8, 2, 2, 32),
     r"qkv must be \[batch, seqlen, 3, heads, head_dim\] with 3 at axis 2"),
    (lambda x: flashjit.flash_attn_kvpacked_func(x[:, :, 0], x, arch=ARCH), (1, 8, 3, 2, 32),
     r"kv must be \[batch, seqlen_k, 2, kv_heads, head_dim\] with 2 at axis 2"),
    (lambda x: flashjit.flash_attn_varlen_qkvpacked_func(
        x, np.array([0, 8], np.int32), 8, arch=ARCH), (8, 3, 2),
     r"qkv must be \[total, 3, heads, head_dim\]"),
])
def test_misshapen_packed_tensors_are_refused(call, shape, message):
    x = np.zeros(shape, dtype=np.float16) + np.float16(0.5)
    with pytest.raises(ValueError, match=message):
        call(x)
