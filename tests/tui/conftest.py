"""TUI fixtures: a fresh SPECTUI_HOME per test, with the embedded model linked in when needed.

`model_home` links `<SPECTUI_HOME>/cache/models/smollm2-135m` to the session's converted
embedded model, so the app loads it without fetching anything. `tiny_model` is a random 2-layer LLaMA folder
with the embedded model's tokenizer: a real engine process that loads in seconds. Async tests
run on anyio's pytest plugin (asyncio backend).
"""

from __future__ import annotations


import pytest
from tiny_models import save_tiny_llama


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def fresh_home(tmp_path, monkeypatch, spectui_home):
    """A new SPECTUI_HOME: no config, history or models of its own. What load builds once per machine
    and keeps in the model cache (the compiled C kernels, a model's 4-bit weights) is linked to the
    session home's, as a second run finds it: the first build is the session's (tests/engine)."""
    home = tmp_path / "home"
    models = home / "cache" / "models"
    models.mkdir(parents=True)
    shared = spectui_home / "cache" / "models"
    for built in ("kernels", "quantized"):
        (shared / built).mkdir(parents=True, exist_ok=True)
        (models / built).symlink_to(shared / built, target_is_directory=True)
    monkeypatch.setenv("SPECTUI_HOME", str(home))
    return home


@pytest.fixture
def model_home(fresh_home, embedded_dir):
    (fresh_home / "cache" / "models" / "smollm2-135m").symlink_to(embedded_dir, target_is_directory=True)
    return fresh_home


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, embedded_dir):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny") / "verifier", embedded_dir, seed=1)  # with its chat template
