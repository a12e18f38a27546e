"""flash_attn_backward on NumPy arrays (the CPU emulator of gfx1201): dq, dk, dv against
float64 analytic gradients (reference.attention_grads) from fresh random inputs; the
outputs start as NaN (the package fills them).

Tolerance: each gradient's relative L2 error within 2e-2 (bf16) / 1e-2 (f16) and every
element within 4e-2 (bf16) / 2e-2 (f16) of the largest reference magnitude: the kernels
round P and dS to the input dtype before their products, as FlashAttention does. A gradient
that is 0 but for float64's rounding (rows that each see one key: a softmax over one score
has none) has no relative error: there every element must be within 1e-3 of 0, the
absolute term of FlashAttention's rule.
"""
import re

import numpy as np
import pytest

import flashjit
from flashjit import api
from reference import attention_grads, bf16_round

ARCH = "gfx1201"
TOL = {"bf16": (2e-2, 4e-2), "f16": (1e-2, 2e-2)}


def make(rng, shape, dtype):
    x = rng.uniform(-1, 1, size=shape).astype(np.float32)
    return x.astype(np.float16) if dtype == "f16" else bf16_round(x)


def check(name, got, want, dtype):
    rel, scale = TOL[dtype]
    got = np.asarray(got, dtype=np.float64)
    assert np.isfinite(got).all(), f"{name}: non-finite values"
    if np.abs(want).max() < 1e-9:  # 0 but for rounding: D and dP differ in the last bits
        assert np.abs(got).max() <= 1e-3, f"{name}: {np.abs(got).max():.3g}, expected 0"
        return
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-12)
    assert err <= rel, f"{name}: relative L2 error {err:.3g} > {rel}"
    worst = np.abs(got - want).max()
    assert worst <= scale * max(np.abs(want).max(), 1e-6), f"{name}: max error {worst:.3g}"


CASES = [
    # b, sq, sk, hq, hkv, d, dv, dtype, causal, window
    (1, 40, 56, 2, 2, 64, 64, "bf16", False, (-1, -1)),
    (1, 70, 30, 4, 2, 32, 32, "f16", True, (-1, -1)),      # GQA, causal with sq > sk
    (2, 33, 33, 2, 1, 48, 40, "bf16", False, (8, 4)),      # MQA, window, dqk != dv
]


@pytest.mark.parametrize("b,sq,sk,hq,hkv,d,dv,dtype,causal,window", CASES)
def test_gradients_match_float64(b, sq, sk, hq, hkv, d, dv, dtype, causal, window):
    rng = np.random.default_rng(7 + sq + d)
    q, k, v = make(rng, (b, sq, hq, d), dtype), make(rng, (b, sk, hkv, d), dtype), \
        make(rng, (b, sk, hkv, dv), dtype)
    dout = make(rng, (b, sq, hq, dv), dtype)
    out, lse, _ = flashjit.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                           return_attn_probs=True, arch=ARCH)
    dq, dk, dv_ = flashjit.flash_attn_backward(dout, q, k, v, out, lse, causal=causal,
                                               window_size=window, arch=ARCH)
    assert dq.shape == q.shape and dk.shape == k.shape and dv_.shape == v.shape
    want = attention_grads(q, k, v, dout, causal=causal, window_size=window)
    for name, got, ref in zip(("dq", "dk", "dv"), (dq, dk, dv_), want):
        check(name, got, ref, dtype)


