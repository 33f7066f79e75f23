"""The verifier as loaded on CPU: fused 4-bit kernel, exact attention, guarded output layer.

The property that makes tree verification lossless on it: a token's hidden state has the same
bits whether the verifier computes it in one pass with other tokens or alone, one token after
another, and its greedy choice is the one-token choice.
"""

from __future__ import annotations

import pytest
import torch
from bitsandbytes.functional import has_avx512bf16
from transformers import DynamicCache

from spectui.engine.chat import encode_chat
from spectui.kernels.guarded_head import GuardedHead

PROMPTS = ["Summarise the plot of Hamlet in two sentences.", "Write a Python function that reverses a list."]


def hidden_and_logits(model, prompt_ids, tokens, one_by_one: bool):
    cache = DynamicCache(config=model.config)
    model(input_ids=prompt_ids, past_key_values=cache, use_cache=True)
    chunks = [tokens[:, i:i + 1] for i in range(tokens.shape[1])] if one_by_one else [tokens]
    hidden, logits = [], []
    for chunk in chunks:
        out = model(input_ids=chunk, past_key_values=cache, use_cache=True, output_hidden_states=True)
        hidden.append(out.hidden_states[-1][0])
        logits.append(out.logits[0])
    return torch.cat(hidden), torch.cat(logits)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_a_chain_pass_gives_each_token_its_one_token_bits(embedded_models, prompt):
    m = embedded_models
    assert m.attention_backend == "exact" and isinstance(m.verifier.lm_head, GuardedHead)
    ids = torch.tensor([encode_chat(m.tokenizer, [{"role": "user", "content": prompt}])])
    with torch.inference_mode():
        answer = m.verifier.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                                     pad_token_id=m.stop_token_ids()[0])[:, ids.shape[1]:]
        h_chain, z_chain = hidden_and_logits(m.verifier, ids, answer, one_by_one=False)
        h_single, z_single = hidden_and_logits(m.verifier, ids, answer, one_by_one=True)
    assert torch.equal(h_chain, h_single)  # bitwise, through 30 layers of bf16-rounded 4-bit matmuls
    assert torch.equal(z_chain.argmax(-1), z_single.argmax(-1))
    assert torch.equal(z_single.argmax(-1)[:-1], answer[0, 1:])  # and that is what generate() chose
    torch.testing.assert_close(z_chain, z_single, atol=1e-3, rtol=0)


def test_the_4bit_layers_run_the_kernel_chosen_for_this_cpu(embedded_models):
    """spectui's kernel (kernels/nf4_cpu.py) where its AVX-512 path runs, or where bitsandbytes has no fused
    kernel for this CPU; bitsandbytes' fused bf16 kernel (its packed CPU layout) where the CPU has AVX512-BF16
    and spectui's kernel would run its AVX2 path."""
    import bitsandbytes as bnb

    from spectui.kernels import nf4_cpu

    with torch.inference_mode():
        embedded_models.verifier(input_ids=torch.tensor([[1, 2, 3]]))  # bitsandbytes repacks at the first forward
    layers = [mod for mod in embedded_models.verifier.modules() if isinstance(mod, bnb.nn.Linear4bit)]
    assert layers and all(layer.weight.quant_state is not None for layer in layers)
    packed = {bool(getattr(layer.weight.quant_state, "packing_format_for_cpu", False)) for layer in layers}
    ours = {nf4_cpu.uses_kernel(layer) for layer in layers}
    described = embedded_models.verifier.spectui_4bit
    assert len(ours) == 1 and described.startswith("spectui 4-bit kernel") == ours.pop()
    fused = has_avx512bf16() and not described.startswith(("spectui 4-bit kernel (AVX-512", "spectui 4-bit kernel (AMX"))
    assert packed == {fused}
