"""config.toml: round trip, bad values fall back with a notice, settings validation."""

from __future__ import annotations

import tomllib

import pytest

from spectui.config import Config, load_config, save_config
from spectui.engine.settings import DEFAULT_TREE, tree_text


def test_round_trip(tmp_path):
    path = tmp_path / "config.toml"
    config = Config(theme="spectui-light", colour_origins=True, temperature=0.7, top_p=0.9, tree="3,1", max_new_tokens=64, speculate=False)
    save_config(path, config)
    data = tomllib.loads(path.read_text())
    assert data["theme"] == "spectui-light" and data["tree"] == "3,1"
    loaded = load_config(path)
    assert loaded == config
    assert loaded.settings().tree_shape == (3, 1)
    assert loaded.settings().speculate is False


def test_missing_file_gives_defaults(tmp_path):
    config = load_config(tmp_path / "none.toml")
    assert config == Config()
    assert config.settings().tree_shape == DEFAULT_TREE


def test_unparsable_file_is_ignored_with_notice(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("theme = [unclosed")
    config = load_config(path)
    assert config.theme == Config().theme
    assert config.notice and "ignored" in config.notice


def test_wrong_types_and_bad_settings_fall_back(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('theme = "spectui-high-contrast"\ntemperature = "hot"\ntree = "0,0"\n')
    config = load_config(path)
    assert config.theme == "spectui-high-contrast"
    assert config.temperature == 0.0
    assert config.tree == tree_text()
    assert config.notice


def test_strings_with_quotes_survive(tmp_path):
    path = tmp_path / "config.toml"
    save_config(path, Config(theme='we"ird\\name'))
    assert load_config(path).theme == 'we"ird\\name'


def test_invalid_settings_raise():
    with pytest.raises(ValueError):
        Config(top_p=0).settings()


def test_an_old_default_tree_moves_to_auto(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('tree = "1,1,1"\n', encoding="utf-8")
    assert load_config(path).settings().tree_shape == "auto"
    path.write_text('tree = "3,1"\n', encoding="utf-8")
    assert load_config(path).settings().tree_shape == (3, 1)  # a chosen shape stays
