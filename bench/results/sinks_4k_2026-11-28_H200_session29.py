import statistics, sys, torch
sys.path.insert(0, "python")
import flashjit
flush = torch.empty(256 << 18, dtype=torch.int32, device="cuda")
def timed(fn, iters=20):
    for _ in range(3): fn()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in ev:
        flush.zero_(); a.record(); fn(); b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev) * 1e3
q = torch.randn(1, 1, 64, 64, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(1, 4096, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in "kv")
sinks = torch.randn(64, device="cuda") * 2
for r in range(4):
    a = timed(lambda: flashjit.flash_attn_func(q, k, v, causal=True, sinks=sinks))
    b = timed(lambda: flashjit.flash_attn_func(q, k, v, causal=True))
    print(f"round {r}: sinks {a:.1f} us, no sinks {b:.1f} us", flush=True)
import os
os.environ["FLASHJIT_DEBUG"] = "0"
print(flashjit.__file__)
