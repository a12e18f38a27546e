#!/usr/bin/env python3
"""Plots bench/dynamic_shapes.py's CSV: host time per call against the pair index.

    python3 bench/plot_dynamic_shapes.py bench/results/h100_dynamic_shapes_py_2026-11-23.csv
"""
import csv
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot(csv_path):
    rows = list(csv.DictReader(open(csv_path)))
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(x, [float(r["flashjit_host_us"]) for r in rows], "o-", ms=3, label="flashjit")
    ax.plot(x, [float(r["sdpa_host_us"]) for r in rows], "s-", ms=3, label="PyTorch SDPA")
    ax.axvline(31.5, color="gray", lw=0.5)
    ax.text(2, ax.get_ylim()[1] * 0.92, "prefill: seqlen 1..4097", fontsize=8)
    ax.text(34, ax.get_ylim()[1] * 0.92, "decode: sq=1, sk=4000..4031", fontsize=8)
    ax.set_xlabel("(seqlen_q, seqlen_k) pair, in call order; one flashjit kernel for all 64")
    ax.set_ylabel("host time per call (us), median")
    ax.set_title("Run-time shapes from Python on the H100 (GQA 32:8, D=128, causal, bf16)")
    ax.legend()
    out = pathlib.Path(csv_path).with_suffix(".png")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return out


if __name__ == "__main__":
    print(f"wrote {plot(sys.argv[1])}")
