#!/usr/bin/env python3
"""Attention with mask tensors, or dropout, on one GPU: flashjit.scaled_dot_product_attention
with an attn_mask (or dropout_p = 0.1) against PyTorch SDPA's backends that take one (EFFICIENT,
CUDNN; FLASH for dropout), in one process (issues 14 and 15).

Masks: a bool key-padding mask [B, 1, 1, S] (batch b keeps its first S * (1 - b / (2 B))
keys), the bool [B, 1, S, S] mask transformers builds for that batch in a causal model
("causal_padding": causal and the same keys), and an additive bf16 bias [S, S] broadcast
over batch and heads (values in [-2, 1), 1 in 10 -inf, each query keeping key 0). For the
padding masks, "flashjit_no_mask" is flashjit's same call without the mask (causal for
causal_padding): the mask's cost is the gap to it. Shapes: B * S = 16k tokens, H * D =
2048, bf16, forward only. TFLOP/s count the dense 4 * B * H * S^2 * D. Timing: --iters
calls between CUDA events, each after a 256 MB write that flushes L2; the median.
flashjit's output is checked against SDPA EFFICIENT's (max abs difference printed; not
with dropout, whose random patterns differ).
Writes masks_<date>_<gpu>.csv, .png and prints the command line first.

    FLASHJIT_LIBRARY=build/runtime/libflashjit.so python3 bench/bench_masks.py --out bench/results
"""
import argparse
import csv
import datetime
import pathlib
import shlex
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE))
import flashjit  # noqa: E402
from bench_backward import timed  # noqa: E402

FIELDS = ["date", "gpu", "batch", "seqlen", "heads", "head_dim", "mask", "contender",
          "time_us", "tflops", "vs_efficient", "max_abs_diff"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seqlens", default="1024,4096")
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--kinds", default="padding,causal_padding,bias,dropout")
    return p.parse_args(argv)


def make_mask(torch, kind, B, S):
    if kind in ("padding", "causal_padding"):
        keep = torch.arange(S, device="cuda")[None, :] < \
            torch.tensor([S - (S * b) // (2 * B) for b in range(B)], device="cuda")[:, None]
        keep = keep[:, None, None, :]
        if kind == "causal_padding":
            keep = keep & torch.ones(S, S, dtype=torch.bool, device="cuda").tril()[None, None]
        return keep
    g = torch.Generator(device="cuda").manual_seed(S)
    u = torch.rand(S, S, device="cuda", generator=g)
    bias = torch.where(u < 0.1, float("-inf"), 3 * u - 2)
    bias[:, 0] = 0.0
    return bias.bfloat16()


def case(torch, args, rows, day, gpu, S, D, kind):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    F = torch.nn.functional
    B, H = max(1, 16384 // S), max(1, 2048 // D)
    torch.manual_seed(S + D)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    mask = make_mask(torch, kind, B, S) if kind != "dropout" else None
    p = 0.1 if kind == "dropout" else 0.0
    flops = 4 * B * H * S * S * D
    results, outs = {}, {}

    def fj():
        return flashjit.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
    outs["flashjit"] = fj()
    results["flashjit"] = timed(torch, fj, args)
    if kind in ("padding", "causal_padding"):
        def fj_no_mask():
            return flashjit.scaled_dot_product_attention(q, k, v,
                                                         is_causal=kind == "causal_padding")
        fj_no_mask()
        results["flashjit_no_mask"] = timed(torch, fj_no_mask, args)
    backends = [("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION),
                ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)]
    if kind == "dropout":
        backends.append(("sdpa_flash", SDPBackend.FLASH_ATTENTION))
    for name, backend in backends:
        try:
            with sdpa_kernel(backend):
                def run():
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
                outs[name] = run()
                results[name] = timed(torch, run, args)
        except RuntimeError as e:
            print(f"  {name}: not run ({str(e).splitlines()[0][:80]})")
    ref = outs.get("sdpa_efficient") if kind != "dropout" else None
    for name, t in results.items():
        diff = (outs[name].float() - ref.float()).abs().max().item() \
            if ref is not None and name in outs else None
        rows.append({"date": day, "gpu": gpu, "batch": B, "seqlen": S, "heads": H,
                     "head_dim": D, "mask": kind, "contender": name, "time_us": f"{t:.1f}",
                     "tflops": f"{flops / t / 1e6:.1f}",
                     "vs_efficient": f"{results['sdpa_efficient'] / t:.3f}"
                     if "sdpa_efficient" in results else "",
                     "max_abs_diff": f"{diff:.2e}" if diff is not None else ""})
        print(f"B={B} S={S} H={H} D={D} {kind:8s} {name:15s} {t:9.1f} us "
              f"{flops / t / 1e6:6.1f} TFLOP/s" +
              (f"  max |diff| vs EFFICIENT {diff:.1e}" if diff is not None else ""), flush=True)


def main(argv=None):
    args = parse_args(argv)
    import torch
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    day = datetime.date.today().isoformat()
    gpu = torch.cuda.get_device_name().replace(" ", "_")
    short = "H100" if "H100" in gpu else gpu
    print("python3 bench/bench_masks.py " + shlex.join(sys.argv[1:] if argv is None else argv))
    rows = []
    for D in (int(x) for x in args.head_dims.split(",")):
        for S in (int(x) for x in args.seqlens.split(",")):
            for kind in args.kinds.split(","):
                case(torch, args, rows, day, gpu, S, D, kind)
    path = out / f"masks_{day}_{short}.csv"
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
    cases = sorted({(int(r["head_dim"]), int(r["seqlen"]), r["mask"]) for r in rows})
    names = sorted({r["contender"] for r in rows})
    fig, ax = plt.subplots(figsize=(12, 5))
    width = 0.8 / max(len(names), 1)
    for i, n in enumerate(names):
        ys = [next((float(r["tflops"]) for r in rows if r["contender"] == n and
                    (int(r["head_dim"]), int(r["seqlen"]), r["mask"]) == c), 0) for c in cases]
        ax.bar([x + i * width for x in range(len(cases))], ys, width, label=n)
    ax.set_xticks([x + 0.4 for x in range(len(cases))],
                  [f"D={c[0]} S={c[1]} {c[2]}" for c in cases], fontsize=8)
    ax.set_ylabel("forward TFLOP/s (dense FLOPs)")
    ax.set_title("attention with attn_mask, bf16, B*S=16k, H*D=2048 (L2 flushed); "
                 "bar 0 = not run")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
