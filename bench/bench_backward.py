#!/usr/bin/env python3
"""The backward pass on one GPU: flashjit's (flash_attn_backward: preprocess, dQ, dK/dV,
group sum; deterministic) against PyTorch SDPA's backends (FLASH, EFFICIENT, CUDNN), in
one process (issue 15).

Shapes: B * S = 16k tokens, H * D = 2048 (H = 2048 / D), bf16, causal and not. FLOPs =
2.5 x the forward's 4 * B * H * S^2 * D (FlashAttention's convention), halved under
causal. Timing: --iters backward calls between CUDA events, each after a 256 MB write
that flushes L2; the median. SDPA's backward is timed as torch.autograd.grad of its
output (retain_graph); flashjit's as flash_attn_backward on the forward's out and LSE.
flashjit's gradients are checked against SDPA FLASH's (relative L2 error < 2e-2).
Writes backward_<date>_<gpu>.csv, .png and prints the command line first.

    FLASHJIT_LIBRARY=build/runtime/libflashjit.so python3 bench/bench_backward.py --out bench/results
"""
import argparse
import csv
import datetime
import pathlib
import shlex
import statistics
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
import flashjit  # noqa: E402

L2_FLUSH_BYTES = 256 << 20
FIELDS = ["date", "gpu", "batch", "seqlen", "heads", "head_dim", "causal", "dropout", "contender",
          "time_us", "tflops", "vs_flash", "rel_err"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seqlens", default="1024,4096")
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--dropout", type=float, default=0.0,
                   help="dropout probability of every contender (their patterns differ, so no "
                        "gradient comparison)")
    return p.parse_args(argv)


def timed(torch, fn, args):
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    for _ in range(args.warmup):
        fn()
    times = []
    for _ in range(args.iters):
        flush.fill_(1)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


def case(torch, args, rows, day, gpu, S, D, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    F = torch.nn.functional
    B, H = max(1, 16384 // S), max(1, 2048 // D)
    torch.manual_seed(S + D)
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    dout = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
    flops = 2.5 * 4 * B * H * S * S * D / (2 if causal else 1)
    results, grads = {}, {}
    drop = dict(dropout_p=args.dropout, dropout_seed=1) if args.dropout else {}
    out, lse = flashjit.flash_attn_func(q, k, v, causal=causal, return_lse=True, **drop)

    def fj():
        return flashjit.flash_attn_backward(dout, q, k, v, out, lse, causal=causal, **drop)
    grads["flashjit"] = fj()
    results["flashjit"] = timed(torch, fj, args)
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
    dt = dout.transpose(1, 2)
    for name, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION),
                          ("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal,
                                                   dropout_p=args.dropout)

                def run():
                    return torch.autograd.grad(o, (qt, kt, vt), dt, retain_graph=True)
                g = run()
                grads[name] = tuple(x.transpose(1, 2) for x in g)
                results[name] = timed(torch, run, args)
        except RuntimeError as e:
            print(f"  {name}: not run ({str(e).splitlines()[0][:80]})")
    ref = grads.get("sdpa_flash") if not args.dropout else None
    for name, t in results.items():
        err = ""
        if ref is not None:
            err = max(((a.double() - b.double()).norm() / b.double().norm()).item()
                      for a, b in zip(grads[name], ref))
        rows.append({"date": day, "gpu": gpu, "batch": B, "seqlen": S, "heads": H,
                     "head_dim": D, "causal": int(causal), "dropout": args.dropout,
                     "contender": name,
                     "time_us": f"{t:.1f}", "tflops": f"{flops / t / 1e6:.1f}",
                     "vs_flash": f"{results['sdpa_flash'] / t:.3f}" if "sdpa_flash" in results
                     else "", "rel_err": f"{err:.2e}" if err != "" else ""})
        print(f"B={B} S={S} H={H} D={D} causal={int(causal)} {name:15s} {t:9.1f} us "
              f"{flops / t / 1e6:6.1f} TFLOP/s" + (f"  err vs FLASH {err:.1e}" if err != "" else ""),
              flush=True)
    if ref is not None and rows[-len(results)]["rel_err"] and \
            float(rows[-len(results)]["rel_err"]) > 2e-2:
        print(f"  WARNING: flashjit's gradients differ from SDPA FLASH's by {err:.2e}")


def main(argv=None):
    args = parse_args(argv)
    import torch
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    day = datetime.date.today().isoformat()
    gpu = torch.cuda.get_device_name().replace(" ", "_")
    short = "H100" if "H100" in gpu else gpu
    print("python3 bench/bench_backward.py " + shlex.join(sys.argv[1:] if argv is None else argv))
    rows = []
    for D in (int(x) for x in args.head_dims.split(",")):
        for S in (int(x) for x in args.seqlens.split(",")):
            for causal in (False, True):
                case(torch, args, rows, day, gpu, S, D, causal)
    path = out / f"backward_{day}_{short}{f'_dropout{args.dropout}' if args.dropout else ''}.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")
    plot(rows, path.with_suffix(".png"))


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    cases = sorted({(int(r["head_dim"]), int(r["seqlen"]), int(r["causal"])) for r in rows})
    names = sorted({r["contender"] for r in rows})
    fig, ax = plt.subplots(figsize=(12, 5))
    width = 0.8 / max(len(names), 1)
    for i, n in enumerate(names):
        ys = [next((float(r["tflops"]) for r in rows if r["contender"] == n and
                    (int(r["head_dim"]), int(r["seqlen"]), int(r["causal"])) == c), 0)
              for c in cases]  # 0: the backend did not run that case
        ax.bar([x + i * width for x in range(len(cases))], ys, width, label=n)
    ax.set_xticks([x + 0.4 for x in range(len(cases))],
                  [f"D={c[0]} S={c[1]}{' causal' if c[2] else ''}" for c in cases], fontsize=8)
    ax.set_ylabel("backward TFLOP/s (2.5x forward FLOPs)")
    ax.set_title("attention backward, bf16, B*S=16k, H*D=2048 (L2 flushed); bar 0 = not run")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
