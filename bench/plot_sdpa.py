#!/usr/bin/env python3
"""Draws bench_sdpa.py's CSV as a PNG: TFLOP/s against head dim, one panel per mask,
at the longest sequence length measured (and the mean over lengths as dashed lines)."""
import csv
import pathlib
import sys


def plot(csv_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(csv.DictReader(open(csv_path)))
    impls = ["flashjit", "cudnn", "flash", "efficient"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, causal in zip(axes, ("False", "True")):
        sel = [r for r in rows if r["causal"] == causal]
        seqlens = sorted({int(r["seqlen"]) for r in sel})
        for impl in impls:
            for s, style in ((seqlens[-1], "-o"), (seqlens[0], ":x")):
                pts = sorted((int(r["head_dim"]), float(r[impl])) for r in sel
                             if int(r["seqlen"]) == s and r[impl] not in ("", "None"))
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style,
                            label=f"{impl} S={s}")
        ax.set_title(f"causal={causal}")
        ax.set_xlabel("head dim")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("TFLOP/s")
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle(pathlib.Path(csv_path).stem)
    fig.tight_layout()
    png = pathlib.Path(csv_path).with_suffix(".png")
    fig.savefig(png, dpi=110)
    return png


if __name__ == "__main__":
    print(plot(sys.argv[1]))
