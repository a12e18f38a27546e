"""flash_attn_func, emit and compile over libflashjit's C API."""

import collections
import ctypes
import json
import math
import operator
import sys

from . import _lib, torch_ops
from ._lib import FlashJitError, InputError, InputTypeError

# (kernel signature, device, config) -> fj_attention handle: one handle (one compiled
# kernel) serves every shape of its signature; the least recently used beyond
# MAX_HANDLES are destroyed.
_ATTENTIONS = collections.OrderedDict()
MAX_HANDLES = 64
# A torch call's repeat (its shapes, strides, dtypes, devices and arguments) -> what the
# first one built: the _ATTENTIONS key, the spec (and its address), and the output
# shapes (_fast_forward).
_REPEATS = {}
MAX_REPEATS = 1024
# The tuning knobs flash_attn_func(config=...) accepts (the config of flashjit emit's flags).
CONFIG_KEYS = ("block_m", "block_n", "waves", "stages", "q_in_lds", "pad_k", "mma_m",
               "persistent", "prefetch_blocks", "dkdv_passes")
# Each knob's range (fj_options holds int64s; block_m 0 there would mean "the
# default config", mma_m and dkdv_passes 0 "the lowering's choice"; q_in_lds,
# persistent and prefetch_blocks are flags).
_CONFIG_RANGES = {"block_m": (1,), "block_n": (1,), "waves": (1,), "stages": (1,),
                  "q_in_lds": (0, 1), "pad_k": (0,), "mma_m": (0,), "persistent": (0, 1),
                  "prefetch_blocks": (0, 1), "dkdv_passes": (0, 2)}


def version():
    return _lib.lib.fj_version().decode()


# ---- arguments, checked before ctypes sees them ----------------------------------------
# ctypes stores an int in a C field modulo 2**bits and ends a char* at the first NUL,
# silently: every integer and string bound for the C API passes through here first.

INT64_MAX = 2**63 - 1


def _int(name, value, lo, hi=INT64_MAX):
    """`value` as a Python int in lo..hi, else a TypeError (not an integer) or a
    ValueError naming the argument and its range."""
    try:
        i = operator.index(value)
    except TypeError:
        raise InputTypeError(f"flashjit: {name} must be an integer, got {value!r}") from None
    if not lo <= i <= hi:
        top = "2**63-1" if hi == INT64_MAX else str(hi)
        raise InputError(f"flashjit: {name} ({i}) is outside {lo}..{top}: pass an integer in "
                         "that range")
    return i


def _c_str(name, value):
    """`value` encoded for a `const char *`; refuses non-strings and NUL characters."""
    if not isinstance(value, str):
        raise InputTypeError(f"flashjit: {name} must be a string, got {type(value).__name__}")
    if "\0" in value:
        raise InputError(f"flashjit: {name} {value!r} contains a NUL character, where the C API "
                         "would cut it short: pass the name without it")
    return value.encode()


def _window(window_size):
    """(left, right) as ints, each -1 (unbounded) or a count of keys."""
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise InputError(f"flashjit: window_size must be a pair (left, right), got "
                         f"{window_size!r}") from None
    return _int("window_size[0]", left, -1), _int("window_size[1]", right, -1)


def _scale(softmax_scale):
    """The C spec's scale field: 0.0 there means the default 1/sqrt(head_dim)."""
    if softmax_scale is None:
        return 0.0
    try:
        scale = float(softmax_scale)
    except OverflowError:
        raise InputError(f"flashjit: softmax_scale ({softmax_scale}) is past what a double "
                         "holds: use a scale between 1e-30 and 1e30") from None
    if scale == 0.0:
        raise InputError("flashjit: softmax_scale=0.0 is not supported: the C API reads a scale of "
                         "0 as 'the default', and a zero scale would only make every visible key "
                         "weigh the same; pass softmax_scale=None for 1/sqrt(head_dim), or a "
                         "positive scale")
    return scale


def _refuse_grad(tensors, grad_enabled, what="varlen and KV-cache calls"):
    """For calls the backward pass does not take yet (issue 15): their output would be
    detached from autograd, so a gradient through attention would be lost without a
    word. Refuses when an input requires grad and grad mode is on. `tensors`: (name,
    tensor) pairs; `grad_enabled`: torch.is_grad_enabled (asked only when an input
    requires grad)."""
    needing = [name for name, x in tensors if getattr(x, "requires_grad", False)]
    if needing and grad_enabled():
        raise NotImplementedError(
            f"flashjit: {', '.join(needing)} require{'s' if len(needing) == 1 else ''} grad and "
            f"grad mode is on, but flashjit's backward pass does not take {what} yet (issue "
            "15): no gradient would flow through attention. For inference, call it under "
            "torch.no_grad() or torch.inference_mode(); to run it on purpose without "
            f"gradients, pass {', '.join(n + '.detach()' for n in needing)}")


_NO_BACKWARD = None


def _backward_refused(out, what, tensors):
    """`out` (a torch tensor computed without autograd) joined to the graph of `tensors`
    ((name, tensor) pairs) through a node whose backward raises: for calls the backward
    pass does not take yet whose forward FlashAttention runs all the same (a varlen call
    over a block_table: its tests make q require grad and check only the forward). The
    forward runs; a gradient asked for through it is an error naming the call, never a
    silent zero."""
    needing = [(name, x) for name, x in tensors if getattr(x, "requires_grad", False)]
    global _NO_BACKWARD
    if _NO_BACKWARD is None:
        import torch

        class NoBackward(torch.autograd.Function):
            @staticmethod
            def forward(ctx, message, result, *inputs):
                ctx.message = message
                return result  # a fresh tensor of the call's, not an input

            @staticmethod
            def backward(ctx, *grads):
                raise NotImplementedError(ctx.message)

        _NO_BACKWARD = NoBackward
    names = ", ".join(name for name, _ in needing)
    message = (f"flashjit: the gradient of {names} was asked for, but flashjit's backward pass "
               f"does not take {what} yet (issue 15). Run the forward of such a call without "
               "gradients (torch.no_grad(), or detached inputs), or pass packed k and v with "
               "cu_seqlens_k, whose gradients flashjit computes")
    return _NO_BACKWARD.apply(message, out, *(x for _, x in needing))


