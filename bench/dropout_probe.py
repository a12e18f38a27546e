#!/usr/bin/env python3
"""What dropout costs flashjit on one GPU: flash_attn_func's forward, and forward +
backward, with dropout_p 0 and 0.1 (B=4, S=4096, H*D=2048, bf16; CUDA events, median of
15 calls after 3, no L2 flush: a comparison of flashjit with itself, tree against tree,
not against a rival; --sdpa adds PyTorch SDPA's FLASH_ATTENTION backend, FlashAttention-2,
the same calls in the same process). Also what `ncu` profiles for the forward alone:

    python3 bench/dropout_probe.py [--head-dims 64,128] [--dropouts 0,0.1] [--forward-only]
                                   [--sdpa]
"""
import argparse
import statistics
import sys

import torch

sys.path.insert(0, "python")
import flashjit  # noqa: E402


def median_ms(fn, iters=15, flush=None):
    """The median ms of `iters` calls after 3; with `flush` (a large CUDA tensor) zeroed before
    each, which evicts L2."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        if flush is not None:
            flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--dropouts", default="0,0.1")
    p.add_argument("--forward-only", action="store_true")
    p.add_argument("--sdpa", action="store_true", help="also time SDPA's FLASH_ATTENTION")
    args = p.parse_args()
    for d in (int(x) for x in args.head_dims.split(",")):
        h = 2048 // d
        q, k, v = (torch.randn(4, 4096, h, d, device="cuda", dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        g = torch.randn(4, 4096, h, d, device="cuda", dtype=torch.bfloat16)
        for drop in (float(x) for x in args.dropouts.split(",")):
            with torch.no_grad():
                fwd = median_ms(lambda: flashjit.flash_attn_func(q, k, v, dropout_p=drop,
                                                                 dropout_seed=7))
            line = f"D={d} dropout={drop}: forward {fwd * 1e3:8.1f} us"
            if not args.forward_only:
                def both():
                    flashjit.flash_attn_func(q, k, v, dropout_p=drop, dropout_seed=7).backward(g)
                line += f", forward+backward {median_ms(both) * 1e3:8.1f} us"
            print(line, flush=True)
            if args.sdpa:
                print(f"D={d} dropout={drop}: " + sdpa_flash(q, k, v, g, drop, args.forward_only),
                      flush=True)


def sdpa_flash(q, k, v, g, drop, forward_only):
    """SDPA's FLASH_ATTENTION (FlashAttention-2) on the same tensors, as BHSD views."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa
    qt, kt, vt, gt = (x.transpose(1, 2) for x in (q, k, v, g))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        with torch.no_grad():
            fwd = median_ms(lambda: sdpa(qt, kt, vt, dropout_p=drop))
        line = f"SDPA FLASH forward {fwd * 1e3:8.1f} us"
        if not forward_only:
            line += (", forward+backward "
                     f"{median_ms(lambda: sdpa(qt, kt, vt, dropout_p=drop).backward(gt)) * 1e3:8.1f}"
                     " us")
    return line


if __name__ == "__main__":
    main()
