"""scaled_dot_product_attention: PyTorch's SDPA signature over flash_attn_func."""

from ._lib import InputError, InputTypeError
from .api import _from_dlpack, _kind, flash_attn_func


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *, arch=None,
                                 config=None, dropout_seed=None):
    """torch.nn.functional.scaled_dot_product_attention's semantics, run by flashjit.

    query [batch, heads, seqlen_q, head_dim], key [batch, kv_heads, seqlen_k, head_dim],
    value [batch, kv_heads, seqlen_k, head_dim_v]; as in PyTorch, any leading dims may
    stand for the batch ([..., heads, seqlen, head_dim]: none, one or several, run as
    one batch). kv_heads != heads needs enable_gqa=True, as in PyTorch. is_causal is
    SDPA's top-left causal mask (query i sees keys 0..i, also when seqlen_q !=
    seqlen_k; flash_attn_func's causal is FlashAttention's bottom-right one). attn_mask
    broadcasts to [..., heads, seqlen_q, seqlen_k] as in PyTorch: bool (True takes part
    in attention) or float32/float16/bfloat16 added to the scaled scores; a query whose
    keys are all masked gets output 0 (PyTorch's math backend gives NaN there). It
    combines with is_causal. scale None means 1/sqrt(head_dim). Returns [..., heads,
    seqlen_q, head_dim_v] (a view of flashjit's [batch, seqlen_q, heads, head_dim_v]
    output). Gradients flow as through flash_attn_func. NumPy arrays run on the CPU
    emulator of `arch`.

    dropout_p drops attention weights as flash_attn_func does (a Philox pattern of
    dropout_seed, None: a new seed per call from torch's or NumPy's generator), not
    with PyTorch's random stream: the same probability, another pattern.
    """
    query, key, value, attn_mask = map(_from_dlpack, (query, key, value, attn_mask))
    nd = len(query.shape)
    if nd < 2 or len(key.shape) != nd or len(value.shape) != nd:
        raise InputError(f"flashjit: query, key and value must have one number of dims, at least "
                         f"2 ([..., heads, seqlen, head_dim], as in PyTorch), got "
                         f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    lead = tuple(query.shape[:-2])  # [..., heads]
    if tuple(key.shape[:-3]) != lead[:-1] or tuple(value.shape[:-2]) != tuple(key.shape[:-2]):
        raise InputError(f"flashjit: query {tuple(query.shape)}, key {tuple(key.shape)} and value "
                         f"{tuple(value.shape)} must share their leading dims, and key and value "
                         "their heads and seqlen (broadcast them first)")
    kind = _kind(query)
    batch = 1
    for n in lead[:-1]:
        batch *= n

    def bshd(x):  # [..., H, S, D] -> [B, H, S, D] (the leading dims as one) -> a [B, S, H, D] view
        x = x.reshape(batch, x.shape[-3] if nd > 2 else 1, x.shape[-2], x.shape[-1])
        return x.transpose(1, 2) if kind == "torch" else x.transpose(0, 2, 1, 3)

    q, k, v = bshd(query), bshd(key), bshd(value)
    if q.shape[2] != k.shape[2] and not enable_gqa:
        raise InputError(f"flashjit: query has {q.shape[2]} heads and key {k.shape[2]}: pass "
                         "enable_gqa=True for grouped-query attention, as in PyTorch")
    sq, sk = q.shape[1], k.shape[1]
    causal, mask_mod = False, None
    if is_causal:
        if sq == sk:
            causal = True  # top-left and bottom-right agree: the kernels' causal loop
        else:
            mask_mod = "kv_idx <= q_idx"  # SDPA's top-left diagonal
    if attn_mask is not None:
        m = len(attn_mask.shape)
        if m > nd:
            raise InputError(f"flashjit: attn_mask {tuple(attn_mask.shape)} has more dims than the "
                             f"inputs {tuple(query.shape)}: pass a mask of at most {nd} dims")
        if nd > 4 and m > 2:  # broadcast over the leading dims, which become the batch
            full = lead + (sq, sk)
            if kind == "torch":
                attn_mask = attn_mask.expand(full)
            else:
                import numpy as np
                attn_mask = np.broadcast_to(attn_mask, full)
            attn_mask = attn_mask.reshape(batch, lead[-1], sq, sk)
    out = flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, mask_mod=mask_mod,
                          arch=arch, config=config, attn_mask=attn_mask, dropout_p=dropout_p,
                          dropout_seed=dropout_seed)
    out = out.transpose(1, 2) if kind == "torch" else out.transpose(0, 2, 1, 3)
    return out.reshape(lead + (sq, out.shape[-1]))
