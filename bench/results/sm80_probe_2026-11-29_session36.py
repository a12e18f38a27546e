"""The sm80 rules against SDPA FLASH (FA2) on an H100/H200: a build with -DFLASHJIT_SM80_RULES_ON_SM90=ON
(session 36 ran this with a patched Sm90Rules::lowers to the same effect).
B*S = 16384, H*D = 2048 as bench_sdpa, L2 flushed, median of 15; configs alternate over 2 rounds.
argv: S:D:causal,... then per-D config lists as D=cfg;cfg (cfg = bm/bn/waves/stages/qlds)."""
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
cases = [c.split(":") for c in sys.argv[1].split(",")]
per_d = {}
for arg in sys.argv[2:]:
    d, _, cfgs = arg.partition("=")
    per_d[int(d)] = [dict(zip(("block_m", "block_n", "waves", "stages", "q_in_lds"), map(int, c.split("/"))))
                     for c in cfgs.split(";")]
for S, D, causal in cases:
    S, D, causal = int(S), int(D), causal == "1"
    B, H = max(1, 16384 // S), 2048 // D
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4 * B * H * S * S * D / (2 if causal else 1)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)
    res = {}
    for r in range(2):
        for i, cfg in enumerate(per_d[D]):
            try:
                out = flashjit.flash_attn_func(q, k, v, causal=causal, config=cfg)
                err = (out - ref).abs().max().item()
                us = t_us(lambda: flashjit.flash_attn_func(q, k, v, causal=causal, config=cfg))
                res.setdefault(i, []).append((us, err))
            except Exception as e:
                res[i] = [(float('nan'), str(e)[:160])]
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        fl = t_us(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
    print(f"S={S} D={D} causal={causal}: FLASH {fl:.1f} us {flops/fl/1e6:.0f} TF/s", flush=True)
    for i, cfg in enumerate(per_d[D]):
        ts = [u for u, _ in res[i]]
        best = min(ts)
        print(f"   {'/'.join(str(x) for x in cfg.values()):16s} {' / '.join(f'{u:.1f}' for u in ts)} us  {flops/best/1e6:.0f} TF/s  {fl/best:.2f}x FLASH  err {res[i][0][1]}", flush=True)