# ---- inputs ---------------------------------------------------------------------------

_NATIVE_MODULES = ("torch", "cupy", "numpy")


def _from_dlpack(x):
    """An array of another framework (JAX, TensorFlow, MLX, PaddlePaddle, ...) as a native
    one through DLPack, without a copy: NumPy for CPU memory (the emulator), torch (else
    CuPy) for CUDA and ROCm memory. Torch tensors, CuPy and NumPy arrays, None and
    anything without __dlpack__ come back as they are."""
    if x is None or type(x).__module__.partition(".")[0] in _NATIVE_MODULES or \
            not hasattr(x, "__dlpack__"):
        return x
    device_type, _ = x.__dlpack_device__()
    if device_type == 1:  # kDLCPU
        import numpy as np
        return np.from_dlpack(x)
    if device_type in (2, 10):  # kDLCUDA, kDLROCM
        try:
            import torch
        except ImportError:
            import cupy
            return cupy.from_dlpack(x)
        return torch.from_dlpack(x)
    raise InputTypeError(f"flashjit: {type(x).__name__} lives on DLPack device type {device_type}; "
                         "flashjit takes CPU memory (run on the emulator with arch=) or CUDA/ROCm "
                         "GPU memory")


def _kind(x):
    mod = type(x).__module__
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith("cupy"):
        return "cupy"
    if mod.startswith("numpy"):
        return "numpy"
    raise InputTypeError(f"flashjit: q, k and v must be torch tensors, CuPy arrays, NumPy arrays "
                         f"or DLPack arrays (__dlpack__), got {type(x).__name__}")


def _dtype_name(x, kind):
    if kind == "torch":
        import torch
        return {torch.bfloat16: "bf16", torch.float16: "f16"}.get(x.dtype)
    name = str(x.dtype)
    if kind == "numpy" and name == "float32":
        return "bf16"  # NumPy has no bfloat16: float32 runs as bf16, rounded to nearest even
    return {"float16": "f16"}.get(name)


def _strides(x, kind):
    if 0 in tuple(x.shape):  # an empty array's strides address nothing (NumPy's are 0): dense
        s, step = [], 1
        for n in reversed(tuple(x.shape)):
            s.insert(0, step)
            step *= max(n, 1)
        return tuple(s)
    if kind == "torch":
        s = tuple(x.stride())
    else:
        s = tuple(b // x.itemsize for b in x.strides)
    if any(v < 0 for v in s) or any(b % x.itemsize for b in ([] if kind == "torch" else x.strides)):
        raise InputError("flashjit: negative or fractional strides are not supported; pass a "
                         "copy (e.g. .contiguous() / np.ascontiguousarray)")
    return s


def _device(x, kind, arch):
    if kind == "numpy":
        if not arch:
            raise InputError("flashjit: NumPy arrays run on the CPU emulator of an AMD GPU: pass "
                             "arch='gfx1201' (or another AMD arch, see `flashjit archs`)")
        _c_str("arch", arch)
        return f"emulator:{arch}", None
    if arch:
        raise InputError(f"flashjit: arch={arch!r} applies to NumPy inputs (the emulator); GPU "
                         "tensors run for the arch of the device they live on")
    if kind == "torch":
        import torch
        if not x.is_cuda:
            raise InputError("flashjit: torch tensors must live on a GPU (device 'cuda'); for the "
                             "CPU, pass NumPy arrays with arch='gfx1201'")
        backend = "hip" if getattr(torch.version, "hip", None) else "cuda"
        index = x.device.index or 0
        return f"{backend}:{index}", _raw_stream(torch, index)
    import cupy
    return f"cuda:{x.device.id}", cupy.cuda.get_current_stream().ptr


def _ptr(x, kind):
    if kind == "torch":
        return x.data_ptr()
    if kind == "cupy":
        return x.data.ptr
    return x.ctypes.data


def _bf16_bits(a):
    """float32 NumPy array -> uint16 bf16 bit patterns, round to nearest even."""
    import numpy as np
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    nan = np.isnan(a)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    bits[nan] = 0x7FC0
    return bits


def _spec(b, sq, sk, hq, hkv, d, dv, dtype, scale, causal, window, lse, strides):
    # Every field set in one constructor call (this runs on every forward). Every
    # integer is in range: sizes and strides come from real arrays or were checked
    # by _spec_from_args, the window by _window; `scale` comes from _scale.
    # dtype "f32": f32 tensors in memory, rounded to bf16 in the kernel (fj_spec.f32_io).
    q, k, v, o = (_lib.Strides(sb, sh, ss, sd) for sb, ss, sh, sd in strides)  # BSHD -> BHSD order
    return _lib.Spec(batch=b, heads=hq, kv_heads=hkv, seqlen_q=sq, seqlen_k=sk, head_dim_qk=d,
                     head_dim_v=dv, dtype=_lib.DTYPE_F16 if dtype == "f16" else _lib.DTYPE_BF16,
                     layout=_lib.LAYOUT_BSHD,
                     scale=scale, causal=int(bool(causal)), lse=int(bool(lse)),
                     window_left=window[0], window_right=window[1],
                     q=q, k=k, v=v, o=o, f32_io=int(dtype == "f32"))


def _modifiers(spec, kind, device_of, batch, heads, softcap, alibi_slopes, score_mod, mask_mod,
               sinks):
    """Sets the spec's score modifiers (docs/masks.md) and returns (signature part, the
    pointers of alibi_slopes and sinks, arrays to keep alive until the call returns)."""
    try:
        cap = float(softcap)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"flashjit: softcap must be a number (0: off), got {softcap!r}") from None
    if not cap >= 0.0 or cap == float("inf"):
        raise InputError(f"flashjit: softcap ({softcap}) must be 0 (off) or a positive finite "
                         "number")
    spec.softcap = cap
    keep = []
    slopes_ptr = sinks_ptr = None
    alibi = 0
    if alibi_slopes is not None:
        shape = tuple(alibi_slopes.shape)
        if shape == (heads,):
            alibi = 1
        elif shape == (batch, heads):
            alibi = 2
        else:
            raise InputError(f"flashjit: alibi_slopes must be float32 [heads] = ({heads},) or "
                             f"[batch, heads] = ({batch}, {heads}), got shape {shape}")
        slopes_ptr, held = _array(alibi_slopes, kind, device_of, "alibi_slopes", "float32")
        keep.append(held)
    spec.alibi = alibi
    texts = []
    for name, text in (("score_mod", score_mod), ("mask_mod", mask_mod)):
        if text is None:
            texts.append(None)
            continue
        c = _c_str(name, text)
        keep.append(c)
        setattr(spec, name, c)
        texts.append(text)
    if sinks is not None:
        if tuple(sinks.shape) != (heads,):
            raise InputError(f"flashjit: sinks must be float32 [heads] = ({heads},), got shape "
                             f"{tuple(sinks.shape)}")
        if _kind(sinks) == kind and str(sinks.dtype).replace("torch.", "") in ("bfloat16",
                                                                                "float16"):
            # A model's sinks parameter in its 16-bit dtype (gpt-oss): widened, exactly.
            sinks = sinks.float() if kind == "torch" else sinks.astype("float32")
        sinks_ptr, held = _array(sinks, kind, device_of, "sinks", "float32")
        keep.append(held)
        spec.sinks = 1
    return (cap > 0, alibi, texts[0], texts[1], sinks is not None), slopes_ptr, sinks_ptr, keep


