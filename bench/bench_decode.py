#!/usr/bin/env python3
"""Decode attention on one GPU: flashjit against PyTorch SDPA's backends, in one process.

The decode benchmark of issue 13. Each sequence's query tokens (1; --query-tokens 1,16
adds 16) attend, without a mask, to a KV cache: q [B, Sq, Hq, D], k and v [B, Sk, Hkv, D],
bf16, for batch in {1, 8, 32, 128}, keys in {4k, 32k, 128k}, GQA 32:8 and 8:1 and D in
{64, 128} (each configurable). A case whose K+V would pass --max-kv-gb is skipped and
the log says so.

Contenders, on the same tensors: flashjit.flash_attn_func with num_splits 0 (flashjit
chooses: "flashjit") and 1 (no split-KV: "flashjit_nosplit"), and
torch.nn.functional.scaled_dot_product_attention with one backend forced at a time
(sdpa_flash, sdpa_cudnn, sdpa_efficient; [B, H, S, D] views, GQA through enable_gqa);
a backend that refuses a case is recorded as unsupported, with its reason. Every
flashjit output is checked against the first SDPA backend that ran: a max abs
difference, or that difference relative to max |SDPA output|, above 2e-2 fails the run
(random keys make the attention nearly uniform, so the output is small and the
relative check is the one that catches a lost split).

Timing: compile excluded (the first case is run once untimed before the table, so the
process's first timings are not its slowest), --warmup calls, then --iters calls, each between two CUDA
events and each preceded by a 256 MB write that flushes L2 (the H100's is 50 MB), so
K and V come from HBM every time; the median is reported. Bytes moved = K + V + Q + O;
bandwidth = bytes / time, as a fraction of --peak-gbps (3350: H100 SXM, HBM3).
ratio = best SDPA time / flashjit time (> 1: flashjit faster). Writes into --out:
decode_<date>_<gpu>.csv (one row per case and contender), decode_<date>_<gpu>.log (the
command line first) and the PNGs of bench/plot_decode.py where matplotlib is installed.

    FLASHJIT_LIBRARY=build/runtime/libflashjit.so python3 bench/bench_decode.py --out bench/results
    python3 bench/bench_decode.py --dry-run --out /tmp/dec   # fake timings: no torch, no GPU
"""
import argparse
import collections
import csv
import datetime
import math
import os
import pathlib
import random
import re
import shlex
import statistics
import sys
import warnings

HERE = pathlib.Path(__file__).resolve().parent
L2_FLUSH_BYTES = 256 << 20
TOLERANCE = 2e-2
ELEMENT_BYTES = {"bf16": 2, "f16": 2}
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "efficient": "EFFICIENT_ATTENTION"}
FIELDS = ["date", "gpu", "dtype", "batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv",
          "head_dim", "contender", "status", "time_us", "bytes", "gbps", "peak_gbps",
          "hbm_fraction", "vs_best_sdpa", "max_abs_diff", "rel_diff", "note"]

Case = collections.namedtuple("Case", "batch seqlen_q seqlen_k heads_q heads_kv head_dim")
# status: ok, unsupported (an SDPA backend refused the case), error (flashjit raised),
# mismatch (flashjit's output differs from SDPA's), skipped (K+V past --max-kv-gb).
Result = collections.namedtuple("Result", "status time_us max_abs_diff rel_diff note",
                                defaults=(None, None, None, ""))
FAILED = ("error", "mismatch")


def kv_bytes(case, elem):
    return 2 * case.batch * case.seqlen_k * case.heads_kv * case.head_dim * elem


def bytes_moved(case, elem):
    """K and V read once, Q read and O written once; split-KV's workspace not counted."""
    q_bytes = case.batch * case.seqlen_q * case.heads_q * case.head_dim * elem
    return kv_bytes(case, elem) + 2 * q_bytes


def flashjit_name(splits):
    return {0: "flashjit", 1: "flashjit_nosplit"}.get(splits, f"flashjit_split{splits}")


def contenders(args):
    return [flashjit_name(n) for n in args.splits] + [f"sdpa_{name}" for name in args.sdpa]


