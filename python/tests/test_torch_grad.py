"""Issue 15, step 1: flash_attn_func has no backward yet, so torch inputs that require
grad while grad mode is on are refused rather than returning an output detached from
autograd (a gradient silently lost). Needs torch; runs on the CPU too: the check comes
before the device check, and on a CPU-only machine the calls that pass it stop at
"torch tensors must live on a GPU"; on a CUDA machine they run."""
import pytest

torch = pytest.importorskip("torch")

import flashjit  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make(requires_grad):
    return [(torch.rand(1, 16, 2, 32) * 2 - 1).to(DEVICE, torch.float16).requires_grad_(r)
            for r in requires_grad]


@pytest.mark.parametrize("requires_grad,message", [
    ((True, True, True), r"q, k, v require grad .*issue 15.*torch\.no_grad\(\)"),
    ((False, True, False), r"k requires grad .*torch\.no_grad\(\).*k\.detach\(\)"),
])
def test_issue15_inputs_requiring_grad_are_refused_in_grad_mode(requires_grad, message):
    q, k, v = make(requires_grad)
    assert torch.is_grad_enabled()
    with pytest.raises(NotImplementedError, match=message):
        flashjit.flash_attn_func(q, k, v, causal=True)
    with pytest.raises(NotImplementedError, match=message):
        flashjit.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)


def past_the_grad_check(q, k, v):
    if DEVICE == "cuda":
        out = flashjit.flash_attn_func(q, k, v, causal=True)
        torch.cuda.synchronize()
        assert out.shape == q.shape and not torch.isnan(out).any()
    else:
        with pytest.raises(ValueError, match="must live on a GPU"):
            flashjit.flash_attn_func(q, k, v, causal=True)


def test_issue15_no_grad_inference_mode_and_detach_are_the_way_out():
    q, k, v = make((True, True, True))
    with torch.no_grad():
        past_the_grad_check(q, k, v)
    with torch.inference_mode():
        past_the_grad_check(q, k, v)
    past_the_grad_check(q.detach(), k.detach(), v.detach())
    past_the_grad_check(*make((False, False, False)))  # nothing requires grad
