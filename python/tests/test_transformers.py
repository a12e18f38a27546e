"""flashjit as transformers' attention implementation (flashjit.integrations): a
Llama-architecture model with random weights (head_dim 80, GQA 8:2, bf16) on CUDA runs
prefill of a left-padded batch and greedy generation with attn_implementation="fj"
and with "sdpa" (PyTorch). Tolerance: the prefill logits of the real (unpadded)
positions agree within 5e-2 of the largest logit magnitude, and the greedy tokens of the
first steps agree (random-weight logits are well separated at the first steps; later
ones may diverge on bf16 ties, so only the first 4 are compared)."""
import pytest


def test_llama_prefill_and_generation_match_sdpa():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import flashjit.integrations
    flashjit.integrations.register_transformers()
    def config(attn):
        c = transformers.LlamaConfig(vocab_size=512, hidden_size=640, intermediate_size=1024,
                                     num_hidden_layers=2, num_attention_heads=8,
                                     num_key_value_heads=2, head_dim=80,
                                     max_position_embeddings=512)
        c._attn_implementation = attn
        return c
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(config("sdpa")).to("cuda", torch.bfloat16).eval()
    mine = transformers.LlamaForCausalLM(config("fj")).to("cuda", torch.bfloat16).eval()
    mine.load_state_dict(ref.state_dict())
    assert mine.config._attn_implementation == "fj"
    ids = torch.randint(0, 512, (2, 37), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :11] = 0  # left padding of the second sequence
    with torch.no_grad():
        a = ref(input_ids=ids, attention_mask=mask).logits.float()
        b = mine(input_ids=ids, attention_mask=mask).logits.float()
        real = mask.bool()
        err = (a[real] - b[real]).abs().max().item() / a[real].abs().max().item()
        assert err < 5e-2, f"prefill logits differ by {err:.3g} of the largest"
        ga = ref.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12,
                          do_sample=False, pad_token_id=0)
        gb = mine.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12,
                           do_sample=False, pad_token_id=0)
    assert torch.equal(ga[:, 37:41], gb[:, 37:41]), (ga[:, 37:], gb[:, 37:])
