"""The backward pass: flash_attn_backward, and the autograd function flash_attn_func
uses when a torch input requires grad."""

import ctypes

from ._lib import InputError, InputTypeError
from . import _lib
from .api import (_attention, _attention_forward, _bf16_bits, _check_qkv, _device, _dropout,
                  _from_dlpack, _kind, _mask_tensor, _modifiers, _scale, _signature, _spec,
                  _strides, _window)


def flash_attn_backward(dout, q, k, v, out, softmax_lse, dropout_p=0.0, softmax_scale=None,
                        causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                        deterministic=False, *, arch=None, config=None, score_mod=None,
                        mask_mod=None, attn_mask=None, dropout_seed=None, sinks=None):
    """(dq, dk, dv): the gradients of out = flash_attn_func(q, k, v, ...) given dout; with
    sinks (the forward's attention sinks, [heads]), (dq, dk, dv, dsinks), dsinks float32
    [heads].

    out and softmax_lse are the forward's, from flash_attn_func(..., return_attn_probs=True)
    (FlashAttention's +inf for a query that sees no key) or return_lse=True (-inf there);
    the other arguments must be the forward's. dout has out's shape; dq, dk and dv come
    back with the shapes, dtypes and strides of q, k and v. Torch tensors run on their
    GPU on torch's current stream, NumPy arrays on the CPU emulator of `arch`. The
    score modifiers (softcap, alibi_slopes, score_mod, mask_mod) are differentiated
    through, and attn_mask is read as the forward read it (it gets no gradient): pass
    the forward's. Deterministic (no atomics): the same bits run to run,
    so `deterministic` changes nothing. With dropout_p > 0, dropout_seed must be the
    forward's (pass one to flash_attn_func), so the backward drops the same weights.
    """
    # Arrays of other frameworks, through DLPack (api._from_dlpack).
    (dout, q, k, v, out, softmax_lse, alibi_slopes, attn_mask, sinks) = map(_from_dlpack, (
        dout, q, k, v, out, softmax_lse, alibi_slopes, attn_mask, sinks))
    if dropout_p != 0.0 and dropout_seed is None:
        raise InputError("flashjit: dropout_p > 0 needs the forward's dropout_seed: pass "
                         "dropout_seed=S to both flash_attn_func and flash_attn_backward (or let "
                         "autograd run the backward)")
    window = _window(window_size)
    scale = _scale(softmax_scale)
    kind = _kind(q)
    kinds = {_kind(x) for x in (dout, q, k, v, out, softmax_lse)}
    if len(kinds) != 1:
        raise InputTypeError(f"flashjit: dout, q, k, v, out and softmax_lse must be of one kind, "
                             f"got {sorted(kinds)}")
    b, sq, sk, hq, hkv, d, dv, dtype = _check_qkv(q, k, v, kind)
    if tuple(out.shape) != (b, sq, hq, dv) or tuple(dout.shape) != (b, sq, hq, dv):
        raise InputError(f"flashjit: out and dout must be [batch, seqlen_q, heads, head_dim_v] = "
                         f"{(b, sq, hq, dv)}, got {tuple(out.shape)} and {tuple(dout.shape)}")
    if tuple(softmax_lse.shape) != (b, hq, sq):
        raise InputError(f"flashjit: softmax_lse must be [batch, heads, seqlen_q] = {(b, hq, sq)}, "
                         f"got {tuple(softmax_lse.shape)}")
    device, stream = _device(q, kind, arch)
    if kind == "torch":
        import torch
        if out.dtype != q.dtype or dout.dtype != q.dtype:
            raise InputTypeError(f"flashjit: out and dout must be {q.dtype} like q, got "
                                 f"{out.dtype} and {dout.dtype}")
        if softmax_lse.dtype != torch.float32:
            raise InputTypeError(f"flashjit: softmax_lse must be float32, got {softmax_lse.dtype}")
        lse = softmax_lse.contiguous()
        # dO is read with out's strides; the gradients are written with q's, k's, v's.
        if dout.stride() != out.stride():
            dout = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype,
                                       device=out.device).copy_(dout)
        grads = [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
                 for x in (q, k, v)]
        ins = (q, k, v, out, dout)
        bufs = grads
    elif kind == "numpy":
        import numpy as np
        lse = np.ascontiguousarray(softmax_lse, dtype=np.float32)
        if dtype == "bf16":  # float32 arrays run as bf16: their bits, rounded
            ins = tuple(_bf16_bits(x) for x in (q, k, v, out, dout))
            bufs = [np.full(x.shape, 0x7FC0, dtype=np.uint16) for x in ins[:3]]
        else:
            ins = tuple(np.ascontiguousarray(x) for x in (q, k, v, out, dout))
            bufs = [np.full(x.shape, np.nan, dtype=np.float16) for x in ins[:3]]
    else:
        raise InputTypeError("flashjit: flash_attn_backward takes torch tensors or NumPy arrays")

    strides = [_strides(x, kind) for x in ins[:4]]
    spec = _spec(b, sq, sk, hq, hkv, d, dv, dtype, scale, causal, window, True, strides)
    mods, slopes, sinks_ptr, keep = _modifiers(
        spec, kind, None if kind == "numpy" else str(q.device), b, hq, softcap, alibi_slopes,
        score_mod, mask_mod, sinks)
    mask_type, mask_ptr, mask_view = _mask_tensor(
        spec, kind, None if kind == "numpy" else str(q.device), attn_mask, (b, hq, sq, sk))
    spec.dropout_p, spec.dropout_seed = _dropout(dropout_p, dropout_seed, kind)
    # One handle with the forward's: the signature of a forward that returned the LSE.
    signature = (_signature(dtype, d, dv, causal, window, True, strides) + mods +
                 (mask_type, spec.dropout_p > 0))
    handle = _attention(signature, spec, device, config, kind)
    arrays = dict(alibi_slopes=slopes, attn_mask=mask_ptr)
    dsinks = _sink_gradient(arrays, sinks_ptr, hq, kind, q)
    grads = _run_backward(handle, spec, kind, dtype, stream, ins, lse, bufs, **arrays)
    del keep, mask_view
    return grads if dsinks is None else grads + (dsinks,)


