"""Where a backward call's time goes: each CUDA kernel's device time per call (torch.profiler)
for flashjit's flash_attn_backward and the backward of SDPA's cuDNN and flash backends, L2
flushed before each call (as bench_backward.py). Shapes as bench_backward.py: B * S = 16k
tokens, H * D = 2048, bf16; --kv-heads N gives K and V N heads (GQA) instead of H. Each
--config k=v,... (repeatable) times flashjit's backward with that config too (the same
config for the dQ and dK/dV kernels, as flash_attn_backward(config=) passes it) and prints
each gradient's largest difference from the default config's. --dropout P runs every
backward with dropout P (flashjit's with seed 1; SDPA's with its own draws).

    python3 bench/backward_probe.py [--kv-heads N] [--causal] [--dropout P] [--config k=v,...]
        S:D [...]
    e.g. 1024:128 4096:64
"""
import sys

import torch

sys.path.insert(0, "python")
import flashjit  # noqa: E402
from decode_probe import kernels  # noqa: E402  (each kernel's device time, L2 flushed)


def main():
    args = sys.argv[1:]
    kv_heads, causal, configs, dropout = 0, False, [], 0.0
    while args[:1] in (["--kv-heads"], ["--causal"], ["--config"], ["--dropout"]):
        if args[0] == "--causal":
            causal, args = True, args[1:]
        elif args[0] == "--dropout":
            dropout, args = float(args[1]), args[2:]
        elif args[0] == "--config":
            configs.append({k: int(v) for k, v in (kv.split("=") for kv in args[1].split(","))})
            args = args[2:]
        else:
            kv_heads, args = int(args[1]), args[2:]
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for case in args:
        s, d = (int(x) for x in case.split(":"))
        b, h = max(1, 16384 // s), max(1, 2048 // d)
        hk = kv_heads or h
        flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
        torch.manual_seed(s + d)
        q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, s, hk, d, device="cuda", dtype=torch.bfloat16) for _ in "kv")
        dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
        print(f"== B={b} S={s} H={h}:{hk} D={d}{' causal' if causal else ''}"
              f"{f' dropout {dropout:g}' if dropout else ''}")
        drop = dict(dropout_p=dropout, dropout_seed=1) if dropout else {}
        out, lse = flashjit.flash_attn_func(q, k, v, causal=causal, return_lse=True, **drop)
        runs = {"flashjit": lambda: flashjit.flash_attn_backward(dout, q, k, v, out, lse,
                                                                  causal=causal, **drop)}
        grads = {"flashjit": runs["flashjit"]()}
        for config in configs:
            name = "flashjit " + ",".join(f"{k}={v}" for k, v in config.items())
            runs[name] = lambda c=config: flashjit.flash_attn_backward(
                dout, q, k, v, out, lse, causal=causal, config=c, **drop)
            try:
                grads[name] = runs[name]()
            except RuntimeError as e:
                print(f"  {name}: {str(e).splitlines()[0]}")
                del runs[name]
                continue
            diffs = (float((a.float() - b.float()).abs().max())
                     for a, b in zip(grads[name], grads["flashjit"]))
            print(f"  {name}: max diff from the default dq {next(diffs):.2e} "
                  f"dk {next(diffs):.2e} dv {next(diffs):.2e}")
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
        dt = dout.transpose(1, 2)
        for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    o = torch.nn.functional.scaled_dot_product_attention(
                        qt, kt, vt, is_causal=causal, enable_gqa=hk != h, dropout_p=dropout)
            except RuntimeError as e:
                print(f"  {name}: not run ({str(e).splitlines()[0][:80]})")
                continue
            runs[name] = lambda o=o: torch.autograd.grad(o, (qt, kt, vt), dt, retain_graph=True)
        for name, fn in runs.items():
            try:
                ks = kernels(fn)
            except RuntimeError as e:
                print(f"  {name}: {str(e).splitlines()[0]}")
                continue
            total = sum(t for _, t in ks)
            print(f"  {name}: {total:.1f} us on the device ({flops / total / 1e6:.0f} TFLOP/s)")
            for kname, t in ks:
                print(f"      {t:8.1f} us  {kname}")


if __name__ == "__main__":
    main()
