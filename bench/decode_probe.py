"""Where a decode call's time goes: each CUDA kernel's device time per call (torch.profiler)
for flashjit's flash_attn_func and SDPA's cuDNN and flash backends, with the plan flashjit
chose (explain()). L2 is flushed before each call, as in bench_decode.py. Also the time per
call of 200 calls back to back (no flush), which is the host's time where that is longer.

    python3 bench/decode_probe.py [--splits 0,4,8] B:SK:HQ:HKV:D[:SQ] [...]
        e.g. 1:32768:8:1:128 8:32768:32:8:128 8:4096:8:1:128:16

SQ is the number of query tokens (default 1: decode of one token).

--splits runs flashjit once per num_splits value (0: chosen per call, 1: off); default 0.
--config KEY=N,KEY=N (repeatable) runs flashjit with that config too (flash_attn_func's
config=, e.g. block_m=16,block_n=32,waves=1,stages=2: the split kernel takes it whole).
--bhsd keeps K and V head-major in memory ([b, hkv, sk, d]: each head's keys contiguous;
flashjit reads that through strides, SDPA gets it as is) instead of FlashAttention's BSHD.
"""
import sys
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "python")
import flashjit  # noqa: E402
from flashjit import _lib, api  # noqa: E402

ITERS = 20
flush = torch.empty(256 << 18, dtype=torch.int32, device="cuda")  # 256 MB, above the L2


def kernels(fn):
    """(name, microseconds per call) of each device kernel fn launches, the flush left out."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(ITERS):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    times = defaultdict(float)
    for e in prof.events():
        if e.device_type.name == "CUDA" and "zero" not in e.name.lower() and \
                "fill" not in e.name.lower():
            times[e.name[:70]] += e.device_time / ITERS
    return sorted(times.items(), key=lambda kv: -kv[1])


def main():
    args = sys.argv[1:]
    splits, configs, bhsd = [0], [], False
    while args[:1] in (["--splits"], ["--config"], ["--bhsd"]):
        if args[0] == "--bhsd":
            bhsd, args = True, args[1:]
            continue
        if args[0] == "--splits":
            splits = [int(x) for x in args[1].split(",")]
        else:
            configs.append({k: int(v) for k, v in (kv.split("=") for kv in args[1].split(","))})
        args = args[2:]
    for case in args:
        fields = [int(x) for x in case.split(":")]
        if len(fields) not in (5, 6):
            sys.exit(f"decode_probe: {case!r} is not B:SK:HQ:HKV:D[:SQ]")
        b, sk, hq, hkv, d = fields[:5]
        sq = fields[5] if len(fields) == 6 else 1
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16)
        if bhsd:
            k, v = (torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.bfloat16)
                    .transpose(1, 2) for _ in "kv")
        else:
            k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16)
                    for _ in "kv")
        gbytes = (k.numel() + v.numel()) * 2 / 1e3  # KB -> GB/s when divided by us
        print(f"== B={b} Sq={sq} Sk={sk} Hq:Hkv={hq}:{hkv} D={d}"
              f"{' (K, V head-major)' if bhsd else ''}: "
              f"K+V {gbytes / 1e3:.1f} MB")
        before = set(api._ATTENTIONS)
        flashjit.flash_attn_func(q, k, v)
        new = set(api._ATTENTIONS) - before
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        runs = {}
        for n in splits:
            runs["flashjit" + (f" num_splits={n}" if n else "")] = \
                lambda n=n: flashjit.flash_attn_func(q, k, v, num_splits=n)
        for c in configs:
            runs["flashjit " + ",".join(f"{k}={v}" for k, v in c.items())] = \
                lambda c=c: flashjit.flash_attn_func(q, k, v, config=c)
        from torch.nn.attention import SDPBackend, sdpa_kernel
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("flash", SDPBackend.FLASH_ATTENTION)):
            def call(backend=backend):
                with sdpa_kernel([backend]):
                    return torch.nn.functional.scaled_dot_product_attention(
                        qt, kt, vt, enable_gqa=hq != hkv)
            runs[f"sdpa_{name}"] = call
        for name, fn in runs.items():
            try:
                ks = kernels(fn)
            except RuntimeError as e:
                print(f"  {name}: {str(e).splitlines()[0]}")
                continue
            total = sum(t for _, t in ks)
            start = time.perf_counter()  # back to back: the host's time where it is longer
            for _ in range(200):
                fn()
            torch.cuda.synchronize()
            back = (time.perf_counter() - start) / 200 * 1e6
            print(f"  {name}: {total:.1f} us on the device ({gbytes / total:.0f} GB/s K+V); "
                  f"{back:.1f} us per call back to back")
            for kname, t in ks:
                print(f"      {t:8.1f} us  {kname}")
            if name == "flashjit":  # the split count it chose for this case
                for handle in api._ATTENTIONS.values():
                    text = (_lib.lib.fj_attention_explain(handle) or b"").decode()
                    for line in text.splitlines():
                        if line.strip().startswith("split-kv:"):
                            print("     " + line.strip()[:160])
        for key in new:  # the plan flashjit chose, with the calls it counted
            text = _lib.lib.fj_attention_explain(api._ATTENTIONS[key]) or b""
            print("   " + text.decode().replace("\n", "\n   ").rstrip())


if __name__ == "__main__":
    main()