# fj_mask_type of a mask tensor's dtype name (torch's without "torch.").
_MASK_TYPES = {"bool": 1, "float32": 2, "float16": 3, "bfloat16": 4}


def _dropout(dropout_p, dropout_seed, kind):
    """(p, seed) of a call: p a float in [0, 1); seed below 2^53, drawn when None from
    torch's default generator (torch inputs; torch.manual_seed repeats it) or NumPy's
    global one, so every call draws a new pattern."""
    try:
        p = float(dropout_p)
    except (TypeError, ValueError):
        raise InputError(f"flashjit: dropout_p must be a number in [0, 1), got "
                         f"{dropout_p!r}") from None
    if not 0.0 <= p < 1.0:
        raise InputError(f"flashjit: dropout_p ({dropout_p}) must be in [0, 1)")
    if p == 0.0:
        return 0.0, 0
    if dropout_seed is None:
        if kind == "torch":
            import torch
            return p, int(torch.randint(0, 1 << 53, (1,)).item())
        import numpy as np
        return p, int(np.random.randint(0, 1 << 53, dtype=np.int64))
    return p, _int("dropout_seed", dropout_seed, 0, (1 << 53) - 1)


def _mask_tensor(spec, kind, device_of, attn_mask, shape):
    """Sets the spec's mask tensor from attn_mask (None: none), broadcast to `shape`
    = (batch, heads, seqlen_q, seqlen_k) by 0 strides as SDPA broadcasts it. Returns
    (fj_mask_type, pointer, the broadcast view to keep alive until the call returns)."""
    if attn_mask is None:
        return 0, None, None
    if _kind(attn_mask) != kind:
        raise InputTypeError(f"flashjit: attn_mask must be of the inputs' kind ({kind}), got "
                             f"{type(attn_mask).__name__}")
    name = str(attn_mask.dtype).replace("torch.", "")
    if name not in _MASK_TYPES:
        raise InputTypeError(f"flashjit: attn_mask must be bool (True attends) or float32, "
                             f"float16 or bfloat16 (added to the scaled scores), got "
                             f"{attn_mask.dtype}")
    if kind == "torch" and str(attn_mask.device) != device_of:
        raise InputError(f"flashjit: attn_mask is on {attn_mask.device} but the inputs are on "
                         f"{device_of}")
    try:
        if len(attn_mask.shape) > 4:
            raise ValueError
        if kind == "torch":
            view = attn_mask.expand(*shape)
        else:
            xp = __import__(kind)
            view = xp.broadcast_to(attn_mask, shape)
    except (RuntimeError, ValueError):
        raise InputError(f"flashjit: attn_mask of shape {tuple(attn_mask.shape)} does not "
                         f"broadcast to [batch, heads, seqlen_q, seqlen_k] = {tuple(shape)}") \
            from None
    spec.mask_type = _MASK_TYPES[name]
    (spec.mask_batch_stride, spec.mask_head_stride, spec.mask_q_stride,
     spec.mask_k_stride) = _strides(view, kind)
    return spec.mask_type, _ptr(view, kind), view


def _array(x, kind, device_of, name, dtype):
    """(pointer, object to keep alive) of a small array flashjit reads as `dtype`
    (int32 or float32): same kind and device as q, contiguous, that dtype."""
    if _kind(x) != kind:
        raise InputTypeError(f"flashjit: {name} must be of the inputs' kind ({kind}), got "
                             f"{type(x).__name__}")
    if kind == "numpy":
        import numpy as np
        if str(x.dtype) != dtype:
            raise InputTypeError(f"flashjit: {name} must be {dtype}, got {x.dtype}: pass "
                                 f"{name}.astype(np.{dtype})")
        held = np.ascontiguousarray(x)
        return held.ctypes.data, held
    if str(x.dtype).replace("torch.", "") != dtype:
        raise InputTypeError(f"flashjit: {name} must be {dtype}, got {x.dtype}")
    if str(x.device) != device_of:
        raise InputError(f"flashjit: {name} is on {x.device} but the inputs are on {device_of}")
    if kind == "torch" and not x.is_contiguous():
        raise InputError(f"flashjit: {name} must be contiguous: pass {name}.contiguous()")
    return _ptr(x, kind), x


