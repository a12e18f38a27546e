#!/usr/bin/env python3
"""Draws bench_decode.py's CSV: one PNG per (GQA, query tokens), a grid of panels (rows:
batch, columns: head dim), each the fraction of peak HBM bandwidth against keys, one
line per contender; the dotted line is issue 13's goal (80% at batch 1, 85% above)."""
import csv
import pathlib
import sys


def plot(csv_path):
    """Returns the paths of the PNGs written beside csv_path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    csv_path = pathlib.Path(csv_path)
    rows = list(csv.DictReader(open(csv_path)))
    num = lambda r, k: int(r[k])
    contenders = list(dict.fromkeys(r["contender"] for r in rows))
    colors = {c: plt.cm.tab10(i % 10) for i, c in enumerate(contenders)}
    pngs = []
    groups = sorted({(num(r, "heads_q"), num(r, "heads_kv"), num(r, "seqlen_q")) for r in rows},
                    key=lambda g: (-g[0] // g[1], -g[0], g[2]))
    for hq, hkv, sq in groups:
        sel = [r for r in rows if (num(r, "heads_q"), num(r, "heads_kv"), num(r, "seqlen_q"))
               == (hq, hkv, sq)]
        batches = sorted({num(r, "batch") for r in sel})
        dims = sorted({num(r, "head_dim") for r in sel})
        keys = sorted({num(r, "seqlen_k") for r in sel})
        fig, axes = plt.subplots(len(batches), len(dims), squeeze=False, sharex=True, sharey=True,
                                 figsize=(1.5 + 3.2 * len(dims), 1.2 + 2.4 * len(batches)))
        for i, b in enumerate(batches):
            for j, d in enumerate(dims):
                ax = axes[i][j]
                here = [r for r in sel if num(r, "batch") == b and num(r, "head_dim") == d]
                for c in contenders:
                    pts = sorted((num(r, "seqlen_k"), float(r["hbm_fraction"])) for r in here
                                 if r["contender"] == c and r["status"] == "ok")
                    if pts:
                        flashjit = c.startswith("flashjit")
                        ax.plot([p[0] for p in pts], [p[1] for p in pts],
                                "-o" if flashjit else "--s", color=colors[c], label=c,
                                lw=2 if flashjit else 1.2, ms=4)
                skipped = sorted({num(r, "seqlen_k") for r in here if r["status"] == "skipped"})
                if skipped:
                    ax.text(0.03, 0.04, "skipped (K+V too large): Sk=" +
                            ",".join(f"{k // 1024}k" for k in skipped),
                            transform=ax.transAxes, fontsize=7, color="grey")
                ax.axhline(0.80 if b == 1 else 0.85, ls=":", color="grey", lw=1)
                ax.set_title(f"B={b}, D={d}", fontsize=9)
                ax.set_xscale("log", base=2)
                ax.set_xticks(keys)
                ax.set_xticklabels([f"{k // 1024}k" if k >= 1024 else str(k) for k in keys])
                ax.set_ylim(0, 1.05)
                ax.grid(alpha=0.3)
                if i == len(batches) - 1:
                    ax.set_xlabel("keys (S_k)")
                if j == 0:
                    ax.set_ylabel("fraction of peak HBM")
        handles = {}
        for ax in axes.flat:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(lab, h)
        labels = [c for c in contenders if c in handles]
        fig.legend([handles[c] for c in labels], labels, loc="lower center", ncol=len(labels),
                   fontsize=8)
        peak = rows[0]["peak_gbps"]
        fig.suptitle(f"{csv_path.stem}: decode, GQA {hq}:{hkv}, {sq} query token"
                     f"{'s' if sq != 1 else ''}; fraction of {float(peak):.0f} GB/s", fontsize=10)
        fig.tight_layout(rect=(0, 0.04 if len(batches) > 2 else 0.1, 1, 1))
        png = csv_path.with_name(f"{csv_path.stem}_gqa{hq}-{hkv}_q{sq}.png")
        fig.savefig(png, dpi=110)
        plt.close(fig)
        pngs.append(png)
    return pngs


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: plot_decode.py DECODE_CSV")
    for png in plot(sys.argv[1]):
        print(png)
