#!/usr/bin/env python3
"""The forward of one flashjit library (FLASHJIT_LIBRARY), case by case: its time, its
TFLOP/s and its largest difference from float64, and with --cudnn PyTorch's cuDNN
backend on the same tensors in the same process. B*S = 16384, H = 16 (bench_sdpa.py's
shapes), bf16; CUDA events around each call after a 256 MB write that flushes L2, the
median of --iters after 3 warm-up calls. The error is measured where S <= 4096 (the
float64 reference of 16k-long sequences takes tens of GB).

Two trees are compared by running it once per library, each in its own process, in
alternating order (`tag` names the tree in the output):

    for lib in base new base new; do FLASHJIT_LIBRARY=/tmp/$lib/runtime/libflashjit.so \\
        python3 bench/forward_tree_probe.py $lib 1024:128:0,4096:64:1; done

CASES are S:D:causal, comma-separated.
"""
import argparse
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, "python")
import flashjit  # noqa: E402
from dropout_probe import median_ms  # noqa: E402


def median_us(fn, flush, iters):
    return median_ms(fn, iters, flush=flush) * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tag", help="the tree's name in the output")
    p.add_argument("cases", help="S:D:causal,...")
    p.add_argument("--cudnn", action="store_true", help="also time SDPA's cuDNN backend")
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args()
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for case in args.cases.split(","):
        S, D, causal = case.split(":")
        S, D, causal = int(S), int(D), causal == "1"
        B, H = max(1, 16384 // S), 16
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * B * H * S * S * D / (2 if causal else 1)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        err = float("nan")
        if S <= 4096:
            ref = F.scaled_dot_product_attention(qt.double(), kt.double(), vt.double(),
                                                 is_causal=causal).transpose(1, 2)
            out = flashjit.flash_attn_func(q, k, v, causal=causal)
            err = (out.double() - ref).abs().max().item()
            del ref
        us = median_us(lambda: flashjit.flash_attn_func(q, k, v, causal=causal), flush,
                       args.iters)
        line = (f"{args.tag} S={S} D={D} causal={int(causal)}: flashjit {us:8.1f} us "
                f"{flops / us / 1e6:5.0f} TF/s err {err:.2e}")
        if args.cudnn:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                cu = median_us(lambda: F.scaled_dot_product_attention(qt, kt, vt,
                                                                      is_causal=causal),
                               flush, args.iters)
            line += f" | cudnn {cu:8.1f} us {flops / cu / 1e6:5.0f} TF/s ratio {cu / us:.3f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
