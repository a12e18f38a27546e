"""gpt-oss-like decode with attention sinks (64 query heads, 8 KV heads, head dim 64, bf16):
flashjit against a float64 reference, and its time with split-KV (num_splits 0: chosen)
against the attention kernel alone (num_splits 1, the path every call with sinks took before
session 28) and against the same call without sinks. CUDA events, L2 flushed (256 MB
written) before each timed call, the median of 20. Needs PyTorch with CUDA; run from the
repository root:

    FLASHJIT_LIBRARY=build/runtime/libflashjit.so python3 bench/sinks_decode_probe.py
"""
import statistics
import sys

import torch
sys.path.insert(0, "python")
import flashjit

flush = torch.empty(256 << 18, dtype=torch.int32, device="cuda")

def timed(fn, iters=20):
    for _ in range(3):
        fn()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in ev:
        flush.zero_(); a.record(); fn(); b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev) * 1e3

def reference(q, k, v, sinks, window):
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    qd, kd, vd = (x.double() for x in (q, k, v))
    kd = kd.repeat_interleave(g, dim=2); vd = vd.repeat_interleave(g, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", qd, kd) / d ** 0.5
    qi = torch.arange(sq, device=q.device)[:, None] + sk - sq
    ki = torch.arange(sk, device=q.device)[None, :]
    keep = ki <= qi
    if window >= 0:
        keep &= ki >= qi - window
    s = s.masked_fill(~keep, float("-inf"))
    sink = sinks.double()[None, :, None, None].expand(b, hq, sq, 1)
    p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
    return torch.einsum("bhqk,bkhd->bqhd", p, vd)

print(f"# {torch.cuda.get_device_name()}: flashjit with sinks, 64:8 query:KV heads, D=64, bf16")
print(f"{'B':>4} {'Sq':>3} {'Sk':>7} {'window':>6} {'max err':>9} {'split-KV us':>12} {'num_splits=1 us':>16} {'no sinks us':>12}")
worst = 0.0
for b, sq, sk, window in ((1, 1, 4096, -1), (1, 1, 32768, -1), (1, 1, 131072, -1), (8, 1, 32768, -1),
                          (32, 1, 8192, -1), (1, 4, 32768, -1), (8, 1, 32768, 128)):
    torch.manual_seed(b * 7 + sk)
    q = torch.randn(b, sq, 64, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, 8, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, sk, 8, 64, device="cuda", dtype=torch.bfloat16)
    sinks = torch.randn(64, device="cuda", dtype=torch.float32) * 2
    ws = (window, 0) if window >= 0 else (-1, -1)
    call = lambda n, s=sinks: flashjit.flash_attn_func(q, k, v, causal=True, window_size=ws, sinks=s, num_splits=n)
    out = call(0)
    ref = reference(q, k, v, sinks, window)
    err = (out.double() - ref).abs().max().item()
    err1 = (call(1).double() - ref).abs().max().item()
    worst = max(worst, err, err1)
    t0, t1 = timed(lambda: call(0)), timed(lambda: call(1))
    tn = timed(lambda: flashjit.flash_attn_func(q, k, v, causal=True, window_size=ws, num_splits=0))
    print(f"{b:>4} {sq:>3} {sk:>7} {window:>6} {max(err, err1):>9.2e} {t0:>12.1f} {t1:>16.1f} {tn:>12.1f}", flush=True)
print(f"worst max abs error against float64: {worst:.2e} (tolerance 2e-2, bf16 output)")
assert worst < 2e-2
