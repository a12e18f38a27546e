#!/usr/bin/env python3
"""Static metrics of the AMD kernels, from LLVM 22's resource report (no GPU): issue 16's
bench table for gfx1201, gfx1100, gfx942 and gfx950.

For every arch, head dim (--head-dims, default 64, 80, 128, 256), causal and not, and
kernel (the forward, the backward's dQ kernel and both dK/dV kernels -- f32 per query head
for GQA, and dK and dV written directly where each KV head has one query head --, decode's
split kernel and the decode kernel of one split),
`flashjit compile --json` compiles the default config (bf16, the library's choice) and
this script records what the code object says: VGPRs and AGPRs, SGPRs, VGPR and SGPR
spills, scratch bytes, LDS bytes, waves per SIMD the registers and LDS allow, and the
matrix instructions in the kernel (the loop body is emitted once, so that is one KV
block's products per wave: tests/compile_regression_test.cpp checks the count). Writes
amd_static_<date>.csv, a markdown table (amd_static_<date>.md) and, where matplotlib
is installed, amd_static_<date>.png (VGPRs and occupancy per head dim) into --out.

    python3 bench/amd_static.py --cli build/tools/flashjit --out bench/results

Exits 1 when a forward, split or decode kernel spills a VGPR or uses scratch (issue 16 asks for
none at every default config), after writing everything; the backward's spills are
listed (issue 15 reports on them: none on gfx1201 up to head dim 128).
"""
import argparse
import csv
import datetime
import json
import pathlib
import shlex
import subprocess
import sys

ARCHS = ("gfx1201", "gfx1100", "gfx942", "gfx950")
KERNELS = ("attention", "backward-dq", "backward-dkdv", "backward-dkdv-direct", "split-partial",
           "decode")
FIELDS = ["arch", "kernel", "head_dim", "causal", "config", "vgprs", "agprs", "sgprs",
          "vgpr_spills", "sgpr_spills", "scratch_bytes", "lds_bytes", "waves_per_simd",
          "matrix_instructions", "wave_size", "workgroup_size", "symbol"]


def compile_one(cli, arch, kernel, d, causal):
    """One row: the resource report of `flashjit compile --json`, with the config it chose."""
    cmd = [cli, "compile", "--arch", arch, "--head-dim", str(d), "--kernel", kernel, "--json"]
    if causal:
        cmd.append("--causal")
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{shlex.join(cmd)} failed ({done.returncode}):\n{done.stderr.strip()}")
    report = json.loads(done.stdout)
    return {"arch": arch, "kernel": kernel, "head_dim": d, "causal": int(causal),
            "config": report["config"], "vgprs": report["vgprs"], "agprs": report["agprs"],
            "sgprs": report["sgprs"], "vgpr_spills": report["vgpr_spill_count"],
            "sgpr_spills": report["sgpr_spill_count"],
            "scratch_bytes": report["private_segment_bytes"],
            "lds_bytes": report["group_segment_bytes"],
            "waves_per_simd": report["occupancy_waves_per_simd"],
            "matrix_instructions": report["matrix_instructions"],
            "wave_size": report["wavefront_size"],
            "workgroup_size": report["max_flat_workgroup_size"], "symbol": report["kernel"]}


def markdown(rows):
    """One table per kernel: a row per (arch, head dim), causal and not side by side."""
    out = []
    for kernel in KERNELS:
        out += [f"### {kernel}", "",
                "| arch | D | config | VGPRs (AGPRs) | spills | LDS bytes | waves/SIMD | matrix "
                "instr. | causal: VGPRs | spills | waves/SIMD |",
                "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for arch in ARCHS:
            for d in sorted({r["head_dim"] for r in rows}):
                pair = {r["causal"]: r for r in rows
                        if (r["arch"], r["kernel"], r["head_dim"]) == (arch, kernel, d)}
                if not pair:
                    continue
                a, c = pair.get(0), pair.get(1)
                regs = lambda r: f"{r['vgprs']}" + (f" ({r['agprs']})" if r["agprs"] else "")  # noqa: E731
                spills = lambda r: f"{r['vgpr_spills']}/{r['sgpr_spills']}"  # noqa: E731
                out.append(f"| {arch} | {d} | {a['config']} | {regs(a)} | {spills(a)} | {a['lds_bytes']} | "
                           f"{a['waves_per_simd']} | {a['matrix_instructions']} | {regs(c)} | "
                           f"{spills(c)} | {c['waves_per_simd']} |")
        out.append("")
    return "\n".join(out)


def plot(rows, path):
    """VGPRs and waves per SIMD against the head dim, a line per (arch, kernel), not causal."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return False
    fig, axes = plt.subplots(2, len(KERNELS), figsize=(4 * len(KERNELS), 6.5), sharex=True)
    for col, kernel in enumerate(KERNELS):
        for arch in ARCHS:
            pts = sorted((r["head_dim"], r["vgprs"], r["waves_per_simd"],
                          r["vgpr_spills"] > 0)
                         for r in rows if r["arch"] == arch and r["kernel"] == kernel
                         and not r["causal"])
            if not pts:
                continue
            xs = [p[0] for p in pts]
            line, = axes[0][col].plot(xs, [p[1] for p in pts], marker="o", label=arch)
            axes[1][col].plot(xs, [p[2] for p in pts], marker="o", label=arch)
            spills = [p for p in pts if p[3]]
            if spills:  # a ring around each point whose kernel spills VGPRs
                axes[0][col].scatter([p[0] for p in spills], [p[1] for p in spills], s=160,
                                     facecolors="none", edgecolors=line.get_color())
        axes[0][col].set_title(kernel)
        axes[1][col].set_xlabel("head dim")
    axes[0][0].set_ylabel("VGPRs per lane (CDNA: with AGPRs)")
    axes[1][0].set_ylabel("waves per SIMD")
    axes[0][0].legend(fontsize="small")
    fig.suptitle("flashjit AMD kernels, default configs, bf16, not causal (LLVM 22 resource "
                 "report; ringed: the kernel spills VGPRs)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", default="build/tools/flashjit", help="the flashjit executable")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--head-dims", default="64,80,128,256")
    ap.add_argument("--archs", default=",".join(ARCHS))
    args = ap.parse_args()
    dims = [int(x) for x in args.head_dims.split(",")]
    archs = args.archs.split(",")
    rows = [compile_one(args.cli, arch, kernel, d, causal)
            for arch in archs for kernel in KERNELS for d in dims for causal in (False, True)]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"amd_static_{datetime.date.today().isoformat()}"
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    command = "$ python3 bench/amd_static.py " + shlex.join(sys.argv[1:])
    stem.with_suffix(".md").write_text(f"{command}\n\n{markdown(rows)}")
    plotted = plot(rows, stem.with_suffix(".png"))
    print(f"wrote {stem}.csv, {stem}.md" + (f", {stem}.png" if plotted else ""))
    spilled = [r for r in rows if r["vgpr_spills"] or r["scratch_bytes"]]
    for r in spilled:
        print(f"spill: {r['arch']} {r['kernel']} d={r['head_dim']} causal={r['causal']}: "
              f"{r['vgpr_spills']} VGPRs spilled, {r['scratch_bytes']} B scratch")
    forward = [r for r in spilled if not r["kernel"].startswith("backward")]
    print(f"{len(rows)} kernels: {len(spilled)} with VGPR spills or scratch, "
          f"{len(forward)} of them forward, split or decode kernels")
    return 1 if forward else 0


if __name__ == "__main__":
    sys.exit(main())
