"""FlashAttention-2's S_dmask for torch calls with dropout: what
flash_attn_func(..., return_attn_probs=True) returns third.

FlashAttention-2 returns, for a call with dropout, a [batch, heads, seqlen_q rounded up
to 128, seqlen_k rounded up to 128] tensor: the softmax's numerators exp(s - m) as its
kernel leaves them, negated where dropout drops the element. Its kernel visits the key
blocks from the last one, so m is the running max at a block: the max of the scores of
that block and every block after it; the block width is FlashAttention-2's for the head
dim and the device (_block_n). Its test helpers (normalize_flash_attn_S) undo exactly
that scaling with the row's LSE, so S_dmask here is the same quantity, computed in
float32 from q and k: the sign carries flashjit's own dropout pattern (the kernel's
Philox draws, ir::philox_uniform), the values FlashAttention-2's scaling.
"""
import math

_M32 = 0xFFFFFFFF


def _philox(c, k0, k1, rounds):
    """Philox-4x32 (`rounds` rounds) of counters c (4 int64 tensors holding uint32 values)
    under the key (k0, k1): int64 products of two 32-bit values wrap, and their words are
    masked."""
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & _M32, (k1 + 0xBB67AE85) & _M32
        p0, p1 = c[0] * 0xD2511F53, c[2] * 0xCD9E8D57
        c = [((p1 >> 32) & _M32) ^ c[1] ^ k0, p1 & _M32, ((p0 >> 32) & _M32) ^ c[3] ^ k1,
             p0 & _M32]
    return c


def _key(seed, offset):
    """The kernels' key: Philox of (seed, offset) under a fixed key (plain integers)."""
    words = _philox([seed & _M32, seed >> 32, offset & _M32, offset >> 32], 0x2545F491,
                    0x9E3779B9, 10)
    return words[0], words[1]


def kept(batch, heads, seqlen_q, seqlen_k, p, seed, device, offset=0, first_batch=0):
    """bool [batch, heads, seqlen_q, seqlen_k]: True where the kernels keep P[b, h, i, j]:
    16 bits of the 7-round draw of (j // 8, i, h, b), half j % 2 of word j % 8 // 2, over 2^16,
    compared in float32 with p (ir::philox_uniform); b counts from first_batch."""
    import torch
    k0, k1 = _key(seed, offset)
    ar = lambda n: torch.arange(n, device=device, dtype=torch.int64)  # noqa: E731
    groups = (seqlen_k + 7) // 8
    b = (ar(batch) + first_batch).view(-1, 1, 1, 1)
    h = ar(heads).view(1, -1, 1, 1)
    i = ar(seqlen_q).view(1, 1, -1, 1)
    g = ar(groups).view(1, 1, 1, -1)
    shape = (batch, heads, seqlen_q, groups)
    words = _philox([g.expand(shape), i.expand(shape), h.expand(shape), b.expand(shape)],
                    k0, k1, 7)  # ir::kDrawRounds
    words = torch.stack(words, dim=-1)  # [b, h, i, group, word]
    halves = torch.stack([words & 0xFFFF, words >> 16], dim=-1)  # [..., word, half]
    bits = halves.reshape(batch, heads, seqlen_q, groups * 8)[..., :seqlen_k]
    u = bits.to(torch.float64) * 2.0 ** -16
    return u >= float(torch.tensor(p, dtype=torch.float32))  # the kernels compare in f32


def _block_n(device, head_dim):
    """FlashAttention-2's key block width with dropout, by head dim and device (sm8x,
    other than the A100's sm80, differs at head dims 129..160)."""
    import torch
    major, minor = torch.cuda.get_device_capability(device)
    sm8x = major == 8 and minor > 0
    if head_dim <= 32:
        return 128
    if head_dim <= 96:
        return 64
    if head_dim <= 128:
        return 32
    if head_dim <= 160:
        return 64 if sm8x else 32
    return 64


def s_dmask(q, k, scale, causal, window, softcap, alibi_slopes, p, seed, first_batch=0):
    """FlashAttention-2's S_dmask (module docstring) of a flash_attn_func call: q [b, sq,
    h, d], k [b, sk, hk, d] torch tensors; window (left, right), -1 unbounded; alibi_slopes
    None, [h] or [b, h]; the dtype q's. first_batch: the draws' b of q's first batch (a
    varlen call's sequence)."""
    import torch
    batch, sq, heads, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    kf = k.float().repeat_interleave(heads // hk, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), kf) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq, device=q.device).view(-1, 1)
    j = torch.arange(sk, device=q.device).view(1, -1)
    diag = i + sk - sq  # bottom-right aligned
    if alibi_slopes is not None:  # FlashAttention's: -slope * |i + sk - sq - j|
        slopes = alibi_slopes.float().reshape(-1 if alibi_slopes.dim() == 2 else 1, heads, 1, 1)
        s = s - slopes * (diag - j).abs()
    left, right = window
    if causal:
        right = 0
    visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if right >= 0:
        visible &= j <= diag + right
    if left >= 0:
        visible &= j >= diag - left
    s = s.masked_fill(~visible, float("-inf"))
    # The running max at each key block, FlashAttention-2's visiting order (last first).
    width = _block_n(q.device, d)
    blocks = math.ceil(sk / width)
    padded = torch.nn.functional.pad(s, (0, blocks * width - sk), value=float("-inf"))
    block_max = padded.view(batch, heads, sq, blocks, width).amax(dim=-1)
    running = torch.cummax(block_max.flip(-1), dim=-1).values.flip(-1)
    m = running.repeat_interleave(width, dim=-1)[..., :sk]
    unnorm = torch.exp(s - m.masked_fill(m == float("-inf"), 0.0))
    keep = kept(batch, heads, sq, sk, p, seed, q.device, first_batch=first_batch)
    out = torch.zeros(batch, heads, -(-sq // 128) * 128, -(-sk // 128) * 128,
                      dtype=q.dtype, device=q.device)
    out[..., :sq, :sk] = torch.where(keep, unnorm, -unnorm).to(q.dtype)
    return out
