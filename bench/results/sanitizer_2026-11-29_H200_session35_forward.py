"""Forward calls through O's staging rows (head dims 64, 80, 128; causal and not; seqlen_q not
a multiple of the block), checked against float64 - for compute-sanitizer."""
import sys, torch
sys.path.insert(0, "python")
import flashjit
torch.manual_seed(1)
worst = 0.0
import os
for D in [int(x) for x in os.environ.get("SAN_DIMS", "64,80,128,192,256").split(",")]:
    for causal in (False, True):
        for S in (200, 1000):
            q, k, v = (torch.randn(2, S, 4, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            out = flashjit.flash_attn_func(q, k, v, causal=causal)
            qt, kt, vt = (x.transpose(1, 2).double() for x in (q, k, v))
            ref = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)
            err = (out.double() - ref).abs().max().item()
            worst = max(worst, err)
            print(f"D={D} causal={causal} S={S}: max |err| {err:.2e}", flush=True)
print("worst", worst, "PASS" if worst < 2e-2 else "FAIL")
