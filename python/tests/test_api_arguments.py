"""flash_attn_func's FlashAttention 2 signature, the features it refuses until they
exist, and the arguments checked before the C call (issue 18, finding 12: ctypes
wraps integers modulo 2**64 and cuts strings at NUL without a word). Runs on the
CPU emulator; no torch needed (the torch side of the grad check is in
test_torch_grad.py)."""
import collections
import inspect
import sys
import types

import numpy as np
import pytest

import flashjit
from flashjit import api
from reference import attention
from test_numpy_emulator import ARCH, TOL, inputs

EMPTY = inspect.Parameter.empty
# flash_attn.flash_attn_func of FlashAttention 2, in order, with its defaults.
FA2_PARAMETERS = [("q", EMPTY), ("k", EMPTY), ("v", EMPTY), ("dropout_p", 0.0),
                  ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
                  ("softcap", 0.0), ("alibi_slopes", None), ("deterministic", False),
                  ("return_attn_probs", False)]


def test_flash_attn_func_has_flash_attention_2s_signature():
    params = list(inspect.signature(flashjit.flash_attn_func).parameters.values())
    positional = [p for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert [(p.name, p.default) for p in positional] == FA2_PARAMETERS
    extras = params[len(positional):]
    assert all(p.kind == p.KEYWORD_ONLY for p in extras), extras
    assert {"return_lse", "arch", "config"} <= {p.name for p in extras}


def test_return_attn_probs_gives_flash_attentions_triple():
    # causal with seqlen_q 40 > seqlen_k 33: queries 0..6 see no key.
    q, k, v = inputs(np.random.default_rng(5), 2, 40, 33, 2, 2, 40, 40, "f16")
    out, lse, s_dmask = flashjit.flash_attn_func(q, k, v, 0.0, None, True, (-1, -1), 0.0, None,
                                                 True, True, arch=ARCH)  # all 11 positionally
    assert s_dmask is None
    ref, ref_lse = attention(q, k, v, causal=True)
    assert np.abs(out.astype(np.float64) - ref).max() <= TOL["f16"]
    empty = ~np.isfinite(ref_lse)
    assert empty.any() and (~empty).any()
    assert np.isposinf(lse[empty]).all()  # FlashAttention's LSE of an empty row
    assert np.abs(lse[~empty] - ref_lse[~empty]).max() <= 1e-3
    # flashjit's return_lse keeps -inf there; the output is the same.
    out2, lse2 = flashjit.flash_attn_func(q, k, v, causal=True, return_lse=True, arch=ARCH)
    assert np.isneginf(lse2[empty]).all()
    assert np.array_equal(lse2[~empty], lse[~empty])
    assert np.array_equal(out2, out)
    with pytest.raises(ValueError, match="return_attn_probs and return_lse"):
        flashjit.flash_attn_func(q, k, v, return_attn_probs=True, return_lse=True, arch=ARCH)


def test_deterministic_is_accepted_and_changes_nothing():
    q, k, v = inputs(np.random.default_rng(6), 1, 30, 30, 2, 1, 32, 32, "bf16")
    a = flashjit.flash_attn_func(q, k, v, causal=True, deterministic=True, arch=ARCH)
    b = flashjit.flash_attn_func(q, k, v, causal=True, deterministic=False, arch=ARCH)
    assert not np.isnan(a).any()
    assert np.array_equal(a, b)


@pytest.mark.parametrize("kwargs,message", [
    ({"dropout_p": 1.0}, r"dropout_p \(1.0\) must be in \[0, 1\)"),
    ({"dropout_p": "x"}, r"dropout_p must be a number"),
    ({"dropout_p": 0.1, "dropout_seed": 1 << 53}, r"dropout_seed"),
])
def test_bad_dropout_arguments_are_named(kwargs, message):
    q = np.zeros((1, 8, 2, 16), dtype=np.float16)
    with pytest.raises(ValueError, match=message):
        flashjit.flash_attn_func(q, q, q, arch=ARCH, **kwargs)


def test_softmax_scale_is_used_and_zero_is_refused():
    q, k, v = inputs(np.random.default_rng(8), 1, 20, 25, 2, 2, 32, 32, "f16")
    out = flashjit.flash_attn_func(q, k, v, softmax_scale=0.3, arch=ARCH)
    ref, _ = attention(q, k, v, softmax_scale=0.3)
    default, _ = attention(q, k, v)
    assert np.abs(out.astype(np.float64) - ref).max() <= TOL["f16"]
    assert np.abs(ref - default).max() > 10 * TOL["f16"]  # the scale is visible in the output
    # 0 means "default" in the C spec: a zero scale is refused, never run as 1/sqrt(d).
    for zero in (0.0, -0.0, 0):
        with pytest.raises(ValueError, match="softmax_scale=0.0 is not supported"):
            flashjit.flash_attn_func(q, k, v, softmax_scale=zero, arch=ARCH)
        with pytest.raises(ValueError, match="softmax_scale=0.0 is not supported"):
            flashjit.emit(arch=ARCH, softmax_scale=zero)
    with pytest.raises(ValueError, match="softmax_scale"):
        flashjit.flash_attn_func(q, k, v, softmax_scale=10**400, arch=ARCH)


# ---- issue 15, step 1: no gradient silently lost -----------------------------------------

class FakeTensor:
    """Just what the grad check reads."""

    def __init__(self, requires_grad):
        self.requires_grad = requires_grad


def test_issue15_grad_check_refuses_inputs_requiring_grad_in_grad_mode():
    on, off = FakeTensor(True), FakeTensor(False)
    with pytest.raises(NotImplementedError,
                       match=r"k requires grad .*issue 15.*torch\.no_grad\(\).*k\.detach\(\)"):
        api._refuse_grad((("q", off), ("k", on), ("v", off)), lambda: True)
    with pytest.raises(NotImplementedError, match=r"q, k, v require grad .*q\.detach\(\), "
                                                  r"k\.detach\(\), v\.detach\(\)"):
        api._refuse_grad((("q", on), ("k", on), ("v", on)), lambda: True)


def test_issue15_grad_check_passes_without_grad_mode_or_without_requires_grad():
    on, off = FakeTensor(True), FakeTensor(False)
    api._refuse_grad((("q", on), ("k", on), ("v", on)), lambda: False)  # torch.no_grad()

    def never():
        raise AssertionError("grad mode asked although no input requires grad")
    api._refuse_grad((("q", off), ("k", off), ("v", off)), never)
    api._refuse_grad((("q", np.zeros(1)),), never)  # arrays have no requires_grad


def test_issue15_flash_attn_func_asks_torchs_grad_mode(monkeypatch):
    """flash_attn_func asks torch.is_grad_enabled for torch inputs that require grad, and
    refuses what the backward does not take (a gradient of attn_mask) instead of detaching: through
    a stand-in torch module, so that it runs without torch installed."""
    grad_mode = [True]
    fake_torch = types.ModuleType("torch")
    fake_torch.is_grad_enabled = lambda: grad_mode[0]
    monkeypatch.setitem(sys.modules, "torch", fake_torch)

    class Tensor(FakeTensor):
        shape = (8, 2, 16)  # 3-D: refused right after the grad check
    Tensor.__module__ = "torch"
    q, k = Tensor(False), Tensor(True)
    with pytest.raises(NotImplementedError, match=r"attn_mask requires grad.*\.detach\(\)"):
        flashjit.flash_attn_func(q, k, q, attn_mask=k)
    grad_mode[0] = False  # torch.no_grad(): past the check, to the next one
    with pytest.raises(ValueError, match="4-D"):
        flashjit.flash_attn_func(q, k, q, attn_mask=k)


# ---- issue 18, finding 12: integers range-checked, NUL refused ---------------------------

@pytest.mark.parametrize("window,name", [((2**64 - 1, 4), "window_size[0]"),
                                         ((4, 2**63), "window_size[1]"),
                                         ((-2, 0), "window_size[0]")])
def test_issue18_finding12_window_size_out_of_range(window, name):
    q = np.zeros((1, 8, 2, 16), dtype=np.float16)
    pattern = rf"{name.replace('[', '.').replace(']', '.')} \(-?\d+\) is outside -1\.\.2\*\*63-1"
    with pytest.raises(ValueError, match=pattern):
        flashjit.flash_attn_func(q, q, q, window_size=window, arch=ARCH)
    with pytest.raises(ValueError, match=pattern):
        flashjit.emit(arch=ARCH, window_size=window)
    with pytest.raises(ValueError, match="window_size must be a pair"):
        flashjit.flash_attn_func(q, q, q, window_size=(4,), arch=ARCH)
    with pytest.raises(TypeError, match="window_size.0. must be an integer"):
        flashjit.flash_attn_func(q, q, q, window_size=(4.5, 0), arch=ARCH)


@pytest.mark.parametrize("config,message", [
    ({"block_m": 2**70},
     r"config\['block_m'\] \(1180591620717411303424\) is outside 1\.\.2\*\*63-1"),
    ({"block_m": 64, "block_n": 32, "waves": 2, "stages": 2**64 + 2}, r"config\['stages'\]"),
    ({"block_m": 0, "block_n": 32, "waves": 2}, r"config\['block_m'\] \(0\) is outside 1\.\."),
    ({"mma_m": -16}, r"config\['mma_m'\] \(-16\) is outside 0\.\."),
    ({"block_m": 64, "block_n": 32, "waves": 2, "q_in_lds": 2}, r"config\['q_in_lds'\].*0\.\.1"),
    ({"block_m": 64, "block_n": 32, "waves": 2, "persistent": 2},
     r"config\['persistent'\].*0\.\.1"),
    ({"block_m": 64, "block_n": 32, "waves": 2, "stages": 2, "prefetch_blocks": 2},
     r"config\['prefetch_blocks'\].*0\.\.1"),
    ({"block_m": 64, "block_n": 32, "waves": 2, "dkdv_passes": 3},
     r"config\['dkdv_passes'\].*0\.\.2"),
])
def test_issue18_finding12_config_out_of_range(config, message):
    q, k, v = inputs(np.random.default_rng(3), 1, 8, 8, 1, 1, 32, 32, "f16")
    handles = len(api._ATTENTIONS)
    with pytest.raises(ValueError, match=message):
        flashjit.flash_attn_func(q, k, v, arch="gfx942", config=config)
    assert len(api._ATTENTIONS) == handles  # nothing created for a refused config
    with pytest.raises(TypeError, match=r"config\['waves'\] must be an integer"):
        flashjit.flash_attn_func(q, k, v, arch="gfx942",
                                 config={"block_m": 64, "block_n": 32, "waves": 2.5})


def test_persistent_needs_a_producer():
    """config["persistent"] reaches the library (fj_options.persistent): without the
    producer warpgroup of stages 3 it is refused by name."""
    q, k, v = inputs(np.random.default_rng(4), 1, 8, 8, 1, 1, 32, 32, "f16")
    with pytest.raises(flashjit.FlashJitError, match="config persistent needs stages 3"):
        flashjit.flash_attn_func(q, k, v, arch="gfx942", config={
            "block_m": 64, "block_n": 32, "waves": 2, "persistent": 1})


def test_prefetch_blocks_runs_with_stages_2():
    """config["prefetch_blocks"] reaches the library (fj_options.prefetch_blocks): with
    stages 2 the KV loop copies whole blocks one iteration ahead and matches the float64
    reference (GQA 4:1, causal, bottom-right aligned); without stages 2 it is refused by
    name, and a value other than 0 or 1 before any C call."""
    config = {"block_m": 64, "block_n": 32, "waves": 4, "stages": 2, "prefetch_blocks": 1}
    q, k, v = inputs(np.random.default_rng(8), 1, 70, 150, 4, 1, 80, 80, "bf16")
    out = flashjit.flash_attn_func(q, k, v, causal=True, arch=ARCH, config=config)
    ref, _ = attention(q, k, v, causal=True)
    assert np.abs(out.astype(np.float64) - ref).max() <= TOL["bf16"]
    explained = [flashjit._lib.lib.fj_attention_explain(h).decode()
                 for key, h in api._ATTENTIONS.items()
                 if key[1] == f"emulator:{ARCH}" and dict(key[2]) == config]
    assert len(explained) == 1 and "prefetch_blocks" in explained[0], explained
    with pytest.raises(flashjit.FlashJitError,
                       match=r"config prefetch_blocks needs stages 2 \(got stages 1\)"):
        flashjit.flash_attn_func(q, k, v, causal=True, arch=ARCH,
                                 config=dict(config, stages=1))
    handles = len(api._ATTENTIONS)
    with pytest.raises(flashjit.InputError, match=r"config\['prefetch_blocks'\] \(2\)"):
        flashjit.flash_attn_func(q, k, v, causal=True, arch=ARCH,
                                 config=dict(config, prefetch_blocks=2))
    assert len(api._ATTENTIONS) == handles


@pytest.mark.parametrize("arg", ["batch", "heads", "kv_heads", "seqlen_q", "seqlen_k",
                                 "head_dim", "head_dim_v"])
def test_issue18_finding12_emit_sizes_out_of_range(arg):
    for value in (2**64 + 128, 2**63, 0, -1):
        with pytest.raises(ValueError, match=rf"{arg} \({value}\) is outside 1\.\.2\*\*63-1"):
            flashjit.emit(arch=ARCH, **{arg: value})
        with pytest.raises(ValueError, match=rf"{arg} \({value}\) is outside 1\.\.2\*\*63-1"):
            flashjit.compile(arch=ARCH, **{arg: value})


def test_issue18_finding12_emit_seqlen_past_int64_is_not_the_seqlen_128_kernel():
    with pytest.raises(ValueError, match=r"seqlen_q \(18446744073709551744\) is outside"):
        flashjit.emit(arch=ARCH, seqlen_q=2**64 + 128)
    # Sizes each in range whose dense strides are not: refused too, before ctypes wraps them.
    with pytest.raises(ValueError, match=r"dense q tensor's batch stride .* past int64"):
        flashjit.emit(arch=ARCH, heads=2**31 - 1, seqlen_q=2**29, head_dim=512)


def test_issue18_finding12_strings_with_nul_are_refused():
    q = np.zeros((1, 8, 2, 16), dtype=np.float16)
    with pytest.raises(ValueError, match=r"arch 'gfx1201\\x00gfx942' contains a NUL"):
        flashjit.flash_attn_func(q, q, q, arch="gfx1201\0gfx942")
    with pytest.raises(ValueError, match="arch .* contains a NUL"):
        flashjit.emit(arch="gfx1201\0junk")
    with pytest.raises(ValueError, match="arch .* contains a NUL"):
        flashjit.compile(arch="gfx1201\0junk")
    with pytest.raises(ValueError, match="compiler .* contains a NUL"):
        flashjit.compile(arch=ARCH, compiler="llvm\0junk")
    with pytest.raises(TypeError, match="arch must be a string"):
        flashjit.emit(arch=b"gfx1201")


# ---- the handle LRU ---------------------------------------------------------------------

def test_handles_are_bounded_least_recently_used_first_out(monkeypatch):
    fresh = collections.OrderedDict()
    monkeypatch.setattr(api, "_ATTENTIONS", fresh)
    monkeypatch.setattr(api, "MAX_HANDLES", 2)
    rng = np.random.default_rng(9)

    def run(d):  # one signature per head dim
        q, k, v = inputs(rng, 1, 9, 9, 1, 1, d, d, "f16")
        out = flashjit.flash_attn_func(q, k, v, arch=ARCH)
        assert np.abs(out.astype(np.float64) - attention(q, k, v)[0]).max() <= TOL["f16"]
    try:
        run(16)
        run(32)
        first = list(fresh.values())[0]
        run(16)  # used again: now the most recent
        assert [key[0][1] for key in fresh] == [32, 16]
        assert list(fresh.values())[1] is first  # the same handle, not a new one
        run(48)  # a third: the least recently used (32) is destroyed
        assert [key[0][1] for key in fresh] == [16, 48]
    finally:
        for handle in fresh.values():
            flashjit._lib.lib.fj_attention_destroy(handle)


# ---- the custom ops are registered after `import torch` when flashjit came first ---------

def test_ops_registered_right_after_torch_is_imported(tmp_path):
    """import flashjit, then torch (a stand-in package here): the ops are registered as
    torch's import finishes, not inside a later torch.compile trace (where registering
    fails), and the finder removes itself."""
    import os
    import pathlib
    import subprocess
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("MARK = 1\n")
    package = pathlib.Path(flashjit.__file__).resolve().parent.parent
    code = f"""
import sys
sys.path[:0] = [{str(tmp_path)!r}, {str(package)!r}]
assert "torch" not in sys.modules
import flashjit
from flashjit import torch_ops
calls = []
torch_ops.ops = lambda: calls.append(sys.modules["torch"].MARK)
import torch
assert calls == [1], calls
assert not any(isinstance(f, torch_ops._AfterTorchImport) for f in sys.meta_path)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ), timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_empty_shapes_follow_flash_attention():
    """FlashAttention-2's empty calls: queries without keys get output 0 and LSE +inf (its
    LSE of an empty row; flashjit's return_lse keeps -inf), a batch of 0 or no queries an
    empty output. The same for the varlen, KV-cache, SDPA and backward entry points. The
    inputs that exist are random; every output is checked element by element."""
    rng = np.random.default_rng(9)
    for b, sq, sk in ((2, 17, 0), (2, 0, 17), (0, 17, 17), (1, 0, 0)):
        q, k, v = inputs(rng, b, sq, sk, 4, 2, 40, 40, "bf16")
        out, lse, _ = flashjit.flash_attn_func(q, k, v, causal=True, return_attn_probs=True,
                                               arch=ARCH)
        assert out.shape == (b, sq, 4, 40) and lse.shape == (b, 4, sq)
        assert (out == 0).all() and np.isposinf(lse).all()
        _, lse2 = flashjit.flash_attn_func(q, k, v, return_lse=True, arch=ARCH)
        assert np.isneginf(lse2).all()
        dq, dk, dv = flashjit.flash_attn_backward(rng.standard_normal(out.shape).astype(np.float32),
                                                  q, k, v, out, lse, causal=True, arch=ARCH)
        # Without keys no query sees one (dq 0); without queries no key is seen (dk, dv 0).
        assert (dq == 0).all() and (dk == 0).all() and (dv == 0).all()
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    # Varlen: empty sequences among others, all empty, and a batch of 0.
    for lq, lk in (([3, 0, 5], [0, 6, 4]), ([0, 0], [0, 0]), ([2], [0]), ([], [])):
        cq = np.array([0] + list(np.cumsum(lq)), np.int32)
        ck = np.array([0] + list(np.cumsum(lk)), np.int32)
        q, k, v = inputs(rng, 1, int(cq[-1]), int(ck[-1]), 4, 2, 40, 40, "bf16")
        out, lse, _ = flashjit.flash_attn_varlen_func(
            q[0], k[0], v[0], cq, ck, max(lq, default=0), max(lk, default=0), causal=True,
            return_attn_probs=True, arch=ARCH)
        assert out.shape == (cq[-1], 4, 40) and lse.shape == (4, cq[-1])
        dq, dk, dv = flashjit.flash_attn_varlen_backward(
            rng.standard_normal(out.shape).astype(np.float32), q[0], k[0], v[0], out, lse, cq,
            ck, max(lq, default=0), max(lk, default=0), causal=True, arch=ARCH)
        assert not (np.isnan(dq).any() or np.isnan(dk).any() or np.isnan(dv).any())
        for i in range(len(lq)):  # no key seen: dq 0; no query: dk, dv 0
            if lk[i] == 0:
                assert (dq[cq[i]:cq[i + 1]] == 0).all()
            if lq[i] == 0:
                assert (dk[ck[i]:ck[i + 1]] == 0).all() and (dv[ck[i]:ck[i + 1]] == 0).all()
        for i in range(len(lq)):
            rows = slice(cq[i], cq[i + 1])
            if lq[i] == 0:
                continue
            if lk[i] == 0:
                assert (out[rows] == 0).all() and np.isposinf(lse[:, rows]).all()
                continue
            ref, ref_lse = attention(q[:, rows], k[:, ck[i]:ck[i + 1]], v[:, ck[i]:ck[i + 1]],
                                     causal=True)
            assert np.abs(out[rows].astype(np.float64) - ref[0]).max() <= TOL["bf16"]
            want = np.where(np.isneginf(ref_lse[0]), np.inf, ref_lse[0])
            assert np.allclose(lse[:, rows], want, atol=1e-3)
    # A KV cache that holds no key (cache_seqlens 0, or a capacity of 0).
    q = rng.standard_normal((2, 1, 4, 40)).astype(np.float32)
    for cap, seqlens in ((32, np.zeros(2, np.int32)), (0, None)):
        kc = rng.standard_normal((2, cap, 2, 40)).astype(np.float32)
        vc = rng.standard_normal((2, cap, 2, 40)).astype(np.float32)
        out, lse = flashjit.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens,
                                                    return_softmax_lse=True, arch=ARCH)
        assert (out == 0).all() and np.isposinf(lse).all()
    # SDPA (BHSD): no keys gives 0 (PyTorch's math backend does too), no queries nothing.
    q = rng.standard_normal((1, 4, 8, 40)).astype(np.float32)
    kv = rng.standard_normal((1, 4, 0, 40)).astype(np.float32)
    assert (flashjit.scaled_dot_product_attention(q, kv, kv, arch=ARCH) == 0).all()
    mask = np.ones((8, 0), bool)
    assert (flashjit.scaled_dot_product_attention(q, kv, kv, attn_mask=mask, arch=ARCH) == 0).all()
    out = flashjit.scaled_dot_product_attention(kv, q, q, arch=ARCH)
    assert out.shape == (1, 4, 0, 40)
