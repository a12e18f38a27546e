"""A backward call to profile: ncu --kernel-name regex:fa_bwd --launch-skip 4 python3
bench/ncu_backward_probe.py S D (bf16, B*S = 16k, H*D = 2048, as bench_backward.py)."""
import sys, torch
sys.path.insert(0, "python")
import flashjit
S, D = int(sys.argv[1]), int(sys.argv[2])
B, H = 16384 // S, 2048 // D
q, k, v, do = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
out, lse = flashjit.flash_attn_func(q, k, v, return_lse=True)
for _ in range(2):
    flashjit.flash_attn_backward(do, q, k, v, out, lse)
torch.cuda.synchronize()
