import torch


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """(the kept tokens [total, ...], their flat indices, cu_seqlens int32, max length, lengths)."""
    all_mask = attention_mask if unused_mask is None else attention_mask + unused_mask
    seqlens = all_mask.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_mask.flatten(), as_tuple=False).flatten()
    cu = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return flat[indices], indices, cu, int(seqlens.max().item()), used


def pad_input(hidden_states, indices, batch, seqlen):
    out = torch.zeros(batch * seqlen, *hidden_states.shape[1:], device=hidden_states.device,
                      dtype=hidden_states.dtype)
    out[indices] = hidden_states
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])
