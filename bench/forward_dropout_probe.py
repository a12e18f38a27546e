#!/usr/bin/env python3
"""The forward with dropout 0.1 in one process: flashjit (with and without dropout) against
SDPA's FLASH and cuDNN backends with dropout 0.1; B * S = 16k tokens, H * D = 2048, bf16;
CUDA events around each call after a 256 MB write that flushes L2, the median of 15 after 3.

    FLASHJIT_LIBRARY=... python3 bench/forward_dropout_probe.py S:D:causal [...]
    e.g. 4096:64:0 4096:128:1
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, "python")
import flashjit  # noqa: E402
from dropout_probe import median_ms  # noqa: E402


def main():
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for case in sys.argv[1:]:
        s, d, causal = case.split(":")
        s, d, causal = int(s), int(d), causal == "1"
        b, h = 16384 // s, 2048 // d
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in "qkv")
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        us = {}
        us["flashjit"] = 1e3 * median_ms(
            lambda: flashjit.flash_attn_func(q, k, v, causal=causal, dropout_p=0.1), flush=flush)
        us["flashjit_nodrop"] = 1e3 * median_ms(
            lambda: flashjit.flash_attn_func(q, k, v, causal=causal), flush=flush)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        for name, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION),
                              ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    us[name] = 1e3 * median_ms(lambda: F.scaled_dot_product_attention(
                        qt, kt, vt, is_causal=causal, dropout_p=0.1), flush=flush)
            except RuntimeError:
                us[name] = float("nan")
        print(f"S={s} D={d} causal={int(causal)} "
              + " ".join(f"{n} {t:.1f}us ({flops / t / 1e6:.0f} TF)" for n, t in us.items())
              + f"  flashjit/flash {us['sdpa_flash'] / us['flashjit']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
