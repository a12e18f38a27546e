#!/usr/bin/env python3
"""The cost of f32 inputs (fj_spec.f32_io) on a GPU: flash_attn_func on float32 tensors
(rounded to bf16 in the kernel, float32 out) against the same call on bfloat16 ones, in
one process. Median of 20 timed calls after 3 warmups, L2 flushed (a 256 MiB write)
before each. Prints CSV.

    PYTHONPATH=python FLASHJIT_LIBRARY=build/runtime/libflashjit.so python3 bench/f32_io_cost.py
"""
import torch

import flashjit

CASES = [(2, 16, 4096, 128, False), (2, 16, 4096, 128, True), (4, 16, 2048, 64, False),
         (2, 8, 4096, 256, False)]  # batch, heads, seqlen, head dim, causal


def median_ms(fn, flush):
    for _ in range(3):
        fn()
    times = []
    for _ in range(20):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main():
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    print("B,H,S,D,causal,bf16_ms,f32io_ms,f32io_tflops")
    for b, h, s, d, causal in CASES:
        q32, k32, v32 = (torch.randn(b, s, h, d, device="cuda") for _ in range(3))
        q16, k16, v16 = (x.bfloat16() for x in (q32, k32, v32))
        bf16 = median_ms(lambda: flashjit.flash_attn_func(q16, k16, v16, causal=causal), flush)
        f32 = median_ms(lambda: flashjit.flash_attn_func(q32, k32, v32, causal=causal), flush)
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        print(f"{b},{h},{s},{d},{causal},{bf16:.3f},{f32:.3f},{flops / f32 / 1e9:.1f}")


if __name__ == "__main__":
    main()
