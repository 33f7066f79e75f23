"""config.toml: round trip, bad values fall back with a notice, settings validation, and saving
only the chosen keys into the user's own text (comments, unknown keys and tables kept, 0600)."""

from __future__ import annotations

import os
import stat
import tomllib
from dataclasses import asdict

import pytest

from spectui.config import Config, ConfigError, load_config, save_config
from spectui.engine.settings import DEFAULT_TREE, tree_text


def test_round_trip(tmp_path):
    path = tmp_path / "config.toml"
    config = Config(theme="spectui-light", colour_origins=True, temperature=0.7, top_p=0.9, tree="3,1", max_new_tokens=64, speculate=False)
    save_config(path, {name: value for name, value in asdict(config).items() if name != "notice"})
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
    save_config(path, {"theme": 'we"ird\\name\ttab\x01#'})
    assert load_config(path).theme == 'we"ird\\name\ttab\x01#'


def test_invalid_settings_raise():
    with pytest.raises(ValueError):
        Config(top_p=0).settings()


def test_an_old_default_tree_moves_to_auto(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('tree = "1,1,1"\n', encoding="utf-8")
    assert load_config(path).settings().tree_shape == "auto"
    path.write_text('tree = "3,1"\n', encoding="utf-8")
    assert load_config(path).settings().tree_shape == (3, 1)  # a chosen shape stays


USER_TEXT = '''# my spectui settings
theme = "spectui-light"   # the light one
"top_p" = 0.9
notes = """
tree = "not this one"
[not a table]
"""
plugins = ["a",
  "b"]  # a key spectui does not know

# keep this section
[extra]
tree = "the section's own"
'''


def test_save_changes_only_the_chosen_keys_and_keeps_the_rest(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(USER_TEXT, encoding="utf-8")
    save_config(path, {"theme": "spectui-dark", "top_p": 0.5, "tree": "3,1"})
    text = path.read_text(encoding="utf-8")
    data = tomllib.loads(text)
    assert data["theme"] == "spectui-dark" and data["top_p"] == 0.5 and data["tree"] == "3,1"
    assert data["notes"] == 'tree = "not this one"\n[not a table]\n'
    assert data["plugins"] == ["a", "b"] and data["extra"] == {"tree": "the section's own"}
    assert 'theme = "spectui-dark"   # the light one\n' in text  # the line's own comment stays
    assert '"top_p" = 0.5\n' in text
    for line in ("# my spectui settings", "# keep this section", "[extra]", '  "b"]  # a key spectui does not know'):
        assert line in text
    assert text.index('tree = "3,1"') < text.index("# keep this section")  # a new key goes before the tables
    assert set(data) == {"theme", "top_p", "notes", "plugins", "tree", "extra"}  # no defaults written


def test_a_new_file_holds_only_the_chosen_keys_and_is_private(tmp_path):
    path = tmp_path / "home" / "config" / "config.toml"
    save_config(path, {"colour_origins": True})
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    assert data == {"colour_origins": True}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.parent.parent.stat().st_mode) == 0o700
    path.chmod(0o644)
    save_config(path, {"colour_origins": False})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not [p.name for p in path.parent.iterdir() if p.name != "config.toml"]  # no temp file left


def test_a_broken_file_is_never_written(tmp_path):
    path = tmp_path / "config.toml"
    broken = b'# mine\ntheme = "spectui-light"\ntree = [unclosed\n'
    path.write_bytes(broken)
    config = load_config(path)
    assert config == Config(notice=config.notice)
    assert "not valid TOML" in config.notice and "using the defaults" in config.notice
    with pytest.raises(ConfigError, match="not saved"):
        save_config(path, {"theme": "spectui-dark"})
    assert path.read_bytes() == broken


def test_a_symlinked_config_keeps_its_link(tmp_path):
    real = tmp_path / "dotfiles" / "spectui.toml"
    real.parent.mkdir()
    real.write_text("# versioned elsewhere\nmerge = \"vote\"\n", encoding="utf-8")
    link = tmp_path / "config.toml"
    link.symlink_to(real)
    save_config(link, {"merge": "union"})
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text(encoding="utf-8") == '# versioned elsewhere\nmerge = "union"\n'


def test_value_types(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("temperature = 1\ntheme = 5\n", encoding="utf-8")
    config = load_config(path)
    assert config.temperature == 1.0 and isinstance(config.temperature, float)  # an integer is a float
    assert config.theme == Config().theme and "theme = 5 ignored" in config.notice  # not a string


def test_the_app_run_spec_takes_the_picked_model_unless_a_flag_names_one(tmp_path):
    """Config.run_spec: the model picked with ctrl+o and its speculators; --model wins, with the preset's
    own speculators; the generation settings are the config's."""
    path = tmp_path / "config.toml"
    save_config(path, {"model": "llama-7b", "speculators": "ngram", "max_new_tokens": 12, "tree": "2,1"})
    config = load_config(path)
    picked = config.run_spec(quant="none", device="cpu", seed=3)
    assert (picked.model, picked.speculators, picked.ssms, picked.quant, picked.device) == ("llama-7b", "ngram", (), "none", "cpu")
    assert (picked.settings.max_new_tokens, picked.settings.tree_shape, picked.settings.seed) == (12, (2, 1), 3)
    flagged = config.run_spec("smollm2-135m", ["some/ssm"])
    assert (flagged.model, flagged.speculators, flagged.ssms) == ("smollm2-135m", "default", ("some/ssm",))
