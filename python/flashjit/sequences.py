"""flash_attn_varlen_func and flash_attn_with_kvcache: FlashAttention's varlen and KV-cache
calls over flashjit's sequences (docs/sequences.md). One kernel per signature serves every
batch of lengths; the lengths, block tables and cache counts are per-call arrays."""

import sys

from ._lib import InputError, InputTypeError
from . import torch_ops
from .api import (_ATTENTIONS, MAX_REPEATS, _attention, _backward_refused, _bf16_bits, _device,
                  _dropout, _dtype_name, _fast_call, _forward, _from_dlpack, _handle_key, _int,
                  _kind, _modifiers, _refuse_grad, _s_dmask_scale, _scale, _signature, _spec,
                  _strides, _window)

# A plain torch decode step's repeat -> what its first call built (_kv_fast_forward):
# flash_attn_with_kvcache without rotary, cache_leftpad, slopes or sinks, its int32
# arrays contiguous on q's device, with the same shapes, strides, dtypes, devices and
# arguments (new k and v included).
_KV_REPEATS = {}


_ARANGES = {}


def _torch_arange(n, device):
    """torch.arange(n) (int64) on `device`, made once: a decode step needs the same few."""
    key = (n, device)
    got = _ARANGES.get(key)
    if got is None:
        import torch
        if len(_ARANGES) >= 64:
            _ARANGES.clear()
        got = _ARANGES[key] = torch.arange(n, device=device)
    return got


