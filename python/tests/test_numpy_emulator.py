"""flash_attn_func on NumPy arrays: the emitted AMD kernel runs on the CPU emulator.

Inputs are fresh random values in [-1, 1); outputs start as NaN (the package fills them)
and are compared with a float64 reference. Tolerances: bf16 abs 3e-2, f16 abs 4e-3
(P is rounded to the input dtype before P V, as on the GPU).
"""
import numpy as np
import pytest

import flashjit
from reference import attention, bf16_round

TOL = {"bf16": 3e-2, "f16": 4e-3}
ARCH = "gfx1201"


def inputs(rng, b, sq, sk, hq, hkv, d, dv, dtype):
    def make(shape):
        x = rng.uniform(-1, 1, size=shape).astype(np.float32)
        return x.astype(np.float16) if dtype == "f16" else bf16_round(x)
    return make((b, sq, hq, d)), make((b, sk, hkv, d)), make((b, sk, hkv, dv))


CASES = [
    # b, sq, sk, hq, hkv, d, dv, dtype, causal, window
    (1, 17, 17, 2, 2, 64, 64, "f16", False, (-1, -1)),
    (1, 113, 203, 4, 1, 80, 80, "bf16", True, (-1, -1)),      # GQA 4:1, bottom-right causal
    (2, 40, 33, 2, 2, 40, 40, "f16", True, (-1, -1)),         # causal with sq > sk
    (1, 65, 65, 2, 1, 72, 72, "bf16", False, (16, 4)),        # window, MQA
    (1, 33, 47, 2, 2, 100, 100, "f16", False, (-1, -1)),      # odd head dim
]


@pytest.mark.parametrize("b,sq,sk,hq,hkv,d,dv,dtype,causal,window", CASES)
def test_matches_float64_reference(b, sq, sk, hq, hkv, d, dv, dtype, causal, window):
    rng = np.random.default_rng(1 + d + sq)
    q, k, v = inputs(rng, b, sq, sk, hq, hkv, d, dv, dtype)
    out, lse = flashjit.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                        return_lse=True, arch=ARCH)
    ref, ref_lse = attention(q, k, v, causal=causal, window_size=window)
    assert out.shape == (b, sq, hq, dv)
    assert not np.isnan(out).any()
    assert np.abs(out.astype(np.float64) - ref).max() <= TOL[dtype]
    finite = np.isfinite(ref_lse)
    assert np.array_equal(np.isneginf(lse), ~finite)
    assert np.abs(lse[finite] - ref_lse[finite]).max() <= 1e-3


def test_non_contiguous_inputs_work_through_strides():
    rng = np.random.default_rng(7)
    # [b, h, s, d] storage viewed as BSHD: every stride differs from a dense BSHD tensor.
    q = rng.uniform(-1, 1, size=(1, 2, 37, 32)).astype(np.float16).transpose(0, 2, 1, 3)
    k = rng.uniform(-1, 1, size=(1, 2, 50, 32)).astype(np.float16).transpose(0, 2, 1, 3)
    v = rng.uniform(-1, 1, size=(1, 2, 50, 32)).astype(np.float16).transpose(0, 2, 1, 3)
    assert not q.flags.c_contiguous
    out = flashjit.flash_attn_func(q, k, v, causal=True, arch=ARCH)
    ref, _ = attention(q, k, v, causal=True)
    assert np.abs(out.astype(np.float64) - ref).max() <= TOL["f16"]


def test_float32_inputs_round_in_the_kernel_and_return_float32():
    """f32 tensors in memory (fj_spec.f32_io): fresh float32 values that bf16 cannot hold
    are rounded by the kernel; the output is float32 and not rounded to bf16."""
    rng = np.random.default_rng()
    q, k, v = (rng.uniform(-1, 1, size=s).astype(np.float32)
               for s in ((2, 45, 4, 72), (2, 60, 2, 72), (2, 60, 2, 72)))
    assert (bf16_round(k) != k).mean() > 0.5
    out, lse = flashjit.flash_attn_func(q, k, v, causal=True, return_lse=True, arch=ARCH)
    assert out.dtype == np.float32 and not np.isnan(out).any()
    ref, ref_lse = attention(q, k, v, causal=True)
    assert np.abs(out.astype(np.float64) - ref).max() <= TOL["bf16"]
    assert np.abs(lse - ref_lse).max() <= 1e-2
    assert (bf16_round(out) != out).any(), "the output was rounded to bf16"


