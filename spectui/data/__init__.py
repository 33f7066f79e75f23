"""Prompt files shipped with spectui, read through importlib.resources (README.md here: what they are,
their sources and licences, and how scripts/package_data.py made them).

    bench_questions()          the 80 Vicuna-bench questions: the default of `spectui bench`,
                               `tui-bench` and `tune-eval`, and what `spectui tune` never trains on
    tune_prompts(cache_dir)    2,400 prompts for `spectui tune --shipped-prompts`, unpacked once
                               from the gzip in this folder into cache_dir
"""

from __future__ import annotations

import gzip
import hashlib
from importlib.resources import files
from pathlib import Path

BENCH_QUESTIONS = "vicuna_bench_questions.jsonl"
TUNE_PROMPTS = "tune_prompts.jsonl.gz"


def packaged(name: str) -> Path:
    """A file of this package on disk (spectui is installed as files, as engine/loading.py assumes for ssms/)."""
    return Path(str(files(__name__) / name))


def bench_questions() -> Path:
    return packaged(BENCH_QUESTIONS)


def tune_prompts(cache_dir: Path) -> Path:
    """The shipped tuning prompts as plain JSONL (what prompt files are read as), in
    cache_dir/prompts/ under a name that holds the gzip's hash, so an upgrade unpacks its own."""
    from ..engine import write_private

    packed = packaged(TUNE_PROMPTS).read_bytes()
    digest = hashlib.sha256(packed).hexdigest()[:12]
    target = cache_dir / "prompts" / f"tune_prompts-{digest}.jsonl"
    if not target.is_file():
        write_private(target, gzip.decompress(packed).decode("utf-8"))  # atomic: whole or absent
    return target
