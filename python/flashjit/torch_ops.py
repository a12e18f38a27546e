"""flash_attn_func as torch.library custom ops (flashjit::attention_forward and
flashjit::attention_backward) with fake implementations and autograd, so that
torch.compile traces through flashjit without a graph break (fullgraph=True works).
flash_attn_func routes torch tensors here while torch.compile traces; eager calls
keep the direct path (no dispatcher overhead). `import flashjit` registers the ops
when torch is already imported, else right after `import torch` (register_after_torch_import):
registering them while torch.compile traces fails."""

import importlib.abc
import importlib.util
import sys
from typing import Optional

_OPS = None


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """A finder that steps aside for torch's own and, once torch's module has run,
    registers the ops (never failing torch's import: ops() is retried on first use)."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # once, and not for the lookup below
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            try:
                ops()
            except Exception:  # a torch too old or too new for custom_op: left to the call
                pass
        spec.loader.exec_module = exec_module
        return spec


def register_after_torch_import():
    """Registers the ops right after torch is imported (nothing if it never is)."""
    if not any(isinstance(f, _AfterTorchImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorchImport())


def compiling_check(torch):
    """torch.compiler.is_compiling, or a function that says False where torch has none."""
    return getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)


def compiling():
    """Whether torch.compile is tracing the caller (False without torch.compiler)."""
    import torch
    return bool(compiling_check(torch)())


def ops():
    """The registered (forward, backward) ops."""
    global _OPS
    if _OPS is not None:
        return _OPS
    import torch
    from torch import Tensor
    from torch.library import custom_op

    from .api import _attention_forward
    from .backward import flash_attn_backward

    @custom_op("flashjit::attention_forward", mutates_args=())
    def forward(q: Tensor, k: Tensor, v: Tensor, softmax_scale: Optional[float], causal: bool,
                window_left: int, window_right: int, softcap: float,
                alibi_slopes: Optional[Tensor], num_splits: int, score_mod: Optional[str],
                mask_mod: Optional[str], attn_mask: Optional[Tensor], dropout_p: float,
                dropout_seed: int, sinks: Optional[Tensor]) -> tuple[Tensor, Tensor]:
        return _attention_forward(q, k, v, True, softmax_scale, causal,
                                  (window_left, window_right), softcap, alibi_slopes, None, None,
                                  num_splits, score_mod, mask_mod, sinks, attn_mask, dropout_p,
                                  dropout_seed)

    @forward.register_fake
    def _(q, k, v, *args):
        b, sq, hq, _ = q.shape
        return (q.new_empty((b, sq, hq, v.shape[-1])),
                q.new_empty((b, hq, sq), dtype=torch.float32))

    @custom_op("flashjit::attention_backward", mutates_args=())
    def backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                 softmax_scale: Optional[float], causal: bool, window_left: int,
                 window_right: int, softcap: float, alibi_slopes: Optional[Tensor],
                 score_mod: Optional[str], mask_mod: Optional[str],
                 attn_mask: Optional[Tensor], dropout_p: float, dropout_seed: int,
                 sinks: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(dq, dk, dv, dsinks): dsinks float32 [heads] with sinks, else empty (an op
        returns tensors)."""
        grads = flash_attn_backward(dout, q, k, v, out, lse, dropout_p, softmax_scale, causal,
                                    (window_left, window_right), softcap, alibi_slopes,
                                    score_mod=score_mod, mask_mod=mask_mod, attn_mask=attn_mask,
                                    dropout_seed=dropout_seed if dropout_p else None,
                                    sinks=sinks)
        return grads if sinks is not None else grads + (q.new_empty(0, dtype=torch.float32),)

    @backward.register_fake
    def _(dout, q, k, v, *args):
        sinks = args[-1]
        return tuple(torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
                     for x in (q, k, v)) + (
            q.new_empty(sinks.shape[0] if sinks is not None else 0, dtype=torch.float32),)

    def setup_context(ctx, inputs, output):
        q, k, v = inputs[:3]
        ctx.save_for_backward(q, k, v, *output, inputs[-1])  # the last input: sinks
        ctx.args = inputs[3:-1]

    def run_backward(ctx, dout, _dlse):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        (softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, _splits,
         score_mod, mask_mod, attn_mask, dropout_p, dropout_seed) = ctx.args
        dq, dk, dv, dsinks = backward(dout, q, k, v, out, lse, softmax_scale, causal,
                                      window_left, window_right, softcap, alibi_slopes,
                                      score_mod, mask_mod, attn_mask, dropout_p, dropout_seed,
                                      sinks)
        # The sinks' gradient in their own dtype (a model's bf16 parameter), as eagerly.
        dsinks = dsinks.to(sinks.dtype) if sinks is not None else None
        return (dq, dk, dv) + (None,) * len(ctx.args) + (dsinks,)

    forward.register_autograd(run_backward, setup_context=setup_context)
    _OPS = (forward, backward)
    return _OPS


def attention(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, arch, config,
              num_splits, score_mod, mask_mod, sinks, attn_mask, dropout_p, dropout_seed,
              seed_given=True):
    """flash_attn_func's (out, lse) through the custom op, for torch.compile."""
    refused = [name for name, value in (("arch", arch), ("config", config)) if value is not None]
    if refused:
        raise NotImplementedError(f"flashjit: under torch.compile, flash_attn_func does not take "
                                  f"{', '.join(refused)} yet: call it eagerly (e.g. "
                                  f"torch.compiler.disable) or drop them")
    window_left, window_right = window_size
    return ops()[0](q, k, v, softmax_scale, bool(causal), int(window_left), int(window_right),
                    float(softcap), alibi_slopes, int(num_splits), score_mod, mask_mod,
                    attn_mask, float(dropout_p), int(dropout_seed), sinks)
