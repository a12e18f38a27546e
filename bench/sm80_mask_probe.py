#!/usr/bin/env python3
"""The sm80 rules with a mask tensor on an sm_90 GPU: sm_80's config at head dims 128 and 256
with Q in registers (which sm_90 lowers with the sm80 rules), B*S = 16k, H*D = 2048, bf16, L2
flushed (bench_masks.py's masks and timing); each output checked against SDPA's. TAG (env)
names the run in each line: run it once per library to compare two trees.

    TAG=new FLASHJIT_LIBRARY=build/runtime/libflashjit.so python3 bench/sm80_mask_probe.py
"""
import os
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
tag = os.environ.get("TAG", "?")
for D in (128, 256):
    cfg = dict(block_m=64, block_n=64, waves=4, stages=2, q_in_lds=0)
    for S in (1024, 4096):
        B, H = 16384 // S, 2048 // D
        torch.manual_seed(S)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for kind in ("bias", "padding", "causal_padding"):
            mask = make_mask(torch, kind, B, S)
            def f():
                return flashjit.scaled_dot_product_attention(q, k, v, attn_mask=mask, config=cfg)
            out = f()
            want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            err = (out.float() - want.float()).abs().max().item()
            t = timed(torch, f, args)
            print(f"{tag} sm80-rules D={D} S={S} {kind:15s} {t:9.1f} us  "
                  f"max|diff| vs SDPA {err:.1e}", flush=True)