class Foreign:
    """An array of another framework: nothing but the DLPack protocol."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, stream=None):
        return self._array.__dlpack__()

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_dlpack_arrays_of_other_frameworks_run():
    rng = np.random.default_rng()
    q, k, v = inputs(rng, 1, 29, 41, 2, 1, 56, 56, "f16")
    out = flashjit.flash_attn_func(Foreign(q), Foreign(k), Foreign(v), causal=True, arch=ARCH)
    assert isinstance(out, np.ndarray) and not np.isnan(out).any()
    ref, _ = attention(q, k, v, causal=True)
    assert np.abs(out.astype(np.float64) - ref).max() <= TOL["f16"]
    # SDPA's layout through DLPack too: [batch, heads, seqlen, head_dim].
    qt, kt, vt = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v))
    sdpa = flashjit.scaled_dot_product_attention(Foreign(qt), Foreign(kt), Foreign(vt),
                                                 enable_gqa=True, arch=ARCH)
    ref_sdpa, _ = attention(q, k, v)
    assert np.abs(sdpa.transpose(0, 2, 1, 3).astype(np.float64) - ref_sdpa).max() <= TOL["f16"]


def test_bad_inputs_raise_clear_errors():
    q = np.zeros((1, 8, 2, 16), dtype=np.float16)
    with pytest.raises(ValueError, match="dropout_p"):
        flashjit.flash_attn_func(q, q, q, dropout_p=-0.1, arch=ARCH)
    with pytest.raises(TypeError, match="float16"):
        flashjit.flash_attn_func(q.astype(np.int32), q, q, arch=ARCH)
    with pytest.raises(ValueError, match="arch="):
        flashjit.flash_attn_func(q, q, q)
    with pytest.raises(ValueError, match="4-D"):
        flashjit.flash_attn_func(q[0], q, q, arch=ARCH)
    with pytest.raises(ValueError, match="multiple"):
        flashjit.flash_attn_func(np.zeros((1, 8, 3, 16), np.float16), q, q, arch=ARCH)
    with pytest.raises(ValueError, match="head dims"):
        flashjit.flash_attn_func(np.zeros((1, 8, 2, 32), np.float16), q, q, arch=ARCH)
    with pytest.raises(TypeError):
        flashjit.flash_attn_func([1, 2], q, q, arch=ARCH)


def test_emit_returns_hip_for_the_arch():
    src = flashjit.emit(arch="gfx1201", head_dim=80, heads=4, kv_heads=1, causal=True)
    assert "__builtin_amdgcn_wmma_f32_16x16x16_bf16_w32_gfx12" in src
    assert "constexpr int kDimQK = 80;" in src
    with pytest.raises(flashjit.FlashJitError, match="gfx9999"):
        flashjit.emit(arch="gfx9999")


def test_compile_returns_the_resource_report():
    report = flashjit.compile(arch="gfx1201", head_dim=64, causal=True)
    if isinstance(report, list):
        report = report[0]
    assert report["wavefront_size"] == 32
    assert report["vgpr_spill_count"] == 0
    assert report["matrix_instructions"] > 0


@pytest.mark.parametrize("config,rules", [
    ({"mma_m": 32}, "cdna32"),
    ({"mma_m": 16}, "cdna"),
    ({"block_m": 64, "block_n": 32, "waves": 2, "mma_m": 32}, "cdna32"),
    ({"block_m": 32, "block_n": 16, "waves": 1, "stages": 2}, "cdna"),
])
def test_config_picks_the_kernel(config, rules):
    rng = np.random.default_rng(11)
    q, k, v = inputs(rng, 1, 70, 90, 2, 1, 64, 64, "f16")
    out = flashjit.flash_attn_func(q, k, v, causal=True, arch="gfx942", config=config)
    ref, _ = attention(q, k, v, causal=True)
    assert np.abs(out.astype(np.float64) - ref).max() <= TOL["f16"]
    # What the handle built for this config says it lowered with (fj_attention_explain).
    explained = [flashjit._lib.lib.fj_attention_explain(h).decode()
                 for key, h in flashjit.api._ATTENTIONS.items()
                 if key[1] == "emulator:gfx942" and dict(key[2]) == config]
    assert len(explained) == 1, explained
    rules_line = next(line for line in explained[0].splitlines() if "rules" in line)
    assert rules_line.split(":", 1)[1].split()[0] == rules, explained[0]


def test_bad_config_is_named():
    q, k, v = inputs(np.random.default_rng(3), 1, 8, 8, 1, 1, 32, 32, "f16")
    with pytest.raises(ValueError, match="unknown config keys"):
        flashjit.flash_attn_func(q, k, v, arch="gfx942", config={"blockm": 64})
    with pytest.raises(ValueError, match="not \\['block_n', 'waves'\\]"):
        flashjit.flash_attn_func(q, k, v, arch="gfx942", config={"block_m": 64})
    with pytest.raises(flashjit.FlashJitError, match="mma_m = 32"):
        flashjit.flash_attn_func(q, k, v, arch="gfx1201", config={"mma_m": 32})


def test_one_handle_serves_every_shape_of_a_signature():
    """Prefill of several lengths, decode with a growing KV cache, another batch and
    GQA group: one signature, so one handle (one compiled kernel) runs them all."""
    from flashjit import api
    before = set(api._ATTENTIONS)
    rng = np.random.default_rng(11)
    shapes = [(1, 5, 5, 4, 2), (2, 70, 70, 4, 4), (1, 1, 31, 4, 1), (1, 1, 32, 4, 1),
              (3, 17, 9, 2, 1)]  # b, sq, sk, hq, hkv
    for b, sq, sk, hq, hkv in shapes:
        q, k, v = inputs(rng, b, sq, sk, hq, hkv, 48, 48, "f16")
        out = flashjit.flash_attn_func(q, k, v, causal=True, arch=ARCH)
        ref, _ = attention(q, k, v, causal=True)
        assert not np.isnan(out).any()
        assert np.abs(out.astype(np.float64) - ref).max() <= TOL["f16"]
    added = set(api._ATTENTIONS) - before
    assert len(added) == 1, added
    explain = flashjit._lib.lib.fj_attention_explain(api._ATTENTIONS[added.pop()]).decode()
    assert f"{len(shapes)} forward calls" in explain, explain


@pytest.mark.parametrize("num_splits", [0, 1, 4])
def test_split_kv_decode_matches_float64_reference(num_splits):
    # Decode against a long cache: 0 chooses split-KV (the emulator stands for 32
    # compute units), 1 turns it off, 4 forces four splits; all give the reference.
    rng = np.random.default_rng(40 + num_splits)
    q, k, v = inputs(rng, 1, 1, 900, 4, 2, 64, 64, "f16")
    out, lse = flashjit.flash_attn_func(q, k, v, causal=True, return_lse=True, arch=ARCH,
                                        num_splits=num_splits)
    ref, ref_lse = attention(q, k, v, causal=True)
    assert not np.isnan(out).any()
    assert np.abs(out.astype(np.float64) - ref).max() <= TOL["f16"]
    assert np.abs(lse - ref_lse).max() <= 1e-3


def test_causal_with_a_right_window_is_causal_as_in_flash_attention():
    rng = np.random.default_rng(5)
    q, k, v = inputs(rng, 1, 20, 30, 2, 2, 32, 32, "f16")
    out = flashjit.flash_attn_func(q, k, v, causal=True, window_size=(-1, 7), arch=ARCH)
    ref, _ = attention(q, k, v, causal=True)
    assert np.abs(out.astype(np.float64) - ref).max() <= TOL["f16"]
