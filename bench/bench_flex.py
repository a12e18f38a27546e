#!/usr/bin/env python3
"""Masks and score modifiers against FlexAttention (issue 14): flashjit (its built-in
feature, or a mask_mod expression compiled at run time) against PyTorch's FlexAttention
(torch.compile'd flex_attention with a BlockMask) and SDPA EFFICIENT with the mask
materialized as an attn_mask tensor, in one process.

Cases: a key-padding mask (batch b keeps its first S * (1 - b / (2 B)) keys; flashjit
runs it as varlen sequences with seqused_k, as FlashAttention's users unpad, and as an
attn_mask tensor, "flashjit_attn_mask"), sliding
windows of 128 and 1024 keys (causal), a document mask (documents of 512 tokens), ALiBi
(slopes 2^(-8 (h + 1) / H)), softcap 30, and a 90%-empty block-sparse mask (128 x 128
blocks: the diagonal block and every block with (7 qb + 13 kb) % 10 == 0). Shapes:
B * S = 16k tokens, H * D = 2048, bf16, forward only. TFLOP/s are of the useful work:
4 * D * (the (query, key) pairs the mask keeps) * B * H. Timing: --iters calls between
CUDA events, each after a 256 MB write that flushes L2; the median. Outputs are checked
against FlexAttention's (max abs difference printed). Writes flex_<date>_<gpu>.csv, .png.

    FLASHJIT_LIBRARY=build/runtime/libflashjit.so python3 bench/bench_flex.py --out bench/results
"""
import argparse
import csv
import datetime
import math
import pathlib
import shlex
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE))
import flashjit  # noqa: E402
from bench_backward import timed  # noqa: E402

FIELDS = ["date", "gpu", "batch", "seqlen", "heads", "head_dim", "case", "contender",
          "time_us", "useful_tflops", "vs_flex", "max_abs_diff_vs_flex"]
CASES = ["padding", "window128", "window1024", "document", "alibi", "softcap", "sparse90"]
DOC = 512
BLOCK = 128
CAP = 30.0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seqlens", default="4096")
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--cases", default=",".join(CASES))
    return p.parse_args(argv)


