"""`spectui models`: the presets with their verifier, SSMs, source and whether they are cached."""

from __future__ import annotations

from .presets import BUNDLED, EMBEDDED, PRESETS, Preset


def is_cached(source: str) -> bool:
    if source.startswith(BUNDLED):
        return True  # shipped inside the package
    if source == EMBEDDED:
        from .embedded import is_cached as embedded_cached

        return embedded_cached()
    from .loading import is_hub_cached

    return is_hub_cached(source)


def preset_rows() -> list[dict]:
    return [describe(preset) for preset in PRESETS.values()]


def describe(preset: Preset) -> dict:
    verifier = "SmolLM2-135M-Instruct (embedded GGUF)" if preset.verifier == EMBEDDED else preset.verifier
    ssms = [describe_ssm(s) for s in preset.ssms] + (["ngram (prompt lookup)"] if preset.ngram else [])
    cached = all(is_cached(source) for source in (preset.verifier, *preset.ssms))
    return {
        "name": preset.name,
        "verifier": verifier,
        "ssms": ssms,
        "source": preset.source,
        "cached": cached,
        "description": preset.description,
    }


def describe_ssm(source: str) -> str:
    if source.startswith(BUNDLED):
        return f"{source.removeprefix(BUNDLED)} (boost-tuned, shipped with spectui)"
    return source
