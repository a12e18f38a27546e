#!/usr/bin/env python3
"""Sliding-window forward, config against config, in one process: flash_attn_func(q, k, v,
causal=True, window_size=(W, 0)) with the default config and with each config given as
JSON, beside the same call causal only. B = 16384 / S, H = 2048 / D, bf16 (bench_flex.py's
shapes); CUDA events around each call after a 256 MB write that flushes L2, the median of
--iters after 3, the configs taken in turn for --rounds rounds. Prints us, TFLOP/s of the
useful work (4 D per kept (query, key) pair) and each output's largest difference from the
default config's.

    FLASHJIT_LIBRARY=build/runtime/libflashjit.so python3 bench/window_probe.py 4096 64 128 \
        '{"persistent": 1}' '{"block_n": 64}'
"""
import argparse
import json
import statistics
import sys

import torch

sys.path.insert(0, "python")
import flashjit  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("S", type=int)
    p.add_argument("D", type=int)
    p.add_argument("W", type=int)
    p.add_argument("configs", nargs="*", help="config dicts as JSON (flash_attn_func(config=))")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    S, D, W = a.S, a.D, a.W
    B, H = max(1, 16384 // S), max(1, 2048 // D)
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    i = torch.arange(S)
    pairs = int(((i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] <= W)).sum())
    flops = 4 * D * pairs * B * H
    runs = {"default": dict(causal=True, window_size=(W, 0))}
    for text in a.configs:
        runs[text] = dict(causal=True, window_size=(W, 0), config=json.loads(text))
    runs["causal only"] = dict(causal=True)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    outs, times = {}, {name: [] for name in runs}
    for name, kw in runs.items():
        outs[name] = flashjit.flash_attn_func(q, k, v, **kw)
        for _ in range(3):
            flashjit.flash_attn_func(q, k, v, **kw)
    for _ in range(a.rounds):
        for name, kw in runs.items():
            for _ in range(a.iters):
                flush.fill_(1)
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                flashjit.flash_attn_func(q, k, v, **kw)
                end.record()
                end.synchronize()
                times[name].append(start.elapsed_time(end) * 1000.0)
    print(f"S={S} D={D} W={W} B={B} H={H}")
    for name in runs:
        t = statistics.median(times[name])
        diff = "" if name == "causal only" else \
            f" max_diff_vs_default={(outs[name].float() - outs['default'].float()).abs().max():.2e}"
        useful = "" if name == "causal only" else f" {flops / t / 1e6:6.1f} TFLOP/s"
        print(f"  {name:40s} {t:9.1f} us{useful}{diff}", flush=True)


if __name__ == "__main__":
    main()