def _forward(handle, spec, kind, stream, q, k, v, out, lse, **pointers):
    """fj_attention_forward_tensors with the tensors' pointers and the named arrays'."""
    t = _lib.Tensors(q=_ptr(q, kind), k=_ptr(k, kind), v=_ptr(v, kind), out=_ptr(out, kind),
                     lse=_ptr(lse, kind) if lse is not None else None)
    for name, pointer in pointers.items():
        if pointer is not None:
            setattr(t, name, pointer)
    _lib.check(_lib.lib.fj_attention_forward_tensors(
        handle, ctypes.byref(spec), ctypes.byref(t), ctypes.c_void_p(stream) if stream else None),
        "fj_attention_forward_tensors")


def _signature(dtype, d, dv, causal, window, lse, strides):
    """What the kernel specializes on (AttentionSpec::signature): dtype, head dims,
    causal, window on/off, lse, which head dims are contiguous and the rows'
    alignment class. Computed here rather than by a C call on every forward; were
    it ever coarser than the library's, fj_attention_forward_shape would refuse
    the call naming the field, so a handle never runs a kernel of another signature.
    `strides`: per tensor (batch, seq, head, dim) in elements."""
    unit = tuple(st[3] == 1 for st in strides)
    bits = d | dv  # every row start and length is a multiple of what all of these are
    for sb, ss, sh, _ in strides:
        bits |= sb | ss | sh
    if dtype == "f32":  # f32 tensors (f32_io): 4-byte elements
        align = 4 if not all(unit) else 16 if bits % 4 == 0 else 8 if bits % 2 == 0 else 4
    else:
        align = 2 if not all(unit) else 16 if bits % 8 == 0 else 8 if bits % 4 == 0 else 2
    local = window[0] >= 0 or window[1] >= 0
    return (dtype, d, dv, bool(causal), local, bool(lse), unit, align)


def _options(config):
    """fj_options for a config dict: unset knobs keep the target's default."""
    options = _lib.Options()
    _lib.lib.fj_options_init(ctypes.byref(options))
    if not config:
        return options
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise InputError(f"flashjit: unknown config keys {unknown}: expected some of "
                         f"{list(CONFIG_KEYS)}")
    knobs = {key: _int(f"config[{key!r}]", value, *_CONFIG_RANGES[key])
             for key, value in config.items()}
    if "mma_m" in knobs:
        options.mma_m = knobs["mma_m"]
    tiles = {k: v for k, v in knobs.items() if k != "mma_m"}
    if tiles:
        missing = [k for k in ("block_m", "block_n", "waves") if k not in tiles]
        if missing:
            raise InputError(f"flashjit: config sets {sorted(tiles)} but not {missing}: a config "
                             "with tile knobs names block_m, block_n and waves (stages 1, "
                             "q_in_lds 0 and pad_k 16 when unset)")
        options.block_m, options.block_n, options.waves = (
            tiles["block_m"], tiles["block_n"], tiles["waves"])
        options.stages = tiles.get("stages", 1)
        options.q_in_lds = tiles.get("q_in_lds", 0)
        options.pad_k = tiles.get("pad_k", 16)
        options.persistent = tiles.get("persistent", 0)
        options.prefetch_blocks = tiles.get("prefetch_blocks", 0)
        options.dkdv_passes = tiles.get("dkdv_passes", 0)
    return options


def _handle_key(signature, device, config=None):
    """The _ATTENTIONS key of a kernel signature on a device with a config."""
    return (signature, device, tuple(sorted(config.items())) if config else ())


def _attention(signature, spec, device, config=None, kind=None):
    key = _handle_key(signature, device, config)
    handle = _live_handle(key)
    if handle is not None:
        return handle
    h = ctypes.c_void_p()
    options = _options(config)
    _lib.check(_lib.lib.fj_attention_create_ex(ctypes.byref(spec), device.encode(),
                                               ctypes.byref(options), ctypes.byref(h)),
               "fj_attention_create")
    _ATTENTIONS[key] = h
    while len(_ATTENTIONS) > MAX_HANDLES:
        _, old = _ATTENTIONS.popitem(last=False)
        if kind == "torch":  # its kernel may still be queued: let it finish first
            import torch
            torch.cuda.synchronize()
        _lib.lib.fj_attention_destroy(old)
    return h


# ---- the public functions --------------------------------------------------------------

