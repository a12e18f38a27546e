#!/usr/bin/env python3
"""Head dim 64 with a mask tensor on one GPU: one consumer warpgroup of two query tiles (the
sm90 producer config for bool masks) against two consumer warpgroups of one tile each (where
the mask's loads are issued before the S product; the config for additive masks), the two
alternating, twice; B*S = 16k, H*D = 2048, bf16, L2 flushed (bench_masks.py's masks and
timing). Prints each config's times (us) and the largest difference between their outputs.

    FLASHJIT_LIBRARY=build/runtime/libflashjit.so python3 bench/mask_config_probe.py
"""
import pathlib
import sys
import types

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))
import torch  # noqa: E402

import flashjit  # noqa: E402
from bench_backward import timed  # noqa: E402
from bench_masks import make_mask  # noqa: E402

args = types.SimpleNamespace(iters=15, warmup=3)
ONE = dict(block_m=128, block_n=128, waves=4, stages=3, q_in_lds=1)
TWO = dict(block_m=128, block_n=128, waves=8, stages=3, q_in_lds=1)


def interleaved(run):
    """Each config's time of run(config) (us), the two alternating, twice; and its output."""
    res, outs = {}, {}
    for _ in range(2):
        for name, cfg in (("one_wg", ONE), ("two_wg", TWO)):
            outs[name] = run(cfg)
            res.setdefault(name, []).append(timed(torch, lambda: run(cfg), args))
    return res, outs


for S in (1024, 4096):
    D = 64
    B, H = 16384 // S, 2048 // D
    torch.manual_seed(S)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for kind in ("bias", "padding", "causal_padding"):
        mask = make_mask(torch, kind, B, S)
        res, outs = interleaved(lambda cfg: flashjit.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, config=cfg))
        diff = (outs["one_wg"].float() - outs["two_wg"].float()).abs().max().item()
        print(f"S={S} D={D} {kind:15s} one_wg {res['one_wg']} two_wg {res['two_wg']} "
              f"max|diff| {diff:.1e}", flush=True)
    for causal in (False, True):
        res, _ = interleaved(lambda cfg: flashjit.scaled_dot_product_attention(
            q, k, v, is_causal=causal, config=cfg))
        print(f"S={S} D={D} no mask causal={causal} one_wg {res['one_wg']} "
              f"two_wg {res['two_wg']}", flush=True)
