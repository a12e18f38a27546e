"""flash_attn_func on torch CUDA tensors against SDPA computed in float64 (GPU machines)."""
import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
import torch.nn.functional as F  # noqa: E402

import flashjit  # noqa: E402

TOL = {torch.bfloat16: 3e-2, torch.float16: 4e-3}


def reference(q, k, v, causal, window):
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    q, k, v = (x.double().transpose(1, 2) for x in (q, k, v))
    k = k.repeat_interleave(hq // hkv, 1)
    v = v.repeat_interleave(hq // hkv, 1)
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    diag = i + sk - sq
    mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        mask &= j <= diag
    if window[0] >= 0:
        mask &= j >= diag - window[0]
    if window[1] >= 0:
        mask &= j <= diag + window[1]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return torch.nan_to_num(out, nan=0.0).transpose(1, 2)


CASES = [(2, 113, 203, 8, 2, 80, torch.bfloat16, True, (-1, -1)),
         (1, 256, 256, 4, 4, 128, torch.float16, False, (-1, -1)),
         (1, 300, 200, 4, 1, 72, torch.bfloat16, True, (-1, -1)),
         (1, 128, 512, 2, 2, 256, torch.bfloat16, False, (64, 0)),
         (3, 1, 1000, 16, 2, 96, torch.float16, True, (-1, -1))]


@pytest.mark.parametrize("b,sq,sk,hq,hkv,d,dtype,causal,window", CASES)
def test_matches_sdpa_in_float64(b, sq, sk, hq, hkv, d, dtype, causal, window):
    torch.manual_seed(d + sq)
    q = (torch.rand(b, sq, hq, d, device="cuda") * 2 - 1).to(dtype)
    k = (torch.rand(b, sk, hkv, d, device="cuda") * 2 - 1).to(dtype)
    v = (torch.rand(b, sk, hkv, d, device="cuda") * 2 - 1).to(dtype)
    out = flashjit.flash_attn_func(q, k, v, causal=causal, window_size=window)
    torch.cuda.synchronize()
    ref = reference(q, k, v, causal, window)
    assert not torch.isnan(out).any()
    assert (out.double() - ref).abs().max().item() <= TOL[dtype]


def test_float32_tensors_round_in_the_kernel():
    """float32 q, k, v (fj_spec.f32_io): rounded to bf16 in the kernel, out float32 and
    unrounded; the backward refuses them by name."""
    torch.manual_seed(9)
    q = torch.rand(2, 300, 8, 128, device="cuda") * 2 - 1
    k = torch.rand(2, 517, 2, 128, device="cuda") * 2 - 1
    v = torch.rand(2, 517, 2, 128, device="cuda") * 2 - 1
    out = flashjit.flash_attn_func(q, k, v, causal=True)
    torch.cuda.synchronize()
    assert out.dtype == torch.float32
    ref = reference(q, k, v, True, (-1, -1))
    assert (out.double() - ref).abs().max().item() <= TOL[torch.bfloat16]
    assert (out.bfloat16().float() != out).any(), "the output was rounded to bf16"
    decode = flashjit.flash_attn_func(q[:, :1], k, v, num_splits=4)  # split-KV's combine
    ref = reference(q[:, :1], k, v, False, (-1, -1))
    assert (decode.double() - ref).abs().max().item() <= TOL[torch.bfloat16]
    with pytest.raises(NotImplementedError, match="float32 q, k and v run forward only"):
        flashjit.flash_attn_func(q.requires_grad_(), k, v)


class Foreign:
    """A GPU array of another framework: nothing but the DLPack protocol."""

    def __init__(self, tensor):
        self._tensor = tensor

    def __dlpack__(self, stream=None):
        return self._tensor.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self._tensor.__dlpack_device__()


def test_dlpack_gpu_arrays_of_other_frameworks_run():
    torch.manual_seed(5)
    q, k, v = ((torch.rand(2, 77, 4, 80, device="cuda") * 2 - 1).to(torch.bfloat16)
               for _ in range(3))
    out = flashjit.flash_attn_func(Foreign(q), Foreign(k), Foreign(v), causal=True)
    torch.cuda.synchronize()
    assert isinstance(out, torch.Tensor) and out.is_cuda
    ref = reference(q, k, v, True, (-1, -1))
    assert (out.double() - ref).abs().max().item() <= TOL[torch.bfloat16]


def test_non_contiguous_torch_tensors():
    q = torch.rand(1, 4, 100, 64, device="cuda", dtype=torch.float16).transpose(1, 2)
    out = flashjit.flash_attn_func(q, q, q, causal=True)
    ref = reference(q, q, q, True, (-1, -1))
    assert (out.double() - ref).abs().max().item() <= TOL[torch.float16]


# Configs past the 48 KiB of static shared memory (dynamic, opted into at launch):
# 202 KiB at head dim 256 with 128 queries and 128 keys per block and Q in shared memory.
@pytest.mark.parametrize("d,config", [
    (256, {"block_m": 128, "block_n": 128, "waves": 8, "stages": 2, "q_in_lds": True}),
    (128, {"block_m": 128, "block_n": 64, "waves": 8, "stages": 2, "q_in_lds": True}),
    (64, {"block_m": 32, "block_n": 16, "waves": 1}),
])
def test_configs_beyond_static_shared_memory(d, config):
    torch.manual_seed(d)
    q, k, v = ((torch.rand(2, 333, 4, d, device="cuda") * 2 - 1).to(torch.bfloat16)
               for _ in range(3))
    out = flashjit.flash_attn_func(q, k, v, causal=True, config=config)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()
    assert (out.double() - reference(q, k, v, True, (-1, -1))).abs().max().item() <= TOL[torch.bfloat16]


@pytest.mark.parametrize("num_splits", [0, 1, 2, 9, 128])
@pytest.mark.parametrize("b,sq,sk,hq,hkv,d,causal,window",
                         [(1, 1, 8192, 32, 8, 128, False, (-1, -1)),
                          (4, 1, 3000, 8, 1, 64, True, (-1, -1)),
                          (1, 16, 5000, 8, 1, 80, True, (-1, -1)),
                          (2, 1, 4100, 16, 4, 256, False, (1000, 0)),
                          # 128 grouped rows or more per KV head and 32768 keys or more
                          # in all: sm_90's wide kernels (two consumer warpgroups and a
                          # producer), 132 rows ragged
                          (2, 16, 9000, 16, 2, 128, True, (500, 0)),
                          (3, 11, 6000, 24, 2, 96, True, (-1, -1)),
                          (2, 16, 17000, 8, 1, 256, False, (-1, -1))])
def test_split_kv_decode_matches_sdpa_in_float64(b, sq, sk, hq, hkv, d, causal, window,
                                                 num_splits):
    torch.manual_seed(sk + num_splits)
    q = (torch.rand(b, sq, hq, d, device="cuda") * 2 - 1).to(torch.bfloat16)
    k = (torch.rand(b, sk, hkv, d, device="cuda") * 2 - 1).to(torch.bfloat16)
    v = (torch.rand(b, sk, hkv, d, device="cuda") * 2 - 1).to(torch.bfloat16)
    out, lse = flashjit.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                        return_lse=True, num_splits=num_splits)
    torch.cuda.synchronize()
    ref = reference(q, k, v, causal, window)
    assert not torch.isnan(out).any()
    assert (out.double() - ref).abs().max().item() <= TOL[torch.bfloat16]
    # The same call twice gives the same bits: the splits are merged in order.
    again = flashjit.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                     num_splits=num_splits)
    assert torch.equal(out, again)
    assert torch.isfinite(lse).all()


