"""Gradients through flash_attn_func (issue 15): torch inputs that require grad get
dq, dk, dv from flashjit's backward on CUDA, compared with float64 analytic gradients;
what the backward does not take yet is refused by name (KV-cache calls at once; varlen
calls over a block_table or seqused_k run forward and refuse the backward, as
FlashAttention's do); attention sinks get their own gradient; varlen calls get their gradients per sequence rather than returning an output detached from autograd; softcap and
ALiBi are differentiated through. Needs torch; the refusals run on the CPU too (they come before
the device check).

Tolerance: each gradient's relative L2 error within 2e-2 (bf16) / 1e-2 (f16) of the
float64 reference, and at most 3x that of PyTorch's own bf16/f16 math-attention
gradients plus 1e-3 (FlashAttention's rule for its backward tests)."""
import math

import pytest

torch = pytest.importorskip("torch")

import flashjit  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def make(requires_grad, dtype=torch.float16, shape=(1, 16, 2, 32)):
    return [(torch.rand(*shape) * 2 - 1).to(DEVICE, dtype).requires_grad_(r)
            for r in requires_grad]


def causal_sinks_grads(q, k, v, sinks, dout):
    """float64 (dq, dk, dv, dsinks) of causal attention with sinks, q [b, sq, hq, d], k, v
    [b, sk, hkv, d]: autograd through softmax over [scores, sink] with the sink's column
    dropped (it has no value)."""
    q64, k64, v64, s64 = (x.detach().double().requires_grad_() for x in (q, k, v, sinks))
    b, sq, hq, d = q.shape
    sk, g = k.shape[1], hq // k.shape[2]
    scores = torch.einsum("bqhd,bkhd->bhqk", q64, k64.repeat_interleave(g, 2)) / math.sqrt(d)
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    scores = scores.masked_fill(j > i + sk - sq, float("-inf"))
    logits = torch.cat([scores, s64[None, :, None, None].expand(b, hq, sq, 1)], dim=-1)
    p = torch.softmax(logits, dim=-1)[..., :sk]
    torch.einsum("bhqk,bkhd->bqhd", p, v64.repeat_interleave(g, 2)).backward(dout.double())
    return q64.grad, k64.grad, v64.grad, s64.grad


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sinks_get_gradients_on_cuda(dtype):
    """Learned attention sinks (gpt-oss) that require grad: q, k, v and the sinks get
    their gradients, against float64 autograd through softmax over [scores, sink] with
    the sink's column dropped; dsinks comes in the sinks' dtype."""
    torch.manual_seed(3)
    b, sq, sk, hq, hkv, d = 2, 40, 64, 4, 2, 64
    q = (torch.rand(b, sq, hq, d, device="cuda") * 2 - 1).to(dtype).requires_grad_()
    k = (torch.rand(b, sk, hkv, d, device="cuda") * 2 - 1).to(dtype).requires_grad_()
    v = (torch.rand(b, sk, hkv, d, device="cuda") * 2 - 1).to(dtype).requires_grad_()
    sinks = (torch.rand(hq, device="cuda") * 3 - 1).to(dtype).requires_grad_()
    dout = (torch.rand(b, sq, hq, d, device="cuda") * 2 - 1).to(dtype)
    out = flashjit.flash_attn_func(q, k, v, causal=True, sinks=sinks)
    out.backward(dout)
    assert sinks.grad is not None and sinks.grad.dtype == dtype

    want = causal_sinks_grads(q, k, v, sinks, dout)
    rel = 2e-2 if dtype == torch.bfloat16 else 1e-2
    for name, got, ref in zip("q k v sinks".split(), (q.grad, k.grad, v.grad, sinks.grad), want):
        err = ((got.double() - ref).norm() / ref.norm()).item()
        assert err <= rel, f"d{name} relative error {err:.3g} > {rel}"


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_varlen_sinks_get_gradients_on_cuda():
    """flash_attn_varlen_func with sinks that require grad: each sequence's dq, dk, dv
    against its float64 gradients, and dsinks against the sum of the sequences' (bf16,
    relative L2 2e-2)."""
    torch.manual_seed(8)
    cu = torch.tensor([0, 20, 65], dtype=torch.int32, device="cuda")
    q, k, v = ((torch.rand(65, 4, 64, device="cuda") * 2 - 1).to(torch.bfloat16)
               .requires_grad_() for _ in range(3))
    sinks = (torch.rand(4, device="cuda") * 2 - 1).requires_grad_()
    dout = (torch.rand(65, 4, 64, device="cuda") * 2 - 1).to(torch.bfloat16)
    flashjit.flash_attn_varlen_func(q, k, v, cu, cu, 45, 45, causal=True,
                                    sinks=sinks).backward(dout)
    want_dsinks = 0
    for b in range(2):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        want = causal_sinks_grads(q[rows][None], k[rows][None], v[rows][None], sinks,
                                  dout[rows][None])
        for name, got, ref in zip("qkv", (q.grad[rows], k.grad[rows], v.grad[rows]), want):
            err = ((got.double() - ref[0]).norm() / ref[0].norm()).item()
            assert err <= 2e-2, f"sequence {b}: d{name} relative error {err:.3g}"
        want_dsinks = want_dsinks + want[3]
    err = ((sinks.grad.double() - want_dsinks).norm() / want_dsinks.norm()).item()
    assert err <= 2e-2, f"dsinks relative error {err:.3g}"


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_varlen_over_a_block_table_runs_forward_and_refuses_backward():
    """flash_attn_varlen_func with a block_table (or seqused_k) and q requiring grad: the
    forward runs, as FlashAttention's does (its tests call it so and check the output),
    with the output of the same call without grad; asking for a gradient through it is
    a NotImplementedError naming the call (the backward does not take it), never a
    silent zero."""
    torch.manual_seed(6)
    q = (torch.rand(24, 2, 64, device="cuda") * 2 - 1).to(torch.bfloat16).requires_grad_()
    cache = (torch.rand(4, 16, 2, 64, device="cuda") * 2 - 1).to(torch.bfloat16)
    table = torch.tensor([[3, 1], [0, 2]], dtype=torch.int32, device="cuda")
    cu_q = torch.tensor([0, 10, 24], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 20, 52], dtype=torch.int32, device="cuda")
    out = flashjit.flash_attn_varlen_func(q, cache, cache, cu_q, cu_k, 14, 32, causal=True,
                                          block_table=table)
    with torch.no_grad():
        plain = flashjit.flash_attn_varlen_func(q, cache, cache, cu_q, cu_k, 14, 32,
                                                causal=True, block_table=table)
    assert out.requires_grad and torch.equal(out.detach(), plain)
    with pytest.raises(NotImplementedError, match=r"gradient of q .*block_table or seqused_k"):
        out.sum().backward()
    kv = (torch.rand(24, 2, 64, device="cuda") * 2 - 1).to(torch.bfloat16)
    used = torch.tensor([7, 14], dtype=torch.int32, device="cuda")
    out = flashjit.flash_attn_varlen_func(q, kv, kv, cu_q, cu_q, 14, 14, seqused_k=used)
    with pytest.raises(NotImplementedError, match=r"gradient of q .*block_table or seqused_k"):
        out.sum().backward()


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("packing", ["qkv", "kv"])
def test_varlen_packed_tensors_get_their_gradients_on_cuda(packing):
    """flash_attn_varlen_qkvpacked_func / flash_attn_varlen_kvpacked_func through autograd:
    dq, dk and dv are written by the strides of the views of the packed tensor (dense
    buffers read back by those strides gave wrong gradients: FlashAttention's own varlen
    packed tests found it), each sequence's against float64 (the tolerance above)."""
    torch.manual_seed(9)
    lens = [1, 130, 0, 77]
    cu = torch.tensor([0, 1, 131, 131, 208], dtype=torch.int32, device="cuda")
    qkv = (torch.rand(208, 3, 4, 64, device="cuda") * 2 - 1).to(torch.bfloat16)
    dout = (torch.rand(208, 4, 64, device="cuda") * 2 - 1).to(torch.bfloat16)
    if packing == "qkv":
        qkv.requires_grad_()
        out = flashjit.flash_attn_varlen_qkvpacked_func(qkv, cu, 130, causal=True)
        out.backward(dout)
        grads = [qkv.grad[:, i] for i in range(3)]
    else:
        q = qkv.detach()[:, 0].clone().requires_grad_()
        kv = qkv.detach()[:, 1:].clone().requires_grad_()
        flashjit.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, 130, 130,
                                                 causal=True).backward(dout)
        grads = [q.grad, kv.grad[:, 0], kv.grad[:, 1]]
    for b in range(4):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        if not lens[b]:
            continue
        parts = [qkv.detach()[rows, i][None] for i in range(3)]
        args = (*parts, dout[rows][None], True, (-1, -1))
        truth, low = reference_grads(*args, torch.float64), reference_grads(*args, torch.bfloat16)
        expect_sequence_grads(b, [g[rows] for g in grads], truth, low, 2e-2)


