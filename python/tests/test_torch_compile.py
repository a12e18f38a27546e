"""flash_attn_func under torch.compile(fullgraph=True) (the flashjit::attention_forward
and attention_backward custom ops with fake implementations) and inside a CUDA graph,
on CUDA. The compiled and the eager calls run the same kernels, so outputs and
gradients agree within 1e-6 (the same bits, up to the order of the backward's sums,
which is fixed); the eager result is checked against float64 elsewhere
(test_torch_cuda.py, test_torch_grad.py)."""
import re

import pytest


def cuda_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch


def test_compile_fullgraph_forward_and_backward():
    torch = cuda_torch()
    import flashjit

    def loss(q, k, v, mask):
        out = flashjit.flash_attn_func(q, k, v, causal=True, softcap=20.0)
        sdpa = flashjit.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                     v.transpose(1, 2), attn_mask=mask,
                                                     enable_gqa=True)
        return (out.float() ** 2).sum() + sdpa.float().sum()

    torch.manual_seed(0)
    b, s, hq, hkv, d = 2, 160, 8, 2, 64
    base = [torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
            for h in (hq, hkv, hkv)]
    mask = torch.rand(b, 1, s, s, device="cuda") > 0.2
    compiled = torch.compile(loss, fullgraph=True)
    results = []
    for fn in (compiled, loss):
        q, k, v = (x.clone().requires_grad_() for x in base)
        value = fn(q, k, v, mask)
        value.backward()
        results.append((value.detach(), q.grad, k.grad, v.grad))
    for got, want in zip(*results):
        assert torch.allclose(got.float(), want.float(), atol=1e-6, rtol=1e-6)


def test_compile_works_when_flashjit_is_imported_before_torch():
    """A fresh process that imports flashjit first and torch second, then compiles a
    function whose first flashjit call is inside the trace (fullgraph): the ops were
    registered as torch's import finished."""
    cuda_torch()
    import os
    import pathlib
    import subprocess
    import sys
    package = pathlib.Path(__file__).resolve().parent.parent
    code = f"""
import sys
sys.path.insert(0, {str(package)!r})
import flashjit
import torch
q = torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.bfloat16)
f = torch.compile(lambda q: flashjit.flash_attn_func(q, q, q, causal=True), fullgraph=True)
assert torch.equal(f(q), flashjit.flash_attn_func(q, q, q, causal=True))
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ), timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_compile_refuses_dropout_without_a_seed():
    torch = cuda_torch()
    import flashjit
    q = torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.bfloat16)
    f = torch.compile(lambda q: flashjit.flash_attn_func(q, q, q, dropout_p=0.1), fullgraph=True)
    with pytest.raises(Exception, match="dropout needs dropout_seed"):
        f(q)
    g = torch.compile(lambda q: flashjit.flash_attn_func(q, q, q, dropout_p=0.1, dropout_seed=3),
                      fullgraph=True)
    assert torch.equal(g(q), flashjit.flash_attn_func(q, q, q, dropout_p=0.1, dropout_seed=3))


def captured(torch, call):
    """(graph, output) of `call` captured in a CUDA graph, after a first call on a side
    stream has created and compiled its kernels off the graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    return graph, out


def test_cuda_graph_capture_and_replay():
    torch = cuda_torch()
    import flashjit
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 300, 8, 128, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    graph, out = captured(torch, lambda: flashjit.flash_attn_func(q, k, v, causal=True,
                                                                  num_splits=1))
    for seed in (2, 3):
        torch.manual_seed(seed)
        for x in (q, k, v):
            x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        want = flashjit.flash_attn_func(q, k, v, causal=True, num_splits=1)
        assert torch.equal(out, want)



@pytest.mark.parametrize("hq,hkv,causal", [(32, 8, True), (8, 8, False)])
def test_decode_without_splits_is_captured_by_a_cuda_graph(hq, hkv, causal):
    """One-token decode with num_splits=1 splits no keys: it runs the decode kernel
    alone, which writes O itself (no workspace), so a CUDA graph captures it. Each
    replay over new K/V gives the eager call's bits and matches float64 within bf16's
    3e-2 (the GQA-packed rows with 32:8, the plain decode rows with 8:8)."""
    torch = cuda_torch()
    import flashjit
    from flashjit import _lib, api
    torch.manual_seed(5)
    b, sk, d = 3, 1500, 128
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    decode = lambda: flashjit.flash_attn_func(q, k, v, causal=causal, num_splits=1)  # noqa: E731
    graph, out = captured(torch, decode)
    for seed in (6, 7):
        torch.manual_seed(seed)
        for x in (q, k, v):
            x.copy_(torch.randn_like(x))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, decode())
        # float64: one query sees every key (bottom-right causal hides none)
        qd, kd, vd = (x.double().transpose(1, 2) for x in (q, k, v))
        want = torch.nn.functional.scaled_dot_product_attention(
            qd, kd.repeat_interleave(hq // hkv, 1), vd.repeat_interleave(hq // hkv, 1))
        assert (out.double() - want.transpose(1, 2)).abs().max().item() <= 3e-2
    plans = [(_lib.lib.fj_attention_explain(a) or b"").decode() for a in api._ATTENTIONS.values()]
    assert any(re.search(r"[1-9][0-9]* ran the decode kernel fa_fwd_\w+_decode_", p)
               for p in plans), plans

@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_compile_fullgraph_with_sinks_that_require_grad(dtype):
    """gpt-oss's attention sinks under torch.compile: q, k, v and the sinks (a bf16 or f32
    parameter) get the eager call's gradients, dsinks in the sinks' dtype."""
    torch = cuda_torch()
    import flashjit

    def loss(q, k, v, sinks):
        out = flashjit.flash_attn_func(q, k, v, causal=True, sinks=sinks)
        return (out.float() ** 2).sum()

    torch.manual_seed(4)
    b, s, hq, hkv, d = 2, 96, 4, 2, 64
    base = [torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
            for h in (hq, hkv, hkv)]
    sinks0 = torch.randn(hq, device="cuda").to(getattr(torch, dtype))
    compiled = torch.compile(loss, fullgraph=True)
    results = []
    for fn in (compiled, loss):
        q, k, v = (x.clone().requires_grad_() for x in base)
        sinks = sinks0.clone().requires_grad_()
        value = fn(q, k, v, sinks)
        value.backward()
        assert sinks.grad is not None and sinks.grad.dtype == sinks.dtype
        results.append((value.detach(), q.grad, k.grad, v.grad, sinks.grad))
    for got, want in zip(*results):
        assert torch.allclose(got.float(), want.float(), atol=1e-6, rtol=1e-6)
