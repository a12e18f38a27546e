import torch, flashjit
torch.manual_seed(0)
for (sq, sk, hq, hkv, d, causal) in ((150, 200, 2, 2, 64, False), (120, 100, 4, 2, 128, True), (70, 90, 2, 1, 256, False)):
    q = torch.randn(1, sq, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, sk, hkv, d, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
    do = torch.randn_like(q)
    out, lse = flashjit.flash_attn_func(q, k, v, causal=causal, return_lse=True, dropout_p=0.2, dropout_seed=5)
    g = flashjit.flash_attn_backward(do, q, k, v, out, lse, causal=causal, dropout_p=0.2, dropout_seed=5)
torch.cuda.synchronize(); print("done", [x.float().abs().mean().item() for x in g])
