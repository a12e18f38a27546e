#!/usr/bin/env python3
"""Varlen prefill and paged-KV decode on one GPU: flashjit's sequences (issue 13) against
the equivalent dense flashjit call and PyTorch SDPA's backends, in one process.

1. varlen prefill: batch B of sequences packed [total, H, D] with cu_seqlens against the
   dense [B, L, H, D] call of the same work (every length L), then ragged lengths
   (uniform in [L/2, 3L/2]) whose TFLOP/s are reported. Goal (issue 13): varlen within
   5% of dense. FLOPs = 4 * sum_b(Lq * Lk * D) * H, halved under causal.
2. paged decode: one query token per sequence over a KV cache of `keys` keys held in
   pages of 16 or 256 keys (a shuffled block table) with cache_seqlens = keys, against
   flashjit's dense decode (the same keys contiguous) and SDPA FLASH/cuDNN/EFFICIENT
   on the dense cache. Bytes = K + V + Q + O; fraction of --peak-gbps (H100 SXM: 3350).

flashjit runs through the C API (ctypes: fj_attention_forward_tensors) with torch CUDA
tensors, so the numbers are the kernels' (no Python wrapper cost). Timing: --iters calls
between CUDA events, each after a 256 MB write that flushes L2; the median. Every
flashjit output is checked against the dense flashjit or SDPA output (max abs diff
< 2e-2). Writes sequences_<date>_<gpu>.csv and .log (command line first) into --out.

    FLASHJIT_LIBRARY=build/runtime/libflashjit.so python3 bench/bench_sequences.py --out bench/results
"""
import argparse
import ctypes
import csv
import datetime
import itertools
import pathlib
import random
import shlex
import statistics
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
from flashjit import _lib  # noqa: E402

L2_FLUSH_BYTES = 256 << 20
FIELDS = ["date", "gpu", "bench", "batch", "seqlen", "heads_q", "heads_kv", "head_dim",
          "page_size", "contender", "time_us", "tflops", "gbps", "hbm_fraction", "vs_dense",
          "max_abs_diff"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--peak-gbps", type=float, default=3350.0)
    p.add_argument("--prefill-lengths", default="512,2048")
    p.add_argument("--prefill-batch", type=int, default=8)
    p.add_argument("--prefill-dims", default="128")
    p.add_argument("--decode-batches", default="8,32")
    p.add_argument("--decode-keys", default="4096,32768")
    p.add_argument("--pages", default="16,256")
    return p.parse_args(argv)


class Flashjit:
    """One fj_attention per signature, called with torch tensors through fj_tensors."""

    def __init__(self, torch):
        self.torch = torch
        self.handles = {}

    def spec(self, *, batch, heads, kv_heads, seqlen_q, seqlen_k, dim, causal, strides,
             packed_q=0, packed_k=0, used_k=0, total_q=0, total_k=0, page_size=0,
             num_pages=0, pages_per_seq=0):
        q, k, v, o = (_lib.Strides(*s) for s in strides)
        return _lib.Spec(batch=batch, heads=heads, kv_heads=kv_heads, seqlen_q=seqlen_q,
                         seqlen_k=seqlen_k, head_dim_qk=dim, head_dim_v=dim,
                         dtype=_lib.DTYPE_BF16, layout=_lib.LAYOUT_BSHD, causal=int(causal),
                         window_left=-1, window_right=-1, q=q, k=k, v=v, o=o,
                         packed_q=packed_q, packed_k=packed_k, used_k=used_k, total_q=total_q,
                         total_k=total_k, page_size=page_size, num_pages=num_pages,
                         pages_per_seq=pages_per_seq)

    def call(self, spec, q, k, v, out, **arrays):
        key = (spec.causal, spec.packed_q, spec.packed_k, spec.used_k, spec.page_size > 0,
               spec.head_dim_qk)
        handle = self.handles.get(key)
        if handle is None:
            handle = ctypes.c_void_p()
            _lib.check(_lib.lib.fj_attention_create(ctypes.byref(spec), b"cuda:0", b"auto",
                                                    ctypes.byref(handle)), "create")
            self.handles[key] = handle
        t = _lib.Tensors(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), out=out.data_ptr())
        for name, tensor in arrays.items():
            setattr(t, name, tensor.data_ptr())
        stream = self.torch.cuda.current_stream().cuda_stream
        _lib.check(_lib.lib.fj_attention_forward_tensors(handle, ctypes.byref(spec),
                                                         ctypes.byref(t),
                                                         ctypes.c_void_p(stream)), "forward")


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