def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, return_lse=False, arch=None, config=None,
                    num_splits=0, score_mod=None, mask_mod=None, sinks=None, attn_mask=None,
                    dropout_seed=None):
    """Attention with FlashAttention 2's signature and conventions.

    q: [batch, seqlen_q, heads, head_dim]; k: [batch, seqlen_k, kv_heads, head_dim];
    v: [batch, seqlen_k, kv_heads, head_dim_v]; heads a multiple of kv_heads (GQA/MQA).
    Torch CUDA tensors (bf16/f16) run on their GPU, on torch's current stream; CuPy
    arrays (float16) on theirs; NumPy arrays on the CPU emulator of the AMD GPU
    `arch` (float16 as f16). float32 inputs (torch, CuPy, NumPy) are read as float32
    and rounded to bf16 in the kernel (nearest even) for the matrix products; out is
    float32, not rounded (forward only: float32 inputs have no backward). Any strides
    work. softmax_scale None means 1/sqrt(head_dim). causal is
    bottom-right aligned when seqlen_q != seqlen_k; window_size = (left, right), -1
    unbounded. softcap > 0 caps the scaled scores (cap * tanh(score / cap));
    alibi_slopes, float32 [heads] or [batch, heads], adds FlashAttention's ALiBi bias.
    Torch inputs that require grad (with grad mode on) get gradients through
    flashjit's backward (flash_attn_backward, through softcap, ALiBi, score_mod and
    mask_mod; deterministic, so `deterministic` changes nothing); sinks that require
    grad get theirs (in their dtype); an attn_mask that requires grad raises
    NotImplementedError rather than dropping its gradient. dropout_p in [0, 1) drops each attention weight with
    that probability after the softmax and scales the kept ones by 1 / (1 - dropout_p),
    as FlashAttention does (in training; pass 0 for inference): which ones is a Philox
    draw of (dropout_seed, b, h, q_idx, kv_idx), dropout_seed None drawing a new seed
    from torch's (or NumPy's) default generator per call; the backward drops the same.

    Returns out; with return_attn_probs, FlashAttention's (out, softmax_lse, S_dmask):
    softmax_lse [batch, heads, seqlen_q] float32 (natural log), +inf where a query
    sees no key, as FlashAttention writes it; S_dmask None without dropout, and with it
    FlashAttention-2's [batch, heads, seqlen_q and seqlen_k rounded up to 128] tensor
    in q's dtype: the softmax numerators as its kernel scales them, negative where the
    element is dropped (flashjit's pattern; torch tensors, FlashAttention's arguments),
    which FlashAttention's own test helpers read (flashjit/attn_probs.py).

    flashjit's keyword-only extras: return_lse returns (out, lse), lse as above but
    -inf where a query sees no key (log of an empty sum); arch, the AMD arch that
    NumPy inputs are emulated for; config, tuning knobs instead of the target's
    defaults, a dict of CONFIG_KEYS: {"mma_m": 16} alone picks the query tile;
    block_m, block_n and waves (with optional stages, q_in_lds, pad_k) replace the
    whole config; num_splits, split-KV (flash-decoding, as in FlashAttention's
    flash_attn_with_kvcache): 0 chooses per call from the device's compute units, 1
    turns it off (decode then runs the decode kernel: no workspace), n in 2..128 splits each query block's keys over n workgroups;
    score_mod and mask_mod, expressions compiled into the kernel (docs/masks.md):
    score_mod of score, b, h, q_idx, kv_idx, seqlen_q, seqlen_k gives the new score,
    mask_mod of the same names but score hides a key where it is 0 (e.g.
    mask_mod="q_idx / 512 == kv_idx / 512"); sinks, [heads] (float32, or bf16/f16
    widened), gpt-oss's attention sinks (a logit per head in each row's softmax
    denominator; their gradient flows when they require grad); attn_mask, SDPA's mask
    tensor in its layout [batch, heads, seqlen_q, seqlen_k] (or any shape that
    broadcasts to it, e.g. [batch, 1, 1, seqlen_k] for key padding): bool, True
    where the query attends, or float32/float16/bfloat16 added to the scaled
    scores (-inf hides a key); it gets no gradient (one that requires grad raises
    NotImplementedError).
    """
    if return_attn_probs and return_lse:
        raise InputError("flashjit: return_attn_probs and return_lse both ask for the LSE: pass "
                         "one (return_attn_probs gives FlashAttention's (out, softmax_lse, None))")
    want_lse = bool(return_attn_probs or return_lse)
    plain = (not dropout_p and alibi_slopes is None and attn_mask is None and config is None and
             arch is None)
    repeat = None
    if plain:  # a repeat of a plain torch call first: nothing to convert or check again
        repeat = _repeat_key(q, k, v, softmax_scale, causal, window_size, softcap, want_lse,
                             num_splits, score_mod, mask_mod, _sinks_key(sinks))
        if repeat is not None:
            done = _fast_forward(repeat, q, k, v, sinks)
            if done is not None:
                return _returned(*done, return_attn_probs, return_lse)
    # Arrays of other frameworks, through DLPack (_from_dlpack).
    q, k, v, alibi_slopes, sinks, attn_mask = map(_from_dlpack, (q, k, v, alibi_slopes, sinks,
                                                                 attn_mask))
    if plain and repeat is None:  # a first call, or torch tensors that came through DLPack
        if _Torch.module is None and _kind(q) == "torch" and not torch_ops.compiling():
            _Torch.get()  # outside any trace: from now on _repeat_key gives keys
        repeat = _repeat_key(q, k, v, softmax_scale, causal, window_size, softcap, want_lse,
                             num_splits, score_mod, mask_mod, _sinks_key(sinks))
    if dropout_p and dropout_seed is None and _kind(q) == "torch" and torch_ops.compiling():
        raise NotImplementedError("flashjit: under torch.compile, dropout needs dropout_seed (a "
                                  "seed drawn while tracing would be baked into the graph: the "
                                  "same pattern every step): pass one per step")
    args = (softmax_scale, causal, window_size, softcap, alibi_slopes, arch, config, num_splits,
            score_mod, mask_mod, sinks, attn_mask, *_dropout(dropout_p, dropout_seed, _kind(q)))
    if _kind(q) == "torch":
        import torch
        if torch_ops.compiling():  # torch.compile: the custom op, traced without a break
            out, lse = torch_ops.attention(q, k, v, *args, seed_given=dropout_seed is not None)
        elif torch.is_grad_enabled() and any(getattr(x, "requires_grad", False)
                                             for x in (q, k, v, sinks)):
            if str(getattr(q, "dtype", "")) == "torch.float32":
                raise NotImplementedError(
                    "flashjit: float32 q, k and v run forward only (rounded to bf16 in the "
                    "kernel); the backward pass takes bfloat16 or float16. Pass bf16/f16 "
                    "tensors to train, or call under torch.no_grad() for inference")
            from .backward import attention_with_grad
            out, lse = attention_with_grad(q, k, v, *args)
        else:
            out, lse = _attention_forward(q, k, v, want_lse, *args, repeat=repeat)
    else:
        out, lse = _attention_forward(q, k, v, want_lse, *args)
    probs = None
    if return_attn_probs and args[-2] > 0:  # dropout: the pattern, as FlashAttention-2 gives it
        probs = _s_dmask(q, k, *args)
    return _returned(out, lse, return_attn_probs, return_lse, probs)


