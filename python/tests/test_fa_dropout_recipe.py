"""FlashAttention's own way of checking dropout (its tests' test_flash_attn_output recipe,
written anew here), run against flashjit on CUDA: the sign of S_dmask is the dropout
pattern, its magnitude normalized FlashAttention's way (a running max per key block, its
block width for the head dim and device, then the LSE) is the softmax, and with that
pattern flashjit's output is within twice the error of a PyTorch implementation in the
inputs' precision, as FlashAttention demands of itself; the dropped fraction is within
0.01 of p (0.025 with a local window; not checked with ALiBi, as FlashAttention does not)."""
import math

import pytest

import flashjit

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def block_n(d):
    """FlashAttention-2's key block width with dropout."""
    major, minor = torch.cuda.get_device_capability()
    if d <= 32:
        return 128
    if d <= 96:
        return 64
    if d <= 128:
        return 32
    if d <= 160:
        return 64 if (major == 8 and minor > 0) else 32
    return 64


def hidden(sq, sk, window, device):
    """True where FlashAttention's local mask hides (query i, key j), bottom-right aligned."""
    i = torch.arange(sq, device=device).view(-1, 1)
    j = torch.arange(sk, device=device).view(1, -1)
    if window[0] < 0:
        return j > i + sk - sq + window[1]
    return (j > torch.clamp(i + sk - sq + window[1], max=sk)) | (j < i + sk - sq - window[0])


def scores(q, k, bias, window, reorder=False):
    g = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(g, 2)
    d = q.shape[-1]
    s = (torch.einsum("bthd,bshd->bhts", q, k / math.sqrt(d)) if reorder else
         torch.einsum("bthd,bshd->bhts", q / math.sqrt(d), k))
    if window[0] >= 0 or window[1] >= 0:
        s = s.masked_fill(hidden(q.shape[1], k.shape[1], window, q.device), float("-inf"))
    return s if bias is None else s + bias


def reference(q, k, v, bias, p, keep, window, upcast=True):
    dtype = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    a = torch.softmax(scores(q, k, bias, window, reorder=not upcast), dim=-1).to(v.dtype)
    if window[0] >= 0 or window[1] >= 0:
        a = a.masked_fill(hidden(q.shape[1], k.shape[1], window, q.device).all(-1, keepdim=True),
                          0.0)
    v = v.repeat_interleave(q.shape[2] // v.shape[2], 2)
    o = torch.einsum("bhts,bshd->bthd", a.masked_fill(~keep, 0.0) / (1 - p), v)
    return o.to(dtype), a.to(dtype)


def normalized(unnorm, q, k, bias, window):
    s = scores(q.float(), k.float(), bias, window)
    width = block_n(q.shape[-1])
    blocks = s.split(width, dim=-1)
    lse = torch.logsumexp(torch.stack([torch.logsumexp(b, -1) for b in blocks], -1), -1)
    lse[lse == float("-inf")] = float("inf")
    running = torch.cummax(torch.stack([b.amax(-1) for b in blocks], -1).flip(-1),
                           -1).values.flip(-1).unbind(-1)
    return torch.cat([a * torch.exp(m - lse).unsqueeze(-1)
                      for a, m in zip(unnorm.split(width, -1), running)], -1).to(unnorm.dtype)


CASES = [  # d, (seqlen_q, seqlen_k), causal, local, alibi, GQA
    (32, (113, 203), False, False, False, False),
    (40, (128, 217), True, False, False, True),
    (59, (256, 512), False, True, False, False),
    (64, (512, 256), True, False, True, True),
    (80, (1023, 1024), False, False, False, True),
    (96, (108, 256), True, True, False, False),
    (111, (113, 203), False, False, True, False),
    (128, (256, 512), True, False, False, True),
    (160, (128, 217), False, True, True, True),
    (192, (512, 256), False, False, False, False),
    (256, (1023, 1024), True, False, False, True),
]


@pytest.mark.parametrize("d,lens,causal,local,alibi,gqa", CASES)
def test_flash_attentions_dropout_recipe(d, lens, causal, local, alibi, gqa):
    sq, sk = lens
    torch.manual_seed(0)
    b, h, p = 4, 9, 0.17
    hk = 3 if gqa else h
    window = tuple(int(x) for x in torch.randint(0, sk, (2,))) if local else (-1, -1)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(b, sk, hk, d, device="cuda", dtype=torch.float16) for _ in range(2))
    slopes = torch.rand(b, h, device="cuda") * 0.3 if alibi else None
    bias = None
    if alibi:
        i = torch.arange(sq, device="cuda").view(-1, 1)
        j = torch.arange(sk, device="cuda").view(1, -1)
        bias = -slopes.view(b, h, 1, 1) * (i + sk - sq - j).abs()
    out, _, s_dmask = flashjit.flash_attn_func(q, k, v, p, causal=causal, window_size=window,
                                               alibi_slopes=slopes, return_attn_probs=True)
    win = (window[0], 0) if causal else window
    s = s_dmask[..., :sq, :sk]
    if win[0] >= 0 or win[1] >= 0:
        s = s.masked_fill(hidden(sq, sk, win, "cuda"), 0.0)
    keep = s >= 0
    attn = normalized(s.abs(), q, k, bias, win)
    o_ref, a_ref = reference(q, k, v, bias, p, keep, win)
    o_pt, a_pt = reference(q, k, v, bias, p, keep, win, upcast=False)
    assert (out - o_ref).abs().max() <= 2 * (o_pt - o_ref).abs().max() + 1e-5
    assert (attn - a_ref).abs().max() <= 2 * (a_pt - a_ref).abs().max()
    if not alibi:
        valid = ~hidden(sq, sk, win, "cuda") if win != (-1, -1) else torch.ones_like(keep[0, 0])
        dropped = (~keep & valid).sum() / (valid.sum() * b * h)
        assert abs(dropped.item() - p) <= (0.025 if local else 0.01)
