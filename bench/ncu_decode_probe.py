"""A decode call to profile: ncu --kernel-name regex:splitkv --launch-skip 2 --launch-count 1
python3 bench/ncu_decode_probe.py B:SK:HQ:HKV:D (bf16, one query token, split-KV chosen)."""
import sys
import torch
sys.path.insert(0, "python")
import flashjit  # noqa: E402
b, sk, hq, hkv, d = (int(x) for x in sys.argv[1].split(":"))
q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in "kv")
for _ in range(4):
    flashjit.flash_attn_func(q, k, v)
torch.cuda.synchronize()
