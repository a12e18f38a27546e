#!/usr/bin/env python3
"""Candidate sm90 forward configs against the default and cuDNN, checked first.

For each head dim of CANDIDATES (or --head-dims): each candidate config (config stages 3 by default:
a producer warpgroup filling a ring of two K/V copies) is checked against a float64
reference on four shapes (GQA, ragged lengths, decode), causal and not, and must
stay within twice the default config's error; then it is timed beside the default
and cuDNN, in one process (B*S = 16k tokens, H = 16, bf16, bench_sdpa.time_ms).
What docs/decisions.md's "A producer warpgroup" was chosen from
(bench/results/producer_2026-11-27_H100.log).

    FLASHJIT_LIBRARY=build/runtime/libflashjit.so python3 bench/producer_probe.py \
        [check|perf|both] [--head-dims 72,80,96]
"""
import argparse
import itertools
import pathlib
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "python"))
import flashjit  # noqa: E402
from bench_sdpa import time_ms  # noqa: E402


def config(block_m, block_n, waves, stages=3):
    return {"block_m": block_m, "block_n": block_n, "waves": waves, "stages": stages,
            "q_in_lds": True}


CANDIDATES = {
    64: [config(128, 128, 8), config(128, 64, 4), config(192, 128, 12), config(128, 192, 8)],
    72: [config(128, 128, 8), config(128, 64, 4), config(128, 192, 8)],
    80: [config(128, 128, 8), config(128, 64, 4), config(128, 192, 8)],
    96: [config(128, 128, 8), config(128, 64, 4), config(128, 192, 8)],
    112: [config(128, 128, 8), config(128, 64, 4), config(128, 192, 8)],
    160: [config(128, 64, 8), config(128, 96, 8), config(128, 32, 8)],
    128: [config(128, 128, 8), config(128, 64, 4), config(128, 192, 8), config(128, 64, 8)],
    192: [config(128, 64, 8), config(128, 96, 8)],
    256: [config(128, 64, 8), config(128, 32, 8)],
}


def name(c):
    return f"bm{c['block_m']}bn{c['block_n']}w{c['waves']}"


def reference(q, k, v, causal):
    """Bottom-right causal attention in float64, GQA by repeating K and V."""
    qq, kk, vv = (x.transpose(1, 2).double() for x in (q, k, v))
    group = qq.shape[1] // kk.shape[1]
    kk, vv = kk.repeat_interleave(group, 1), vv.repeat_interleave(group, 1)
    s = qq @ kk.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        sq, sk = s.shape[-2:]
        i = torch.arange(sq, device=s.device)[:, None]
        j = torch.arange(sk, device=s.device)[None]
        s = s.masked_fill(j > i + sk - sq, float("-inf"))
    return (torch.softmax(s, -1) @ vv).transpose(1, 2)


def check(dims):
    shapes = ((2, 333, 517, 8, 2), (1, 1000, 1000, 4, 4), (3, 77, 1200, 6, 3), (1, 1, 700, 8, 8))
    bad = 0
    for d, causal in itertools.product(dims, (False, True)):
        for b, sq, sk, h, hk in shapes:
            q = torch.randn(b, sq, h, d, dtype=torch.bfloat16, device="cuda")
            k = torch.randn(b, sk, hk, d, dtype=torch.bfloat16, device="cuda")
            v = torch.randn(b, sk, hk, d, dtype=torch.bfloat16, device="cuda")
            want = reference(q, k, v, causal)
            default = (flashjit.flash_attn_func(q, k, v, causal=causal).double() - want)
            e0 = default.abs().max().item()
            for c in CANDIDATES[d]:
                out = flashjit.flash_attn_func(q, k, v, causal=causal, config=c)
                e = (out.double() - want).abs().max().item()
                ok = e <= max(2 * e0, 1e-2)
                bad += not ok
                print(f"CHECK {'ok' if ok else 'BAD'} d={d} causal={int(causal)} "
                      f"{b},{sq},{sk},{h},{hk} {name(c)}: error {e:.2e} (default {e0:.2e})")
    return bad


def perf(dims):
    heads = 16
    for s, d, causal in itertools.product((1024, 4096, 16384), dims, (False, True)):
        b = 16384 // s
        q, k, v = (torch.randn(b, s, heads, d, dtype=torch.bfloat16, device="cuda")
                   for _ in range(3))
        flops = 4 * b * heads * s * s * d / (2 if causal else 1)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            cudnn = time_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
                qt, kt, vt, is_causal=causal))
        default = time_ms(lambda: flashjit.flash_attn_func(q, k, v, causal=causal))
        line = (f"PERF S={s} D={d} c={int(causal)}: cudnn {flops / cudnn / 1e9:.0f} "
                f"default {flops / default / 1e9:.0f}")
        for c in CANDIDATES[d]:
            ms = time_ms(lambda: flashjit.flash_attn_func(q, k, v, causal=causal, config=c))
            line += f" | {name(c)} {flops / ms / 1e9:.0f}"
        print(line, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="both", choices=("check", "perf", "both"))
    parser.add_argument("--head-dims", default="64,128,192,256",
                        help="comma-separated, each a key of CANDIDATES")
    args = parser.parse_args()
    dims = [int(d) for d in args.head_dims.split(",")]
    unknown = [d for d in dims if d not in CANDIDATES]
    if unknown:
        parser.error(f"no candidates for head dims {unknown}: choose from {sorted(CANDIDATES)}")
    torch.manual_seed(0)
    bad = check(dims) if args.mode in ("both", "check") else 0
    if args.mode in ("both", "perf"):
        perf(dims)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
