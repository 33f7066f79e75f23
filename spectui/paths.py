"""Where spectui keeps its files: config, chat history and the model cache, and how it makes them.

platformdirs gives the usual per-user folders; SPECTUI_HOME, when set, relocates all three
under one folder (tests point it at a temp dir). What spectui writes is private: folders it
creates are 0700 (`private_dir`), files 0600 (`private_file`, `write_private`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
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


def exports_dir() -> Path:
    return data_dir() / "exports"


def models_dir() -> Path:
    return cache_dir() / "models"


def private_dir(folder: Path) -> Path:
    """mkdir -p; every folder this creates is 0700 whatever the umask (existing ones are left alone)."""
    missing, here = [], Path(folder)
    while not here.exists() and here != here.parent:
        missing.append(here)
        here = here.parent
    for path in reversed(missing):
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:  # made meanwhile by someone else: theirs
            continue
        os.chmod(path, 0o700)
    return Path(folder)


def private_file(path: Path) -> None:
    """Create `path` empty and 0600 when it does not exist (in a private folder)."""
    private_dir(Path(path).parent)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass


def write_private(path: Path, text: str) -> Path:
    """Replace `path` with `text` atomically (temp file, fsync, rename), 0600. A symlink's target is replaced."""
    target = Path(path).resolve()
    private_dir(target.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)  # mkstemp: 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target

