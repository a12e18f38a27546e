#!/usr/bin/env python3
"""Times flashjit kernels of several tuning configs per head dim on one GPU.

For B*S = 16k tokens, H = 16, the given seqlens and head dims, causal on and off:
every config of the grid below (waves, query rows per warp, Q in shared memory or
registers, keys per KV block; cp.async two stages) that the target accepts, timed
as bench_sdpa.py times flashjit.flash_attn_func (CUDA events around 10 calls,
median of 7 repeats, compile excluded). Prints TFLOP/s per config and the best
one per case, and writes a CSV: what the target's default configs are chosen from.

    FLASHJIT_LIBRARY=build/runtime/libflashjit.so python3 bench/sweep_configs.py --out bench/results
"""
import argparse
import csv
import datetime
import itertools
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "python"))
import flashjit  # noqa: E402
from bench_sdpa import time_ms  # noqa: E402


def configs(q_placement="both"):
    """The grid: waves x 16-query tiles per warp x Q placement x block_n (on sm_90,
    Q in registers with whole warpgroups takes the sm90 rules' wgmma, the rest the
    sm80 rules' mma.sync)."""
    placements = {"both": (False, True), "lds": (True,), "regs": (False,)}[q_placement]
    for waves, tiles, q_in_lds, block_n in itertools.product((4, 8), (1, 2), placements,
                                                             (32, 64, 128, 192)):
        yield {"block_m": 16 * tiles * waves, "block_n": block_n, "waves": waves, "stages": 2,
               "q_in_lds": q_in_lds}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seqlens", default="4096")
    ap.add_argument("--head-dims", default="64,96,128,192,256")
    ap.add_argument("--q-in", default="both", choices=["both", "lds", "regs"],
                    help="the grid's Q placements (on sm_90, lds: the sm90 rules' configs)")
    args = ap.parse_args()
    gpu = torch.cuda.get_device_name()
    stamp = datetime.date.today().isoformat()
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"sweep_{gpu.replace(' ', '_')}_{stamp}.csv"
    rows = []
    for s, d, causal in itertools.product(map(int, args.seqlens.split(",")),
                                          map(int, args.head_dims.split(",")), (False, True)):
        b = max(1, args.tokens // s)
        q, k, v = (torch.randn(b, s, args.heads, d, dtype=torch.bfloat16, device="cuda")
                   for _ in range(3))
        flops = 4 * b * args.heads * s * s * d / (2 if causal else 1)
        want = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            is_causal=causal).transpose(1, 2)
        default_ms = time_ms(lambda: flashjit.flash_attn_func(q, k, v, causal=causal))
        best = ("default", default_ms)
        print(f"S={s} D={d} causal={int(causal)}: default {flops / default_ms / 1e9:.0f} TF/s")
        rows.append([s, d, int(causal), "default", f"{default_ms:.4f}",
                     f"{flops / default_ms / 1e9:.1f}"])
        for c in configs(args.q_in):
            name = (f"bm{c['block_m']}_bn{c['block_n']}_w{c['waves']}"
                    f"_{'qlds' if c['q_in_lds'] else 'qreg'}")
            try:
                # Each config's output against SDPA's first: a fast wrong kernel is no candidate.
                err = (flashjit.flash_attn_func(q, k, v, causal=causal, config=c)
                       - want).abs().max().item()
                if not err < 2e-2:
                    rows.append([s, d, int(causal), name, "", f"wrong: max abs error {err:.3g}"])
                    print(f"  {name:<26} WRONG: max abs error {err:.3g}")
                    continue
                ms = time_ms(lambda: flashjit.flash_attn_func(q, k, v, causal=causal, config=c))
            except flashjit.FlashJitError as e:
                rows.append([s, d, int(causal), name, "", f"refused: {str(e).splitlines()[0]}"])
                continue
            tf = flops / ms / 1e9
            rows.append([s, d, int(causal), name, f"{ms:.4f}", f"{tf:.1f}"])
            print(f"  {name:<26} {tf:6.0f} TF/s")
            if ms < best[1]:
                best = (name, ms)
        print(f"  best: {best[0]} {flops / best[1] / 1e9:.0f} TF/s")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["seqlen", "head_dim", "causal", "config", "ms", "tflops_or_reason"])
        w.writerows(rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
