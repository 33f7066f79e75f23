"""Model-cache entries: whether one is sound, its marker, and deleting a damaged one.

Every entry of the model cache (the embedded default's conversion, converted GGUF files, hub
snapshots) carries a marker written last (engine/embedded.py: files, sizes, fingerprints, source,
revision). An entry is checked against it at every load; a damaged one is set aside and rebuilt or
fetched again (engine/loading.py). Folders outside the cache are the user's: never checked or deleted.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path


def hub_cache(models_dir: Path) -> Path:
    return Path(models_dir) / "hub"


def in_model_cache(folder: Path, models_dir: Path) -> bool:
    return Path(folder).resolve().is_relative_to(Path(models_dir).resolve())


def entry_problem(folder: Path, models_dir: Path) -> str | None:
    """Why a model-cache entry is damaged (None: it is sound, or it is not in the cache, so not ours).

    With a marker: sizes and fingerprints (embedded.marker_problem); without one (cached by an older
    spectui, or by huggingface_hub itself): config.json, JSON files and safetensors lengths."""
    from .embedded import CACHE_MARKER, marker_problem, read_marker

    if not in_model_cache(folder, models_dir):
        return None
    if not Path(folder).is_dir():
        return "it is missing"
    return marker_problem(Path(folder), read_marker(Path(folder) / CACHE_MARKER) or {})


def mark_entry(folder: Path, info: dict, models_dir: Path) -> None:
    """Write the marker of a sound cache entry that has none (a read-only cache is left as it is)."""
    from .embedded import CACHE_MARKER, read_marker, write_cache_marker

    if in_model_cache(folder, models_dir) and "files" not in (read_marker(folder / CACHE_MARKER) or {}):
        with contextlib.suppress(OSError):
            write_cache_marker(folder, CACHE_MARKER, info)


def discard_entry(folder: Path, models_dir: Path) -> bool:
    """Delete a damaged cache entry (a hub snapshot: its whole repo folder, blobs included); False when
    folder is not inside the model cache, so not spectui's to delete."""
    target, hub = Path(folder).resolve(), hub_cache(models_dir).resolve()
    if target.parent.name == "snapshots" and target.parent.parent.parent == hub:
        target = target.parent.parent
    if not in_model_cache(target, models_dir) or target == hub:
        return False
    shutil.rmtree(target, ignore_errors=True)
    return True
