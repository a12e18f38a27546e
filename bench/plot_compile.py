#!/usr/bin/env python3
"""Draws the compile-latency figure from one or more CSVs of `compile_bench --sweep`
(e.g. one from a 2-core machine and one from a GPU host): the cold compile time of one
forward kernel (bf16, causal), wall time, median, against the head dim, one line per
(compiler, target, host); the dashed line is issue 12's goal of 300 ms.

    python3 bench/plot_compile.py OUT.png CSV [CSV ...]
"""
import csv
import pathlib
import sys

COLUMNS = ("compiler", "target", "head_dim", "wall_ms_median", "cpu_ms_median", "repeats",
           "source_bytes", "host")
GOAL_MS = 300.0


def read_rows(paths):
    """The rows of every CSV; exits with a message naming the file when one lacks a
    column or holds a value that is not a number."""
    rows = []
    for path in paths:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                sys.exit(f"{path}: not a compile_bench --sweep CSV: missing column(s) "
                         f"{', '.join(missing)} (expected {','.join(COLUMNS)}; "
                         f"found {','.join(reader.fieldnames or []) or 'no header'})")
            for line, r in enumerate(reader, start=2):
                try:
                    rows.append({"compiler": r["compiler"], "target": r["target"],
                                 "host": r["host"], "head_dim": int(r["head_dim"]),
                                 "wall_ms": float(r["wall_ms_median"])})
                except (TypeError, ValueError) as e:
                    sys.exit(f"{path}:{line}: head_dim or wall_ms_median is not a number: {e}")
    if not rows:
        sys.exit(f"no rows in {', '.join(map(str, paths))}")
    return rows


def plot(out_png, csv_paths):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_rows(csv_paths)
    # In the order of the files and their rows, so each host's lines stay together.
    series = list(dict.fromkeys((r["compiler"], r["target"], r["host"]) for r in rows))
    dims = sorted({r["head_dim"] for r in rows})
    markers = "osD^v<>ph*Xd"
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for i, (compiler, target, host) in enumerate(series):
        pts = sorted((r["head_dim"], r["wall_ms"]) for r in rows
                     if (r["compiler"], r["target"], r["host"]) == (compiler, target, host))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=markers[i % len(markers)],
                color=plt.cm.tab10(i % 10), lw=1.6, ms=5,
                label=f"{compiler} {target} ({host})")
    ax.axhline(GOAL_MS, ls="--", color="grey", lw=1.2, label=f"goal (issue 12): {GOAL_MS:.0f} ms")
    ax.set_xticks(dims)
    ax.set_xlabel("head dim")
    ax.set_ylabel("cold compile time, wall, median (ms)")
    ax.set_ylim(bottom=0)
    ax.set_title("flashjit cold compile time per kernel (forward, bf16, causal)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return pathlib.Path(out_png)


def main(argv):
    if len(argv) < 3:
        sys.exit(f"usage: {argv[0]} OUT.png CSV [CSV ...]")
    print(plot(argv[1], argv[2:]))


if __name__ == "__main__":
    main(sys.argv)
