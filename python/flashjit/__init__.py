"""flashjit: FlashAttention kernels generated at run time, in the shape Python users know.

    import flashjit
    out = flashjit.flash_attn_func(q, k, v, causal=True)          # torch CUDA tensors
    out = flashjit.flash_attn_func(q, k, v, arch="gfx1201")       # NumPy: the CPU emulator

Tensors follow FlashAttention's conventions: [batch, seqlen, heads, head_dim] (BSHD),
causal masks aligned bottom-right when seqlen_q != seqlen_k, GQA/MQA from the head
counts. flashjit.emit() returns the generated HIP source, flashjit.compile() the
resource report of its code object. flash_attn_varlen_func and flash_attn_with_kvcache
are FlashAttention's varlen and KV-cache calls (packed batches, paged caches), and
flash_attn_qkvpacked_func / flash_attn_kvpacked_func (and their varlen forms) its calls
with Q, K and V stacked in one tensor;
flash_attn_backward and flash_attn_varlen_backward are the backward pass, which
flash_attn_func and flash_attn_varlen_func also run through torch's autograd when an
input requires grad. scaled_dot_product_attention is
PyTorch's SDPA signature (BHSD, top-left is_causal, attn_mask, dropout). Under
torch.compile the torch path runs as custom ops (flashjit.torch_ops);
flashjit.integrations registers flashjit with transformers.
"""

from ._lib import InputError, InputTypeError
from .api import FlashJitError, compile, emit, flash_attn_func, version
from .backward import flash_attn_backward
from .packed import (flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                     flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func)
from .sdpa import scaled_dot_product_attention
from .sequences import flash_attn_varlen_backward, flash_attn_varlen_func, flash_attn_with_kvcache

import sys as _sys

# torch.compile needs the custom ops registered before it traces (registering
# them inside a trace fails): now if torch is imported, else right after it is.
from . import torch_ops as _torch_ops  # noqa: E402  (imports nothing of torch itself)

if "torch" in _sys.modules:
    _torch_ops.ops()
else:
    _torch_ops.register_after_torch_import()

__all__ = ["flash_attn_func", "flash_attn_backward", "flash_attn_varlen_func",
           "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func",
           "flash_attn_varlen_backward",
           "flash_attn_with_kvcache", "scaled_dot_product_attention", "emit", "compile",
           "version", "FlashJitError", "InputError", "InputTypeError"]
