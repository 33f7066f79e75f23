"""The app and its files, without a model: the config is written only for a choice made in the
app, and then only that key; a broken config is kept and explained; an unwritable or damaged
history gives a notice, not a crash; what spectui creates is private (0600 files, 0700 folders)."""

from __future__ import annotations

import contextlib
import sqlite3
import stat
import tomllib

import pytest

from spectui import paths
from spectui.chat_app import ChatApp
from spectui.store import Store
from spectui.widgets.conversation import UserBlock

from tui_helpers import save_chat, save_settings

pytestmark = pytest.mark.anyio

USER_CONFIG = """# my settings: spectui must keep this comment
theme = "spectui-light"  # light, please
tree = "2,1"
future_option = "spectui does not know me"

[plugins]
enabled = ["x"]
"""
FLAGS = {"tree": "3,1", "max_new_tokens": 32, "temperature": 0.5, "merge": "vote"}  # as `spectui chat` passes its flags


def write_config(text: str):
    path = paths.config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def messages(app) -> str:
    return " | ".join(str(n.message) for n in app._notifications)


async def test_start_with_flags_leaves_the_config_alone(fresh_home):
    path = write_config(USER_CONFIG)
    app = ChatApp(autoload=False, overrides=FLAGS, step_mode=True)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause(0.3)
        assert app.theme == "spectui-light"
        assert (app.config.tree, app.config.max_new_tokens, app.config.temperature, app.config.step_mode) == ("3,1", 32, 0.5, True)
    assert path.read_text(encoding="utf-8") == USER_CONFIG


async def test_settings_save_writes_only_what_changed(fresh_home):
    path = write_config(USER_CONFIG)
    app = ChatApp(autoload=False, overrides=FLAGS)
    async with app.run_test(size=(120, 40)) as pilot:
        await save_settings(app, pilot, top_p="0.8")
        assert "settings saved" in messages(app)
        assert app.config.top_p == 0.8 and app.config.tree == "3,1"  # the flag still holds for the session
    text = path.read_text(encoding="utf-8")
    assert text == USER_CONFIG.replace('future_option = "spectui does not know me"\n', 'future_option = "spectui does not know me"\ntop_p = 0.8\n')
    assert tomllib.loads(text)["tree"] == "2,1"  # not the session's --tree


async def test_a_broken_config_is_kept_and_explained(fresh_home):
    broken = b'# hand-edited\ntheme = "spectui-light"\ntree = "3,1\n'
    path = paths.config_file()
    path.parent.mkdir(parents=True)
    path.write_bytes(broken)
    app = ChatApp(autoload=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        assert "not valid TOML" in messages(app) and "using the defaults" in messages(app)
        assert app.theme == "spectui-dark"
        app.theme = "spectui-high-contrast"  # choices made in the app: this session only
        await pilot.press("f4")
        await save_settings(app, pilot, temperature="0.7")
        assert app.config.temperature == 0.7 and app.config.colour_origins
        assert "not saved" in messages(app)
    assert path.read_bytes() == broken


def corrupt_conversations(db_path):
    db = sqlite3.connect(db_path)
    root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'conversations'").fetchone()[0]
    size = db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    data = bytearray(db_path.read_bytes())
    data[(root - 1) * size:(root - 1) * size + 64] = b"\xff" * 64
    db_path.write_bytes(bytes(data))
    return bytes(data)


@pytest.mark.parametrize("case", ["read-only file", "read-only folder", "malformed page"])
async def test_a_bad_history_gives_a_notice_and_the_app_works(fresh_home, case, read_only):
    db_path = paths.history_db()
    store = Store(db_path)
    for n in range(150):
        record = store.create(f"chat {n} " + "x" * 200)
    store.add_message(record.id, "user", "an old question")
    store.close()
    original = corrupt_conversations(db_path) if case == "malformed page" else db_path.read_bytes()
    locked = {"read-only file": db_path, "read-only folder": db_path.parent}.get(case)
    with read_only(locked) if locked else contextlib.nullcontext():
        app = ChatApp(autoload=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause(0.2)
            notice = str(app.chat.query_one("#notice").render())
            if case == "malformed page":
                assert "moved to" in notice and app.record is None
            else:
                assert "cannot be written" in notice and "not saved" in notice
                assert [str(u.render()) for u in app.chat.query(UserBlock)] == ["an old question"]  # shown as it was
            await pilot.press("ctrl+n")
            await pilot.pause(0.2)
            assert app.is_running and app.record is not None and app.record.title == "New chat"
    aside = list(db_path.parent.glob("history.sqlite3.broken-*"))
    if case == "malformed page":
        assert len(aside) == 1 and aside[0].read_bytes() == original
    else:
        assert not aside and db_path.read_bytes() == original


async def test_what_spectui_creates_is_private(fresh_home):
    save_chat("France", ("assistant", "Paris."))
    app = ChatApp(autoload=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause(0.2)
        await pilot.press("f4")  # a choice: writes the config
        app.action_export()
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    exported = list((paths.data_dir() / "exports").glob("*.md"))
    assert len(exported) == 1 and mode(exported[0]) == 0o600
    assert mode(paths.config_file()) == mode(paths.history_db()) == 0o600
    assert tomllib.loads(paths.config_file().read_text()) == {"colour_origins": True}
    for folder in (paths.config_dir(), paths.data_dir(), paths.data_dir() / "exports"):
        assert mode(folder) == 0o700, folder