def bshd_strides(t):
    """(batch, head, seq, dim) strides of a [B, S, H, D] tensor, for fj_strides."""
    s = t.stride()
    return (s[0], s[2], s[1], s[3])


def prefill(torch, fj, args, rows, day, gpu):
    for D in (int(x) for x in args.prefill_dims.split(",")):
        prefill_dim(torch, fj, args, rows, day, gpu, D)


def prefill_dim(torch, fj, args, rows, day, gpu, D):
    H, HKV, B = 32, 8, args.prefill_batch
    for L in (int(x) for x in args.prefill_lengths.split(",")):
        for ragged in (False, True):
            rng = random.Random(L)
            lens = [rng.randint(L // 2, 3 * L // 2) if ragged else L for _ in range(B)]
            total = sum(lens)
            q = torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(total, HKV, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            out = torch.empty_like(q)
            cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32,
                              device="cuda")
            packed = lambda t: (0, t.stride(1), t.stride(0), 1)  # noqa: E731
            spec = fj.spec(batch=B, heads=H, kv_heads=HKV, seqlen_q=max(lens), seqlen_k=max(lens),
                           dim=D, causal=True, strides=[packed(x) for x in (q, k, v, out)],
                           packed_q=1, packed_k=1, total_q=total, total_k=total)
            flops = sum(4 * n * n * D * H / 2 for n in lens)
            t_var = timed(torch, lambda: fj.call(spec, q, k, v, out, cu_seqlens_q=cu,
                                                 cu_seqlens_k=cu), args)
            # The dense call of the same work (equal lengths only); its output checks varlen's.
            t_dense, diff = None, None
            if not ragged:
                qd, kd, vd = (x.view(B, L, x.shape[1], D) for x in (q, k, v))
                od = torch.empty_like(qd)
                dspec = fj.spec(batch=B, heads=H, kv_heads=HKV, seqlen_q=L, seqlen_k=L, dim=D,
                                causal=True, strides=[bshd_strides(x) for x in (qd, kd, vd, od)])
                t_dense = timed(torch, lambda: fj.call(dspec, qd, kd, vd, od), args)
                diff = (od.view_as(out).float() - out.float()).abs().max().item()
                assert diff < 2e-2, f"varlen differs from dense by {diff}"
            for name, t in (("flashjit_varlen", t_var), ("flashjit_dense", t_dense)):
                if t is None:
                    continue
                rows.append(dict(date=day, gpu=gpu, bench="prefill_ragged" if ragged else "prefill",
                                 batch=B, seqlen=L, heads_q=H, heads_kv=HKV, head_dim=D,
                                 page_size="", contender=name, time_us=f"{t:.1f}",
                                 tflops=f"{flops / t / 1e6:.1f}", gbps="", hbm_fraction="",
                                 vs_dense=f"{t_dense / t:.3f}" if t_dense else "",
                                 max_abs_diff=f"{diff:.2e}" if diff is not None else ""))
                print(f"prefill{' ragged' if ragged else ''} D={D} B={B} L={L}: {name} {t:.1f} us "
                      f"{flops / t / 1e6:.1f} TFLOP/s"
                      + (f" ({t_dense / t:.3f}x dense)" if t_dense else ""), flush=True)


def decode(torch, fj, args, rows, day, gpu):
    H, HKV, D = 32, 8, 128
    sdpa = torch.nn.functional.scaled_dot_product_attention
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for B in (int(x) for x in args.decode_batches.split(",")):
        for keys in (int(x) for x in args.decode_keys.split(",")):
            q = torch.randn(B, 1, H, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(B, keys, HKV, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            nbytes = 2 * k.numel() * 2 + 2 * q.numel() * 2
            out = torch.empty_like(q)
            dspec = fj.spec(batch=B, heads=H, kv_heads=HKV, seqlen_q=1, seqlen_k=keys, dim=D,
                            causal=False, strides=[bshd_strides(x) for x in (q, k, v, out)])
            results = {"flashjit_dense": timed(torch, lambda: fj.call(dspec, q, k, v, out), args)}
            reference = out.clone()
            for page in (int(x) for x in args.pages.split(",")):
                per_seq = (keys + page - 1) // page
                pages = B * per_seq
                perm = torch.randperm(pages, device="cuda").to(torch.int32)
                table = perm.view(B, per_seq).contiguous()
                kc = torch.empty(pages, page, HKV, D, device="cuda", dtype=torch.bfloat16)
                vc = torch.empty_like(kc)
                # Scatter the dense keys into their pages (padding rows of the last page zero).
                kpad = torch.zeros(B, per_seq * page, HKV, D, device="cuda", dtype=torch.bfloat16)
                vpad = torch.zeros_like(kpad)
                kpad[:, :keys] = k
                vpad[:, :keys] = v
                kc[table.view(-1).long()] = kpad.view(B * per_seq, page, HKV, D)
                vc[table.view(-1).long()] = vpad.view(B * per_seq, page, HKV, D)
                used = torch.full((B,), keys, dtype=torch.int32, device="cuda")
                pout = torch.empty_like(q)
                pspec = fj.spec(batch=B, heads=H, kv_heads=HKV, seqlen_q=1, seqlen_k=keys, dim=D,
                                causal=False,
                                strides=[bshd_strides(x) for x in (q, kc, vc, pout)], used_k=1,
                                page_size=page, num_pages=pages, pages_per_seq=per_seq)
                results[f"flashjit_paged{page}"] = timed(
                    torch, lambda: fj.call(pspec, q, kc, vc, pout, seqused_k=used,
                                           block_table=table), args)
                diff = (pout.float() - reference.float()).abs().max().item()
                assert diff < 2e-2, f"paged {page} differs from dense by {diff}"
                del kc, vc, kpad, vpad
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            for name, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION),
                                  ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
                                  ("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION)):
                try:
                    with sdpa_kernel(backend):
                        results[name] = timed(torch, lambda: sdpa(qt, kt, vt, enable_gqa=True),
                                              args)
                except RuntimeError as e:
                    print(f"  {name}: unsupported ({str(e).splitlines()[0][:120]})")
            dense = results["flashjit_dense"]
            for name, t in results.items():
                gbps = nbytes / t / 1e3
                rows.append(dict(date=day, gpu=gpu, bench="decode", batch=B, seqlen=keys,
                                 heads_q=H, heads_kv=HKV, head_dim=D,
                                 page_size=name.removeprefix("flashjit_paged")
                                 if "paged" in name else "",
                                 contender=name, time_us=f"{t:.1f}", tflops="",
                                 gbps=f"{gbps:.0f}", hbm_fraction=f"{gbps / args.peak_gbps:.3f}",
                                 vs_dense=f"{dense / t:.3f}", max_abs_diff=""))
            print(f"decode B={B} keys={keys}: " + ", ".join(
                f"{n} {t:.1f} us ({nbytes / t / 1e3 / args.peak_gbps:.0%} HBM)"
                for n, t in results.items()), flush=True)


def main(argv=None):
    args = parse_args(argv)
    import torch
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    day = datetime.date.today().isoformat()
    gpu = torch.cuda.get_device_name().replace(" ", "_")
    short = "H100" if "H100" in gpu else gpu
    rows = []
    fj = Flashjit(torch)
    command = "python3 bench/bench_sequences.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    print(command)
    prefill(torch, fj, args, rows, day, gpu)
    decode(torch, fj, args, rows, day, gpu)
    with open(out / f"sequences_{day}_{short}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {out / f'sequences_{day}_{short}.csv'}")
    plot(rows, out / f"sequences_{day}_{short}.png")


def plot(rows, path):
    """Decode: fraction of HBM per contender and case; prefill: TFLOP/s."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(14, 5))
    dec = [r for r in rows if r["bench"] == "decode"]
    cases = sorted({(r["batch"], r["seqlen"]) for r in dec})
    names = sorted({r["contender"] for r in dec})
    width = 0.8 / max(len(names), 1)
    for i, n in enumerate(names):
        ys = [next((float(r["hbm_fraction"]) for r in dec if r["contender"] == n
                    and (r["batch"], r["seqlen"]) == c), 0) for c in cases]
        a.bar([x + i * width for x in range(len(cases))], ys, width, label=n)
    a.set_xticks([x + 0.4 for x in range(len(cases))], [f"B={c[0]} keys={c[1]}" for c in cases])
    a.set_ylabel("fraction of HBM bandwidth")
    a.set_title("decode, GQA 32:8, D=128, bf16 (L2 flushed)")
    a.legend(fontsize=7)
    pre = [r for r in rows if r["bench"].startswith("prefill")]
    labels = [f"{r['bench']} D={r['head_dim']} L={r['seqlen']}\n{r['contender']}" for r in pre]
    b.bar(range(len(pre)), [float(r["tflops"]) for r in pre])
    b.set_xticks(range(len(pre)), labels, fontsize=6, rotation=60)
    b.set_ylabel("TFLOP/s")
    b.set_title("causal prefill, B=8, GQA 32:8")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