def _s_dmask_scale(q, softmax_scale, **others):
    """The softmax scale attn_probs.s_dmask takes, after refusing what S_dmask does not
    cover: arrays other than torch tensors, and the `others` given (name -> value)."""
    given = [name for name, x in others.items() if x is not None]
    if _kind(q) != "torch" or given:
        raise NotImplementedError(
            "flashjit: return_attn_probs with dropout returns FlashAttention-2's S_dmask for "
            "torch tensors and FlashAttention's arguments (causal, window_size, softcap, "
            f"alibi_slopes); not for {'NumPy/CuPy arrays' if not given else ', '.join(given)}: "
            "pass return_lse=True for (out, lse), or draw the pattern from its definition "
            "(docs/masks.md, uniform)")
    return 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)


def _s_dmask(q, k, softmax_scale, causal, window_size, softcap, alibi_slopes, arch, config,
             num_splits, score_mod, mask_mod, sinks, attn_mask, p, seed):
    """FlashAttention-2's S_dmask of a torch call with dropout (attn_probs.py)."""
    scale = _s_dmask_scale(q, softmax_scale, score_mod=score_mod, mask_mod=mask_mod,
                           sinks=sinks, attn_mask=attn_mask)
    from .attn_probs import s_dmask
    return s_dmask(q.detach(), k.detach(), scale, causal, _window(window_size), float(softcap),
                   alibi_slopes, p, seed)


def _returned(out, lse, return_attn_probs, return_lse, probs=None):
    """flash_attn_func's result from (out, lse with -inf for a query that sees no key);
    probs: S_dmask, None without dropout."""
    if return_attn_probs:
        # FlashAttention writes +inf as the LSE of a query that sees no key.
        if _kind(lse) == "torch":
            lse = lse.masked_fill(lse == float("-inf"), float("inf"))
        else:
            lse[lse == float("-inf")] = float("inf")
        return out, lse, probs
    return (out, lse) if return_lse else out


class _Torch:
    """What the repeat path reads of torch on every call, looked up once torch is
    imported: the Tensor type, grad mode, torch.compile's tracing flag, the current raw
    CUDA stream."""
    module = None

    @classmethod
    def get(cls):
        torch = sys.modules.get("torch")
        if torch is not cls.module and torch is not None:
            cls.tensor = torch.Tensor
            cls.float32 = torch.float32
            cls.sinks_dtypes = (torch.float32, torch.bfloat16, torch.float16)
            cls.grad_enabled = torch.is_grad_enabled
            cls.compiling = torch_ops.compiling_check(torch)
            cls.stream = _stream_getter(torch)
            cls.module = torch
        return torch


def _sinks_key(sinks):
    """The repeat key's part of a call's sinks: None without; the shape, dtype and
    device of a contiguous float32, bfloat16 or float16 torch tensor (a parameter too)
    whose gradient is not asked for (read per call); False for any other, which takes
    the full path."""
    if sinks is None:
        return None
    if _Torch.module is None or not isinstance(sinks, _Torch.tensor) or \
            sinks.dtype not in _Torch.sinks_dtypes or not sinks.is_contiguous() or \
            (sinks.requires_grad and _Torch.grad_enabled()):
        return False
    return sinks.shape, sinks.dtype, sinks.get_device()


def _repeat_key(q, k, v, *args):
    """The _REPEATS key of a plain torch call (no per-call arrays but sinks, grad not
    needed, not under torch.compile), None for any other call. None too until a call
    has recorded a repeat (and with it looked up _Torch): a first call may be inside a
    torch.compile trace, which must not see _Torch change. The last of `args` is the
    call's _sinks_key: False is no repeat."""
    if args[-1] is False:
        return None
    torch = sys.modules.get("torch")
    if torch is None or torch is not _Torch.module:
        return None
    tensor = _Torch.tensor
    if type(q) is not tensor or type(k) is not tensor or type(v) is not tensor:
        return None
    if (q.requires_grad or k.requires_grad or v.requires_grad) and _Torch.grad_enabled():
        return None
    if _Torch.compiling():
        return None
    # get_device: the index, -1 on the CPU (cheaper than .device, an object per call).
    # Not hashed here (a tuple's hash is not kept, and the lookup hashes it): an
    # unhashable key (window_size as a list) is never looked up or recorded.
    return (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype,
            v.dtype, q.get_device(), k.get_device(), v.get_device(), *args)


def _hashable(key):
    """Whether `key` hashes (a tuple may hold a list)."""
    try:
        hash(key)
        return True
    except TypeError:
        return False


def _stream_getter(torch):
    """A function of a CUDA device index: torch's current stream there, as a pointer."""
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return get or (lambda index: torch.cuda.current_stream(index).cuda_stream)


def _raw_stream(torch, index):
    """torch's current stream on CUDA device `index`, as a pointer."""
    return _stream_getter(torch)(index)


def _live_handle(handle_key):
    """The handle of `handle_key`, now the most recently used; None once evicted."""
    handle = _ATTENTIONS.get(handle_key)
    if handle is not None:
        _ATTENTIONS.move_to_end(handle_key)
    return handle


# fj_attention_forward_shape with every argument a pointer-sized integer: the repeat
# path's call (no fj_tensors to build; the spec's address is kept with the repeat).
_FORWARD_POINTERS = _lib.lib["fj_attention_forward_shape"]
_FORWARD_POINTERS.argtypes = [ctypes.c_void_p] * 8
_FORWARD_POINTERS.restype = ctypes.c_int


