#!/usr/bin/env python3
"""flashjit's backward alone, one shape per call, for tree-against-tree comparisons:
flash_attn_backward (preprocess, dQ, dK/dV) on B = 16384 / S, H = 2048 / D, bf16; CUDA
events around each call after a 256 MB write that flushes L2, the median of 10 after 3.
Prints the time, TFLOP/s (2.5x the forward's FLOPs, halved under causal) and the norms of
dQ and dK, which must agree between trees (the inputs come from one seed). Run each
tree's library in its own process:

    FLASHJIT_LIBRARY=<tree>/runtime/libflashjit.so python3 bench/backward_probe.py S D causal
"""
import statistics
import sys

import torch

sys.path.insert(0, "python")
import flashjit  # noqa: E402


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    S, D, causal = int(sys.argv[1]), int(sys.argv[2]), bool(int(sys.argv[3]))
    B, H = max(1, 16384 // S), max(1, 2048 // D)
    torch.manual_seed(0)
    q, k, v, dout = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    out, lse = flashjit.flash_attn_func(q, k, v, causal=causal, return_lse=True)

    def backward():
        return flashjit.flash_attn_backward(dout, q, k, v, out, lse, causal=causal)
    grads = backward()
    for _ in range(3):
        backward()
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    times = []
    for _ in range(10):
        flush.fill_(1)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        backward()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    t = statistics.median(times)
    flops = 2.5 * 4 * B * H * S * S * D / (2 if causal else 1)
    print(f"S={S} D={D} causal={int(causal)} {t:9.1f} us {flops / t / 1e6:6.1f} TFLOP/s "
          f"dq_norm={grads[0].float().norm():.4f} dk_norm={grads[1].float().norm():.4f}",
          flush=True)


if __name__ == "__main__":
    main()
