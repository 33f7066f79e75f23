"""Make the prompt files shipped in the package (spectui/data/) from ../shared/data/.

    .venv/bin/python scripts/package_data.py            # (re)write them
    .venv/bin/python scripts/package_data.py --check    # exit 1 if they differ from what this makes

- vicuna_bench_questions.jsonl: a byte-for-byte copy (the default of `spectui bench`, `tui-bench`
  and `tune-eval`, and the questions `spectui tune` never trains on).
- tune_prompts.jsonl.gz: PER_CATEGORY prompts of each category of ../shared/data/tune_prompts.jsonl.gz,
  drawn at random (random.Random(SEED) shuffles each category's prompts, in file order, and the first
  PER_CATEGORY are kept), then interleaved round-robin over the categories in name order, so any
  prefix of the file (`spectui tune` takes prompts in file order) is balanced. Rows are kept as they
  are (question_id, category, source, turns). Written as gzip with no name and mtime 0, so the same
  input gives the same bytes.

spectui/data/README.md names the sources and licences.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import random
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
OUT = ROOT / "spectui" / "data"
BENCH = "vicuna_bench_questions.jsonl"
TUNE = "tune_prompts.jsonl.gz"
PER_CATEGORY = 300  # the smallest category (classification) has 300
SEED = 0


def tune_subset(path: Path, per_category: int = PER_CATEGORY, seed: int = SEED) -> list[dict]:
    """The rows of the shipped subset, in the order they are written."""
    by_category: dict[str, list[dict]] = defaultdict(list)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                by_category[row["category"]].append(row)
    rng = random.Random(seed)
    drawn = []
    for category in sorted(by_category):
        rows = by_category[category]
        rng.shuffle(rows)
        drawn.append(rows[:per_category])
    return [rows[i] for i in range(max(map(len, drawn))) for rows in drawn if i < len(rows)]


def gzip_bytes(rows: list[dict]) -> bytes:
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8")
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, compresslevel=9, mtime=0) as f:
        f.write(text)
    return buffer.getvalue()


def wanted(shared: Path = SHARED) -> dict[str, bytes]:
    """File name -> the bytes this script writes."""
    return {BENCH: (shared / BENCH).read_bytes(), TUNE: gzip_bytes(tune_subset(shared / TUNE))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = ap.parse_args()
    stale = []
    for name, data in wanted().items():
        target = OUT / name
        if args.check:
            if not target.is_file() or target.read_bytes() != data:
                stale.append(name)
            continue
        target.write_bytes(data)
        print(f"{target.relative_to(ROOT)}: {len(data):,} bytes")
    if stale:
        print(f"differ from what scripts/package_data.py makes: {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