def _fast_forward(key, q, k, v, sinks=None):
    """A repeat of a plain torch call that ran before: the same spec (its shapes,
    strides and arguments are the key's), new pointers and outputs. (out, lse), or
    None when the call has not run before or its handle was evicted. `sinks`, as the
    key's _sinks_key allowed: its pointer goes with the tensors."""
    try:
        seen = _REPEATS.get(key)
    except TypeError:  # e.g. window_size as a list: the full path takes it
        return None
    if seen is None:
        return None
    handle_key, spec, out_shape, lse_shape, index, _, spec_address = seen
    if sinks is not None:  # a 16-bit model parameter widened exactly, as the full path does
        wide = sinks if sinks.dtype is _Torch.float32 else sinks.float()
        return _fast_call(handle_key, spec, out_shape, lse_shape, index, q, k, v,
                          sinks=wide.data_ptr())
    handle = _live_handle(handle_key)
    if handle is None:
        return None
    out = q.new_empty(out_shape)
    lse = q.new_empty(lse_shape, dtype=_Torch.float32) if lse_shape else None
    code = _FORWARD_POINTERS(handle.value, spec_address, q.data_ptr(), k.data_ptr(),
                             v.data_ptr(), out.data_ptr(),
                             lse.data_ptr() if lse is not None else None, _Torch.stream(index))
    if code:
        _lib.check(code, "fj_attention_forward_shape")
    return out, lse


def _fast_call(handle_key, spec, out_shape, lse_shape, index, q, k, v, **pointers):
    """fj_attention_forward_tensors of a repeat: the handle of `handle_key`, the spec its
    first call built, new outputs of those shapes, the named arrays' `pointers`, torch's
    current stream on CUDA device `index`. (out, lse), or None when the handle was
    evicted."""
    handle = _live_handle(handle_key)
    if handle is None:
        return None
    import torch
    out = torch.empty(out_shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device) if lse_shape else None
    t = _lib.Tensors(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), out=out.data_ptr(),
                     lse=lse.data_ptr() if lse is not None else None)
    for name, pointer in pointers.items():
        setattr(t, name, pointer)
    stream = _raw_stream(torch, index)
    _lib.check(_lib.lib.fj_attention_forward_tensors(
        handle, ctypes.byref(spec), ctypes.byref(t), ctypes.c_void_p(stream) if stream else None),
        "fj_attention_forward_tensors")
    return out, lse


def _attention_forward(q, k, v, want_lse, softmax_scale, causal, window_size, softcap,
                       alibi_slopes, arch, config, num_splits, score_mod, mask_mod, sinks,
                       attn_mask=None, dropout_p=0.0, dropout_seed=0, repeat=None):
    """The forward call of flash_attn_func: (out, lse or None), lse -inf where a query
    sees no key. `repeat`, a _repeat_key: once the call has run, _fast_forward runs its
    repeats."""
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or \
            not 0 <= num_splits <= 128:
        raise InputError(f"flashjit: num_splits must be an int in 0..128 (0: chosen per call, 1: "
                         f"off), got {num_splits!r}")
    window = _window(window_size)
    scale = _scale(softmax_scale)
    kinds = {_kind(x) for x in (q, k, v)}
    if len(kinds) != 1:
        raise InputTypeError(f"flashjit: q, k and v must be of one kind, got {sorted(kinds)}")
    kind = kinds.pop()
    b, sq, sk, hq, hkv, d, dv, dtype = _check_qkv(q, k, v, kind, f32=True)
    device, stream = _device(q, kind, arch)

    if kind == "numpy" and dtype == "f32":  # read as they are; out float32, NaN until written
        import numpy as np
        out16 = np.full((b, sq, hq, dv), np.nan, dtype=np.float32)
        lse = np.full((b, hq, sq), np.nan, dtype=np.float32) if want_lse else None
        ins = (q, k, v)
    elif kind == "numpy":
        import numpy as np
        if dtype == "bf16":
            q16, k16, v16 = (_bf16_bits(x) for x in (q, k, v))
        else:
            q16, k16, v16 = q, k, v
        # Outputs start as NaN, so anything the kernel failed to write shows.
        if dtype == "bf16":
            out16 = np.full((b, sq, hq, dv), 0x7FC0, dtype=np.uint16)
        else:
            out16 = np.full((b, sq, hq, dv), np.nan, dtype=np.float16)
        lse = np.full((b, hq, sq), np.nan, dtype=np.float32) if want_lse else None
        ins = (q16, k16, v16)
    elif kind == "torch":
        import torch
        out16 = torch.empty((b, sq, hq, dv), dtype=q.dtype, device=q.device)
        lse = torch.empty((b, hq, sq), dtype=torch.float32, device=q.device) if want_lse else None
        ins = (q, k, v)
    else:
        import cupy
        out16 = cupy.empty((b, sq, hq, dv), dtype=q.dtype)
        lse = cupy.empty((b, hq, sq), dtype=cupy.float32) if want_lse else None
        ins = (q, k, v)

    strides = [_strides(x, kind) for x in ins] + [_strides(out16, kind)]
    spec = _spec(b, sq, sk, hq, hkv, d, dv, dtype, scale, causal, window, want_lse, strides)
    spec.num_splits = num_splits
    mods, slopes, sink_ptr, keep = _modifiers(
        spec, kind, None if kind == "numpy" else str(q.device), b, hq, softcap, alibi_slopes,
        score_mod, mask_mod, sinks)
    mask_type, mask_ptr, mask_view = _mask_tensor(
        spec, kind, None if kind == "numpy" else str(q.device), attn_mask, (b, hq, sq, sk))
    spec.dropout_p, spec.dropout_seed = dropout_p, dropout_seed
    signature = (_signature(dtype, d, dv, causal, window, want_lse, strides) + mods +
                 (mask_type, dropout_p > 0))
    handle = _attention(signature, spec, device, config, kind)  # creating one validates the spec
    _forward(handle, spec, kind, stream, *ins, out16, lse, alibi_slopes=slopes, sinks=sink_ptr,
             attn_mask=mask_ptr)
    if repeat is not None and _hashable(repeat):
        if len(_REPEATS) >= MAX_REPEATS:
            _REPEATS.clear()
        # The spec's score_mod / mask_mod point into `keep`'s strings: kept with it.
        _REPEATS[repeat] = (_handle_key(signature, device), spec, tuple(out16.shape),
                            tuple(lse.shape) if lse is not None else None,
                            q.device.index or 0, keep, ctypes.addressof(spec))
    del keep, mask_view
    out = out16
    if kind == "numpy" and dtype == "bf16":
        out = (out16.astype("uint32") << 16).view("float32")
    return out, lse


