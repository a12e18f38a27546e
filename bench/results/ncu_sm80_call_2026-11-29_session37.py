import sys, torch
sys.path.insert(0, "python")
import flashjit
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
which, D, S, causal = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
B, H = 16384 // S, 2048 // D
q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for _ in range(3):
    if which == "fj":
        flashjit.flash_attn_func(q, k, v, causal=causal)
    else:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
torch.cuda.synchronize()
