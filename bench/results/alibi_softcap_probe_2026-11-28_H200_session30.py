import sys, torch
sys.path.insert(0, "python")
import flashjit
flush = torch.empty(256 << 18, dtype=torch.int32, device="cuda")
def timed(fn, iters=20):
    for _ in range(3): fn()
    ts = []
    for _ in range(iters):
        flush.zero_()
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
    return sorted(ts)[len(ts) // 2]
for D in (64, 128):
    B, S, H = 4, 4096, 2048 // D
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)], device="cuda")
    for causal in (False, True):
        for name, kw in (("plain", {}), ("alibi", {"alibi_slopes": slopes}), ("softcap", {"softcap": 30.0})):
            t = timed(lambda: flashjit.flash_attn_func(q, k, v, causal=causal, **kw))
            print(f"D={D} causal={int(causal)} {name:8s} {t:8.1f} us", flush=True)
