"""TUI fixtures: a fresh SPECTUI_HOME per test, with the embedded model linked in when needed.

`model_home` links `<SPECTUI_HOME>/cache/models/smollm2-135m` to the session's converted
embedded model, so the app loads it without fetching anything. Async tests run on anyio's
pytest plugin (asyncio backend).
"""

from __future__ import annotations

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
