"""flashjit as an attention implementation of Hugging Face transformers.

    import flashjit.integrations
    flashjit.integrations.register_transformers()          # once, before loading a model
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="fj")

The attention function has the signature of transformers' AttentionInterface
functions (that of its "sdpa" implementation) and runs
flashjit.scaled_dot_product_attention: causal prefill, decode over the growing KV
cache (one compiled kernel for every length), GQA without repeating K/V, padded
batches through the 4-D attention mask, and dropout in training. transformers is
imported only by register_transformers(). The name is "fj", not "flashjit":
transformers treats every implementation name containing "flash" as a FlashAttention
kernel to load from its hub.
"""

from .sdpa import scaled_dot_product_attention


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      is_causal=None, **kwargs):
    """transformers' attention call: query [batch, heads, seqlen_q, head_dim], key and value
    [batch, kv_heads, seqlen_k, head_dim], attention_mask None or broadcastable to [batch,
    heads, seqlen_q, >= seqlen_k] (bool, or float added to the scores). Returns
    ([batch, seqlen_q, heads, head_dim], None) as transformers' sdpa_attention_forward."""
    if attention_mask is not None and attention_mask.ndim == 4:
        attention_mask = attention_mask[:, :, :, :key.shape[-2]]
    if is_causal is None:  # transformers' rule: causal when no mask says otherwise
        is_causal = (query.shape[2] > 1 and attention_mask is None and
                     getattr(module, "is_causal", True))
    out = scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                       dropout_p=dropout, is_causal=bool(is_causal),
                                       scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def register_transformers(name="fj"):
    """Registers attention_forward with transformers' AttentionInterface under `name` (and
    SDPA's mask builder with its AttentionMaskInterface where that exists), so that
    attn_implementation=name selects flashjit."""
    from transformers import AttentionInterface
    AttentionInterface.register(name, attention_forward)
    try:
        from transformers import AttentionMaskInterface
        from transformers.masking_utils import sdpa_mask
    except ImportError:  # transformers before masking_utils: masks come as SDPA's
        return
    AttentionMaskInterface.register(name, sdpa_mask)
