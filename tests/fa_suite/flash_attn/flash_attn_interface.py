import torch
from flashjit.attn_probs import _block_n

USE_TRITON_ROCM = False


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    """The key block width S_dmask is normalized by: flashjit's (FlashAttention-2's with dropout)."""
    return _block_n(device, head_dim) if is_dropout else 128
