#!/usr/bin/env python3
"""Where a mask's time goes on one GPU (issue 14, session 21): flashjit with no modifier,
with score_mod="score" (the product by the scale split from the softmax's), a float
mask_mod (no block range), an integer mask_mod that keeps every block whole (the block
range), an all-true bool mask tensor [B, 1, 1, S] (every block full), key padding as a
tensor, causal, a causal mask_mod and the causal padding mask transformers builds; PyTorch
SDPA cuDNN without a mask as the reference point, in the same process. B = 4, S = 4096,
H * D = 2048, bf16, D = 64 and 128; the median of 15 calls between CUDA events, each after
a 256 MB write that flushes L2 (bench_backward.timed).

    FLASHJIT_LIBRARY=build/runtime/libflashjit.so python3 bench/mask_cost_probe.py
"""
import sys
import types
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE))
import flashjit  # noqa: E402
from bench_backward import timed  # noqa: E402


def main():
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    args = types.SimpleNamespace(iters=15, warmup=3)
    S, B = 4096, 4
    print(torch.cuda.get_device_name())
    for D in (64, 128):
        H = 2048 // D
        q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        ones = torch.ones(B, 1, 1, S, dtype=torch.bool, device="cuda")
        lens = torch.tensor([S - (S * b) // (2 * B) for b in range(B)], device="cuda")
        pad = (torch.arange(S, device="cuda")[None] < lens[:, None])[:, None, None]
        cpad = pad & torch.ones(S, S, dtype=torch.bool, device="cuda").tril()[None, None]
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt)
        fa = flashjit.flash_attn_func
        runs = {
            "sdpa_cudnn": cudnn,
            "none": lambda: fa(q, k, v),
            "score_mod_identity": lambda: fa(q, k, v, score_mod="score"),
            "mask_mod_float_true": lambda: fa(q, k, v, mask_mod="kv_idx * 1.0 >= 0.0"),
            "mask_mod_true": lambda: fa(q, k, v, mask_mod="kv_idx >= 0"),
            "mask_all_ones": lambda: fa(q, k, v, attn_mask=ones),
            "mask_pad": lambda: fa(q, k, v, attn_mask=pad),
            "causal": lambda: fa(q, k, v, causal=True),
            "mask_mod_causal": lambda: fa(q, k, v, mask_mod="kv_idx <= q_idx"),
            "mask_causal_pad": lambda: fa(q, k, v, attn_mask=cpad),
        }
        for name, fn in runs.items():
            fn()
            print(f"D={D} {name:20s} {timed(torch, fn, args):9.1f} us", flush=True)


if __name__ == "__main__":
    main()