def label(case):
    return (f"B={case.batch} Sq={case.seqlen_q} Sk={case.seqlen_k} "
            f"Hq:Hkv={case.heads_q}:{case.heads_kv} D={case.head_dim}")


def first_line(text, limit=240):
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


# ---- arguments ---------------------------------------------------------------------------

def int_list(text):
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}")
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return values


def positive_list(text):
    values = int_list(text)
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def splits_list(text):
    values = int_list(text)
    if max(values) > 128:
        raise argparse.ArgumentTypeError(f"num_splits is 0..128 (0: flashjit chooses, 1: off), "
                                         f"got {text!r}")
    return list(dict.fromkeys(values))


def gqa_list(text):
    """'32:8,8:1' -> [(32, 8), (8, 1)]: query heads, KV heads."""
    pairs = []
    for item in text.split(","):
        m = re.fullmatch(r"\s*(\d+):(\d+)\s*", item)
        if not m or int(m[2]) < 1 or int(m[1]) % int(m[2]):
            raise argparse.ArgumentTypeError(f"expected Hq:Hkv pairs with Hq a multiple of Hkv "
                                             f"(e.g. 32:8,8:1), got {item!r}")
        pairs.append((int(m[1]), int(m[2])))
    return pairs


def sdpa_list(text):
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in SDPA_BACKENDS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown SDPA backend {bad}: pick from "
                                         f"{','.join(SDPA_BACKENDS)}")
    return names


# Peak HBM bandwidth (GB/s) by a word of the GPU's name, first match; the data sheets'.
PEAK_GBPS = (("H100 PCIe", 2000.0), ("H100", 3350.0), ("H200", 4800.0))
DEFAULT_PEAK_GBPS = 3350.0


def peak_of(gpu):
    return next((g for name, g in PEAK_GBPS if name in gpu), DEFAULT_PEAK_GBPS)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--batches", type=positive_list, default="1,8,32,128")
    ap.add_argument("--keys", type=positive_list, default="4096,32768,131072",
                    help="KV cache lengths S_k")
    ap.add_argument("--gqa", type=gqa_list, default="32:8,8:1", help="Hq:Hkv pairs")
    ap.add_argument("--head-dims", type=positive_list, default="64,128",
                    help="e.g. 64,80,96,128,256")
    ap.add_argument("--query-tokens", type=positive_list, default="1", help="e.g. 1,16")
    ap.add_argument("--splits", type=splits_list, default="0,1",
                    help="flashjit num_splits values, one contender each (0: flashjit "
                         "chooses, 1: no split-KV)")
    ap.add_argument("--sdpa", type=sdpa_list, default="flash,cudnn,efficient",
                    help="SDPA backends to force, one contender each")
    ap.add_argument("--dtype", default="bf16", choices=sorted(ELEMENT_BYTES))
    ap.add_argument("--max-kv-gb", type=float, default=40.0,
                    help="skip a case whose K+V cache is larger (GB = 1e9 bytes)")
    ap.add_argument("--peak-gbps", type=float, default=None,
                    help="peak HBM bandwidth in GB/s (default: by the GPU's name, "
                         + ", ".join(f"{n} {g:g}" for n, g in PEAK_GBPS) + f"; else {DEFAULT_PEAK_GBPS:g})")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep-going", action="store_true",
                    help="measure every case after an error or a mismatch (the run still fails)")
    ap.add_argument("--dry-run", action="store_true",
                    help="fake the timings (no torch, no GPU): checks the rest of the script")
    args = ap.parse_args(argv)
    if args.warmup < 0 or args.iters < 1:
        ap.error("--warmup must be >= 0 and --iters >= 1")
    if (args.peak_gbps is not None and args.peak_gbps <= 0) or args.max_kv_gb <= 0:
        ap.error("--peak-gbps and --max-kv-gb must be positive")
    return args


def cases(args):
    """In allocation order: the query-token counts of one K/V cache come together."""
    for hq, hkv in args.gqa:
        for d in args.head_dims:
            for b in args.batches:
                for sk in args.keys:
                    for sq in args.query_tokens:
                        yield Case(b, sq, sk, hq, hkv, d)


