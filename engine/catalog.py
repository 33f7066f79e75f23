"""`spectui models`: the presets with their verifier, SSMs, source and whether they are (validly) cached.

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
    from .loading import hub_cache_problem

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
        "source": preset.source,
        "cached": not notes,
        "cache_problems": notes,
        "description": preset.description,
    }


def describe_ssm(source: str) -> str:
    if source.startswith(BUNDLED):
        return f"{source.removeprefix(BUNDLED)} (boost-tuned, shipped with spectui)"
    return source
