#!/usr/bin/env python3
"""flashjit alone, one shape per call, for tree-against-tree comparisons: the forward
(flash_attn_func) or the backward (flash_attn_backward: preprocess, dQ, dK/dV) on
B = 16384 / S, H = 2048 / D, bf16; CUDA events around each call after a 256 MB write
that flushes L2, the median of 10 after 3. Prints the time, TFLOP/s (the forward's
4·B·H·S²·D, 2.5x that for the backward, halved under causal) and the norms of the
outputs, which must agree between trees (the inputs come from one seed). Run each
tree's library in its own process:

    FLASHJIT_LIBRARY=<tree>/runtime/libflashjit.so python3 bench/probe.py fwd|bwd S D causal
"""
import statistics
import sys

import torch

sys.path.insert(0, "python")
import flashjit  # noqa: E402


def main():
    if len(sys.argv) != 5 or sys.argv[1] not in ("fwd", "bwd"):
        sys.exit(__doc__)
    forward = sys.argv[1] == "fwd"
    S, D, causal = int(sys.argv[2]), int(sys.argv[3]), bool(int(sys.argv[4]))
    B, H = max(1, 16384 // S), max(1, 2048 // D)
    torch.manual_seed(0)
    q, k, v, dout = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    out, lse = flashjit.flash_attn_func(q, k, v, causal=causal, return_lse=True)

    def run():
        if forward:
            return (flashjit.flash_attn_func(q, k, v, causal=causal),)
        return flashjit.flash_attn_backward(dout, q, k, v, out, lse, causal=causal)
    results = run()
    for _ in range(3):
        run()
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    times = []
    for _ in range(10):
        flush.fill_(1)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    t = statistics.median(times)
    flops = (1 if forward else 2.5) * 4 * B * H * S * S * D / (2 if causal else 1)
    norms = " ".join(f"{name}_norm={x.float().norm():.4f}"
                     for name, x in zip(("out",) if forward else ("dq", "dk"), results))
    print(f"{sys.argv[1]} S={S} D={D} causal={int(causal)} {t:9.1f} us "
          f"{flops / t / 1e6:6.1f} TFLOP/s {norms}", flush=True)


if __name__ == "__main__":
    main()
