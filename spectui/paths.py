"""Where spectui keeps its files: config, chat history and the model cache, and how it makes them.

platformdirs gives the usual per-user folders; SPECTUI_HOME, when set, relocates all three
under one folder (tests point it at a temp dir). The engine knows none of this: its callers
(the CLI, the app's engine process, bench, tune) hand it `models_dir()` and `costs_dir()`.
What spectui writes is private: folders it creates are 0700 (`private_dir`), files 0600
(`private_file`, `write_private`; the engine's `spectui.engine.files`, which writes its cache
markers the same way).
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from .engine import private_dir, write_private  # noqa: F401  (re-exported: config and store write with them)

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


def exports_dir() -> Path:
    return data_dir() / "exports"


def models_dir() -> Path:
    """The model cache: converted models, hub snapshots (the engine's `models_dir`)."""
    return cache_dir() / "models"


def costs_dir() -> Path:
    """Measured step costs and what the auto tree learned, per machine and model (the engine's `cost_cache`)."""
    return cache_dir() / "costs"


def engine_log_file() -> Path:
    """Where the app's engine process writes its output (the folder is created)."""
    return private_dir(cache_dir() / "logs") / "engine.log"


def private_file(path: Path) -> None:
    """Create `path` empty and 0600 when it does not exist (in a private folder)."""
    private_dir(Path(path).parent)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