# ---- measuring on the GPU ----------------------------------------------------------------

class TorchRunner:
    """The real measurement: torch CUDA tensors, CUDA events, L2 flushed before each call."""

    def __init__(self, args):
        try:
            import torch
        except ImportError as e:
            sys.exit(f"bench_decode: needs PyTorch with CUDA ({e}); --dry-run checks the script "
                     "without it")
        if not torch.cuda.is_available():
            sys.exit("bench_decode: PyTorch sees no CUDA device; this benchmark needs one "
                     "(--dry-run checks the script without it)")
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        sys.path.insert(0, str(HERE.parent / "python"))
        import flashjit
        self.torch, self.F, self.sdpa_kernel, self.flashjit = torch, F, sdpa_kernel, flashjit
        self.backends = {name: getattr(SDPBackend, SDPA_BACKENDS[name]) for name in args.sdpa}
        self.dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
        self.args = args
        self.flush_buffer = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
        self.kv_shape, self.k, self.v = None, None, None

    def gpu(self):
        return self.torch.cuda.get_device_name()

    def versions(self):
        torch = self.torch
        try:
            fj = self.flashjit.version()
        except Exception as e:  # the library is loaded on first use; say why it is not
            sys.exit(f"bench_decode: flashjit cannot load libflashjit.so: {e}")
        return (f"torch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN "
                f"{torch.backends.cudnn.version()}), flashjit {fj}")

    def time_us(self, fn):
        torch = self.torch
        for _ in range(self.args.warmup):
            fn()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(self.args.iters)]
        for start, end in events:
            self.flush_buffer.zero_()  # evicts K and V from L2: each call reads them from HBM
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(start.elapsed_time(end) for start, end in events) * 1e3

    def measure(self, case):
        torch, args = self.torch, self.args
        b, sq, sk, hq, hkv, d = case
        if self.kv_shape != (b, sk, hkv, d):
            self.k = self.v = None
            torch.cuda.empty_cache()
            torch.manual_seed(args.seed)
            self.k = torch.randn(b, sk, hkv, d, device="cuda", dtype=self.dtype)
            self.v = torch.randn(b, sk, hkv, d, device="cuda", dtype=self.dtype)
            self.kv_shape = (b, sk, hkv, d)
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=self.dtype)
        k, v = self.k, self.v
        results, reference = {}, None

        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # SDPA wants [B, H, S, D]
        gqa = {"enable_gqa": True} if hq != hkv else {}
        for name, backend in self.backends.items():
            def call():
                return self.F.scaled_dot_product_attention(qt, kt, vt, **gqa)
            caught = []
            try:
                with warnings.catch_warnings(record=True) as caught, self.sdpa_kernel([backend]):
                    warnings.simplefilter("always")
                    out = call()
                    results[f"sdpa_{name}"] = Result("ok", self.time_us(call))
            except (RuntimeError, TypeError) as e:  # no kernel for the case, out of memory, or
                # enable_gqa unknown to this torch; SDPA's warnings say why
                why = [str(w.message) for w in caught if "not used because" not in str(w.message)]
                results[f"sdpa_{name}"] = Result("unsupported", note=first_line(
                    "; ".join(why + [str(e).splitlines()[0] if str(e) else type(e).__name__])))
                torch.cuda.empty_cache()
                continue
            if reference is None:
                reference = (f"sdpa_{name}", out.transpose(1, 2).float())
            del out

        for splits in args.splits:
            name = flashjit_name(splits)

            def call(n=splits):
                return self.flashjit.flash_attn_func(q, k, v, causal=False, num_splits=n)
            try:
                out = call()  # compiles the kernel on its first use (not timed)
            except (RuntimeError, ValueError, NotImplementedError) as e:
                results[name] = Result("error", note=first_line(e))
                torch.cuda.empty_cache()
                continue
            status, err, rel, note = "ok", None, None, "no SDPA backend ran: unchecked"
            if reference is not None:
                ref_name, ref = reference
                err = (out.float() - ref).abs().max().item()
                scale = ref.abs().max().item()
                rel = err / scale if scale > 0 else (0.0 if err == 0 else math.inf)
                ok = err <= TOLERANCE and rel <= TOLERANCE  # NaN fails too
                status = "ok" if ok else "mismatch"
                note = f"checked against {ref_name}"
            del out
            results[name] = Result(status, self.time_us(call), err, rel, note)
        return results


