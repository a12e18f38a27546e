"""The first calls of a signature in a fresh process with an empty kernel cache (CUDA):
seconds of flash_attn_func's first prefill call (create: the attention kernel), of its
first split decode call (split-KV's two kernels) and of its first backward (the
backward's four kernels), each the wall time of the call and a synchronize.

    FLASHJIT_CACHE_DIR=$(mktemp -d) python3 bench/first_call.py [D]      default D=128
"""
import sys
import time

import torch

sys.path.insert(0, "python")
import flashjit  # noqa: E402


def timed(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main():
    d = int(sys.argv[1]) if len(sys.argv) > 1 else 128
    torch.manual_seed(0)
    make = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    q, k, v = make(2, 512, 8, d), make(2, 512, 2, d), make(2, 512, 2, d)
    prefill = timed(lambda: flashjit.flash_attn_func(q, k, v, causal=True))
    qd, kd, vd = make(1, 1, 8, d), make(1, 8192, 2, d), make(1, 8192, 2, d)
    decode = timed(lambda: flashjit.flash_attn_func(qd, kd, vd, causal=True))
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    out = flashjit.flash_attn_func(qg, kg, vg, causal=True)
    backward = timed(lambda: out.float().sum().backward())
    print(f"first calls, D={d} ({torch.cuda.get_device_name()}): prefill {prefill:.3f} s, "
          f"split decode {decode:.3f} s, backward {backward:.3f} s")


if __name__ == "__main__":
    main()