PERSISTENT_SHAPES = [(3, 1100, 1333, 32, 8, False),  # 9 * 32 * 3 = 864 tiles
                     (3, 1100, 1333, 32, 8, True),
                     # Causal, bottom-right, more queries than keys: the first
                     # query blocks see no key (tiles with no KV block; rows of 0).
                     (2, 1333, 700, 24, 8, True),
                     (1, 4100, 4100, 16, 16, True)]  # 33 * 16 = 528 tiles of 1..33 blocks


@pytest.mark.parametrize("d", [64, 80, 128])
@pytest.mark.parametrize("b,sq,sk,hq,hkv,causal", PERSISTENT_SHAPES)
def test_persistent_kernel_walks_many_tiles(b, sq, sk, hq, hkv, causal, d):
    """More (query block, head, batch) tiles than SMs: the persistent kernel (the sm90
    default from head dim 72 to 128) has each workgroup walk several: the grid's size
    apart where tiles are the same work, from the launch's counter where they are not
    (causal). Against float64, and bit for bit the non-persistent kernel's output (each
    tile's arithmetic is the same). Head dim 64 forces config persistent on."""
    torch.manual_seed(d + sq)
    q = (torch.rand(b, sq, hq, d, device="cuda") * 2 - 1).to(torch.bfloat16)
    k = (torch.rand(b, sk, hkv, d, device="cuda") * 2 - 1).to(torch.bfloat16)
    v = (torch.rand(b, sk, hkv, d, device="cuda") * 2 - 1).to(torch.bfloat16)
    config = {"block_m": 128, "block_n": 128, "waves": 8, "stages": 3, "q_in_lds": 1}
    poison = torch.full_like(q, float("nan"))  # freed: the output most likely takes its memory
    del poison
    out = flashjit.flash_attn_func(q, k, v, causal=causal, config=dict(config, persistent=1))
    plain = flashjit.flash_attn_func(q, k, v, causal=causal, config=dict(config, persistent=0))
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()
    assert (out.double() - reference(q, k, v, causal, (-1, -1))).abs().max().item() \
        <= TOL[torch.bfloat16]
    assert torch.equal(out, plain)
    # Again: the counter starts from zero on every call.
    assert torch.equal(flashjit.flash_attn_func(q, k, v, causal=causal,
                                                config=dict(config, persistent=1)), plain)


