"""Where the host's time of one decode call goes (CUDA): per call, back to back, no L2
flush, the device idle between calls is not what is timed. Prints the time per call of
SDPA's cuDNN backend, of flashjit.flash_attn_func, of flash_attn_with_kvcache (without
and with a one-token append), of the C call alone (fj_attention_forward_tensors with the
spec and tensors flash_attn_func built), Python's share of a flash_attn_func call (its
submission time minus the C call's, interleaved in rounds), and a cProfile of
flash_attn_func's Python.

    python3 bench/host_probe.py [B:SK:HQ:HKV:D ...]      default 1:4096:32:8:128
"""
import cProfile
import ctypes
import io
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, "python")
import flashjit  # noqa: E402
from flashjit import _lib, api  # noqa: E402

CALLS = 2000
ROUNDS = 25


def per_call(fn, calls=CALLS):
    """Microseconds per call of fn, back to back, after a warm-up."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def submitted(fn, calls=200):
    """Microseconds per call of the host's submission alone: calls queued back to back
    (fewer than the launch queue holds), the device's work not waited for."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return host / calls * 1e6


def main():
    for case in sys.argv[1:] or ["1:4096:32:8:128"]:
        b, sk, hq, hkv, d = (int(x) for x in case.split(":"))
        q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in "kv")
        print(f"== B={b} Sk={sk} Hq:Hkv={hq}:{hkv} D={d} ({torch.cuda.get_device_name()})")
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def sdpa():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return torch.nn.functional.scaled_dot_product_attention(
                    qt, kt, vt, enable_gqa=hq != hkv)
        empty = torch.empty(1, device="cuda")
        print(f"  one tiny torch kernel (x.zero_()): {per_call(empty.zero_):6.1f} us per call")
        print(f"  sdpa cudnn:                        {per_call(sdpa):6.1f} us per call, "
              f"{submitted(sdpa):6.1f} submitting")
        fj = lambda: flashjit.flash_attn_func(q, k, v)  # noqa: E731
        print(f"  flashjit.flash_attn_func:          {per_call(fj):6.1f} us per call, "
              f"{submitted(fj):6.1f} submitting")
        # A decode step through the KV-cache entry point: attend to sk cached keys, and
        # the same with one new key and value appended in place first.
        cache_k, cache_v = (torch.randn(b, sk + 64, hkv, d, device="cuda", dtype=torch.bfloat16)
                            for _ in "kv")
        seqlens = torch.full((b,), sk, device="cuda", dtype=torch.int32)
        k1, v1 = (torch.randn(b, 1, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in "kv")
        kv = lambda: flashjit.flash_attn_with_kvcache(  # noqa: E731
            q, cache_k, cache_v, cache_seqlens=seqlens)
        kv_new = lambda: flashjit.flash_attn_with_kvcache(  # noqa: E731
            q, cache_k, cache_v, k=k1, v=v1, cache_seqlens=seqlens)
        print(f"  flash_attn_with_kvcache:           {per_call(kv):6.1f} us per call, "
              f"{submitted(kv):6.1f} submitting")
        print(f"  flash_attn_with_kvcache, append 1: {per_call(kv_new):6.1f} us per call, "
              f"{submitted(kv_new):6.1f} submitting")
        captured = {}
        real = api._forward

        def capture(handle, spec, kind, stream, q_, k_, v_, out, lse, **pointers):
            captured.update(handle=handle, spec=spec, stream=stream, out=out,
                            t=_lib.Tensors(q=api._ptr(q_, kind), k=api._ptr(k_, kind),
                                           v=api._ptr(v_, kind), out=api._ptr(out, kind)))
            return real(handle, spec, kind, stream, q_, k_, v_, out, lse, **pointers)
        api._forward = capture
        api._REPEATS.clear()  # the full path, which calls _forward
        fj()
        api._forward = real
        c = captured
        stream = ctypes.c_void_p(c["stream"]) if c["stream"] else None

        def c_call():
            _lib.lib.fj_attention_forward_tensors(c["handle"], ctypes.byref(c["spec"]),
                                                  ctypes.byref(c["t"]), stream)
        print(f"  fj_attention_forward_tensors:      {per_call(c_call):6.1f} us per call, "
              f"{submitted(c_call):6.1f} submitting")
        # Python's share, interleaved with the C call so both see the same host load:
        # rounds of submissions of each, their medians and the difference.
        py, cc = [], []
        for _ in range(ROUNDS):
            py.append(submitted(fj))
            cc.append(submitted(c_call))
        py_us, c_us = statistics.median(py), statistics.median(cc)
        print(f"  interleaved, median of {ROUNDS} rounds: flash_attn_func {py_us:6.1f} us, "
              f"C call {c_us:6.1f} us, Python's share {py_us - c_us:5.1f} us")
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(500):
            fj()
        torch.cuda.synchronize()
        profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
        print("\n".join(line for line in text.getvalue().splitlines()[:45]))


if __name__ == "__main__":
    main()
