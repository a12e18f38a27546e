"""Forward configs in one process: B*S = 16384, H = 16 (bench_sdpa.py's shapes), L2 flushed,
median of 15; the configs of each case alternate over 2 rounds."""
import json, statistics, sys, torch
sys.path.insert(0, "python")
import flashjit
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
def t_us(fn, iters=15):
    for _ in range(3): fn()
    ts = []
    for _ in range(iters):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)
cases = [c.split(":") for c in sys.argv[1].split(",")]          # S:D:causal
configs = [None] + [json.loads(c) for c in sys.argv[2:]]
H = 16
for S, D, causal in cases:
    S, D, causal = int(S), int(D), causal == "1"
    B = max(1, 16384 // S)
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4 * B * H * S * S * D / (2 if causal else 1)
    ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal).transpose(1, 2)
    res = {}
    for r in range(2):
        for i, cfg in enumerate(configs):
            try:
                out = flashjit.flash_attn_func(q, k, v, causal=causal, config=cfg)
                err = (out - ref).abs().max().item()
                us = t_us(lambda: flashjit.flash_attn_func(q, k, v, causal=causal, config=cfg))
                res.setdefault(i, []).append((us, err))
            except Exception as e:
                res[i] = [(float('nan'), str(e)[:100])]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        cu = t_us(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
    print(f"S={S} D={D} causal={causal}: cudnn {cu:.1f} us {flops/cu/1e6:.0f} TF/s", flush=True)
    for i, cfg in enumerate(configs):
        ts = [u for u, _ in res[i]]
        print(f"   {str(cfg or 'default'):80s} {' / '.join(f'{u:.1f}' for u in ts)} us  {flops/min(ts)/1e6:.0f} TF/s  err {res[i][0][1]}", flush=True)
