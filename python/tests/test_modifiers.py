"""Score modifiers from Python (issue 14): softcap, alibi_slopes, score_mod, mask_mod and
sinks on NumPy inputs (the CPU emulator), against the float64 reference of reference.py,
which applies each by its formula. Tolerances: bf16 abs 3e-2, f16 abs 4e-3; LSE 1e-3
(2e-3 with softcap, whose tanh the kernels compute from exp2)."""
import numpy as np
import pytest

import flashjit
from reference import attention, bf16_round

TOL = {"bf16": 3e-2, "f16": 4e-3}


def inputs(seed, b, sq, sk, hq, hkv, d, dtype):
    rng = np.random.default_rng(seed)

    def make(shape):
        x = rng.uniform(-1, 1, size=shape).astype(np.float32)
        return x.astype(np.float16) if dtype == "f16" else bf16_round(x)
    return make((b, sq, hq, d)), make((b, sk, hkv, d)), make((b, sk, hkv, d)), rng


def check(out, lse, ref, ref_lse, dtype, lse_tol=1e-3):
    assert not np.isnan(out).any()
    assert np.abs(out.astype(np.float64) - ref).max() <= TOL[dtype]
    finite = np.isfinite(ref_lse)
    assert np.array_equal(np.isneginf(lse), ~finite)
    assert np.abs(lse[finite] - ref_lse[finite]).max() <= lse_tol


@pytest.mark.parametrize("arch", ["gfx1201", "gfx942"])
@pytest.mark.parametrize("dtype,causal", [("bf16", True), ("f16", False)])
def test_softcap_and_alibi(arch, dtype, causal):
    q, k, v, rng = inputs(3, 2, 37, 70, 4, 2, 64, dtype)
    slopes = rng.uniform(0.05, 1.0, size=(2, 4)).astype(np.float32)
    out, lse = flashjit.flash_attn_func(q, k, v, causal=causal, softcap=2.5, alibi_slopes=slopes,
                                        return_lse=True, arch=arch)
    ref, ref_lse = attention(q, k, v, causal=causal, softcap=2.5, alibi_slopes=slopes)
    check(out, lse, ref, ref_lse, dtype, lse_tol=2e-3)
    out_h = flashjit.flash_attn_func(q, k, v, causal=causal, alibi_slopes=slopes[0], arch=arch)
    ref_h, _ = attention(q, k, v, causal=causal, alibi_slopes=slopes[0])
    assert np.abs(out_h.astype(np.float64) - ref_h).max() <= TOL[dtype]


def test_mask_mod_and_score_mod():
    q, k, v, _ = inputs(5, 1, 96, 96, 2, 2, 64, "bf16")
    out, lse = flashjit.flash_attn_func(q, k, v, mask_mod="q_idx / 40 == kv_idx / 40",
                                        score_mod="score * 1.5", return_lse=True, arch="gfx1201")
    i, j = np.arange(96)[:, None], np.arange(96)[None, :]
    ref, ref_lse = attention(q, k, v, softmax_scale=1.5 / 8, mask=(i // 40 == j // 40))
    check(out, lse, ref, ref_lse, "bf16")


def test_a_mask_that_hides_every_key_gives_zero_and_minus_inf():
    q, k, v, _ = inputs(6, 1, 20, 30, 2, 2, 32, "f16")
    out, lse = flashjit.flash_attn_func(q, k, v, mask_mod="kv_idx < 0", return_lse=True,
                                        arch="gfx1201")
    assert np.all(out == 0) and np.all(np.isneginf(lse))


def test_sinks():
    q, k, v, rng = inputs(7, 2, 33, 50, 4, 1, 64, "bf16")
    sinks = rng.uniform(-2, 3, size=4).astype(np.float32)
    out, lse = flashjit.flash_attn_func(q, k, v, causal=True, sinks=sinks, return_lse=True,
                                        arch="gfx942")
    ref, ref_lse = attention(q, k, v, causal=True, sinks=sinks)
    check(out, lse, ref, ref_lse, "bf16")


@pytest.mark.parametrize("kwargs,error,message", [
    ({"softcap": -1.0}, ValueError, r"softcap \(-1.0\)"),
    ({"alibi_slopes": np.zeros(3, np.float32)}, ValueError, r"alibi_slopes must be float32"),
    ({"alibi_slopes": np.zeros(2, np.float64)}, TypeError, r"alibi_slopes must be float32"),
    ({"sinks": np.zeros(5, np.float32)}, ValueError, r"sinks must be float32 \[heads\]"),
    ({"score_mod": "score +"}, flashjit.FlashJitError, r"score_mod, column 8"),
    ({"mask_mod": "score > 0"}, flashjit.FlashJitError, r"reads score"),
    ({"mask_mod": "q_idx\0"}, ValueError, r"NUL"),
])
def test_bad_modifiers_are_refused_by_name(kwargs, error, message):
    q = np.ones((1, 8, 2, 16), dtype=np.float16)
    with pytest.raises(error, match=message):
        flashjit.flash_attn_func(q, q, q, arch="gfx1201", **kwargs)
