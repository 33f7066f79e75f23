"""Documents in: a prompt read from a text file or stdin (`spectui generate --file PATH`, `-`), and the
chat's `/file PATH` command, which puts a text file's content into the message.

Text is UTF-8; bytes that are not UTF-8 become U+FFFD, as they do in a prompt given on the command
line. A file larger than MAX_BYTES is refused (no model here has a context that long, and `/dev/zero`
must not hang the app). Every failure is a DocumentError with one line for the user.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

MAX_BYTES = 1 << 20  # 1 MiB: far more text than any model's context here
FILE_COMMAND = "/file"


class DocumentError(ValueError):
    """A document that cannot be read: one line for the user."""


def decode(raw: bytes, where: str) -> str:
    if len(raw) > MAX_BYTES:
        raise DocumentError(f"{where} is larger than {MAX_BYTES >> 20} MiB, more than any model's context")
    return raw.decode("utf-8", "replace")


def read_stream(stream: BinaryIO, where: str = "stdin") -> str:
    return decode(stream.read(MAX_BYTES + 1), where)


def read_document(path: str | os.PathLike) -> str:
    """The text of the file at PATH (`~` expands; relative to the current folder)."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise DocumentError(f"{path} is a folder, not a text file")
    try:
        with open(path, "rb") as handle:
            return read_stream(handle, str(path))
    except FileNotFoundError:
        raise DocumentError(f"no such file: {path}") from None
    except OSError as exc:
        raise DocumentError(f"cannot read {path}: {exc.strerror or exc}") from None


def command_path(line: str) -> str | None:
    """PATH when LINE is the command `/file PATH` (the rest of the line, surrounding quotes removed), else None."""
    head, _, rest = line.partition(" ")
    if head.rstrip() != FILE_COMMAND:
        return None
    path = rest.strip()
    if len(path) >= 2 and path[0] == path[-1] and path[0] in "'\"":
        path = path[1:-1]
    return path


def expand_file_commands(message: str) -> str:
    """The message with each line `/file PATH` replaced by that file's text (other lines as typed).

    Raises DocumentError for a bad path, an empty file, or a command without a path."""
    lines = []
    for line in message.split("\n"):
        path = command_path(line)
        if path is None:
            lines.append(line)
            continue
        if not path:
            raise DocumentError("/file needs a path: /file PATH on a line of its own (ctrl+j starts the next line)")
        try:
            text = read_document(path)
        except DocumentError as exc:
            hint = " (a question goes on the next line: ctrl+j)" if " " in path else ""
            raise DocumentError(f"/file: {exc}{hint}") from None
        if not text.strip():
            raise DocumentError(f"/file: {path} is empty")
        lines.append(text.rstrip("\n"))
    return "\n".join(lines)
