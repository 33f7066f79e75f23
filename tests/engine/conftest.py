"""Engine fixtures: the embedded model loaded as the verifier, and tiny random LLaMA folders.

Tiny models share the embedded model's tokenizer (so they can speculate for it), are seeded,
and are saved to temp folders: they exercise the folder path, quantisation and bad SSMs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tiny_models import save_tiny_llama


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


@pytest.fixture(scope="session")
def tiny_verifier(tmp_path_factory, tiny_dirs, embedded_dir) -> Path:
    """The tiny random LLaMA verifier of tiny_dirs, given the embedded tokenizer's chat template
    (what `spectui tune` needs to render prompts)."""
    folder = tmp_path_factory.mktemp("tune") / "verifier"
    shutil.copytree(tiny_dirs["verifier"], folder)
    shutil.copy(embedded_dir / "chat_template.jinja", folder / "chat_template.jinja")
    return folder
