"""ctypes binding of include/flashjit/flashjit.h (the C API of libflashjit.so)."""

import ctypes
import os
import pathlib

FJ_OK = 0
_ERROR_NAMES = {
    1: "invalid argument",
    2: "invalid spec",
    3: "device",
    4: "unsupported",
    5: "compile",
    6: "runtime",
    7: "out of memory",
}
DTYPE_BF16, DTYPE_F16 = 0, 1
LAYOUT_BSHD = 0
ABI_VERSION = 1  # FJ_ABI_VERSION of the flashjit.h these structs mirror


class Strides(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int64), ("head", ctypes.c_int64),
                ("seq", ctypes.c_int64), ("dim", ctypes.c_int64)]


class _Sized(ctypes.Structure):
    """A struct the caller fills: its first field, struct_size, is its sizeof, which the
    library checks (flashjit.h, FJ_ABI_VERSION)."""

    def __init__(self, **fields):
        super().__init__(struct_size=ctypes.sizeof(type(self)), **fields)


class Spec(_Sized):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("batch", ctypes.c_int64), ("heads", ctypes.c_int64), ("kv_heads", ctypes.c_int64),
        ("seqlen_q", ctypes.c_int64), ("seqlen_k", ctypes.c_int64),
        ("head_dim_qk", ctypes.c_int64), ("head_dim_v", ctypes.c_int64),
        ("dtype", ctypes.c_int32), ("layout", ctypes.c_int32), ("scale", ctypes.c_double),
        ("causal", ctypes.c_int32), ("lse", ctypes.c_int32),
        ("window_left", ctypes.c_int64), ("window_right", ctypes.c_int64),
        ("q", Strides), ("k", Strides), ("v", Strides), ("o", Strides),
        ("num_splits", ctypes.c_int64),
        # Sequences (varlen batches, per-batch key counts, paged KV caches).
        ("packed_q", ctypes.c_int32), ("packed_k", ctypes.c_int32), ("used_k", ctypes.c_int32),
        ("total_q", ctypes.c_int64), ("total_k", ctypes.c_int64),
        ("page_size", ctypes.c_int64), ("num_pages", ctypes.c_int64),
        ("pages_per_seq", ctypes.c_int64),
        # Score modifiers (the texts are bytes, NULL when None).
        ("softcap", ctypes.c_double), ("alibi", ctypes.c_int32),
        ("score_mod", ctypes.c_char_p), ("mask_mod", ctypes.c_char_p),
        ("sinks", ctypes.c_int32),
        # A mask tensor (fj_mask_type, and the strides of [batch, heads, seqlen_q, seqlen_k]).
        ("mask_type", ctypes.c_int32),
        ("mask_batch_stride", ctypes.c_int64), ("mask_head_stride", ctypes.c_int64),
        ("mask_q_stride", ctypes.c_int64), ("mask_k_stride", ctypes.c_int64),
        # Dropout: probability, and the seed and offset of its Philox draws.
        ("dropout_p", ctypes.c_double), ("dropout_seed", ctypes.c_uint64),
        ("dropout_offset", ctypes.c_uint64),
        # 1: q, k, v and out are float32 in memory, rounded to dtype in the kernel.
        ("f32_io", ctypes.c_int32),
    ]


class Tensors(_Sized):
    """fj_tensors: the buffers of fj_attention_forward_tensors."""
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p),
        ("out", ctypes.c_void_p), ("lse", ctypes.c_void_p),
        ("cu_seqlens_q", ctypes.c_void_p), ("cu_seqlens_k", ctypes.c_void_p),
        ("seqused_k", ctypes.c_void_p), ("block_table", ctypes.c_void_p),
        ("alibi_slopes", ctypes.c_void_p), ("sinks", ctypes.c_void_p),
        ("attn_mask", ctypes.c_void_p),
    ]


class BackwardTensors(_Sized):
    """fj_backward_tensors: the buffers of fj_attention_backward."""
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p),
        ("out", ctypes.c_void_p), ("lse", ctypes.c_void_p), ("dout", ctypes.c_void_p),
        ("dq", ctypes.c_void_p), ("dk", ctypes.c_void_p), ("dv", ctypes.c_void_p),
        ("alibi_slopes", ctypes.c_void_p), ("attn_mask", ctypes.c_void_p),
        ("cu_seqlens_q", ctypes.c_void_p), ("cu_seqlens_k", ctypes.c_void_p),
        ("sinks", ctypes.c_void_p), ("dsinks", ctypes.c_void_p),
    ]


class Options(_Sized):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("compiler", ctypes.c_char_p), ("rules", ctypes.c_char_p),
        ("allow_fallback", ctypes.c_int32), ("synchronize", ctypes.c_int32),
        ("opt_level", ctypes.c_int32), ("cpu_threads", ctypes.c_int32),
        ("block_m", ctypes.c_int64), ("block_n", ctypes.c_int64), ("waves", ctypes.c_int64),
        ("stages", ctypes.c_int64), ("q_in_lds", ctypes.c_int64), ("pad_k", ctypes.c_int64),
        ("mma_m", ctypes.c_int64), ("persistent", ctypes.c_int64),
        ("prefetch_blocks", ctypes.c_int64), ("dkdv_passes", ctypes.c_int64),
    ]