def _append(kind, k_cache, v_cache, k, v, seqlens, table, rows):
    """Writes the new keys and values k, v [batch, new, kv_heads, d] into the caches, at
    rows seqlens[b] .. seqlens[b] + new - 1 of batch b's sequence: through `table`'s pages
    of `rows` rows when given, else rows of cache row b."""
    batch, new = k.shape[0], k.shape[1]
    if kind == "torch":
        pos = seqlens.reshape(batch, 1) + _torch_arange(new, k.device)  # int64
        b_idx = _torch_arange(batch, k.device).reshape(batch, 1)
        index = (table[b_idx, pos // rows].long(), pos % rows) if table is not None else \
            (b_idx, pos)
        k_cache.index_put_(index, k)
        v_cache.index_put_(index, v)
        return
    import numpy as np
    pos = seqlens.reshape(batch, 1) + np.arange(new)
    b_idx = np.arange(batch).reshape(batch, 1)
    index = (table[b_idx, pos // rows], pos % rows) if table is not None else (b_idx, pos)
    k_cache[index] = k
    v_cache[index] = v


def _check_capacity(seqlens, new, capacity, paged, kind):
    """Refuses cache_seqlens + `new` appended keys past the cache's `capacity` rows per
    sequence (or below 0): every NumPy call; on torch, a paged call (FlashAttention's check,
    which it too pays a host sync for: the kernels would read block_table past its row and
    the append write through it). Skipped while a CUDA graph is captured, where the host
    cannot read the device."""
    if kind == "numpy":
        import numpy as np
        bad, shown = np.any(seqlens < 0) or np.any(seqlens + new > capacity), seqlens
    elif paged:
        import torch
        if seqlens.is_cuda and torch.cuda.is_current_stream_capturing():
            return
        lo, hi = torch.stack([seqlens.min(), seqlens.max()]).tolist()  # one sync
        bad, shown = lo < 0 or hi + new > capacity, f"min {lo}, max {hi}"
    else:
        return
    if bad:
        where = (f"the {capacity} rows block_table's pages address per sequence (give "
                 "block_table more columns)" if paged else
                 f"the cache's {capacity} rows per sequence")
        raise InputError(f"flashjit: cache_seqlens + the {new} new keys must stay within "
                         f"{where}, got cache_seqlens {shown}")


def _kv_repeat_key(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table,
                   *args):
    """The _KV_REPEATS key of a plain torch decode step, None for any other call."""
    torch = sys.modules.get("torch")
    if torch is None or any(type(x) is not torch.Tensor for x in (q, k_cache, v_cache)):
        return None
    if k is not None and (type(k) is not torch.Tensor or type(v) is not torch.Tensor):
        return None
    if _needs_grad(q, k_cache, v_cache, k, v) or torch_ops.compiling():
        return None
    new = () if k is None else (k.shape, v.shape, k.stride(), v.stride(), k.dtype, v.dtype,
                                k.device, v.device)
    arrays = []
    for x in (cache_seqlens, cache_batch_idx, block_table):
        if x is None or (x is cache_seqlens and type(x) is int):
            arrays.append(x)  # the count itself: the first call's array holds it
        elif type(x) is torch.Tensor and x.dtype == torch.int32 and x.device == q.device \
                and x.is_contiguous():
            arrays.append(tuple(x.shape))
        else:
            return None
    key = (q.shape, k_cache.shape, v_cache.shape, q.stride(), k_cache.stride(), v_cache.stride(),
           q.dtype, k_cache.dtype, v_cache.dtype, q.device, k_cache.device, v_cache.device,
           new, tuple(arrays), *args)
    try:
        hash(key)
    except TypeError:  # e.g. a config dict: the full path takes it
        return None
    return key


def _kv_fast_forward(key, q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx,
                     block_table):
    """A repeat of a plain decode step that ran before: its spec, the append of k and v
    (when given), the new pointers (q, the caches, the counts, the table), new outputs.
    (out, lse), or None when the call has not run before or its handle was evicted."""
    seen = _KV_REPEATS.get(key)
    if seen is None:
        return None
    handle_key, spec, out_shape, lse_shape, index, counts, _ = seen
    if handle_key not in _ATTENTIONS:
        return None  # evicted: the full path runs the whole call, the append included
    seqlens = counts if counts is not None else cache_seqlens
    table = block_table if block_table is not None else \
        (cache_batch_idx.reshape(-1, 1) if cache_batch_idx is not None else None)
    if block_table is not None:
        _check_capacity(seqlens, 0 if k is None else k.shape[1],
                        block_table.shape[1] * k_cache.shape[1], True, "torch")
    if k is not None:
        _append("torch", k_cache, v_cache, k, v, seqlens, table, k_cache.shape[1])
        seqlens = seqlens + k.shape[1]  # int32; alive until the launch is queued
    pointers = {"seqused_k": seqlens.data_ptr()}
    if table is not None:
        pointers["block_table"] = table.data_ptr()
    return _fast_call(handle_key, spec, out_shape, lse_shape, index, q, k_cache, v_cache,
                      **pointers)


def _needs_grad(*tensors):
    """Torch inputs of which one requires grad, with grad mode on."""
    if not any(getattr(x, "requires_grad", False) for x in tensors):
        return False
    import torch
    return torch.is_grad_enabled()


def _common(q, k, v, arrays, arch, what="KV-cache calls", refuse_grad=True):
    """kind, dtype, device, stream of the inputs; every array of one kind and device.
    With refuse_grad, torch inputs that require grad in grad mode are refused: the
    call has no backward (`what` names why)."""
    kinds = {_kind(x) for x in (q, k, v)}
    if len(kinds) != 1:
        raise InputTypeError(f"flashjit: q, k and v must be of one kind, got {sorted(kinds)}")
    kind = kinds.pop()
    if kind == "cupy":
        raise InputTypeError("flashjit: the varlen and KV-cache calls take torch tensors or NumPy "
                             "arrays")
    if kind == "torch" and refuse_grad:
        import torch
        # Every tensor: q, k, v and the per-call arrays (new keys, sinks) alike.
        _refuse_grad((("q", q), ("k", k), ("v", v)) + tuple(arrays.items()),
                     torch.is_grad_enabled, what)
    dtypes = {_dtype_name(x, kind) for x in (q, k, v)}
    if None in dtypes or len(dtypes) != 1:
        raise InputTypeError(f"flashjit: q, k and v must share one dtype, bf16 or f16 (NumPy: "
                             f"float32 as bf16 or float16); got "
                             f"{[str(x.dtype) for x in (q, k, v)]}")
    device, stream = _device(q, kind, arch)
    if kind == "torch":
        devs = {str(x.device) for x in (q, k, v)}
        if len(devs) != 1:
            raise InputError(f"flashjit: q, k and v are on different devices: {sorted(devs)}")
    for name, a in arrays.items():
        if a is not None and _kind(a) != kind:
            raise InputTypeError(f"flashjit: {name} must be of the inputs' kind ({kind}), got "
                                 f"{type(a).__name__}")
    return kind, dtypes.pop(), device, stream


def _int32(x, kind, device_of, name, shape):
    """(pointer, keep-alive) of an int32 array of `shape`."""
    from .api import _array
    if tuple(x.shape) != shape:
        raise InputError(f"flashjit: {name} must have shape {shape}, got {tuple(x.shape)}")
    return _array(x, kind, device_of, name, "int32")


def _bits(x, kind, dtype):
    return _bf16_bits(x) if kind == "numpy" and dtype == "bf16" else x


def _outputs(kind, dtype, shape, lse_shape, like, want_lse):
    if kind == "numpy":
        import numpy as np
        out = np.full(shape, 0x7FC0, dtype=np.uint16) if dtype == "bf16" else \
            np.full(shape, np.nan, dtype=np.float16)
        lse = np.full(lse_shape, np.nan, dtype=np.float32) if want_lse else None
        return out, lse
    import torch
    out = torch.empty(shape, dtype=like.dtype, device=like.device)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=like.device) if want_lse else None
    return out, lse


def _finish(out, lse, kind, dtype, fa_lse):
    if kind == "numpy" and dtype == "bf16":
        out = (out.astype("uint32") << 16).view("float32")
    if lse is not None and fa_lse:  # FlashAttention writes +inf for a query that sees no key
        if kind == "torch":
            lse.masked_fill_(lse == float("-inf"), float("inf"))
        else:
            lse[lse == float("-inf")] = float("inf")
    return out, lse


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, *, seqused_k=None,
                           return_lse=False, arch=None, config=None, score_mod=None,
                           mask_mod=None, sinks=None, dropout_seed=None):
    """FlashAttention 2's flash_attn_varlen_func: q [total_q, heads, d], k and v [total_k,
    kv_heads, d] packed, cu_seqlens_q / cu_seqlens_k int32 [batch + 1]; with block_table
    (int32 [batch, max_blocks]) k and v are a paged cache [num_blocks, page_size, kv_heads,
    d] and each batch's key count is cu_seqlens_k's difference. Causal and windows are
    bottom-right aligned per sequence. Returns out [total_q, heads, dv]; with
    return_attn_probs (out, softmax_lse [heads, total_q], S_dmask), +inf where a query sees
    no key, S_dmask None without dropout. Keyword-only extras as flash_attn_func's, and seqused_k (int32 [batch]: batch
    b attends to its first seqused_k[b] keys). dropout_p and dropout_seed as
    flash_attn_func's, b the sequence's index and q_idx, kv_idx positions within it (not
    with a block_table); return_attn_probs with dropout gives FlashAttention-2's S_dmask
    [batch, heads, max_seqlen_q, max_seqlen_k rounded up to 128] for torch tensors. NumPy
    inputs run on the emulator of `arch`; there every array entry is checked (a bad one is
    an error naming it). Torch inputs that require grad (grad mode on) run through
    autograd: flash_attn_varlen_backward gives dq, dk, dv, and sinks that require grad get
    theirs (not with a block_table or seqused_k: those raise NotImplementedError)."""
    # Arrays of other frameworks, through DLPack (api._from_dlpack).
    (q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, block_table, seqused_k,
     sinks) = map(_from_dlpack, (q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, block_table,
                                 seqused_k, sinks))
    if dropout_p and dropout_seed is None and _kind(q) == "torch" and torch_ops.compiling():
        raise NotImplementedError("flashjit: under torch.compile, dropout needs dropout_seed")
    p_drop, seed = _dropout(dropout_p, dropout_seed, _kind(q))
    if p_drop and block_table is not None:
        raise NotImplementedError("flashjit: dropout over a paged KV cache (block_table) is not "
                                  "built: pass dropout_p=0.0, or packed k and v")
    if return_attn_probs and return_lse:
        raise InputError("flashjit: return_attn_probs and return_lse both ask for the LSE: pass "
                         "one")
    if _needs_grad(q, k, v, sinks) and block_table is None and seqused_k is None:
        if arch:
            raise InputError(f"flashjit: arch={arch!r} applies to NumPy inputs (the emulator)")
        out, lse = _varlen_function().apply(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                            max_seqlen_k, softmax_scale, causal, window_size,
                                            softcap, alibi_slopes, config, score_mod, mask_mod,
                                            sinks, p_drop, seed)
        if return_attn_probs:  # FlashAttention's +inf for a query that sees no key
            return (out, lse.masked_fill(lse == float("-inf"), float("inf")),
                    _varlen_s_dmask(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    softmax_scale, causal, window_size, softcap, alibi_slopes,
                                    (score_mod, mask_mod, sinks), p_drop, seed))
        return (out, lse) if return_lse else out
    want_lse = bool(return_attn_probs or return_lse)
    window, scale = _window(window_size), _scale(softmax_scale)
    paged = block_table is not None
    # A block_table or seqused_k with inputs that require grad: FlashAttention runs the
    # forward (its tests do, checking only the output) and fails in the backward, so
    # flashjit runs it too, and its backward raises (_backward_refused below).
    no_backward = _needs_grad(q, k, v, sinks)
    kind, dtype, device, stream = _common(q, k, v, {"cu_seqlens_q": cu_seqlens_q,
                                                    "cu_seqlens_k": cu_seqlens_k,
                                                    "block_table": block_table,
                                                    "seqused_k": seqused_k, "sinks": sinks},
                                          arch, "a block_table or seqused_k",
                                          refuse_grad=not no_backward)
    if len(q.shape) != 3 or len(k.shape) != (4 if paged else 3) or len(v.shape) != len(k.shape):
        raise InputError(f"flashjit: q must be [total_q, heads, d] and k, v "
                         f"{'[num_blocks, page_size, kv_heads, d] (paged)' if paged else '[total_k, kv_heads, d]'}; "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    total_q, hq, d = q.shape
    hkv, dv = v.shape[-2], v.shape[-1]
    if k.shape[-1] != d or k.shape[:-1] != v.shape[:-1] or hkv == 0 or hq % hkv:
        raise InputError(f"flashjit: q {tuple(q.shape)}, k {tuple(k.shape)} and v "
                         f"{tuple(v.shape)} do not fit: head dims of q and k, and k's and v's "
                         "rows and heads, must agree; heads a multiple of kv_heads")
    batch = _int("len(cu_seqlens_q) - 1", cu_seqlens_q.shape[0] - 1, 0)
    max_q = _int("max_seqlen_q", max_seqlen_q, 0)
    max_k = _int("max_seqlen_k", max_seqlen_k, 0)
    dev = None if kind == "numpy" else str(q.device)
    keep = []
    pointers = {}
    p, held = _int32(cu_seqlens_q, kind, dev, "cu_seqlens_q", (batch + 1,))
    pointers["cu_seqlens_q"] = p
    keep.append(held)
    if paged:
        if seqused_k is None:  # the keys per batch: cu_seqlens_k's differences
            seqused_k = (cu_seqlens_k[1:] - cu_seqlens_k[:-1])
            seqused_k = seqused_k.astype("int32") if kind == "numpy" else \
                seqused_k.to(cu_seqlens_k.dtype)
        _int32(cu_seqlens_k, kind, dev, "cu_seqlens_k", (batch + 1,))
    else:
        p, held = _int32(cu_seqlens_k, kind, dev, "cu_seqlens_k", (batch + 1,))
        pointers["cu_seqlens_k"] = p
        keep.append(held)
    if seqused_k is not None:
        p, held = _int32(seqused_k, kind, dev, "seqused_k", (batch,))
        pointers["seqused_k"] = p
        keep.append(held)
    if paged:
        if len(block_table.shape) != 2 or block_table.shape[0] != batch:
            raise InputError(f"flashjit: block_table must be int32 [batch, max_blocks] = "
                             f"[{batch}, ...], got {tuple(block_table.shape)}")
        p, held = _int32(block_table, kind, dev, "block_table", tuple(block_table.shape))
        pointers["block_table"] = p
        keep.append(held)

    ins = tuple(_bits(x, kind, dtype) for x in (q, k, v))
    out, lse = _outputs(kind, dtype, (total_q, hq, dv), (hq, total_q), q, want_lse)
    st = [_strides(x, kind) for x in ins] + [_strides(out, kind)]
    packed = lambda s: (0, s[0], s[1], s[2])  # noqa: E731  (batch, seq, head, dim)
    paged_s = lambda s: (s[0], s[1], s[2], s[3])  # noqa: E731  pages as the batch
    strides = [packed(st[0]), *(paged_s(s) if paged else packed(s) for s in st[1:3]),
               packed(st[3])]
    spec = _spec(batch, max_q, max_k, hq, hkv, d, dv, dtype, scale, causal, window, want_lse,
                 strides)
    spec.packed_q, spec.total_q = 1, total_q
    spec.dropout_p, spec.dropout_seed = p_drop, seed
    if paged:
        spec.used_k = 1
        spec.page_size, spec.num_pages, spec.pages_per_seq = k.shape[1], k.shape[0], \
            block_table.shape[1]
    else:
        spec.packed_k, spec.total_k = 1, k.shape[0]
        spec.used_k = int(seqused_k is not None)
    mods, slopes, sink_ptr, held = _modifiers(spec, kind, dev, batch, hq, softcap, alibi_slopes,
                                              score_mod, mask_mod, sinks)
    keep += held
    signature = _signature(dtype, d, dv, causal, window, want_lse, strides) + mods + (
        "varlen", paged, spec.packed_k, spec.used_k, p_drop > 0)
    handle = _attention(signature, spec, device, config, kind)
    _forward(handle, spec, kind, stream, *ins, out, lse, alibi_slopes=slopes, sinks=sink_ptr,
             **pointers)
    del keep
    out, lse = _finish(out, lse, kind, dtype, return_attn_probs)
    if no_backward:
        out = _backward_refused(out, "a block_table or seqused_k",
                                (("q", q), ("k", k), ("v", v), ("sinks", sinks)))
    if return_attn_probs:
        return out, lse, _varlen_s_dmask(q, k, cu_seqlens_q, cu_seqlens_k, max_q, max_k,
                                         softmax_scale, causal, window_size, softcap,
                                         alibi_slopes, (score_mod, mask_mod, sinks), p_drop, seed)
    return (out, lse) if return_lse else out


def _varlen_s_dmask(q, k, cu_q, cu_k, max_q, max_k, softmax_scale, causal, window_size, softcap,
                    alibi_slopes, others, p, seed):
    """FlashAttention-2's S_dmask of a varlen call with dropout (None without): sequence b
    in rows [0, its queries) and columns [0, its keys) of [b] (attn_probs.py). others:
    (score_mod, mask_mod, sinks)."""
    if not p:
        return None
    score_mod, mask_mod, sinks = others
    scale = _s_dmask_scale(q, softmax_scale, score_mod=score_mod, mask_mod=mask_mod, sinks=sinks)
    import torch
    from .attn_probs import s_dmask
    starts_q, starts_k = cu_q.tolist(), cu_k.tolist()
    batch, heads = len(starts_q) - 1, q.shape[1]
    out = torch.zeros(batch, heads, -(-max_q // 128) * 128, -(-max_k // 128) * 128,
                      dtype=q.dtype, device=q.device)
    for b in range(batch):
        sq, sk = starts_q[b + 1] - starts_q[b], starts_k[b + 1] - starts_k[b]
        if sq == 0 or sk == 0:
            continue
        slopes = alibi_slopes
        if slopes is not None and slopes.dim() == 2:
            slopes = slopes[b]
        part = s_dmask(q[None, starts_q[b]:starts_q[b + 1]].detach(),
                       k[None, starts_k[b]:starts_k[b + 1]].detach(), scale, causal,
                       _window(window_size), float(softcap), slopes, p, seed, first_batch=b)
        out[b, :, :sq, :sk] = part[0, :, :sq, :sk]
    return out


def flash_attn_varlen_backward(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k,
                               max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                               causal=False, window_size=(-1, -1), softcap=0.0,
                               alibi_slopes=None, deterministic=False, *, arch=None,
                               config=None, score_mod=None, mask_mod=None, sinks=None,
                               dropout_seed=0):
    """(dq, dk, dv): the gradients of out = flash_attn_varlen_func(q, k, v, cu_seqlens_q,
    cu_seqlens_k, ...) given dout [total_q, heads, dv]. out and softmax_lse [heads, total_q]
    are the forward's (return_attn_probs' +inf or return_lse's -inf for a query that sees no
    key); the other arguments must be the forward's. Packed q, k and v only (no
    block_table or seqused_k). dq, dk and dv have the shapes, dtypes and strides of q, k
    and v; rows past the last sequence (cu_seqlens[-1] onward) get 0 in dk and dv, and in
    dq when it is allocated here. With sinks (the forward's, [heads]): (dq, dk, dv,
    dsinks), dsinks float32 [heads]. Deterministic (no atomics). dropout_p and
    dropout_seed must be the forward's (the seed it was given or drew)."""
    # Arrays of other frameworks, through DLPack (api._from_dlpack).
    (dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
     sinks) = map(_from_dlpack, (dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k,
                                 alibi_slopes, sinks))
    p_drop, seed = _dropout(dropout_p, dropout_seed if dropout_p else 0, _kind(q))
    window, scale = _window(window_size), _scale(softmax_scale)
    kind, dtype, device, stream = _common(dout, q, k, {"v": v, "out": out,
                                                       "softmax_lse": softmax_lse,
                                                       "cu_seqlens_q": cu_seqlens_q,
                                                       "cu_seqlens_k": cu_seqlens_k}, arch,
                                          refuse_grad=False)
    if len(q.shape) != 3 or len(k.shape) != 3 or len(v.shape) != 3:
        raise InputError(f"flashjit: q must be [total_q, heads, d] and k, v [total_k, kv_heads, "
                         f"d]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    total_q, hq, d = q.shape
    total_k, hkv, dv = v.shape
    if k.shape[:2] != v.shape[:2] or k.shape[2] != d or hkv == 0 or hq % hkv:
        raise InputError(f"flashjit: q {tuple(q.shape)}, k {tuple(k.shape)} and v "
                         f"{tuple(v.shape)} do not fit: head dims of q and k, and k's and v's "
                         "rows and heads, must agree; heads a multiple of kv_heads")
    if tuple(out.shape) != (total_q, hq, dv) or tuple(dout.shape) != (total_q, hq, dv):
        raise InputError(f"flashjit: out and dout must be [total_q, heads, head_dim_v] = "
                         f"{(total_q, hq, dv)}, got {tuple(out.shape)} and {tuple(dout.shape)}")
    if tuple(softmax_lse.shape) != (hq, total_q):
        raise InputError(f"flashjit: softmax_lse must be [heads, total_q] = {(hq, total_q)}, got "
                         f"{tuple(softmax_lse.shape)}")
    batch = _int("len(cu_seqlens_q) - 1", cu_seqlens_q.shape[0] - 1, 0)
    max_q = _int("max_seqlen_q", max_seqlen_q, 0)
    max_k = _int("max_seqlen_k", max_seqlen_k, 0)
    dev = None if kind == "numpy" else str(q.device)
    keep, pointers = [], {}
    for name, a in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        p, held = _int32(a, kind, dev, name, (batch + 1,))
        pointers[name] = p
        keep.append(held)
    if kind == "torch":
        import torch
        if out.dtype != q.dtype or dout.dtype != q.dtype:
            raise InputTypeError(f"flashjit: out and dout must be {q.dtype} like q, got "
                                 f"{out.dtype} and {dout.dtype}")
        if softmax_lse.dtype != torch.float32:
            raise InputTypeError(f"flashjit: softmax_lse must be float32, got {softmax_lse.dtype}")
        lse = softmax_lse.contiguous()
        if dout.stride() != out.stride():  # dO is read with out's strides
            dout = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype,
                                       device=out.device).copy_(dout)
        ins = (q, k, v, out, dout)
        # With the strides of q, k and v, which the kernels write them by (q, k and v may
        # be views of one packed tensor, whose rows *_like would allocate densely). Zeros:
        # rows past the last sequence belong to none and stay 0 in dq.
        bufs = [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
                for x in (q, k, v)]
        bufs[0].zero_()
    else:
        import numpy as np
        lse = np.ascontiguousarray(softmax_lse, dtype=np.float32)
        ins = tuple(_bits(np.ascontiguousarray(x), kind, dtype) for x in (q, k, v, out, dout))
        bufs = [np.zeros(x.shape, dtype=x.dtype) for x in ins[:3]]
    st = [_strides(x, kind) for x in ins[:4]]
    packed = lambda s: (0, s[0], s[1], s[2])  # noqa: E731  (batch, seq, head, dim)
    strides = [packed(x) for x in st]
    spec = _spec(batch, max_q, max_k, hq, hkv, d, dv, dtype, scale, causal, window, True, strides)
    spec.packed_q, spec.total_q = 1, total_q
    spec.packed_k, spec.total_k = 1, total_k
    spec.dropout_p, spec.dropout_seed = p_drop, seed
    mods, slopes, sink_ptr, held = _modifiers(spec, kind, dev, batch, hq, softcap,
                                              alibi_slopes, score_mod, mask_mod, sinks)
    keep += held
    # One handle with the forward's: the signature of a varlen forward that returned the LSE.
    signature = _signature(dtype, d, dv, causal, window, True, strides) + mods + (
        "varlen", False, 1, 0, p_drop > 0)
    handle = _attention(signature, spec, device, config, kind)
    from .backward import _run_backward, _sink_gradient
    arrays = dict(alibi_slopes=slopes, **pointers)
    dsinks = _sink_gradient(arrays, sink_ptr, hq, kind, q)
    grads = _run_backward(handle, spec, kind, dtype, stream, ins, lse, bufs, **arrays)
    del keep
    return grads if dsinks is None else grads + (dsinks,)


_VARLEN_FUNCTION = None


def _varlen_function():
    """flash_attn_varlen_func's torch.autograd.Function (made on first use)."""
    global _VARLEN_FUNCTION
    if _VARLEN_FUNCTION is None:
        import torch

        class FlashAttnVarlenFunction(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal,
                        window_size, softcap, alibi_slopes, config, score_mod, mask_mod, sinks,
                        dropout_p, dropout_seed):
                args = dict(softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                            softcap=softcap, alibi_slopes=alibi_slopes, config=config,
                            score_mod=score_mod, mask_mod=mask_mod, sinks=sinks,
                            dropout_p=dropout_p, dropout_seed=dropout_seed)
                out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k,
                                                  return_lse=True, **args)
                ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
                ctx.sizes = (max_q, max_k)
                ctx.args = args
                ctx.mark_non_differentiable(lse)
                return out, lse

            @staticmethod
            def backward(ctx, dout, _dlse):
                q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
                grads = flash_attn_varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k,
                                                   *ctx.sizes, **ctx.args)
                sinks = ctx.args["sinks"]  # its gradient in its own dtype
                dsinks = grads[3].to(sinks.dtype) if sinks is not None else None
                return grads[:3] + (None,) * 12 + (dsinks, None, None)

        _VARLEN_FUNCTION = FlashAttnVarlenFunction
    return _VARLEN_FUNCTION


def _rotary(x, cos, sin, positions, interleaved, kind):
    """x [B, S, H, D] rotated in its first 2 * cos.shape[1] dims at positions [B, S]."""
    rd = 2 * cos.shape[1]
    if kind == "torch":
        xf, c, s = x.float(), cos[positions.long()].float(), sin[positions.long()].float()
        out = xf.clone()
    else:
        import numpy as np
        xf = x.astype(np.float32)
        c, s = cos[positions].astype(np.float32), sin[positions].astype(np.float32)
        out = xf.copy()
    c, s = c[:, :, None, :], s[:, :, None, :]
    if interleaved:
        x1, x2 = xf[..., 0:rd:2], xf[..., 1:rd:2]
        out[..., 0:rd:2] = x1 * c - x2 * s
        out[..., 1:rd:2] = x1 * s + x2 * c
    else:
        x1, x2 = xf[..., :rd // 2], xf[..., rd // 2:rd]
        out[..., :rd // 2] = x1 * c - x2 * s
        out[..., rd // 2:rd] = x1 * s + x2 * c
    if kind == "torch":
        return out.to(x.dtype)
    from .api import _bf16_bits
    if str(x.dtype) == "float32":  # a bf16 array: keep its values representable
        return (_bf16_bits(out).astype("uint32") << 16).view("float32")
    return out.astype(x.dtype)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, *, arch=None, config=None, score_mod=None,
                            mask_mod=None, sinks=None):
    """FlashAttention 2's flash_attn_with_kvcache: q [batch, seqlen_q, heads, d] attends to
    a KV cache, dense [batch_cache, seqlen_cache, kv_heads, d] (rows chosen by
    cache_batch_idx, int32 [batch]) or paged [num_blocks, page_size, kv_heads, d] through
    block_table (int32 [batch, max_blocks]). cache_seqlens (int or int32 [batch]; None:
    the whole cache) counts each batch's keys. New k and v [batch, seqlen_new, kv_heads,
    d] are written into the caller's cache in place at cache_seqlens, then attended.
    rotary_cos / rotary_sin [seqlen_ro, rotary_dim / 2] rotate q and the new k
    (interleaved or half-split): k at cache_seqlens + i; q at cache_seqlens + i when
    causal or local, else at cache_seqlens. The append and rotary run as torch / NumPy
    operations before the kernel (not fused yet). Split-KV (num_splits) applies. Returns
    out, and softmax_lse [batch, heads, seqlen_q] with return_softmax_lse (+inf where a
    query sees no key, as FlashAttention writes it). cache_leftpad
    (int32 [batch]) is where each sequence's keys start in its cache row: batch b attends
    to rows cache_leftpad[b] .. cache_seqlens[b] + seqlen_new - 1 (causal and windows
    aligned to the last of them; rotary positions stay the cache rows); not with a
    block_table (FlashAttention refuses the pair too). A torch decode step without rotary,
    cache_leftpad, slopes or sinks, repeated with the same shapes, strides and arguments,
    reuses what its first call built and runs only the append (when k and v are given)
    and the kernel (the host's time per call: bench/host_probe.py)."""
    # Arrays of other frameworks, through DLPack (api._from_dlpack).
    (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
     cache_leftpad, block_table, alibi_slopes, sinks) = map(_from_dlpack, (
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, block_table, alibi_slopes, sinks))
    repeat = None
    if (k is None) == (v is None) and rotary_cos is None and rotary_sin is None and \
            cache_leftpad is None and alibi_slopes is None and sinks is None:
        repeat = _kv_repeat_key(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx,
                                block_table, softmax_scale, causal, window_size, softcap,
                                num_splits, bool(return_softmax_lse), arch, config, score_mod,
                                mask_mod)
        if repeat is not None:
            done = _kv_fast_forward(repeat, q, k_cache, v_cache, k, v, cache_seqlens,
                                    cache_batch_idx, block_table)
            if done is not None:
                if not return_softmax_lse:
                    return done[0]
                # FlashAttention's +inf for a query that sees no key, as _finish writes it
                return done[0], done[1].masked_fill_(done[1] == float("-inf"), float("inf"))
    if cache_leftpad is not None and block_table is not None:
        raise NotImplementedError("flashjit: cache_leftpad with a block_table is not supported "
                                  "(FlashAttention refuses the pair too): pass one of them")
    if (k is None) != (v is None):
        raise InputError("flashjit: k and v are appended together: pass both or neither")
    if cache_batch_idx is not None and block_table is not None:
        raise InputError("flashjit: cache_batch_idx and block_table both choose the cache rows: "
                         "pass one (FlashAttention refuses the pair too)")
    if (rotary_cos is None) != (rotary_sin is None):
        raise InputError("flashjit: rotary_cos and rotary_sin go together")
    window = _window(window_size)
    paged = block_table is not None
    kind, dtype, device, stream = _common(q, k_cache, v_cache, {
        "k": k, "v": v, "cache_batch_idx": cache_batch_idx, "block_table": block_table,
        "sinks": sinks}, arch)
    if len(q.shape) != 4 or len(k_cache.shape) != 4 or k_cache.shape[:-1] != v_cache.shape[:-1]:
        raise InputError(f"flashjit: q must be [batch, seqlen_q, heads, d] and the caches "
                         f"[batch or blocks, rows, kv_heads, d]; got {tuple(q.shape)}, "
                         f"{tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    batch, sq, hq, d = q.shape
    rows, hkv, dv = k_cache.shape[1], k_cache.shape[2], v_cache.shape[3]
    xp = __import__("torch") if kind == "torch" else __import__("numpy")
    dev = None if kind == "numpy" else str(q.device)

    def int32(x, shape, name):
        if kind == "torch":
            return xp.as_tensor(x, dtype=xp.int32, device=q.device).reshape(shape)
        return xp.asarray(x, dtype=xp.int32).reshape(shape)
    capacity = block_table.shape[1] * rows if paged else rows
    if cache_seqlens is None:
        seqlens = int32([capacity - (0 if k is None else k.shape[1])] * batch, (batch,), "")
    elif isinstance(cache_seqlens, int):
        seqlens = int32([cache_seqlens] * batch, (batch,), "")
    else:
        _int32(cache_seqlens, kind, dev, "cache_seqlens", (batch,))
        seqlens = cache_seqlens
    if paged:
        _int32(block_table, kind, dev, "block_table", (batch, block_table.shape[1]))
        table = block_table
    elif cache_batch_idx is not None:  # a paged cache of one page per sequence
        _int32(cache_batch_idx, kind, dev, "cache_batch_idx", (batch,))
        table = cache_batch_idx.reshape(batch, 1)
    else:
        table = None
    new = 0 if k is None else k.shape[1]
    _check_capacity(seqlens, new, capacity, paged, kind)
    def arange(n):
        return xp.arange(n, device=q.device) if kind == "torch" else xp.arange(n)
    # Positions of the rotated queries and keys: none without rotary (each torch op
    # costs host time).
    positions = seqlens.reshape(batch, 1) + arange(max(new, sq)) \
        if rotary_cos is not None else None
    if rotary_cos is not None:
        q_pos = positions[:, :sq] if (causal or window != (-1, -1)) else \
            seqlens.reshape(batch, 1) + 0 * positions[:, :sq]
        q = _rotary(q, rotary_cos, rotary_sin, q_pos, rotary_interleaved, kind)
        if k is not None:
            k = _rotary(k, rotary_cos, rotary_sin, positions[:, :new], rotary_interleaved, kind)
    if k is not None:  # append in place
        _append(kind, k_cache, v_cache, k, v, seqlens, table, rows)
    if new == 0:  # the counts as given (int32, checked above)
        used = seqlens
    else:
        used = (seqlens + new).astype(xp.int32) if kind == "numpy" else \
            (seqlens + new).to(xp.int32)
    page_rows = rows  # rows per page of the table below (a cache row per page when dense)
    if cache_leftpad is not None:
        # Keys from cache_leftpad[b] on: a table of one-row pages (row leftpad[b] + j of
        # batch b's cache row), whose per-batch count is used - leftpad.
        _int32(cache_leftpad, kind, dev, "cache_leftpad", (batch,))
        if kind == "numpy":
            import numpy as np
            if np.any(cache_leftpad < 0) or np.any(cache_leftpad > used):
                raise InputError(f"flashjit: cache_leftpad must be within 0 .. cache_seqlens + "
                                 f"the new keys ({used}) per sequence, got {cache_leftpad}")
        k_st = _strides(k_cache, kind)
        v_st = _strides(v_cache, kind)
        if k_st[0] != rows * k_st[1] or v_st[0] != rows * v_st[1]:
            raise InputError("flashjit: cache_leftpad needs caches whose batch stride is rows x "
                             "the row stride (e.g. contiguous [batch, rows, kv_heads, d]); pass "
                             "k_cache.contiguous() / v_cache.contiguous()")
        base = table.reshape(batch) if table is not None else arange(batch)
        span = arange(rows)
        lead = cache_leftpad.reshape(batch, 1)
        table = base.reshape(batch, 1) * rows + lead + span.reshape(1, rows)
        table = table.to(xp.int32) if kind == "torch" else table.astype(xp.int32)
        used = used - cache_leftpad
        used = used.to(xp.int32) if kind == "torch" else used.astype(xp.int32)
        page_rows = 1

    want_lse = bool(return_softmax_lse)
    ins = tuple(_bits(x, kind, dtype) for x in (q, k_cache, v_cache))
    out, lse = _outputs(kind, dtype, (batch, sq, hq, dv), (batch, hq, sq), q, want_lse)
    strides = [_strides(x, kind) for x in ins] + [_strides(out, kind)]
    if page_rows == 1:  # pages of one cache row: the page stride is the row stride
        strides[1:3] = [(st[1], st[1], st[2], st[3]) for st in strides[1:3]]
    spec = _spec(batch, sq, capacity, hq, hkv, d, dv, dtype, _scale(softmax_scale), causal,
                 window, want_lse, strides)
    spec.used_k = 1
    spec.num_splits = _int("num_splits", num_splits, 0, 128)
    keep = [used]
    pointers = {"seqused_k": _int32(used, kind, dev, "cache_seqlens", (batch,))[0]}
    if table is not None:
        table = table.contiguous() if kind == "torch" else xp.ascontiguousarray(table)
        keep.append(table)
        spec.page_size, spec.num_pages, spec.pages_per_seq = page_rows, \
            k_cache.shape[0] * rows // page_rows, table.shape[1]
        pointers["block_table"] = _int32(table, kind, dev, "block_table", tuple(table.shape))[0]
    mods, slopes, sink_ptr, held = _modifiers(spec, kind, dev, batch, hq, softcap, alibi_slopes,
                                              score_mod, mask_mod, sinks)
    keep += held
    signature = _signature(dtype, d, dv, causal, window, want_lse, strides) + mods + (
        "kvcache", table is not None, page_rows == 1)
    handle = _attention(signature, spec, device, config, kind)
    _forward(handle, spec, kind, stream, *ins, out, lse, alibi_slopes=slopes, sinks=sink_ptr,
             **pointers)
    if repeat is not None:
        if len(_KV_REPEATS) >= MAX_REPEATS:
            _KV_REPEATS.clear()
        # The counts array this call made from an int or None (a tensor comes per call),
        # and what the spec's score_mod / mask_mod strings point into.
        _KV_REPEATS[repeat] = (_handle_key(signature, device, config), spec, tuple(out.shape),
                               tuple(lse.shape) if lse is not None else None,
                               q.device.index or 0,
                               None if cache_seqlens is not None and type(cache_seqlens) is not int
                               else used, held)
    del keep
    out, lse = _finish(out, lse, kind, dtype, True)
    return (out, lse) if return_softmax_lse else out
