"""How spectui writes its files: private (folders 0700, files 0600) and atomic.

The engine writes its cache markers this way; the app (spectui/paths.py) its config, history
and exports.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


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
