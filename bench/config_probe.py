#!/usr/bin/env python3
"""A forward case, config against config, in one process: flash_attn_func with the
default config and with each config given as JSON, beside the same call without the
case's modifier (causal alone for a window, else plain). B = 16384 / S, H = 2048 / D,
bf16 (bench_flex.py's shapes); CUDA events around each call after a 256 MB write that
flushes L2, the median of --iters after 3, the configs taken in turn for --rounds
rounds. Prints us, TFLOP/s (of the useful work for a window: 4 D per kept (query, key)
pair; else 4 D S^2 per head) and each output's largest difference from the default
config's. (Named window_probe.py, windows only, before session 29's later runs.)

CASE is a window size W (causal, window (W, 0)), mask_mod=EXPR, dropout=P, softcap=X,
or padding (a bool key-padding attn_mask [B, 1, 1, S]: batch b keeps its first
S (1 - b / 2B) keys, as bench_flex.py's).

    FLASHJIT_LIBRARY=build/runtime/libflashjit.so python3 bench/config_probe.py 4096 64 128 \\
        '{"block_m": 128, "block_n": 128, "waves": 8, "stages": 3, "q_in_lds": 1}'
"""
import argparse
import json
import statistics
import sys

import torch

sys.path.insert(0, "python")
import flashjit  # noqa: E402


def case_arguments(case, q):
    """(flash_attn_func keywords of the case, of the call without it, useful FLOPs)."""
    B, S, H, D = q.shape
    dense = 4 * D * S * S * B * H
    if case.isdigit():
        W = int(case)
        i = torch.arange(S)
        pairs = int(((i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] <= W)).sum())
        return dict(causal=True, window_size=(W, 0)), dict(causal=True), 4 * D * pairs * B * H
    name, _, value = case.partition("=")
    if name == "mask_mod":
        return dict(mask_mod=value), {}, dense
    if name == "dropout":
        return dict(dropout_p=float(value), dropout_seed=1), {}, dense
    if name == "softcap":
        return dict(softcap=float(value)), {}, dense
    if name == "padding":
        lengths = torch.tensor([S - (S * b) // (2 * B) for b in range(B)], device=q.device)
        keep = torch.arange(S, device=q.device)[None, None, None, :] < lengths[:, None, None, None]
        return dict(attn_mask=keep), {}, dense
    sys.exit(f"unknown case {case!r}: a window size, mask_mod=EXPR, dropout=P, softcap=X "
             "or padding")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("S", type=int)
    p.add_argument("D", type=int)
    p.add_argument("case")
    p.add_argument("configs", nargs="*", help="config dicts as JSON (flash_attn_func(config=))")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    S, D = a.S, a.D
    B, H = max(1, 16384 // S), max(1, 2048 // D)
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    kw, base, flops = case_arguments(a.case, q)
    runs = {"default": kw}
    for text in a.configs:
        runs[text] = dict(kw, config=json.loads(text))
    runs["without " + a.case] = base
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    outs, times = {}, {name: [] for name in runs}
    for name, args in runs.items():
        outs[name] = flashjit.flash_attn_func(q, k, v, **args)
        for _ in range(3):
            flashjit.flash_attn_func(q, k, v, **args)
    for _ in range(a.rounds):
        for name, args in runs.items():
            for _ in range(a.iters):
                flush.fill_(1)
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                flashjit.flash_attn_func(q, k, v, **args)
                end.record()
                end.synchronize()
                times[name].append(start.elapsed_time(end) * 1000.0)
    print(f"S={S} D={D} case={a.case} B={B} H={H}")
    for name in runs:
        t = statistics.median(times[name])
        extra = ""
        if not name.startswith("without "):
            diff = (outs[name].float() - outs["default"].float()).abs().max()
            extra = f" {flops / t / 1e6:6.1f} TFLOP/s max_diff_vs_default={diff:.2e}"
        print(f"  {name:40s} {t:9.1f} us{extra}", flush=True)


if __name__ == "__main__":
    main()
