#!/usr/bin/env python3
"""The sm90 forward's config persistent on and off, beside cuDNN, in one process.

For each head dim and seqlen (B*S = 16k tokens, H = 16, bf16, as bench_sdpa.py): the
default config (read back from the handle's explain()), the same config with persistent
flipped, and SDPA's cuDNN backend, timed in alternating rounds (bench_sdpa.time_ms).
Each flipped output is first compared bit for bit with the default's (the same
arithmetic per tile), and both against the float64 reference on a small shape.
What docs/decisions.md's "Causal tiles from a counter" was chosen from.

    FLASHJIT_LIBRARY=build/runtime/libflashjit.so python3 bench/persistent_probe.py \
        [--head-dims 64,128] [--seqlens 1024,4096] [--causal 1] [--rounds 2]
"""
import argparse
import pathlib
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "python"))
import flashjit  # noqa: E402
from flashjit import _lib, api  # noqa: E402
from bench_sdpa import time_ms  # noqa: E402


def default_config(q, k, v, causal):
    """The config flash_attn_func chose for this signature, from its handle's explain()."""
    flashjit.flash_attn_func(q, k, v, causal=causal)
    handle = next(reversed(api._ATTENTIONS.values()))
    text = _lib.lib.fj_attention_explain(handle).decode()
    line = next(x for x in text.splitlines() if x.startswith("config:"))
    words = line.split(":", 1)[1].split("(")[0].split()
    config = {"persistent": 0}
    for w in words:
        if "=" in w:
            key, value = w.split("=")
            config["q_in_lds" if key == "q_in" else key] = int(value == "lds") \
                if key == "q_in" else int(value)
        elif w == "persistent":
            config["persistent"] = 1
    return config, line


def check(d, causal, config):
    """Float64 check of `config` on a small GQA shape with ragged lengths."""
    torch.manual_seed(d)
    b, sq, sk, hq, hkv = 2, 1333, 1100, 8, 2
    q = (torch.rand(b, sq, hq, d, device="cuda") * 2 - 1).to(torch.bfloat16)
    k = (torch.rand(b, sk, hkv, d, device="cuda") * 2 - 1).to(torch.bfloat16)
    v = (torch.rand(b, sk, hkv, d, device="cuda") * 2 - 1).to(torch.bfloat16)
    out = flashjit.flash_attn_func(q, k, v, causal=causal, config=config)
    qd, kd, vd = (x.double().transpose(1, 2) for x in (q, k, v))
    kd, vd = (x.repeat_interleave(hq // hkv, 1) for x in (kd, vd))
    i = torch.arange(sq, device="cuda")[:, None]
    j = torch.arange(sk, device="cuda")[None, :]
    mask = j <= i + sk - sq if causal else torch.ones(sq, sk, dtype=torch.bool, device="cuda")
    ref = torch.nan_to_num(F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask))
    return (out.double() - ref.transpose(1, 2)).abs().max().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dims", default="64,80,128,256")
    ap.add_argument("--seqlens", default="1024,4096,16384")
    ap.add_argument("--causal", default="1", help="1, 0 or 0,1")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), flush=True)
    for d in (int(x) for x in args.head_dims.split(",")):
        for causal in (bool(int(x)) for x in args.causal.split(",")):
            for s in (int(x) for x in args.seqlens.split(",")):
                b, h = 16384 // s, 16
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))
                base, line = default_config(q, k, v, causal)
                flipped = dict(base, persistent=1 - base["persistent"])
                print(f"D={d} S={s} causal={causal} default {line}", flush=True)
                if s == 1024:
                    print(f"  float64 max_abs: default {check(d, causal, base):.2e}, "
                          f"persistent={flipped['persistent']} {check(d, causal, flipped):.2e}")
                a = flashjit.flash_attn_func(q, k, v, causal=causal, config=base)
                f = flashjit.flash_attn_func(q, k, v, causal=causal, config=flipped)
                same = torch.equal(a, f)
                flops = 4 * b * h * s * s * d / (2 if causal else 1)
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                runs = {"default": lambda: flashjit.flash_attn_func(q, k, v, causal=causal,
                                                                    config=base),
                        f"persistent={flipped['persistent']}":
                            lambda: flashjit.flash_attn_func(q, k, v, causal=causal,
                                                             config=flipped)}

                def cudnn():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                runs["cudnn"] = cudnn
                for r in range(args.rounds):
                    cells = []
                    for name, fn in runs.items():
                        ms = time_ms(fn)
                        cells.append(f"{name} {flops / ms / 1e9:6.1f}")
                    print(f"  round {r}: " + "  ".join(cells) + " TFLOP/s"
                          + ("" if same else "  (flipped output DIFFERS)"), flush=True)


if __name__ == "__main__":
    main()
