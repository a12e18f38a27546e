#!/usr/bin/env python3
"""Run-time shapes from Python: 64 (seqlen_q, seqlen_k) pairs through flash_attn_func.

GQA 32:8, D=128, causal, bf16, torch CUDA tensors: 32 prefill lengths from 1 to
4097 and 32 decode steps (one query, a KV cache growing by one key per step), the
pairs of bench/dynamic_shapes.cpp. flashjit keeps one handle (one compiled kernel)
per signature, so the 64 pairs compile once. For each pair: the first call's wall
time (synchronized), then the host time of a call (perf_counter around
flash_attn_func, launches queued and not waited for; median of --calls), with
PyTorch SDPA's host time measured the same way in the same process. Then the
scenario of the run-time shapes issue: 24 prompts of distinct lengths (300..323)
end to end, flashjit vs SDPA. Writes a CSV.

    FLASHJIT_LIBRARY=build-gpu/runtime/libflashjit.so FLASHJIT_CACHE_DIR=$(mktemp -d) \\
        python3 bench/dynamic_shapes.py --out bench/results
"""
import argparse
import csv
import datetime
import math
import pathlib
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "python"))
import flashjit  # noqa: E402
from flashjit import api  # noqa: E402

H, HKV, D = 32, 8, 128


def pairs():
    p = [(s, s) for s in (round(4097 ** (i / 31)) + i if i < 31 else 4097 for i in range(32))]
    return p + [(1, 4000 + step) for step in range(32)]


def host_us(fn, calls):
    times = []
    for i in range(calls):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
        if i % 8 == 7:
            torch.cuda.synchronize()  # keep the queue short
    torch.cuda.synchronize()
    return statistics.median(times)


def sdpa(q, k, v, causal):
    # SDPA wants [B, H, S, D] and equal heads (enable_gqa on recent torch).
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    sq, sk = q.shape[1], k.shape[1]
    if causal and sq != sk:  # bottom-right alignment, as flashjit and FlashAttention
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=True)
    else:
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=True)
    return out.transpose(1, 2)  # back to [B, S, H, D]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()
    gpu = torch.cuda.get_device_name()
    day = datetime.date.today().isoformat()
    rows = []
    print(f"# {gpu}, {day}: GQA {H}:{HKV}, D={D}, causal, bf16; host time per call (us), median "
          f"of {args.calls}")
    print(f"{'sq':>5} {'sk':>5} {'first_ms':>9} {'flashjit_us':>11} {'sdpa_us':>8} {'max_err':>8}")
    for sq, sk in pairs():
        torch.manual_seed(sq * 7919 + sk)
        q = torch.randn(1, sq, H, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, sk, HKV, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, sk, HKV, D, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = flashjit.flash_attn_func(q, k, v, causal=True)
        torch.cuda.synchronize()
        first_ms = (time.perf_counter() - start) * 1e3
        err = (out.float() - sdpa(q, k, v, True).float()).abs().max().item()
        fj = host_us(lambda: flashjit.flash_attn_func(q, k, v, causal=True), args.calls)
        ref = host_us(lambda: sdpa(q, k, v, True), args.calls)
        print(f"{sq:5d} {sk:5d} {first_ms:9.2f} {fj:11.1f} {ref:8.1f} {err:8.1e}", flush=True)
        rows.append(dict(seqlen_q=sq, seqlen_k=sk, first_call_ms=first_ms, flashjit_host_us=fj,
                         sdpa_host_us=ref, max_abs_err_vs_sdpa=err))
    handles = len(api._ATTENTIONS)
    explain = next(iter(api._ATTENTIONS.values()))
    print(f"handles (compiled kernels) for 64 shapes: {handles}")
    print(flashjit._lib.lib.fj_attention_explain(explain).decode())
    fj_host = statistics.median(r["flashjit_host_us"] for r in rows)
    sdpa_host = statistics.median(r["sdpa_host_us"] for r in rows)
    print(f"host time per call, median over the 64 shapes: flashjit {fj_host:.1f} us, "
          f"SDPA {sdpa_host:.1f} us")

    # 24 prompts of distinct lengths, end to end (the measurement).
    for name, fn in (("flashjit", lambda q, k, v: flashjit.flash_attn_func(q, k, v, causal=True)),
                     ("sdpa", lambda q, k, v: sdpa(q, k, v, True))):
        tensors = []
        for s in range(300, 324):
            tensors.append(tuple(torch.randn(1, s, h, D, device="cuda", dtype=torch.bfloat16)
                                 for h in (H, HKV, HKV)))
        torch.cuda.synchronize()
        start = time.perf_counter()
        for q, k, v in tensors:
            fn(q, k, v)
        torch.cuda.synchronize()
        print(f"24 prompts of lengths 300..323: {name} {time.perf_counter() - start:.4f} s")

    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"dynamic_shapes_{day}_{gpu.replace(' ', '_')}.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")
    return 0 if handles == 1 and not math.isnan(fj_host) else 1


if __name__ == "__main__":
    sys.exit(main())