# ---- --dry-run: fake timings from a bandwidth model ---------------------------------------

class FakeRunner:
    """Times from bytes / (peak * efficiency) plus a launch cost, with noise; the SDPA
    efficient backend refuses GQA and cuDNN refuses D=256, so every path of the report runs."""

    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)

    def gpu(self):
        return "dry-run"

    def versions(self):
        return "dry run: fake timings, no torch"

    def measure(self, case):
        args, results = self.args, {}
        moved = bytes_moved(case, ELEMENT_BYTES[args.dtype])
        # Without split-KV, one workgroup per (batch, KV head) cannot fill 132 SMs.
        fill = min(1.0, case.batch * case.heads_kv / 132)

        def fake(efficiency, launch_us):
            noise = self.rng.uniform(0.97, 1.03)
            return launch_us + moved / (args.peak_gbps * 1e3 * efficiency) * noise

        for name in args.sdpa:
            if name == "efficient" and case.heads_q != case.heads_kv:
                results["sdpa_efficient"] = Result("unsupported", note="fake: no GQA")
            elif name == "cudnn" and case.head_dim > 128:
                results["sdpa_cudnn"] = Result("unsupported", note="fake: head dim > 128")
            else:
                eff = {"flash": 0.55 + 0.3 * fill, "cudnn": 0.9, "efficient": 0.5}[name]
                results[f"sdpa_{name}"] = Result("ok", fake(eff, 6.0))
        for splits in args.splits:
            eff = 0.15 + 0.7 * fill if splits == 1 else 0.88
            err = self.rng.uniform(1e-5, 1e-4)
            results[flashjit_name(splits)] = Result("ok", fake(eff, 8.0), err, err / 0.02,
                                                    "checked against sdpa_flash")
        return results


# ---- the report --------------------------------------------------------------------------

class Log:
    """Prints a line and appends it to the .log file."""

    def __init__(self, path):
        self.file = open(path, "w")

    def __call__(self, line=""):
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


def case_rows(case, results, args, day, gpu):
    """One CSV row per contender; times and diffs rounded for reading."""
    moved = bytes_moved(case, ELEMENT_BYTES[args.dtype])
    sdpa_times = [r.time_us for n, r in results.items()
                  if n.startswith("sdpa_") and r.status == "ok"]
    best = min(sdpa_times) if sdpa_times else None
    rows = []
    for name in contenders(args):
        r = results.get(name, Result("unsupported", note="not measured"))
        row = dict(date=day, gpu=gpu, dtype=args.dtype, batch=case.batch, seqlen_q=case.seqlen_q,
                   seqlen_k=case.seqlen_k, heads_q=case.heads_q, heads_kv=case.heads_kv,
                   head_dim=case.head_dim, contender=name, status=r.status, time_us=None,
                   bytes=moved, gbps=None, peak_gbps=args.peak_gbps, hbm_fraction=None,
                   vs_best_sdpa=None, max_abs_diff=None, rel_diff=None, note=r.note)
        if r.time_us is not None:
            gbps = moved / r.time_us / 1e3
            row.update(time_us=round(r.time_us, 2), gbps=round(gbps, 1),
                       hbm_fraction=round(gbps / args.peak_gbps, 4),
                       vs_best_sdpa=round(best / r.time_us, 3) if best else None)
        if r.max_abs_diff is not None:
            row.update(max_abs_diff=float(f"{r.max_abs_diff:.3e}"),
                       rel_diff=float(f"{r.rel_diff:.3e}"))
        rows.append(row)
    return rows


