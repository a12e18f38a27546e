"""The forward with dropout 0.1 in one process: flashjit (with and without dropout) against
SDPA's FLASH and cuDNN backends with dropout 0.1; B * S = 16k tokens, H * D = 2048, bf16;
CUDA events around each call after a 256 MB write that flushes L2, the median of 15 after 3.

    FLASHJIT_LIBRARY=... python3 bench/forward_dropout_probe.py S:D:causal [...]
    e.g. 4096:64:0 4096:128:1
"""
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
for case in sys.argv[1:]:
    s, d, causal = case.split(":")
    s, d, causal = int(s), int(d), causal == "1"
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in "qkv")
    fl = 4 * b * h * s * s * d / (2 if causal else 1)
    res = {}
    res["flashjit"] = t_us(lambda: flashjit.flash_attn_func(q, k, v, causal=causal, dropout_p=0.1))
    res["flashjit_nodrop"] = t_us(lambda: flashjit.flash_attn_func(q, k, v, causal=causal))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    for name, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with sdpa_kernel(be):
                res[name] = t_us(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, dropout_p=0.1))
        except RuntimeError as e:
            res[name] = float("nan")
    print(f"S={s} D={d} causal={int(causal)} " + " ".join(f"{n} {t:.1f}us ({fl/t/1e6:.0f} TF)" for n, t in res.items())
          + f"  flashjit/flash {res['sdpa_flash']/res['flashjit']:.2f}x", flush=True)
