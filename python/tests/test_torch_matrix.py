"""The NVIDIA numeric matrix (H100 machines): flash_attn_func on torch CUDA tensors
against attention computed in float64, over head dims 16..384 (odd ones included),
seqlens 1..8k (ragged pairs included), causal and windows, GQA/MQA, the three
layouts (BSHD; BHSD and the fused-QKV interleaved layout through strides), bf16 and
f16. Inputs fresh uniform [-1, 1); outputs start as NaN. Tolerances: bf16 abs 3e-2,
f16 abs 4e-3; LSE abs 1e-3 where finite, exactly -inf for fully masked rows."""
import itertools

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import flashjit  # noqa: E402
from test_torch_cuda import reference  # noqa: E402

TOL = {torch.bfloat16: 3e-2, torch.float16: 4e-3}


def make(layout, b, s, h, d, dtype, gen, hkv=None, dv=None):
    """q-like tensor [b, s, h, d] in the given storage layout (a strided view)."""
    if layout == "bshd":
        x = torch.empty(b, s, h, d, device="cuda", dtype=dtype)
    elif layout == "bhsd":
        x = torch.empty(b, h, s, d, device="cuda", dtype=dtype).transpose(1, 2)
    else:  # interleaved: one token row holds 3 such head groups side by side
        row = torch.empty(b, s, 3 * h * d, device="cuda", dtype=dtype)
        x = row[:, :, h * d:2 * h * d].view(b, s, h, d)
    x.copy_(torch.rand(b, s, h, d, device="cuda", generator=gen) * 2 - 1)
    return x


HEAD_DIMS = [16, 33, 40, 64, 72, 80, 96, 100, 112, 128, 160, 192, 256, 320, 384]
SEQS = [(1, 1), (1, 8192), (113, 203), (203, 113), (1000, 1000), (4097, 4096), (8192, 8192)]
CASES = []
for i, (d, (sq, sk)) in enumerate(itertools.product(HEAD_DIMS, SEQS)):
    # Rotate the other axes so every value of each appears, at a bounded case count.
    layout = ("bshd", "bhsd", "interleaved")[i % 3]
    dtype = (torch.bfloat16, torch.float16)[i % 2]
    hq, hkv = ((8, 8), (8, 2), (8, 1))[(i // 3) % 3]
    mask = ("none", "causal", "window")[(i // 2) % 3]
    if sq * sk > 4096 * 4096 and d > 128:
        sq, sk = min(sq, 2048), min(sk, 2048)  # keep the float64 reference affordable
    CASES.append((d, sq, sk, hq, hkv, layout, dtype, mask))


@pytest.mark.parametrize("d,sq,sk,hq,hkv,layout,dtype,mask", CASES)
def test_matrix(d, sq, sk, hq, hkv, layout, dtype, mask):
    gen = torch.Generator(device="cuda").manual_seed(d * 7919 + sq * 31 + sk)
    b = 1 if sq * sk > 1 << 22 else 2
    q = make(layout, b, sq, hq, d, dtype, gen)
    k = make(layout, b, sk, hkv, d, dtype, gen)
    v = make(layout, b, sk, hkv, d, dtype, gen)
    causal = mask == "causal"
    window = (64, 16) if mask == "window" else (-1, -1)
    out, lse = flashjit.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                        return_lse=True)
    torch.cuda.synchronize()
    ref = reference(q, k, v, causal, window)
    assert not torch.isnan(out).any()
    err = (out.double() - ref).abs().max().item()
    assert err <= TOL[dtype], err
    # LSE in float64 from the same masked scores.
    qd, kd = q.double().transpose(1, 2), k.double().transpose(1, 2).repeat_interleave(hq // hkv, 1)
    s = qd @ kd.transpose(-1, -2) / d ** 0.5
    i = torch.arange(sq, device="cuda")[:, None]
    j = torch.arange(sk, device="cuda")[None, :]
    diag = i + sk - sq
    vis = torch.ones(sq, sk, dtype=torch.bool, device="cuda")
    if causal:
        vis &= j <= diag
    if window[0] >= 0:
        vis &= (j >= diag - window[0]) & (j <= diag + window[1])
    ref_lse = torch.logsumexp(s.masked_fill(~vis, float("-inf")), -1)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isneginf(lse), ~fin)
    if fin.any():
        assert (lse.double()[fin] - ref_lse[fin]).abs().max().item() <= 1e-3