def skipped_rows(case, args, day, gpu, why):
    return [dict(date=day, gpu=gpu, dtype=args.dtype, batch=case.batch, seqlen_q=case.seqlen_q,
                 seqlen_k=case.seqlen_k, heads_q=case.heads_q, heads_kv=case.heads_kv,
                 head_dim=case.head_dim, contender=name, status="skipped",
                 bytes=bytes_moved(case, ELEMENT_BYTES[args.dtype]), peak_gbps=args.peak_gbps,
                 note=why) for name in contenders(args)]


def table_header(names):
    cells = "".join(f"  {n:>{max(16, len(n))}}" for n in names)
    return (f"{'B':>4} {'Sk':>7} {'Hq:Hkv':>7} {'D':>4} {'Sq':>3}{cells}  {'ratio':>6} "
            f"{'maxdiff':>8} {'rel':>8}")


def table_line(case, rows):
    def cell(r):
        width = max(16, len(r["contender"]))
        if r["time_us"] is None:
            return f"  {'n/a' if r['status'] == 'unsupported' else r['status'].upper():>{width}}"
        flag = "!" if r["status"] == "mismatch" else " "
        return f"  {r['time_us']:9.1f} {100 * r['hbm_fraction']:4.0f}%{flag:>{width - 15}}"
    fj = [r for r in rows if r["contender"].startswith("flashjit")]
    ratio = fj[0]["vs_best_sdpa"] if fj else None
    diffs = [(r["max_abs_diff"], r["rel_diff"]) for r in fj if r["max_abs_diff"] is not None]
    err = max(diffs, key=lambda x: x[1] if not math.isnan(x[1]) else math.inf) if diffs else None
    return (f"{case.batch:4d} {case.seqlen_k:7d} {f'{case.heads_q}:{case.heads_kv}':>7} "
            f"{case.head_dim:4d} {case.seqlen_q:3d}" + "".join(cell(r) for r in rows)
            + (f"  {ratio:6.2f}" if ratio is not None else f"  {'n/a':>6}")
            + (f" {err[0]:8.1e} {err[1]:8.1e}" if err else f" {'n/a':>8} {'n/a':>8}"))


def goals(rows):
    """Issue 13's decode goals, checked on the 'flashjit' rows (num_splits chosen)."""
    fj = [r for r in rows if r["contender"] == "flashjit" and r["status"] == "ok"]
    if not fj:
        return ["goals: no 'flashjit' (num_splits=0) row measured"]
    key = lambda r: (r["batch"], r["seqlen_k"], r["heads_q"], r["heads_kv"], r["head_dim"])
    name = lambda r: (f"B={r['batch']} Sq={r['seqlen_q']} Sk={r['seqlen_k']} "
                      f"Hq:Hkv={r['heads_q']}:{r['heads_kv']} D={r['head_dim']}")
    lines = []

    def check(text, sel, value, limit, at_least, fmt):
        if not sel:
            lines.append(f"goal {text}: no case measured")
            return
        ok = (lambda x: x >= limit) if at_least else (lambda x: x <= limit)
        worst = (min if at_least else max)(sel, key=value)
        bad = sum(not ok(value(r)) for r in sel)
        lines.append(f"goal {text}: {'met' if not bad else f'NOT met in {bad} of {len(sel)}'}; "
                     f"worst {fmt(value(worst))} at {name(worst)}")

    pct = lambda x: f"{100 * x:.0f}%"
    times = lambda x: f"{x:.2f}x"
    one = [r for r in fj if r["seqlen_q"] == 1]
    check(">= 85% of HBM at batch >= 8, Sk >= 32k",
          [r for r in one if r["batch"] >= 8 and r["seqlen_k"] >= 32768],
          lambda r: r["hbm_fraction"], 0.85, True, pct)
    check(">= 80% of HBM at batch 1, Sk >= 128k",
          [r for r in one if r["batch"] == 1 and r["seqlen_k"] >= 131072],
          lambda r: r["hbm_fraction"], 0.80, True, pct)
    check(">= 1.0x the best SDPA backend", [r for r in fj if r["vs_best_sdpa"] is not None],
          lambda r: r["vs_best_sdpa"], 1.0, True, times)
    time_of_one = {key(r): r["time_us"] for r in one}
    sixteen = [dict(r, slowdown=r["time_us"] / time_of_one[key(r)]) for r in fj
               if r["seqlen_q"] == 16 and key(r) in time_of_one]
    check("16 query tokens <= 1.5x the time of 1", sixteen, lambda r: r["slowdown"], 1.5, False,
          times)
    return lines


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)


