#!/usr/bin/env python3
"""Draws bench_sdpa.py's CSV as a PNG: TFLOP/s against head dim, a panel per
(mask, sequence length) for every length measured. A backend that refused a
case (an empty cell: cuDNN and EFFICIENT at head dim 100, for one) has no
point there and its line breaks, rather than running straight across."""
import csv
import math
import pathlib
import sys

IMPLS = [("flashjit", "-o"), ("cudnn", "-s"), ("flash", "-^"), ("efficient", "-v")]


def value(row, impl):
    text = row.get(impl, "")
    return float(text) if text not in ("", "None", "nan") else math.nan


def plot(csv_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(csv.DictReader(open(csv_path)))
    seqlens = sorted({int(r["seqlen"]) for r in rows})
    dims = sorted({int(r["head_dim"]) for r in rows})
    fig, axes = plt.subplots(2, len(seqlens), figsize=(4.2 * len(seqlens), 7.5), sharey=True,
                             squeeze=False)
    for i, causal in enumerate(("False", "True")):
        for j, s in enumerate(seqlens):
            ax = axes[i][j]
            at = {int(r["head_dim"]): r for r in rows
                  if r["causal"] == causal and int(r["seqlen"]) == s}
            for impl, style in IMPLS:
                # NaN where a case was not run or was refused: matplotlib breaks the line.
                ys = [value(at[d], impl) if d in at else math.nan for d in dims]
                if any(not math.isnan(y) for y in ys):
                    ax.plot(dims, ys, style, markersize=4, label=impl)
            ax.set_title(f"S = {s}, {'causal' if causal == 'True' else 'not causal'}",
                         fontsize=9)
            ax.set_xticks(dims)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            if i == 1:
                ax.set_xlabel("head dim")
        axes[i][0].set_ylabel("TFLOP/s")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(pathlib.Path(csv_path).stem)
    fig.tight_layout()
    png = pathlib.Path(csv_path).with_suffix(".png")
    fig.savefig(png, dpi=100)
    return png


if __name__ == "__main__":
    print(plot(sys.argv[1]))
