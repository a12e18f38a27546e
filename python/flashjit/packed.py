"""FlashAttention's packed entry points: Q, K and V (or K and V) stacked in one tensor.

Each takes views of the packed tensor (no copy: flashjit reads any strides) and calls
flash_attn_func or flash_attn_varlen_func, so everything those take works here too,
and gradients flow back into the packed tensor through torch's autograd of the views.
"""

from ._lib import InputError, InputTypeError
from .api import _from_dlpack, flash_attn_func
from .sequences import flash_attn_varlen_func


def _unpack(x, name, parts, layout):
    """The `parts` views along the packing axis of `x`: axis 2 of a padded batch
    [batch, seqlen, parts, heads, head_dim], axis 1 of a varlen one [total, parts, heads,
    head_dim]. `layout` names the expected shape for the error."""
    dims = layout.count(",") + 1
    axis = dims - 3
    shape = tuple(getattr(x, "shape", ()))
    if len(shape) != dims or shape[axis] != parts:
        raise InputError(f"flashjit: {name} must be {layout} with {parts} at axis {axis}, got "
                         f"shape {shape}")
    index = (slice(None),) * axis
    return tuple(x[index + (i,)] for i in range(parts))


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False, **extras):
    """FlashAttention's flash_attn_qkvpacked_func: qkv [batch, seqlen, 3, heads, head_dim].
    flash_attn_func's keyword-only extras (return_lse, arch, config, ...) pass through."""
    q, k, v = _unpack(_from_dlpack(qkv), "qkv", 3, "[batch, seqlen, 3, heads, head_dim]")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs, **extras)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False, **extras):
    """FlashAttention's flash_attn_kvpacked_func: q [batch, seqlen_q, heads, head_dim], kv
    [batch, seqlen_k, 2, kv_heads, head_dim] (GQA/MQA from the head counts)."""
    k, v = _unpack(_from_dlpack(kv), "kv", 2, "[batch, seqlen_k, 2, kv_heads, head_dim]")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs, **extras)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, **extras):
    """FlashAttention's flash_attn_varlen_qkvpacked_func: qkv [total, 3, heads, head_dim],
    cu_seqlens int32 [batch + 1] for queries and keys alike."""
    q, k, v = _unpack(_from_dlpack(qkv), "qkv", 3, "[total, 3, heads, head_dim]")
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap,
                                  alibi_slopes, deterministic, return_attn_probs, **extras)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False, **extras):
    """FlashAttention's flash_attn_varlen_kvpacked_func: q [total_q, heads, head_dim], kv
    [total_k, 2, kv_heads, head_dim]."""
    k, v = _unpack(_from_dlpack(kv), "kv", 2, "[total_k, 2, kv_heads, head_dim]")
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                  softcap, alibi_slopes, deterministic, return_attn_probs,
                                  **extras)
