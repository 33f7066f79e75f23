"""Prompt files, read one way for `spectui bench`, `spectui tune` and `spectui tune-eval`.

A file is either JSONL, one object a line with the prompt in 'prompt', 'text' or the first of
'turns' (the MT-bench / Spec-Bench layout) and an optional 'category', or plain text with one
prompt a line. Blank lines are skipped. Every problem is a PromptFileError (a ValueError) with one
line: the file, the line number where there is one, and what was expected.
"""

from __future__ import annotations

import json
from pathlib import Path


class PromptFileError(ValueError):
    """A prompts file that cannot be read or holds no usable prompt."""


def read_prompt_file(path: Path) -> list[tuple[str, str | None]]:
    """-> [(prompt, category or None)] in file order; raises PromptFileError."""
    try:
        lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptFileError(f"cannot read prompts from {path}: {getattr(exc, 'strerror', None) or exc}") from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.startswith("{"):
            rows.append((line, None))
            continue
        try:
            record = json.loads(line)
            text = record.get("prompt") or record.get("text") or record["turns"][0]
            category = record.get("category")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise PromptFileError(f"{path}, line {number}: expected 'prompt', 'text' or a 'turns' list") from None
        rows.append((str(text), None if category is None else str(category)))
    if not rows:
        raise PromptFileError(f"{path} holds no prompts")
    return rows