def _check_qkv(q, k, v, kind, f32=False):
    """(batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, head_dim_v, dtype name) of
    FlashAttention's BSHD q, k, v, or an error naming what does not fit. `f32`: float32
    inputs are "f32" (f32 tensors in memory, the forward's f32_io), else NumPy's float32
    is "bf16" (converted on the host) and other float32 inputs are refused."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if len(x.shape) != 4:
            raise InputError(f"flashjit: {name} must be 4-D [batch, seqlen, heads, head_dim], got "
                             f"shape {tuple(x.shape)}")
    b, sq, hq, d = q.shape
    bk, sk, hkv, dk = k.shape
    bv, skv, hv, dv = v.shape
    if not (b == bk == bv):
        raise InputError(f"flashjit: batch sizes differ: q {b}, k {bk}, v {bv}")
    if sk != skv or hkv != hv:
        raise InputError(f"flashjit: k {tuple(k.shape)} and v {tuple(v.shape)} must share seqlen "
                         "and heads")
    if d != dk:
        raise InputError(f"flashjit: q and k head dims differ ({d} vs {dk})")
    if hkv == 0 or hq % hkv:
        raise InputError(f"flashjit: q heads ({hq}) must be a multiple of k/v heads ({hkv})")
    dtypes = {"f32" if f32 and str(x.dtype).endswith("float32") else _dtype_name(x, kind)
              for x in (q, k, v)}
    if None in dtypes or len(dtypes) != 1:
        allowed = {"torch": "torch.bfloat16 or torch.float16", "cupy": "float16",
                   "numpy": "float16 or float32 (as bf16)"}[kind]
        if f32:
            allowed += " (or all float32)"
        raise InputTypeError(f"flashjit: q, k and v must all be {allowed}; got "
                             f"{[str(x.dtype) for x in (q, k, v)]}")
    if kind != "numpy":
        devs = {str(x.device) for x in (q, k, v)}
        if len(devs) != 1:
            raise InputError(f"flashjit: q, k and v are on different devices: {sorted(devs)}")
    return b, sq, sk, hq, hkv, d, dv, dtypes.pop()


def _spec_from_args(batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, head_dim_v, dtype,
                    causal, window_size, softmax_scale, return_lse):
    if dtype not in ("bf16", "f16"):
        raise InputError(f"flashjit: dtype must be 'bf16' or 'f16', got {dtype!r}")
    kv_heads = heads if kv_heads is None else kv_heads
    seqlen_k = seqlen_q if seqlen_k is None else seqlen_k
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, head_dim_v = (
        _int(name, value, 1) for name, value in (
            ("batch", batch), ("heads", heads), ("kv_heads", kv_heads), ("seqlen_q", seqlen_q),
            ("seqlen_k", seqlen_k), ("head_dim", head_dim), ("head_dim_v", head_dim_v)))

    def bshd(tensor, s, h, dd):  # dense BSHD strides: (batch, seq, head, dim)
        if s * h * dd > INT64_MAX:
            raise InputError(f"flashjit: the dense {tensor} tensor's batch stride ({s}*{h}*{dd} "
                             "elements) is past int64: reduce its seqlen, heads or head dim")
        return (s * h * dd, h * dd, dd, 1)
    strides = [bshd("q", seqlen_q, heads, head_dim), bshd("k", seqlen_k, kv_heads, head_dim),
               bshd("v", seqlen_k, kv_heads, head_dim_v), bshd("out", seqlen_q, heads, head_dim_v)]
    spec = _spec(batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, head_dim_v, dtype,
                 _scale(softmax_scale), causal, _window(window_size), return_lse, strides)
    _lib.check(_lib.lib.fj_spec_validate(ctypes.byref(spec)), "spec validation")
    return spec


def emit(*, arch, batch=1, heads=1, kv_heads=None, seqlen_q=128, seqlen_k=None, head_dim=64,
         head_dim_v=None, dtype="bf16", causal=False, window_size=(-1, -1), softmax_scale=None,
         return_lse=False):
    """The generated HIP source for a spec on `arch` (e.g. 'gfx1201', 'sm_90')."""
    arch_c = _c_str("arch", arch)
    spec = _spec_from_args(batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, head_dim_v,
                           dtype, causal, window_size, softmax_scale, return_lse)
    out = ctypes.c_void_p()
    _lib.check(_lib.lib.fj_emit(ctypes.byref(spec), arch_c, ctypes.byref(out)), "fj_emit")
    return _lib.take_string(out)


def compile(*, arch, compiler="auto", **spec_args):
    """Compiles the kernel for a spec on `arch` and returns its resource report as a dict
    (VGPRs, SGPRs, spills, scratch, LDS, wave size, occupancy, matrix instructions)."""
    arch_c, compiler_c = _c_str("arch", arch), _c_str("compiler", compiler)
    spec = _spec_from_args(**{**dict(batch=1, heads=1, kv_heads=None, seqlen_q=128, seqlen_k=None,
                                     head_dim=64, head_dim_v=None, dtype="bf16", causal=False,
                                     window_size=(-1, -1), softmax_scale=None, return_lse=False),
                              **spec_args})
    out = ctypes.c_void_p()
    _lib.check(_lib.lib.fj_compile_report(ctypes.byref(spec), arch_c, compiler_c,
                                          ctypes.byref(out)), "fj_compile_report")
    return json.loads(_lib.take_string(out))