def case(torch, args, rows, day, gpu, S, D, name):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    F = torch.nn.functional
    B, H = max(1, 16384 // S), max(1, 2048 // D)
    torch._dynamo.reset()  # a fresh compile of flex_attention per case (no recompile limit)
    torch.manual_seed(S + D)
    # flashjit takes BSHD (FlashAttention's layout), FlexAttention and SDPA its BHSD views.
    qs, ks, vs = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    q, k, v = (x.transpose(1, 2) for x in (qs, ks, vs))
    i = torch.arange(S, device="cuda")
    lengths = torch.tensor([S - (S * b) // (2 * B) for b in range(B)], device="cuda")
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)], device="cuda")
    mask_mod = score_mod = None
    keep = None  # the [B|1, 1, S, S] bool mask the case keeps, for SDPA and the FLOP count
    if name == "padding":
        def mask_mod(b, h, qi, ki):
            return ki < lengths[b]
        keep = (i[None, None, None, :] < lengths[:, None, None, None]).expand(B, 1, S, S)
        # As FlashAttention's users pad: the batch as varlen sequences of S tokens, each
        # attending to its first lengths[b] keys (seqused_k), so padded keys cost nothing.
        cu = torch.arange(0, (B + 1) * S, S, device="cuda", dtype=torch.int32)
        used = lengths.to(torch.int32)
        fj = lambda: flashjit.flash_attn_varlen_func(  # noqa: E731
            qs.view(B * S, H, D), ks.view(B * S, H, D), vs.view(B * S, H, D), cu, cu, S, S,
            seqused_k=used).view(B, S, H, D)
    elif name.startswith("window"):
        w = int(name[len("window"):])

        def mask_mod(b, h, qi, ki):
            return (qi >= ki) & (qi - ki <= w)
        keep = ((i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] <= w))[None, None]
        fj = lambda: flashjit.flash_attn_func(qs, ks, vs, causal=True,  # noqa: E731
                                              window_size=(w, 0))
    elif name == "document":
        def mask_mod(b, h, qi, ki):
            return qi // DOC == ki // DOC
        keep = (i[:, None] // DOC == i[None, :] // DOC)[None, None]
        fj = lambda: flashjit.flash_attn_func(  # noqa: E731
            qs, ks, vs, mask_mod=f"q_idx / {DOC} == kv_idx / {DOC}")
    elif name == "alibi":
        def score_mod(score, b, h, qi, ki):
            return score - slopes[h] * (qi - ki).abs()
        fj = lambda: flashjit.flash_attn_func(qs, ks, vs, alibi_slopes=slopes)  # noqa: E731
    elif name == "softcap":
        def score_mod(score, b, h, qi, ki):
            return CAP * torch.tanh(score / CAP)
        fj = lambda: flashjit.flash_attn_func(qs, ks, vs, softcap=CAP)  # noqa: E731
    elif name == "sparse90":
        def mask_mod(b, h, qi, ki):
            qb, kb = qi // BLOCK, ki // BLOCK
            return (qb == kb) | ((7 * qb + 13 * kb) % 10 == 0)
        qb, kb = i[:, None] // BLOCK, i[None, :] // BLOCK
        keep = ((qb == kb) | ((7 * qb + 13 * kb) % 10 == 0))[None, None]
        expr = f"q_idx / {BLOCK} == kv_idx / {BLOCK} || (7 * (q_idx / {BLOCK}) + " \
               f"13 * (kv_idx / {BLOCK})) % 10 == 0"
        fj = lambda: flashjit.flash_attn_func(qs, ks, vs, mask_mod=expr)  # noqa: E731
    else:
        raise ValueError(f"unknown case {name}")
    pairs = keep.expand(B, 1, S, S).sum().item() if keep is not None else B * S * S
    flops = 4 * D * pairs * H
    block_mask = create_block_mask(mask_mod, B if name == "padding" else None, None, S, S) \
        if mask_mod is not None else None
    flex = torch.compile(flex_attention)

    def fx():
        return flex(q, k, v, score_mod=score_mod, block_mask=block_mask)

    def sdpa():
        bias = None
        if keep is not None:
            bias = keep
        elif name == "alibi":
            bias = (-slopes[:, None, None] * (i[:, None] - i[None, :]).abs()).to(q.dtype)[None]
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    runs = {"flex": fx, "flashjit": lambda: fj().transpose(1, 2)}
    if name == "padding":  # the same mask as a tensor (SDPA's way): every key is visited
        runs["flashjit_attn_mask"] = lambda: flashjit.flash_attn_func(
            qs, ks, vs, attn_mask=keep[:, :, :1, :]).transpose(1, 2)
    if name != "softcap":  # SDPA has no softcap
        runs["sdpa_efficient"] = sdpa
    times, outs = {}, {}
    for contender, fn in runs.items():
        try:
            outs[contender] = fn()
            times[contender] = timed(torch, fn, args)
        except Exception as e:  # a contender that cannot run this case: say so, go on
            print(f"  {name} {contender}: not run ({str(e).splitlines()[0][:100]})", flush=True)
    ref = outs.get("flex")
    for contender, t in times.items():
        diff = (outs[contender].float() - ref.float()).abs().max().item() \
            if ref is not None else math.nan
        rows.append({"date": day, "gpu": gpu, "batch": B, "seqlen": S, "heads": H,
                     "head_dim": D, "case": name, "contender": contender,
                     "time_us": f"{t:.1f}", "useful_tflops": f"{flops / t / 1e6:.1f}",
                     "vs_flex": f"{times['flex'] / t:.3f}" if "flex" in times else "",
                     "max_abs_diff_vs_flex": f"{diff:.2e}"})
        print(f"B={B} S={S} H={H} D={D} {name:10s} {contender:15s} {t:9.1f} us "
              f"{flops / t / 1e6:6.1f} TFLOP/s useful"
              + (f"  {times['flex'] / t:5.2f}x flex" if "flex" in times else "")
              + f"  max |diff| vs flex {diff:.1e}", flush=True)


def main(argv=None):
    args = parse_args(argv)
    import torch
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    day = datetime.date.today().isoformat()
    gpu = torch.cuda.get_device_name().replace(" ", "_")
    short = "H100" if "H100" in gpu else "H200" if "H200" in gpu else gpu
    print("python3 bench/bench_flex.py " + shlex.join(sys.argv[1:] if argv is None else argv))
    rows = []
    for D in (int(x) for x in args.head_dims.split(",")):
        for S in (int(x) for x in args.seqlens.split(",")):
            for name in args.cases.split(","):
                case(torch, args, rows, day, gpu, S, D, name)
    path = out / f"flex_{day}_{short}.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")
    plot(rows, path.with_suffix(".png"), short)


def plot(rows, path, gpu):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    cases = list(dict.fromkeys((int(r["head_dim"]), int(r["seqlen"]), r["case"]) for r in rows))
    names = sorted({r["contender"] for r in rows})
    fig, ax = plt.subplots(figsize=(13, 5))
    width = 0.8 / max(len(names), 1)
    for n_i, n in enumerate(names):
        ys = [next((float(r["useful_tflops"]) for r in rows if r["contender"] == n and
                    (int(r["head_dim"]), int(r["seqlen"]), r["case"]) == c), 0) for c in cases]
        ax.bar([x + n_i * width for x in range(len(cases))], ys, width, label=n)
    ax.set_xticks([x + 0.4 for x in range(len(cases))],
                  [f"D={c[0]} S={c[1]}\n{c[2]}" for c in cases], fontsize=7)
    ax.set_ylabel("forward TFLOP/s of useful work")
    ax.set_title(f"masks and score modifiers vs FlexAttention, {gpu}, bf16, B*S=16k, "
                 "H*D=2048 (L2 flushed); bar 0 = not run")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
