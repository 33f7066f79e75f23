"""Engine fixtures: the embedded model loaded as the verifier, and tiny random LLaMA folders.

Tiny models share the embedded model's tokenizer (so they can speculate for it), are seeded,
and are saved to temp folders: they exercise the folder path, quantisation and bad SSMs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
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


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory, embedded_dir):
    """Folders: a tiny verifier, two tiny SSMs (same vocabulary), one with a foreign vocabulary."""
    root = tmp_path_factory.mktemp("tiny")
    return {
        "verifier": save_tiny_llama(root / "verifier", embedded_dir, seed=1, chat_template=False),
        "ssm68": save_tiny_llama(root / "ssm68", embedded_dir, seed=2, chat_template=False),
        "ssm160": save_tiny_llama(root / "ssm160", embedded_dir, seed=3, chat_template=False),
        "foreign": save_tiny_llama(root / "foreign", embedded_dir, seed=4, vocab=1000),
    }
