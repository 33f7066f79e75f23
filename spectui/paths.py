"""Where spectui keeps its files: config, chat history and the model cache.

platformdirs gives the usual per-user folders; SPECTUI_HOME, when set, relocates all three
under one folder (tests point it at a temp dir).
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "spectui"


def _home() -> Path | None:
    home = os.environ.get("SPECTUI_HOME")
    return Path(home).expanduser() if home else None


def config_dir() -> Path:
    home = _home()
    return home / "config" if home else Path(platformdirs.user_config_dir(APP))


def data_dir() -> Path:
    home = _home()
    return home / "data" if home else Path(platformdirs.user_data_dir(APP))


def cache_dir() -> Path:
    home = _home()
    return home / "cache" if home else Path(platformdirs.user_cache_dir(APP))


def config_file() -> Path:
    return config_dir() / "config.toml"


def history_db() -> Path:
    return data_dir() / "history.sqlite3"


def models_dir() -> Path:
    return cache_dir() / "models"
