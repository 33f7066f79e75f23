"""Tiny random LLaMA folders for tests (engine and app): seeded, sharing a real tokenizer's vocabulary; and
a check that two saved weight files hold the same tensors (resumed training against uninterrupted)."""

from __future__ import annotations

from pathlib import Path

import torch


def save_tiny_llama(folder: Path, tokenizer_dir: Path, seed: int, vocab: int | None = None, chat_template=True, **overrides):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=vocab or len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        **overrides,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # sharper next-token distributions than the default init, like a trained LM
        model.lm_head.weight.mul_(40.0)
    model.save_pretrained(folder)
    if vocab is None:
        if not chat_template:
            tokenizer.chat_template = None
        tokenizer.save_pretrained(folder)
        if not chat_template:
            (folder / "chat_template.jinja").unlink(missing_ok=True)
    return folder


def assert_same_weights(got: Path, expected: Path) -> None:
    """Both safetensors files hold the same tensor names, each with the same values to the bit."""
    from safetensors.torch import load_file

    a, b = load_file(got), load_file(expected)
    assert a.keys() == b.keys()
    for name in b:
        assert torch.equal(a[name], b[name]), name
