"""The user's config file (`paths.config_file()`, TOML): theme, view toggles, generation defaults.

Read with tomllib; written by hand (flat keys, strings, numbers and booleans are all it holds).
A config that cannot be read falls back to the defaults and says why in `Config.notice`.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from .engine.settings import DEFAULT_MERGE, OLD_DEFAULT_TREES, GenerationSettings, parse_tree, tree_text


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
    notice: str | None = None  # not saved: why the file was ignored

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


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{text}"'


def load_config(path: Path) -> Config:
    config = Config()
    if not path.exists():
        return config
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        config.notice = f"config {path} ignored: {exc}"
        return config
    for f in fields(Config):
        if f.name == "notice" or f.name not in data:
            continue
        value, default = data[f.name], getattr(config, f.name)
        if isinstance(default, bool) != isinstance(value, bool) or not isinstance(value, (type(default), int)):
            config.notice = f"config {path}: {f.name} = {value!r} ignored (expected {type(default).__name__})"
            continue
        setattr(config, f.name, type(default)(value))
    if config.tree in {tree_text(shape) for shape in OLD_DEFAULT_TREES}:
        config.tree = tree_text()  # an earlier default, saved with the settings: the default is now auto
    try:
        config.settings()
    except ValueError as exc:
        config.notice = f"config {path}: generation settings ignored: {exc}"
        defaults = Config()
        for name in ("temperature", "top_p", "tree", "speculate", "merge", "max_new_tokens"):
            setattr(config, name, getattr(defaults, name))
    return config


def save_config(path: Path, config: Config) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# spectui settings (written by the app)"]
    lines += [f"{name} = {toml_value(value)}" for name, value in asdict(config).items() if name != "notice"]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(path)