def test_a_given_config_takes_dkdv_passes_or_leaves_them_to_the_lowering():
    """config["dkdv_passes"] reaches the dK/dV kernel (fj_options.dkdv_passes): 1 and 2
    build different kernels and both match float64; a config without it (0) gets the
    lowering's choice, one of the two, never a pass count the registers cannot hold
    (before, C and Python configs always ran one loop: spills at head dim 256)."""
    rng = np.random.default_rng(11)
    q, k, v, dout = (make(rng, (1, 40, 2, 64), "bf16") for _ in range(4))
    out, lse, _ = flashjit.flash_attn_func(q, k, v, causal=True, return_attn_probs=True,
                                           arch=ARCH)
    want = attention_grads(q, k, v, dout, causal=True)
    names = {}
    for passes in (0, 1, 2):
        config = {"block_m": 32, "block_n": 16, "waves": 2, "stages": 1, "q_in_lds": 1}
        if passes:
            config["dkdv_passes"] = passes
        grads = flashjit.flash_attn_backward(dout, q, k, v, out, lse, causal=True, arch=ARCH,
                                             config=config)
        for name, got, ref in zip(("dq", "dk", "dv"), grads, want):
            check(f"{name} (dkdv_passes {passes})", got, ref, "bf16")
        explained = [flashjit._lib.lib.fj_attention_explain(h).decode()
                     for key, h in api._ATTENTIONS.items() if dict(key[2]) == config]
        assert len(explained) == 1, explained
        names[passes] = re.search(r"fa_bwd_dkdv_direct_\w+", explained[0]).group(0)
    assert names[1] != names[2] and names[0] in (names[1], names[2]), names


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_gradients_through_score_modifiers(dtype):
    """softcap with ALiBi against the reference's own formulas, and a document mask as
    mask_mod against the reference's boolean mask."""
    rng = np.random.default_rng(11)
    b, sq, sk, hq, hkv, d = 1, 40, 52, 2, 1, 32
    q, k, v = make(rng, (b, sq, hq, d), dtype), make(rng, (b, sk, hkv, d), dtype), \
        make(rng, (b, sk, hkv, d), dtype)
    dout = make(rng, (b, sq, hq, d), dtype)
    slopes = np.array([0.5, 0.125], dtype=np.float32)
    mods = dict(softcap=2.0, alibi_slopes=slopes, causal=True)
    out, lse = flashjit.flash_attn_func(q, k, v, return_lse=True, arch=ARCH, **mods)
    grads = flashjit.flash_attn_backward(dout, q, k, v, out, lse, arch=ARCH, **mods)
    for name, got, ref in zip(("dq", "dk", "dv"), grads, attention_grads(q, k, v, dout, **mods)):
        check(name, got, ref, dtype)
    text = "q_idx / 16 == kv_idx / 16"
    mask = (np.arange(sq)[:, None] // 16) == (np.arange(sk)[None, :] // 16)
    out, lse = flashjit.flash_attn_func(q, k, v, return_lse=True, arch=ARCH, mask_mod=text)
    grads = flashjit.flash_attn_backward(dout, q, k, v, out, lse, arch=ARCH, mask_mod=text)
    for name, got, ref in zip(("dq", "dk", "dv"), grads,
                              attention_grads(q, k, v, dout, mask=mask)):
        check(name, got, ref, dtype)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_gradients_with_sinks(dtype):
    """Attention sinks (gpt-oss): dq, dk, dv and the sinks' own gradient against the
    float64 reference, causal with more queries than keys so some rows see only the sink;
    dsinks to the same relative tolerance (a sum over every row of a head)."""
    rng = np.random.default_rng(17)
    b, sq, sk, hq, hkv, d = 2, 48, 30, 4, 2, 32
    q, k, v = make(rng, (b, sq, hq, d), dtype), make(rng, (b, sk, hkv, d), dtype), \
        make(rng, (b, sk, hkv, d), dtype)
    dout = make(rng, (b, sq, hq, d), dtype)
    sinks = rng.uniform(-1, 2, hq).astype(np.float32)
    out, lse = flashjit.flash_attn_func(q, k, v, causal=True, sinks=sinks, return_lse=True,
                                        arch=ARCH)
    grads = flashjit.flash_attn_backward(dout, q, k, v, out, lse, causal=True, sinks=sinks,
                                         arch=ARCH)
    want = attention_grads(q, k, v, dout, causal=True, sinks=sinks)
    assert len(grads) == 4 and grads[3].shape == (hq,)
    for name, got, ref in zip(("dq", "dk", "dv", "dsinks"), grads, want):
        check(name, got, ref, dtype)
    assert np.abs(want[3]).min() > 1e-3  # every head's sink matters here


def test_backward_refuses_what_it_does_not_take():
    rng = np.random.default_rng(3)
    q = make(rng, (1, 8, 2, 32), "f16")
    out, lse = flashjit.flash_attn_func(q, q, q, return_lse=True, arch=ARCH)
    with pytest.raises(ValueError, match="needs the forward's dropout_seed"):
        flashjit.flash_attn_backward(q, q, q, q, out, lse, dropout_p=0.1, arch=ARCH)
    with pytest.raises(ValueError, match="softmax_lse must be"):
        flashjit.flash_attn_backward(q, q, q, q, out, lse[:, :1], arch=ARCH)
