"""TUI fixtures: a fresh SPECTUI_HOME per test, with the embedded model linked in when needed.

`model_home` links `<SPECTUI_HOME>/cache/models/smollm2-135m` to the session's converted
embedded model, so the app loads it without fetching anything. `tiny_model` is a random 2-layer LLaMA folder
with the embedded model's tokenizer: a real engine process that loads in seconds. Async tests
run on anyio's pytest plugin (asyncio backend).
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def fresh_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("SPECTUI_HOME", str(home))
    return home


@pytest.fixture
def model_home(fresh_home, embedded_dir):
    models = fresh_home / "cache" / "models"
    models.mkdir(parents=True)
    (models / "smollm2-135m").symlink_to(embedded_dir, target_is_directory=True)
    return fresh_home


def tiny_llama(folder: Path, tokenizer_dir: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         tie_word_embeddings=False)
    torch.manual_seed(1)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)  # with its chat template
    return folder


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, embedded_dir):
    return tiny_llama(tmp_path_factory.mktemp("tiny") / "verifier", embedded_dir)
