#!/usr/bin/env python3
"""flashjit vs PyTorch SDPA on one GPU, in one process, on the same tensors.

For B*S = 16k tokens, H = 16, S in {512 .. 16k}, D in {64 .. 256}, causal on and off:
times flashjit.flash_attn_func (the public API, compile excluded: one warm-up call
fills the cache) and torch.nn.functional.scaled_dot_product_attention with each
backend that accepts the case (cuDNN, FLASH_ATTENTION, EFFICIENT_ATTENTION).
CUDA events around 10 back-to-back calls, median of 7 repeats after warm-up, fresh
random data per case. Prints TFLOP/s (4*B*H*S*S*D, halved for causal) and the ratio
to the best PyTorch backend; writes a CSV and, where matplotlib is installed, a PNG
of TFLOP/s against head dim (else: bench/plot_sdpa.py CSV draws it anywhere).

    FLASHJIT_LIBRARY=build/runtime/libflashjit.so python3 bench/bench_sdpa.py --out bench/results

--config-of ARCH times flashjit with ARCH's default config instead of this GPU's, as
`flashjit emit --arch ARCH` (--cli) chooses it: on an H100, --config-of sm_80 runs the
sm80 rules' kernels (mma.sync, Q in registers) against SDPA's FlashAttention-2 there.
"""
import argparse
import csv
import datetime
import os
import pathlib
import re
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "python"))
import flashjit  # noqa: E402

BACKENDS = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
            ("efficient", SDPBackend.EFFICIENT_ATTENTION)]


def time_ms(fn, calls=10, repeats=7):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    times.sort()
    return times[len(times) // 2]


def config_of(cli, arch, b, s, heads, d, causal):
    """The default config `flashjit emit --arch arch` takes for this case, as a config dict."""
    with tempfile.TemporaryDirectory() as tmp:
        line = subprocess.run(
            [cli, "emit", "--arch", arch, "--batch", str(b), "--heads", str(heads),
             "--seqlen-q", str(s), "--seqlen-k", str(s), "--head-dim", str(d),
             "-o", f"{tmp}/kernel.hip"] + (["--causal"] if causal else []),
            check=True, capture_output=True, text=True).stderr  # "wrote ... (config ...)"
    m = re.search(r"block_m=(\d+) block_n=(\d+) waves=(\d+) stages=(\d+) q_in=(\w+) "
                  r"pad_k=(\d+)", line)
    if not m:
        raise RuntimeError(f"no config in `flashjit emit`'s line: {line!r}")
    return dict(block_m=int(m[1]), block_n=int(m[2]), waves=int(m[3]), stages=int(m[4]),
                q_in_lds=int(m[5] == "lds"), pad_k=int(m[6]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--head-dims", default="64,72,80,96,100,112,128,160,192,256")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--config-of", metavar="ARCH",
                    help="flashjit with ARCH's default configs (e.g. sm_80 on an H100)")
    ap.add_argument("--cli", default="build/tools/flashjit",
                    help="the flashjit CLI that --config-of asks for the configs")
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    gpu = torch.cuda.get_device_name()
    hopper = torch.cuda.get_device_capability()[0] == 9
    day = datetime.date.today().isoformat()
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"sdpa_{day}_{gpu.replace(' ', '_')}_{args.dtype}" + (
        f"_configs_of_{args.config_of}" if args.config_of else "")
    rows = []
    print(f"# {gpu}, {day}, {args.dtype}, B*S = {args.tokens}, H = {args.heads}; TFLOP/s "
          "(4*B*H*S*S*D, halved for causal); ratio = flashjit / best PyTorch backend")
    print(f"{'S':>6} {'D':>4} {'causal':>6} {'flashjit':>9} {'cudnn':>7} {'flash':>7} "
          f"{'efficient':>9} {'ratio':>6}")
    for s in (int(x) for x in args.seqlens.split(",")):
        b = max(1, args.tokens // s)
        for d in (int(x) for x in args.head_dims.split(",")):
            for causal in (False, True):
                torch.manual_seed(s + d)
                q = torch.randn(b, s, args.heads, d, device="cuda", dtype=dtype)
                k = torch.randn(b, s, args.heads, d, device="cuda", dtype=dtype)
                v = torch.randn(b, s, args.heads, d, device="cuda", dtype=dtype)
                flops = 4 * b * args.heads * s * s * d / (2 if causal else 1)
                tf = {}
                config = (config_of(args.cli, args.config_of, b, s, args.heads, d, causal)
                          if args.config_of else None)
                note = ""
                if config and config["q_in_lds"] and hopper and args.config_of.startswith("sm_8"):
                    # sm_90 lowers Q-in-LDS configs with its own rules (wgmma): keep the
                    # sm80 rules by keeping Q in registers, and say so.
                    config["q_in_lds"] = 0
                    note = f" ({args.config_of}: q_in_lds=1)"
                got = flashjit.flash_attn_func(q, k, v, causal=causal, config=config)  # compile
                if config:  # another target's config: checked against SDPA's output first
                    want = F.scaled_dot_product_attention(
                        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                        is_causal=causal).transpose(1, 2)
                    err = (got - want).abs().max().item()
                    if not err < 2e-2:
                        raise RuntimeError(f"S={s} D={d} causal={causal} config {config}: "
                                           f"max abs error {err:.3g} against SDPA")
                tf["flashjit"] = flops / time_ms(
                    lambda: flashjit.flash_attn_func(q, k, v, causal=causal, config=config)) / 1e9
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                for name, backend in BACKENDS:
                    try:
                        with sdpa_kernel(backend):
                            F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                            tf[name] = flops / time_ms(lambda: F.scaled_dot_product_attention(
                                qt, kt, vt, is_causal=causal)) / 1e9
                    except RuntimeError:
                        tf[name] = None  # the backend does not accept this case
                best = max(v for n, v in tf.items() if n != "flashjit" and v)
                ratio = tf["flashjit"] / best
                fmt = lambda x: f"{x:7.1f}" if x else "    n/a"
                other = (f"  vs FLASH {tf['flashjit'] / tf['flash']:.2f}, {config}{note}"
                         if config else "")
                print(f"{s:6d} {d:4d} {str(causal):>6} {tf['flashjit']:9.1f} {fmt(tf['cudnn'])} "
                      f"{fmt(tf['flash'])} {fmt(tf['efficient']):>9} {ratio:6.2f}{other}",
                      flush=True)
                rows.append(dict(seqlen=s, batch=b, heads=args.heads, head_dim=d, causal=causal,
                                 flashjit=tf["flashjit"], cudnn=tf["cudnn"], flash=tf["flash"],
                                 efficient=tf["efficient"], ratio_to_best=ratio,
                                 ratio_to_flash=(tf["flashjit"] / tf["flash"]
                                                 if tf["flash"] else None),
                                 config=(" ".join(f"{k}={v}" for k, v in config.items()) + note
                                         if config else "default")))
                del q, k, v
    csv_path = out_dir / f"{stem}.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {csv_path}")
    try:
        from plot_sdpa import plot
        print(f"wrote {plot(csv_path)}")
    except ImportError as e:
        print(f"no plot here ({e}); run: python3 bench/plot_sdpa.py {csv_path}")


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    main()
