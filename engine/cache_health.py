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


def hub_cache_problem(repo_id: str, models_dir: Path) -> str | None:
    """None when the pinned (else main) snapshot of repo_id is cached and passes `entry_problem`."""
    from huggingface_hub import try_to_load_from_cache

    from .presets import hub_revision

    found = try_to_load_from_cache(repo_id, "config.json", cache_dir=hub_cache(models_dir), revision=hub_revision(repo_id))
    return entry_problem(Path(found).parent, models_dir) if isinstance(found, str) else "not downloaded"


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
