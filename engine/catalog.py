"""`spectui models`: the presets with their verifier, SSMs, source and whether they are (validly) cached;
what the model cache holds, with its size on disk, and removing an entry of it.

"Cached" means the cache entry passes the same check as a start (files against the entry's marker,
see engine/embedded.py): a truncated or half-written model is reported as not cached, with why.
The model cache is the folder the caller names (`models_dir`, as for engine/loading.py).
"""

from __future__ import annotations

from pathlib import Path

from .presets import BUNDLED, EMBEDDED, PRESETS, Preset


def cache_problem(source: str, models_dir: Path) -> str | None:
    """None when source is cached and sound, else why not ("not downloaded", "model.safetensors is truncated ...")."""
    if source.startswith(BUNDLED):
        return None  # shipped inside the package
    if source == EMBEDDED:
        from .embedded import cache_problem as embedded_problem, embedded_model_dir

        return embedded_problem(embedded_model_dir(models_dir))
    from .cache_health import hub_cache_problem

    return hub_cache_problem(source, models_dir)


def preset_rows(models_dir: Path) -> list[dict]:
    """`spectui models`: one row per preset, cached or not in the model cache models_dir."""
    return [describe(preset, models_dir) for preset in PRESETS.values()]


def describe(preset: Preset, models_dir: Path) -> dict:
    verifier = "SmolLM2-135M-Instruct (embedded GGUF)" if preset.verifier == EMBEDDED else preset.verifier
    ssms = [describe_ssm(s) for s in preset.ssms] + (["ngram (prompt lookup)"] if preset.ngram else [])
    problems = {source: cache_problem(source, models_dir) for source in (preset.verifier, *preset.ssms)}
    notes = [f"{'embedded' if source == EMBEDDED else source}: {problem}"
             for source, problem in problems.items() if problem is not None]
    return {
        "name": preset.name,
        "verifier": verifier,
        "ssms": ssms,
        "extra_ssms": [describe_ssm(s) for s in preset.extra_ssms],  # made for it, not drafted by default
        "source": preset.source,
        "cached": not notes,
        "cache_problems": notes,
        "description": preset.description,
    }


def describe_ssm(source: str) -> str:
    if source.startswith(BUNDLED):
        name = source.removeprefix(BUNDLED)
        kind = "feature head" if name.endswith("-feature") else "boost-tuned"  # ssms/README.md names them so
        return f"{name} ({kind}, shipped with spectui)"
    return source


def model_choices(models_dir: Path) -> list[dict]:
    """The app's model picker: what `spectui models` lists, as --model values (`spec`) with a `label`
    and whether each is `cached`: every preset, then each cached model no preset covers (a hub id,
    or a converted .gguf file's folder)."""
    rows = [{"spec": row["name"], "label": row["description"], "cached": row["cached"]} for row in preset_rows(models_dir)]
    verifiers = {preset.verifier for preset in PRESETS.values()}
    for entry in cache_entries(models_dir):
        if entry["kind"] == "hub" and entry["name"] not in verifiers:
            rows.append({"spec": entry["name"], "label": "hub model in the model cache", "cached": True})
        elif entry["kind"] == "gguf":
            rows.append({"spec": entry["path"], "label": f"{entry['name']} (converted .gguf)", "cached": True})
    return rows


def speculator_choices(model: str, models_dir: Path) -> list[tuple[str, str]]:
    """The model picker's speculators for `model` (a --model value): (choice, label), each choice as
    presets.choose_speculators takes it: a preset's own SSMs first, the n-gram drafter alone, none,
    then every SSM a preset names (drafted by default or extra) that is shipped or cached, with the n-gram drafter."""
    preset = PRESETS.get(model)
    choices = []
    if preset is not None and preset.ssms:
        own = [describe_ssm(source).split(" (")[0] for source in preset.ssms] + (["n-gram"] if preset.ngram else [])
        choices.append(("default", f"the preset's: {', '.join(own)}"))
    choices += [("ngram", "n-gram drafter only (prompt lookup)"), ("none", "none: one token a step, no speculation")]
    owners = sorted(PRESETS.values(), key=lambda p: p is not preset)  # this preset's SSMs first
    for source in dict.fromkeys(source for owner in owners for source in owner.made_for):
        if cache_problem(source, models_dir) is None:
            fits = "" if preset is not None and source in preset.made_for else " (it must share this model's vocabulary)"
            choices.append((source, f"{describe_ssm(source)} + n-gram{fits}"))
    return choices


def folder_bytes(path: Path) -> int:
    """Bytes on disk under path (a file or folder); links are not followed (hub snapshots link to blobs)."""
    path = Path(path)
    if path.is_symlink():
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def cache_entries(models_dir: Path) -> list[dict]:
    """What the model cache holds: one entry per model (name, kind, path, bytes), largest first.

    kinds: "embedded" (the converted default, named by its preset), "wheel" (the package kept for
    offline rebuilds of it, "<preset>-wheel"), "hub" (a hub repository, "org/name", every snapshot),
    "gguf" (a user's converted .gguf, named by its folder), "quantized" (a model's 4-bit copy,
    engine/quantization.py, "quantized/<folder>")."""
    from .embedded import EMBEDDED_NAME, SOURCES_DIR, embedded_model_dir
    from .quantization import FOLDER as QUANTIZED, MARKER

    root = Path(models_dir)
    found = []
    if embedded_model_dir(root).is_dir():
        found.append((EMBEDDED_NAME, "embedded", embedded_model_dir(root)))
    for wheel in sorted((root / SOURCES_DIR).glob("*.whl")):
        found.append((f"{EMBEDDED_NAME}-wheel", "wheel", wheel))
    for repo in sorted((root / "hub").glob("models--*")):
        found.append((repo.name.removeprefix("models--").replace("--", "/"), "hub", repo))
    for folder in sorted((root / "gguf").iterdir() if (root / "gguf").is_dir() else []):
        if folder.is_dir() and not folder.name.startswith("."):
            found.append((folder.name, "gguf", folder))
    for marker in sorted((root / QUANTIZED).glob(f"*/{MARKER}")):
        found.append((f"{QUANTIZED}/{marker.parent.name}", "quantized", marker.parent))
    entries = [{"name": name, "kind": kind, "path": str(path), "bytes": folder_bytes(path)} for name, kind, path in found]
    return sorted(entries, key=lambda e: -e["bytes"])


class CacheEntryError(ValueError):
    """No cache entry has that name (the message lists the names there are)."""


def remove_cache_entry(models_dir: Path, name: str) -> dict:
    """Delete the cache entry `name` (a name cache_entries gives, or a preset whose verifier is
    cached under another name) and the quantized copies made from it; returns the removed entry.
    The next start that needs it downloads, converts or rebuilds it again."""
    import shutil

    from .quantization import FOLDER as QUANTIZED, copies_of

    entries = cache_entries(models_dir)
    preset = PRESETS.get(name)
    wanted = {name, preset.verifier} if preset else {name}
    matches = [e for e in entries if e["name"] in wanted]
    if not matches:
        names = ", ".join(e["name"] for e in entries) or "none: the cache is empty"
        raise CacheEntryError(f"no cached model named {name!r} (cached: {names})")
    entry = matches[0]
    path = Path(entry["path"])
    copies = copies_of(Path(models_dir) / QUANTIZED, path) if entry["kind"] != "quantized" else []
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    for copy in copies:
        shutil.rmtree(copy, ignore_errors=True)
    return entry