def main(argv=None):
    args = parse_args(argv)
    runner = FakeRunner(args) if args.dry_run else TorchRunner(args)
    gpu = runner.gpu()
    if args.peak_gbps is None:
        args.peak_gbps = peak_of(gpu)
    day = datetime.date.today().isoformat()
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"decode_{day}_{re.sub(r'[^A-Za-z0-9.-]+', '_', gpu)}"
    log = Log(out_dir / f"{stem}.log")
    log("$ " + shlex.join(["python3"] + sys.argv if argv is None else ["bench_decode.py"] + argv))
    for var in sorted(v for v in os.environ if v.startswith("FLASHJIT_")):
        log(f"# {var}={os.environ[var]}")
    elem = ELEMENT_BYTES[args.dtype]
    log(f"# {gpu}, {day}, {args.dtype}, {runner.versions()}")
    log(f"# peak HBM bandwidth {args.peak_gbps:.0f} GB/s (--peak-gbps); bytes moved = K + V + Q + "
        f"O; L2 flushed ({L2_FLUSH_BYTES >> 20} MB written) before each of {args.iters} timed "
        f"calls after {args.warmup} warm-up calls; median time")
    log("# cell: time (us) and % of peak HBM; ratio = best SDPA time / flashjit time (> 1: "
        "flashjit faster); maxdiff, rel: flashjit vs SDPA, max abs and relative to max |out|")
    log(table_header(contenders(args)))

    rows, failures, unsupported = [], [], collections.defaultdict(list)
    # The process's first measured case ran slow (B=1, 4096 keys, 8:1, head dim 128: 20.1
    # us where a later run of the same case took 11.4; bench/results/README.md, session
    # 32): the first case that fits is measured once more before the table, not reported.
    first = next((c for c in cases(args) if kv_bytes(c, elem) <= args.max_kv_gb * 1e9), None)
    if first is not None:
        runner.measure(first)
    for case in cases(args):
        kv = kv_bytes(case, elem)
        if kv > args.max_kv_gb * 1e9:
            why = f"K+V {kv / 1e9:.1f} GB > --max-kv-gb {args.max_kv_gb:g}"
            log(f"skip {label(case)}: {why}")
            rows += skipped_rows(case, args, day, gpu, why)
            continue
        results = runner.measure(case)
        new = case_rows(case, results, args, day, gpu)
        rows += new
        log(table_line(case, new))
        for r in new:
            if r["status"] == "unsupported":
                unsupported[(r["contender"], r["note"])].append(label(case))
            if r["status"] in FAILED:
                failures.append(f"{r['contender']} {r['status']} at {label(case)}: " + (
                    f"max abs diff {r['max_abs_diff']:.3e}, relative {r['rel_diff']:.3e} "
                    f"(tolerance {TOLERANCE:g}, {r['note']})" if r["status"] == "mismatch"
                    else r["note"]))
                log(f"FAIL {failures[-1]}")
        if failures and not args.keep_going:
            log("stopping at the first failure (--keep-going measures the rest)")
            break

    for (name, why), where in unsupported.items():
        log(f"{name} unsupported in {len(where)} case(s), e.g. {where[0]}: {why}")
    for line in goals(rows):
        log(line)
    csv_path = out_dir / f"{stem}.csv"
    write_csv(csv_path, rows)
    log(f"wrote {csv_path}")
    try:
        sys.path.insert(0, str(HERE))
        from plot_decode import plot
        for png in plot(csv_path):
            log(f"wrote {png}")
    except ImportError as e:
        log(f"no plot here ({e}); run: python3 bench/plot_decode.py {csv_path}")
    if failures:
        log(f"FAILED: {len(failures)} flashjit result(s) wrong or missing:")
        for f in failures:
            log(f"  {f}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
