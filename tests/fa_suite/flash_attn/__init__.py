"""A stand-in for FlashAttention's package: its Python entry points from flashjit."""
from flashjit import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                      flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                      flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache)