class FlashJitError(RuntimeError):
    """An error reported by libflashjit; the message names the problem and the fix."""


class InputError(FlashJitError, ValueError):
    """An argument's value refused before any launch. A ValueError, and a RuntimeError as
    FlashAttention's checks raise (code written for FlashAttention catches those)."""


class InputTypeError(FlashJitError, TypeError):
    """An argument's type or dtype refused: a TypeError, and a RuntimeError as
    FlashAttention's checks raise."""


def _candidates():
    env = os.environ.get("FLASHJIT_LIBRARY")
    if env:
        return [env]
    here = pathlib.Path(__file__).resolve().parent
    names = [str(here / "libflashjit.so")]
    # Straight from a build tree: python/flashjit -> <repo>/build/runtime/libflashjit.so
    repo = here.parent.parent
    names += [str(repo / d / "runtime" / "libflashjit.so") for d in ("build", "build-api")]
    names.append("libflashjit.so")  # the loader path
    return names


def _load():
    tried = []
    for name in _candidates():
        if "/" in name and not os.path.exists(name):
            tried.append(f"{name} (missing)")
            continue
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            tried.append(f"{name} ({e})")
    raise ImportError(
        "flashjit: cannot load libflashjit.so; tried: " + "; ".join(tried)
        + ". Build it (scripts/setup.sh) or set FLASHJIT_LIBRARY=/path/to/libflashjit.so")


lib = _load()
try:
    _abi = lib.fj_abi_version()
except AttributeError:
    _abi = 0  # a library from before the struct sizes
if _abi != ABI_VERSION:
    raise ImportError(f"flashjit: {getattr(lib, '_name', 'libflashjit.so')} has C ABI {_abi}, but "
                      f"this Python package speaks ABI {ABI_VERSION}: use the package shipped "
                      "with that library (or point FLASHJIT_LIBRARY at the matching build)")
_p = ctypes.POINTER
lib.fj_last_error.restype = ctypes.c_char_p
lib.fj_version.restype = ctypes.c_char_p
lib.fj_free.argtypes = [ctypes.c_void_p]
lib.fj_spec_init.argtypes = [_p(Spec)]
lib.fj_spec_validate.argtypes = [_p(Spec)]
lib.fj_attention_create.argtypes = [_p(Spec), ctypes.c_char_p, ctypes.c_char_p, _p(ctypes.c_void_p)]
lib.fj_options_init.argtypes = [_p(Options)]
lib.fj_options_init.restype = None
lib.fj_attention_create_ex.argtypes = [_p(Spec), ctypes.c_char_p, _p(Options),
                                       _p(ctypes.c_void_p)]
lib.fj_attention_forward.argtypes = [ctypes.c_void_p] * 5 + [_p(ctypes.c_float), ctypes.c_void_p]
lib.fj_attention_forward_shape.argtypes = [ctypes.c_void_p, _p(Spec)] + [ctypes.c_void_p] * 4 + [
    _p(ctypes.c_float), ctypes.c_void_p]
lib.fj_attention_forward_tensors.argtypes = [ctypes.c_void_p, _p(Spec), _p(Tensors),
                                             ctypes.c_void_p]
lib.fj_attention_backward.argtypes = [ctypes.c_void_p, _p(Spec), _p(BackwardTensors),
                                      ctypes.c_void_p]
lib.fj_spec_signature.argtypes = [_p(Spec), ctypes.c_char_p, ctypes.c_size_t]
lib.fj_attention_explain.argtypes = [ctypes.c_void_p]
lib.fj_attention_explain.restype = ctypes.c_char_p
lib.fj_attention_source.argtypes = [ctypes.c_void_p]
lib.fj_attention_source.restype = ctypes.c_char_p
lib.fj_attention_destroy.argtypes = [ctypes.c_void_p]
lib.fj_emit.argtypes = [_p(Spec), ctypes.c_char_p, _p(ctypes.c_void_p)]
lib.fj_compile_report.argtypes = [_p(Spec), ctypes.c_char_p, ctypes.c_char_p, _p(ctypes.c_void_p)]
lib.fj_list_devices.argtypes = [_p(ctypes.c_void_p)]


def check(code, what):
    if code != FJ_OK:
        msg = (lib.fj_last_error() or b"").decode()
        # A refused argument or spec is a ValueError too, as the Python side's own checks are.
        error = InputError if code in (1, 2) else FlashJitError
        raise error(f"{what} failed ({_ERROR_NAMES.get(code, code)}): {msg}")


def take_string(ptr):
    """Decodes and frees a string the library malloc'ed."""
    try:
        return ctypes.string_at(ptr.value).decode()
    finally:
        lib.fj_free(ptr)