def test_issue15_kvcache_sequences_requiring_grad_are_refused():
    q = (torch.rand(16, 2, 32) * 2 - 1).to(DEVICE, torch.float16).requires_grad_()
    kv = (torch.rand(1, 16, 2, 32) * 2 - 1).to(DEVICE, torch.float16)
    with pytest.raises(NotImplementedError, match=r"requires? grad .*does not take KV-cache calls"):
        flashjit.flash_attn_with_kvcache(q[None], kv, kv)
    learned = torch.zeros(2, device=DEVICE, requires_grad=True)  # the sinks alone
    with pytest.raises(NotImplementedError, match=r"sinks requires grad .*KV-cache calls"):
        flashjit.flash_attn_with_kvcache(q.detach()[None], kv, kv, sinks=learned)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_varlen_gradients_match_each_sequence_on_cuda(dtype):
    """flash_attn_varlen_func through autograd: each sequence's rows of q.grad, k.grad and
    v.grad against that sequence alone (the tolerance above)."""
    torch.manual_seed(5)
    lens_q, lens_k = [1, 130, 0, 77], [64, 130, 5, 200]
    cu_q = torch.tensor([0, 1, 131, 131, 208], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 64, 194, 199, 399], dtype=torch.int32, device="cuda")
    q = (torch.rand(208, 8, 64, device="cuda") * 2 - 1).to(dtype).requires_grad_()
    k = (torch.rand(399, 2, 64, device="cuda") * 2 - 1).to(dtype).requires_grad_()
    v = (torch.rand(399, 2, 64, device="cuda") * 2 - 1).to(dtype).requires_grad_()
    dout = (torch.rand(208, 8, 64, device="cuda") * 2 - 1).to(dtype)
    out = flashjit.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                          causal=True)
    out.backward(dout)
    rel = 2e-2 if dtype == torch.bfloat16 else 1e-2
    for b in range(4):
        if not lens_q[b]:
            assert not k.grad[int(cu_k[b]):int(cu_k[b + 1])].any()  # no query sees these keys
            continue
        qs = slice(int(cu_q[b]), int(cu_q[b + 1]))
        ks = slice(int(cu_k[b]), int(cu_k[b + 1]))
        args = (q[qs][None], k[ks][None], v[ks][None], dout[qs][None], True, (-1, -1))
        truth, low = reference_grads(*args, torch.float64), reference_grads(*args, dtype)
        expect_sequence_grads(b, [q.grad[qs], k.grad[ks], v.grad[ks]], truth, low, rel)


