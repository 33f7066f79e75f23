"""The user's config file (`paths.config_file()`, TOML): theme, view toggles, generation defaults, model.

Read with tomllib. Written only when the user chooses a setting in the app (settings screen,
a toggle, a theme, a model that loaded), and then only the chosen keys change: `update_toml` rewrites those keys'
statements in the existing text, or adds them, and keeps every other line (comments, keys and
tables it does not know). A file that is not valid TOML is never written: the app runs on the
defaults and says why (`Config.notice`). Command-line flags change the session, not the file.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from .engine import DEFAULT_MERGE, DEFAULT_PRESET, GenerationSettings, RunSpec, parse_tree, tree_text
from .paths import write_private

GENERATION = ("temperature", "top_p", "tree", "speculate", "merge", "max_new_tokens")
OLD_DEFAULT_TREES = ("1,1,1", "2,2,1,1")  # earlier default trees: a config that saved one moves to the default (auto)
HEADER = "# spectui settings: the app rewrites only the keys you change in it and keeps everything else\n"
ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


class ConfigError(Exception):
    """The config file could not be written; one line for the user."""


@dataclass
class Config:
    theme: str = "spectui-dark"
    colour_origins: bool = False
    step_mode: bool = False
    temperature: float = 0.0
    top_p: float = 1.0
    tree: str = tree_text()
    speculate: bool = True
    merge: str = DEFAULT_MERGE  # how several speculators' trees merge: union or vote
    max_new_tokens: int = 256
    model: str = DEFAULT_PRESET  # the model picker's (ctrl+o) choice: what `spectui chat` loads without --model
    speculators: str = "default"  # and its speculators: default, ngram, none or one SSM (engine choose_speculators)
    notice: str | None = None  # not saved: why (part of) the file was ignored

    def run_spec(self, model: str | None = None, ssms=(), quant: str = "nf4", device: str = "auto",
                 seed: int | None = None) -> RunSpec:
        """The app's run: --model over the picked model (with the preset's own speculators then), these
        settings (ValueError when one is out of range)."""
        speculators = "default" if model else self.speculators
        return RunSpec(model or self.model, ssms, speculators, quant, device, self.settings(seed))

    def settings(self, seed: int | None = None) -> GenerationSettings:
        """GenerationSettings from these values (ValueError when one is out of range)."""
        return GenerationSettings(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=seed,
            tree_shape=parse_tree(self.tree),
            speculate=self.speculate,
            merge=self.merge,
        )


SAVED = tuple(f.name for f in fields(Config) if f.name != "notice")


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = "".join(ESCAPES.get(c, f"\\u{ord(c):04X}" if ord(c) < 0x20 or ord(c) == 0x7F else c) for c in str(value))
    return f'"{text}"'


def load_config(path: Path) -> Config:
    config = Config()
    if not path.exists():
        return config
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        config.notice = f"config {path} ignored, not valid TOML ({exc}): using the defaults; the file is left as it is"
        return config
    except OSError as exc:
        config.notice = f"config {path} ignored, cannot be read ({exc.strerror or exc}): using the defaults"
        return config
    for name in SAVED:
        if name not in data:
            continue
        value, default = data[name], getattr(config, name)
        same = isinstance(value, type(default)) or (type(default) is float and isinstance(value, int))
        if isinstance(default, bool) != isinstance(value, bool) or not same:
            config.notice = f"config {path}: {name} = {value!r} ignored (expected {type(default).__name__})"
            continue
        setattr(config, name, type(default)(value))
    if config.tree in OLD_DEFAULT_TREES:
        config.tree = tree_text()  # an earlier default, saved with the settings: the default is now auto
    try:
        config.settings()
    except ValueError as exc:
        config.notice = f"config {path}: generation settings ignored: {exc}"
        defaults = Config()
        for name in GENERATION:
            setattr(config, name, getattr(defaults, name))
    return config


def save_config(path: Path, changes: dict) -> None:
    """Write these settings into the config file, keeping every other line (ConfigError when it cannot)."""
    path = Path(path)
    unknown = set(changes) - set(SAVED)
    if unknown:
        raise ValueError(f"not config settings: {sorted(unknown)}")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = HEADER
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config {path} not saved: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        write_private(path, update_toml(text, changes))
    except ValueError as exc:
        raise ConfigError(f"config {path} not saved: {exc}; the settings apply to this session") from None
    except OSError as exc:
        raise ConfigError(f"config {path} not saved: {exc.strerror or exc}") from None


def _parse(text: str) -> dict | None:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None


def _statements(lines: list[str]) -> list[tuple[int, int]]:
    """[first, end) line spans of the statements (key/value or table header); a span is the
    shortest run of lines from its first that parses on its own (multi-line strings, arrays)."""
    spans, i = [], 0
    while i < len(lines):
        if not lines[i].strip() or lines[i].lstrip().startswith("#"):
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines) + 1) if _parse("".join(lines[i:j])) is not None), None)
        if end is None:
            raise ValueError(f"line {i + 1} cannot be read")
        spans.append((i, end))
        i = end
    return spans


def _trailing_comment(line: str) -> str:
    """The `  # ...` after a one-line key/value statement, or ''."""
    for k, char in enumerate(line):
        if char == "#" and _parse(line[:k]):
            return line[len(line[:k].rstrip()):]
    return ""


def update_toml(text: str, changes: dict) -> str:
    """`text` with these top-level keys set; every other line kept. ValueError when it is not valid TOML."""
    try:
        before = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"it is not valid TOML ({exc}); fix or remove it") from None
    newline = "\r\n" if "\r\n" in text else "\n"
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines[-1] += newline
    spans = _statements(lines)
    header = next((n for n, (i, _) in enumerate(spans) if lines[i].lstrip().startswith("[")), len(spans))
    top = spans[:header]
    edits, added = [], []  # (first, end, new lines), applied bottom-up so earlier spans stay valid
    for key, value in changes.items():
        pattern = re.compile(rf"""^[ \t]*(?:{re.escape(key)}|"{re.escape(key)}"|'{re.escape(key)}')[ \t]*=[ \t]*""")
        found = next(((i, end) for i, end in top if pattern.match(lines[i])), None)
        if found is None:
            added.append(f"{key} = {toml_value(value)}{newline}")
            continue
        i, end = found
        body = lines[i].rstrip("\r\n")
        comment = _trailing_comment(body) if end == i + 1 else ""
        edits.append((i, end, [f"{pattern.match(body).group(0)}{toml_value(value)}{comment}{newline}"]))
    if added:
        if top:
            at = top[-1][1]
        elif header < len(spans):
            at = spans[header][0]
            while at > 0 and lines[at - 1].lstrip().startswith("#"):
                at -= 1  # a header's comment stays with its header
        else:
            at = len(lines)
        edits.append((at, at, added))
    for i, end, new in sorted(edits, key=lambda edit: edit[0], reverse=True):
        lines[i:end] = new
    result = "".join(lines)
    if _parse(result) != {**before, **changes}:
        raise ValueError("it cannot be updated without changing other entries")
    return result
