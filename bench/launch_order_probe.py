#!/usr/bin/env python3
"""Causal forward TFLOP/s beside cuDNN, for an A/B of hand-edited kernels.

Times flashjit's causal forward (the default config) and cuDNN's in one process at
D = 64, 128, 256 and S = 1k, 4k, 16k (bf16, B*S = 16384, H = 16), and prints the
largest difference between the two outputs. What docs/decisions.md's "The causal
launch order" was measured with (bench/results/producer_partial_2026-11-27_H100.log):

    mkdir -m 700 dump ovr
    FLASHJIT_DUMP_DIR=dump python3 bench/launch_order_probe.py base
    for f in dump/fa_fwd*.hip; do n=$(basename $f .hip); sed 'EDIT' $f > ovr/${n%-*}.hip; done
    FLASHJIT_OVERRIDE_DIR=ovr python3 bench/launch_order_probe.py edited

(each with a fresh FLASHJIT_CACHE_DIR; FLASHJIT_LIBRARY as for the other benches).
"""
import itertools
import pathlib
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "python"))
import flashjit  # noqa: E402
from bench_sdpa import time_ms  # noqa: E402


def main():
    tag = sys.argv[1] if len(sys.argv) > 1 else "run"
    torch.manual_seed(0)
    for d, s in itertools.product((64, 128, 256), (1024, 4096, 16384)):
        b = 16384 // s
        q, k, v = (torch.randn(b, s, 16, d, dtype=torch.bfloat16, device="cuda")
                   for _ in range(3))
        flops = 4 * b * 16 * s * s * d / 2
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            cudnn = time_ms(lambda: sdpa(qt, kt, vt, is_causal=True))
            want = sdpa(qt, kt, vt, is_causal=True).transpose(1, 2)
        got = flashjit.flash_attn_func(q, k, v, causal=True)
        err = (got.float() - want.float()).abs().max().item()
        ms = time_ms(lambda: flashjit.flash_attn_func(q, k, v, causal=True))
        print(f"REV {tag} D={d} S={s} causal: cudnn {flops / cudnn / 1e9:.0f} "
              f"flashjit {flops / ms / 1e9:.0f} ({ms / cudnn:.3f}x cudnn time) err {err:.1e}",
              flush=True)


if __name__ == "__main__":
    main()
