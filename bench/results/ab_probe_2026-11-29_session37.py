"""A/B timing: flashjit default config against SDPA FLASH. argv: mode (fwd|bwd) then S:D:causal...
B*S = 16384, H*D = 2048, bf16, L2 flushed, median of 15."""
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
mode = sys.argv[1]
for c in sys.argv[2:]:
    S, D, causal = c.split(":"); S, D, causal = int(S), int(D), causal == "1"
    B, H = max(1, 16384 // S), 2048 // D
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    if mode == "fwd":
        ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)
        out = flashjit.flash_attn_func(q, k, v, causal=causal)
        err = (out - ref).abs().max().item()
        us = t_us(lambda: flashjit.flash_attn_func(q, k, v, causal=causal))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            fl = t_us(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
    else:
        for x in (q, k, v): x.requires_grad_(True)
        do = torch.randn_like(q)
        out = flashjit.flash_attn_func(q, k, v, causal=causal)
        g = torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
        qr, kr, vr = (x.detach().transpose(1, 2).requires_grad_(True) for x in (q, k, v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            ro = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
            rg = torch.autograd.grad(ro, (qr, kr, vr), do.transpose(1, 2), retain_graph=True)
            fl = t_us(lambda: torch.autograd.grad(ro, (qr, kr, vr), do.transpose(1, 2), retain_graph=True))
        err = max((a - b.transpose(1, 2)).abs().max().item() for a, b in zip(g, rg))
        us = t_us(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True))
    print(f"{mode} S={S} D={D} causal={int(causal)}: {us:.1f} us  FLASH {fl:.1f} us  ratio {fl/us:.3f}  err {err:.4f}", flush=True)