def _sink_gradient(arrays, sinks_ptr, heads, kind, like):
    """With sinks (their pointer, else None): adds them and a float32 [heads] buffer for
    their gradient (NaN until the backward writes it, on `like`'s device) to the
    backward's `arrays`, and returns the buffer."""
    if sinks_ptr is None:
        return None
    if kind == "torch":
        import torch
        dsinks = torch.full((heads,), float("nan"), dtype=torch.float32, device=like.device)
        arrays.update(sinks=sinks_ptr, dsinks=dsinks.data_ptr())
    else:
        import numpy as np
        dsinks = np.full((heads,), np.nan, dtype=np.float32)
        arrays.update(sinks=sinks_ptr, dsinks=dsinks.ctypes.data)
    return dsinks


def _run_backward(handle, spec, kind, dtype, stream, ins, lse, bufs, **arrays):
    """fj_attention_backward over ins = (q, k, v, out, dout), lse and the gradient
    buffers bufs = (dq, dk, dv), with the per-call `arrays` (pointers) by field name;
    the gradients, NumPy bf16 bits widened to float32."""
    ptr = (lambda x: x.data_ptr()) if kind == "torch" else (lambda x: x.ctypes.data)
    t = _lib.BackwardTensors(q=ptr(ins[0]), k=ptr(ins[1]), v=ptr(ins[2]), out=ptr(ins[3]),
                             lse=ptr(lse), dout=ptr(ins[4]), dq=ptr(bufs[0]), dk=ptr(bufs[1]),
                             dv=ptr(bufs[2]), **arrays)
    _lib.check(_lib.lib.fj_attention_backward(
        handle, ctypes.byref(spec), ctypes.byref(t), ctypes.c_void_p(stream) if stream else None),
        "fj_attention_backward")
    if kind == "numpy" and dtype == "bf16":
        return tuple((x.astype("uint32") << 16).view("float32") for x in bufs)
    return tuple(bufs)


_FUNCTION = None


def _function():
    """The torch.autograd.Function (made on first use: torch is imported only then)."""
    global _FUNCTION
    if _FUNCTION is None:
        import torch

        class FlashAttnFunction(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes,
                        config, num_splits, score_mod, mask_mod, attn_mask, dropout_p,
                        dropout_seed, sinks):
                out, lse = _attention_forward(q, k, v, True, softmax_scale, causal, window_size,
                                              softcap, alibi_slopes, None, config, num_splits,
                                              score_mod, mask_mod, sinks, attn_mask, dropout_p,
                                              dropout_seed)
                ctx.save_for_backward(q, k, v, out, lse)
                ctx.sinks = sinks
                ctx.args = dict(softmax_scale=softmax_scale, causal=causal,
                                window_size=window_size, softcap=softcap,
                                alibi_slopes=alibi_slopes, config=config, score_mod=score_mod,
                                mask_mod=mask_mod, attn_mask=attn_mask, dropout_p=dropout_p,
                                dropout_seed=dropout_seed, sinks=sinks)
                ctx.mark_non_differentiable(lse)
                return out, lse

            @staticmethod
            def backward(ctx, dout, _dlse):
                q, k, v, out, lse = ctx.saved_tensors
                grads = flash_attn_backward(dout, q, k, v, out, lse, **ctx.args)
                # No gradient for the slopes (FlashAttention's ALiBi is not learned) nor
                # for attn_mask (attention_with_grad refuses one that requires grad). The
                # sinks' comes in their own dtype.
                dsinks = grads[3].to(ctx.sinks.dtype) if ctx.sinks is not None else None
                return grads[:3] + (None,) * 12 + (dsinks,)

        _FUNCTION = FlashAttnFunction
    return _FUNCTION


def attention_with_grad(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, arch,
                        config, num_splits, score_mod, mask_mod, sinks, attn_mask=None,
                        dropout_p=0.0, dropout_seed=0):
    """flash_attn_func's call when a torch input requires grad: (out, lse) through the
    autograd function (sinks that require grad get theirs), or NotImplementedError naming
    what the backward does not take, so that no gradient is ever dropped without a word."""
    if attn_mask is not None and getattr(attn_mask, "requires_grad", False):
        raise NotImplementedError(
            "flashjit: attn_mask requires grad, but flashjit computes no gradient for a mask "
            "tensor (only for q, k and v): pass attn_mask.detach(), or use a score_mod "
            "expression if the bias is learned")
    if arch:
        raise InputError(f"flashjit: arch={arch!r} applies to NumPy inputs (the emulator)")
    return _function().apply(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes,
                             config, num_splits, score_mod, mask_mod, attn_mask, dropout_p,
                             dropout_seed, sinks)
