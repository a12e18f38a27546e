import torch


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0,
                     cu_seqlens=None, max_seqlen=None):
    """Rotary embedding of x [b, s, h, d]'s first 2 * cos.shape[1] dims at positions offset + s."""
    assert cu_seqlens is None
    b, s = x.shape[:2]
    rd = cos.shape[1] * 2
    pos = torch.arange(s, device=x.device)[None, :]
    off = seqlen_offsets if isinstance(seqlen_offsets, int) else seqlen_offsets.long()[:, None]
    pos = (pos + off).expand(b, s)
    c, sn = cos[pos].float()[:, :, None, :], sin[pos].float()[:, :, None, :]
    xr = x[..., :rd].float()
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        o = torch.stack([x1 * c - x2 * sn, x1 * sn + x2 * c], dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., :rd // 2], xr[..., rd // 2:]
        o = torch.cat([x1 * c - x2 * sn, x1 * sn + x2 * c], dim=-1)
    out = x if inplace else x.clone()
    out[..., :rd] = o.to(x.dtype)
    return out