def expect_sequence_grads(b, grads, truth, low, rel):
    """Sequence b's dq, dk and dv against float64 (`truth`): relative error at most `rel`
    and at most 3x that of PyTorch in the low dtype (`low`, FlashAttention's rule); a
    gradient that is exactly 0 (one query over one key: P = 1, so dS and dq are 0) within
    1e-3 of 0."""
    for name, got, t, lo in zip("qkv", grads, truth, low):
        got, t, lo = got.double(), t[0], lo[0]
        if t.norm() == 0:
            assert got.abs().max().item() <= 1e-3, f"sequence {b}: d{name} is not 0"
            continue
        err = ((got - t).norm() / t.norm()).item()
        base = ((lo - t).norm() / t.norm()).item()
        assert err <= rel, f"sequence {b}: d{name} relative error {err:.3g} > {rel}"
        assert err <= 3 * base + 1e-3, f"sequence {b}: d{name} {err:.3g} vs {base:.3g}"


def reference_grads(q, k, v, dout, causal, window, dtype, softcap=0.0, alibi_slopes=None):
    """PyTorch math attention in `dtype` (float64 for the truth), GQA by repeating K/V,
    softcap and ALiBi (FlashAttention's formulas) differentiated by autograd."""
    q, k, v, dout = (x.detach().to(dtype).requires_grad_() for x in (q, k, v, dout))
    g = q.shape[2] // k.shape[2]
    kr, vr = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kr) / math.sqrt(q.shape[-1])
    sq, sk = q.shape[1], k.shape[1]
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    diag = i + sk - sq
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        s = s - alibi_slopes.to(dtype)[None, :, None, None] * (diag - j).abs()[None, None]
    visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        visible &= j <= diag
    if window[0] >= 0:
        visible &= j >= diag - window[0]
    if window[1] >= 0:
        visible &= j <= diag + window[1]
    p = torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1).nan_to_num(0.0)
    o = torch.einsum("bhqk,bkhd->bqhd", p, vr)
    o.backward(dout.to(dtype))
    return [x.grad.double() for x in (q, k, v)]


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("b,sq,sk,hq,hkv,d,causal,window", [
    (2, 128, 128, 4, 4, 64, False, (-1, -1)),
    (1, 200, 333, 8, 2, 128, True, (-1, -1)),
    (1, 300, 100, 4, 1, 96, True, (-1, -1)),   # rows that see no key
    (2, 96, 96, 4, 2, 80, False, (32, 16)),
    (1, 200, 333, 4, 4, 256, False, (-1, -1)),  # two-pass dK/dV, written directly
    (1, 150, 260, 4, 2, 224, True, (-1, -1)),   # two-pass dK/dV per query head, reduced
])
def test_gradients_match_the_reference_on_cuda(dtype, b, sq, sk, hq, hkv, d, causal, window):
    torch.manual_seed(sq + d)
    q = (torch.rand(b, sq, hq, d, device="cuda") * 2 - 1).to(dtype).requires_grad_()
    k = (torch.rand(b, sk, hkv, d, device="cuda") * 2 - 1).to(dtype).requires_grad_()
    v = (torch.rand(b, sk, hkv, d, device="cuda") * 2 - 1).to(dtype).requires_grad_()
    dout = (torch.rand(b, sq, hq, d, device="cuda") * 2 - 1).to(dtype)
    out = flashjit.flash_attn_func(q, k, v, causal=causal, window_size=window)
    out.backward(dout)
    truth = reference_grads(q, k, v, dout, causal, window, torch.float64)
    low = reference_grads(q, k, v, dout, causal, window, dtype)
    rel = 2e-2 if dtype == torch.bfloat16 else 1e-2
    for name, x, t, lo in zip("qkv", (q, k, v), truth, low):
        assert x.grad is not None and x.grad.shape == x.shape, name
        got = x.grad.double()
        assert torch.isfinite(got).all(), f"d{name} has non-finite values"
        err = ((got - t).norm() / t.norm()).item()
        base = ((lo - t).norm() / t.norm()).item()
        assert err <= rel, f"d{name}: relative error {err:.3g} > {rel}"
        assert err <= 3 * base + 1e-3, f"d{name}: {err:.3g} vs PyTorch {dtype}'s {base:.3g}"


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gradients_through_softcap_and_alibi_on_cuda(dtype):
    torch.manual_seed(9)
    b, sq, sk, hq, hkv, d = 2, 150, 190, 4, 2, 64
    q = (torch.rand(b, sq, hq, d, device="cuda") * 2 - 1).to(dtype).requires_grad_()
    k = (torch.rand(b, sk, hkv, d, device="cuda") * 2 - 1).to(dtype).requires_grad_()
    v = (torch.rand(b, sk, hkv, d, device="cuda") * 2 - 1).to(dtype).requires_grad_()
    dout = (torch.rand(b, sq, hq, d, device="cuda") * 2 - 1).to(dtype)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device="cuda")
    out = flashjit.flash_attn_func(q, k, v, causal=True, softcap=3.0, alibi_slopes=slopes)
    out.backward(dout)
    truth = reference_grads(q, k, v, dout, True, (-1, -1), torch.float64, 3.0, slopes)
    low = reference_grads(q, k, v, dout, True, (-1, -1), dtype, 3.0, slopes)
    rel = 2e-2 if dtype == torch.bfloat16 else 1e-2
    for name, x, t, lo in zip("qkv", (q, k, v), truth, low):
        err = ((x.grad.double() - t).norm() / t.norm()).item()
        base = ((lo - t).norm() / t.norm()).item()
        assert err <= rel and err <= 3 * base + 1e-3, f"d{name}: {err:.3g} (PyTorch {base:.3g})"


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_backward_is_deterministic_and_only_inputs_requiring_grad_get_one():
    torch.manual_seed(5)
    q, k, v = make((True, False, True), torch.bfloat16, (2, 256, 4, 64))
    dout = torch.rand_like(q)
    grads = []
    for _ in range(2):
        q.grad = v.grad = None
        flashjit.flash_attn_func(q, k, v, causal=True).backward(dout)
        grads.append((q.grad.clone(), v.grad.clone()))
    assert k.grad is None
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_packed_qkv_gets_its_gradient_on_cuda():
    """flash_attn_qkvpacked_func and flash_attn_kvpacked_func: the gradient reaches the
    packed tensor through the views, against float64 autograd of causal attention (bf16,
    relative L2 2e-2 per part)."""
    torch.manual_seed(21)
    qkv = (torch.rand(2, 48, 3, 4, 64, device="cuda") * 2 - 1).to(torch.bfloat16)
    qkv.requires_grad_()
    dout = (torch.rand(2, 48, 4, 64, device="cuda") * 2 - 1).to(torch.bfloat16)
    flashjit.flash_attn_qkvpacked_func(qkv, causal=True).backward(dout)
    q = qkv.detach()[:, :, 0].to(torch.bfloat16).requires_grad_()
    kv = qkv.detach()[:, :, 1:].clone().requires_grad_()
    flashjit.flash_attn_kvpacked_func(q, kv, causal=True).backward(dout)
    sinks = torch.full((4,), float("-inf"), device="cuda")  # no sink: plain causal attention
    want = causal_sinks_grads(*(qkv.detach()[:, :, i] for i in range(3)), sinks, dout)
    for i, name in enumerate("qkv"):
        for where, got in ((f"qkv[:, :, {i}]", qkv.grad[:, :, i]),
                           (f"q / kv[:, :, {i - 1}]", q.grad if i == 0 else kv.grad[:, :, i - 1])):
            err = ((got.double() - want[i]).norm() / want[i].norm()).item()
            assert err <= 2e-2, f"d{name} through {where}: relative error {err:.3g}"