# Integer mask_mods, whose blocks the block-range pass skips (on the H100 the
# producer warpgroup scans the mask and tells the consumers which block comes
# next): holes longer than the scan's 32 blocks, blocks kept whole and in part,
# masks of the batch and the head, fully masked rows, GQA.
MASK_MODS = [
    ("q_idx / 200 == kv_idx / 200", lambda b, h, i, j: i // 200 == j // 200),
    ("q_idx / 64 == kv_idx / 64 || (7 * (q_idx / 64) + 13 * (kv_idx / 64)) % 10 == 0",
     lambda b, h, i, j: (i // 64 == j // 64) | ((7 * (i // 64) + 13 * (j // 64)) % 10 == 0)),
    ("kv_idx / 4608 == 1 || kv_idx >= seqlen_k - 50 + b * 7",
     lambda b, h, i, j: (j // 4608 == 1) | (j >= SK_LONG - 50 + b * 7)),
    ("(kv_idx + 3 * h) % 5 != 0 && kv_idx <= q_idx + 600",
     lambda b, h, i, j: ((j + 3 * h) % 5 != 0) & (j <= i + 600)),
    ("q_idx < 250 && kv_idx < 130", lambda b, h, i, j: (i < 250) & (j < 130)),
]
SK_LONG = 9000


@pytest.mark.parametrize("d", [64, 72, 128, 256])
@pytest.mark.parametrize("expr,keep", MASK_MODS, ids=[m[0] for m in MASK_MODS])
def test_mask_mods_match_float64(expr, keep, d):
    torch.manual_seed(d + len(expr))
    b, sq, hq, hkv = 2, 300, 4, 2
    sk = SK_LONG if "seqlen_k" in expr else 1900
    q = (torch.rand(b, sq, hq, d, device="cuda") * 2 - 1).to(torch.bfloat16)
    k = (torch.rand(b, sk, hkv, d, device="cuda") * 2 - 1).to(torch.bfloat16)
    v = (torch.rand(b, sk, hkv, d, device="cuda") * 2 - 1).to(torch.bfloat16)
    out = flashjit.flash_attn_func(q, k, v, mask_mod=expr)
    torch.cuda.synchronize()
    def index(n, axis):  # arange(n) along one of the four axes
        return torch.arange(n, device="cuda").view([n if a == axis else 1 for a in range(4)])
    mask = keep(index(b, 0), index(hq, 1), index(sq, 2), index(sk, 3)).expand(b, hq, sq, sk)
    qd, kd, vd = (x.double().transpose(1, 2) for x in (q, k, v))
    kd, vd = kd.repeat_interleave(hq // hkv, 1), vd.repeat_interleave(hq // hkv, 1)
    ref = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask)
    ref = torch.nan_to_num(ref, nan=0.0).transpose(1, 2)
    assert not torch.isnan(out).any()
    assert (out.double() - ref).abs().max().item() <= TOL[torch.bfloat16]


def test_num_splits_out_of_range_is_refused():
    q = torch.rand(1, 1, 2, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="num_splits"):
        flashjit.flash_attn_func(q, q, q, num_splits=129)


def reference_with_sinks(q, k, v, sinks):
    """Every key visible (decode), one learned logit per head in each row's denominator."""
    hq, hkv = q.shape[2], k.shape[2]
    q, k, v = (x.double().transpose(1, 2) for x in (q, k, v))
    k = k.repeat_interleave(hq // hkv, 1)
    v = v.repeat_interleave(hq // hkv, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    sink = sinks.double()[None, :, None, None]
    m = torch.maximum(s.amax(-1, keepdim=True), sink)
    p = torch.exp(s - m)
    return ((p @ v) / (p.sum(-1, keepdim=True) + torch.exp(sink - m))).transpose(1, 2)


def test_repeated_calls_with_sinks_take_the_fast_path(monkeypatch):
    """gpt-oss decode, the same call every token with the model's sinks: after the first,
    each call takes the repeat path, yet reads that call's sinks (float32, or a bfloat16
    parameter under no_grad) and matches float64; sinks whose gradient is asked for take
    autograd."""
    from flashjit import api
    full = []
    real = api._attention_forward
    monkeypatch.setattr(api, "_attention_forward",
                        lambda *a, **kw: full.append(1) or real(*a, **kw))
    torch.manual_seed(7)
    b, sk, hq, hkv, d = 2, 3000, 16, 2, 64
    k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in "kv")
    f32 = torch.randn(hq, device="cuda") * 2
    param = torch.nn.Parameter((torch.randn(hq, device="cuda") * 2).to(torch.bfloat16))
    for sinks in (f32, param):
        full.clear()
        for call in range(3):
            q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
            with torch.no_grad():
                if call == 2:  # new values in the same tensor: read by this call
                    sinks.add_(0.75)
                out = flashjit.flash_attn_func(q, k, v, causal=True, sinks=sinks)
            err = (out.double() - reference_with_sinks(q, k, v, sinks)).abs().max().item()
            assert err <= TOL[torch.bfloat16], (sinks.dtype, call, err)
        assert len(full) == 1, f"{sinks.dtype}: one full call, then repeats"
    out = flashjit.flash_attn_func(q, k, v, causal=True, sinks=param)
    assert out.requires_grad
    out.float().sum().backward()
    assert param.grad is not None and torch.isfinite(param.grad).all()


def test_repeated_calls_take_the_fast_path_and_see_new_data(monkeypatch):
    """A repeat of a plain call (same shapes, strides, dtypes and arguments) skips the
    Python argument work (_fast_forward), yet reads the new tensors and writes new outputs;
    other strides, a window, LSE, grad and a streamed call each get their own result."""
    from flashjit import api
    full = []
    real = api._attention_forward
    monkeypatch.setattr(api, "_attention_forward",
                        lambda *a, **kw: full.append(1) or real(*a, **kw))
    torch.manual_seed(5)
    shape_q, shape_kv = (2, 1, 8, 128), (2, 700, 2, 128)
    for call in range(3):
        q = torch.randn(shape_q, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(shape_kv, device="cuda", dtype=torch.bfloat16) for _ in "kv")
        out = flashjit.flash_attn_func(q, k, v, causal=True)
        out2, lse, _ = flashjit.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        torch.cuda.synchronize()
        ref = reference(q, k, v, True, (-1, -1))
        for o in (out, out2):
            assert (o.double() - ref).abs().max().item() <= TOL[torch.bfloat16]
        assert out.data_ptr() != out2.data_ptr()
        assert lse.shape == (2, 8, 1) and torch.isfinite(lse).all()
    assert len(full) == 2, "the two kinds of call each took the full path once, then repeated"
    # Other strides (a transposed view of the same shape) and a window: new keys, right.
    k_t = torch.randn(2, 2, 700, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    for args in ({"causal": True}, {"window_size": (100, 0)}):
        for _ in range(2):
            out = flashjit.flash_attn_func(q, k_t, v, **args)
            ref = reference(q, k_t, v, args.get("causal", False),
                            args.get("window_size", (-1, -1)))
            assert (out.double() - ref).abs().max().item() <= TOL[torch.bfloat16]
    # A side stream: the call runs on torch's current stream, as the full path does.
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        out = flashjit.flash_attn_func(q, k, v, causal=True)
    side.synchronize()
    assert (out.double() - reference(q, k, v, True, (-1, -1))).abs().max().item() <= \
        TOL[torch.bfloat16]
    # Inputs that require grad leave the fast path: the result carries autograd.
    qg = q.clone().requires_grad_()
    out = flashjit.flash_attn_func(qg, k, v, causal=True)
    assert out.requires_grad
    out.float().sum().backward()
    assert qg.grad is not None and torch.isfinite(qg.grad).all()



@pytest.mark.parametrize("d", [64, 128])
def test_empty_shapes_on_cuda(d):
    """FlashAttention-2's empty calls on CUDA tensors (whose empty storage is null):
    queries without keys get 0 and LSE +inf (return_attn_probs), gradients 0; no
    queries or a batch of 0 an empty output. D=128 takes sm_90's TMA kernel, whose
    tensor maps see the empty K and V. Outputs start as NaN where the test makes them."""
    torch.manual_seed(5)
    dev, dt = "cuda", torch.bfloat16
    for b, sq, sk in ((2, 300, 0), (2, 1, 0), (2, 0, 300), (0, 64, 64), (1, 0, 0)):
        q = torch.randn(b, sq, 8, d, device=dev, dtype=dt, requires_grad=True)
        k = torch.randn(b, sk, 2, d, device=dev, dtype=dt, requires_grad=True)
        v = torch.randn(b, sk, 2, d, device=dev, dtype=dt, requires_grad=True)
        out, lse, _ = flashjit.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        assert out.shape == (b, sq, 8, d) and lse.shape == (b, 8, sq)
        assert (out == 0).all() and torch.isposinf(lse).all()
        out.backward(torch.randn_like(out))
        for x in (q, k, v):
            assert x.grad.shape == x.shape and (x.grad == 0).all()
        with torch.no_grad():
            for splits in (0, 1, 4):
                o = flashjit.flash_attn_func(q, k, v, num_splits=splits)
                assert o.shape == out.shape and (o == 0).all()
    with torch.no_grad():
        # Varlen with sequences without keys or queries, and all empty.
        for lq, lk in (([3, 0, 500], [0, 600, 400]), ([0, 0], [0, 0])):
            cq = torch.tensor([0] + lq, device=dev).cumsum(0).int()
            ck = torch.tensor([0] + lk, device=dev).cumsum(0).int()
            q = torch.randn(int(cq[-1]), 8, d, device=dev, dtype=dt)
            k = torch.randn(int(ck[-1]), 2, d, device=dev, dtype=dt)
            v = torch.randn_like(k)
            out = flashjit.flash_attn_varlen_func(q, k, v, cq, ck, max(lq), max(lk), causal=True)
            for i in range(len(lq)):
                rows, keys = slice(int(cq[i]), int(cq[i + 1])), slice(int(ck[i]), int(ck[i + 1]))
                if lq[i] and lk[i]:
                    ref = reference(q[None, rows], k[None, keys], v[None, keys], True, (-1, -1))
                    assert (out[None, rows].double() - ref).abs().max().item() <= TOL[dt]
                elif lq[i]:
                    assert (out[rows] == 0).all()
        # A KV cache that holds no key, and SDPA without keys.
        q = torch.randn(2, 1, 8, d, device=dev, dtype=dt)
        for cap in (0, 256):
            kc = torch.randn(2, cap, 2, d, device=dev, dtype=dt)
            out, lse = flashjit.flash_attn_with_kvcache(
                q, kc, torch.randn_like(kc), cache_seqlens=torch.zeros(2, dtype=torch.int32,
                                                                       device=dev),
                return_softmax_lse=True)
            assert (out == 0).all() and torch.isposinf(lse).all()
        kv = torch.randn(2, 8, 0, d, device=dev, dtype=dt)
        out = flashjit.scaled_dot_product_attention(q.transpose(1, 2), kv, kv)
        assert out.shape == (2, 8, 1, d) and (out == 0).all()


def test_many_grouped_rows_take_the_wide_kernels():
    """16 tokens of 8:1 GQA are 128 grouped rows per KV head: with 40000 keys in all, on
    sm_90 the wide split and decode kernels run them (explain() counts them), 8 tokens
    the four-wave ones."""
    import re
    from flashjit import _lib, api

    def wide_calls():
        texts = [(_lib.lib.fj_attention_explain(h) or b"").decode()
                 for h in api._ATTENTIONS.values()]
        return sum(int(n) for t in texts
                   for n in re.findall(r"(\d+) of those 128 or more rows per KV head", t))

    torch.manual_seed(3)
    k = torch.randn(2, 20000, 1, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    before = wide_calls()
    for sq in (8, 16):
        q = torch.randn(2, sq, 8, 128, device="cuda", dtype=torch.bfloat16)
        for splits in (0, 1):
            out = flashjit.flash_attn_func(q, k, v, causal=True, num_splits=splits)
            ref = reference(q, k, v, True, (-1, -1))
            assert (out.double() - ref).abs().max().item() <= TOL[torch.bfloat16]
    sm90 = torch.cuda.get_device_capability() == (9, 0)
    assert wide_calls() - before == (2 if sm90 else 0)
