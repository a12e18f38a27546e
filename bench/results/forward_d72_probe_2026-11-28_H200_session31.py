"""Why head dim 72 runs slower than 80 on sm_90: layouts and configs, one process."""
import statistics, sys, torch
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

B, S, H = 16, 1024, 16
def qkv(D, width=None, causal=False):
    width = width or D
    g = torch.Generator(device="cuda").manual_seed(D)
    mk = lambda: torch.randn(B, S, H, width, device="cuda", dtype=torch.bfloat16, generator=g)[..., :D]
    return mk(), mk(), mk()
def tf(us, D, causal=False): return 4 * B * H * S * S * D / (2 if causal else 1) / us / 1e6
for causal in (False, True):
  for D, width, cfg in [(64, None, None), (72, None, None), (80, None, None), (88, None, None), (96, None, None),
                        (72, 80, None), (72, 128, None), (80, 128, None),
                        (72, None, dict(block_m=128, block_n=128, waves=8, stages=3, q_in_lds=1)),
                        (72, None, dict(block_m=128, block_n=64, waves=4, stages=2, q_in_lds=1)),
                        (80, None, dict(block_m=128, block_n=64, waves=4, stages=2, q_in_lds=1))]:
    q, k, v = qkv(D, width)
    out = flashjit.flash_attn_func(q, k, v, causal=causal, config=cfg)
    ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal).transpose(1, 2)
    err = (out - ref).abs().max().item()
    us = t_us(lambda: flashjit.flash_attn_func(q, k, v, causal=causal, config=cfg))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        try: cu = t_us(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
        except RuntimeError: cu = float('nan')
    print(f"causal={causal} D={D} width={width or D} cfg={cfg}: flashjit {us:8.1f} us {tf(us, D, causal):6.1f} TF/s | cudnn {cu:8.1f} us {tf(cu, D, causal):6.1f} | err {err:.2e}", flush=True)
