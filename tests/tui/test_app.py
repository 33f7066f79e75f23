"""App behaviour without a model: load failures in the app, conversations, settings, help, themes."""

from __future__ import annotations

import os

import pytest

from spectui import paths
from spectui.chat_app import ChatApp
from spectui.config import load_config
from spectui.screens.dialogs import ConfirmScreen, ConversationsScreen, HelpScreen
from spectui.screens.settings import SettingsScreen
from spectui.store import Store
from spectui.widgets.conversation import UserBlock

from tui_helpers import save_chat, save_settings, wait_for

pytestmark = pytest.mark.anyio


async def test_load_failure_is_shown_and_app_keeps_running(fresh_home):
    app = ChatApp(model=str(fresh_home / "no-such-model"))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: app.load_error is not None, 60, "the load to fail")
        await pilot.pause(0.2)
        notice = app.chat.query_one("#notice")
        assert notice.display and "Loading failed" in str(notice.render())
        await pilot.click("#prompt")
        app.chat.query_one("#prompt").insert("hello")
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert app.is_running and not app.generating
        assert any("loading failed" in n.message for n in app._notifications)


async def test_corrupt_history_is_set_aside(fresh_home):
    db = paths.history_db()
    db.parent.mkdir(parents=True, exist_ok=True)
    db.write_bytes(b"garbage" * 500)
    app = ChatApp(autoload=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause(0.2)
        assert "moved to" in str(app.chat.query_one("#notice").render())
        assert list(db.parent.glob("history.sqlite3.broken-*"))


async def test_conversations_switch_rename_delete(fresh_home):
    a = save_chat("alpha [draft]", ("user", "first question"))  # a title is text, never markup
    b = save_chat("beta", ("user", "second question"))
    app = ChatApp(autoload=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause(0.2)
        assert app.record.id == b  # the last one reopens
        await pilot.press("f2")
        assert isinstance(app.screen, ConversationsScreen)
        listing = app.screen.query_one("#conversation-list")
        shown = ["".join(seg.text for seg in listing.render_line(row)).strip() for row in range(2)]
        assert shown[0].startswith("● beta  today ") and shown[1].startswith("alpha [draft]  today "), shown
        await pilot.press("down", "enter")
        await pilot.pause(0.2)
        assert app.record.id == a
        assert [str(u.render()) for u in app.chat.query(UserBlock)] == ["first question"]
        await pilot.press("f2")
        await pilot.pause()
        app.screen.query_one("#conversation-list").highlighted = [r.id for r in app.screen.records].index(a)
        await pilot.press("r")
        await pilot.pause()
        app.screen.query_one("#text").value = "renamed"
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert app.record.title == "renamed"
        assert isinstance(app.screen, ConversationsScreen)
        app.screen.query_one("#conversation-list").highlighted = [r.id for r in app.screen.records].index(a)
        await pilot.press("d")  # asks first: n (or esc, or the focused Keep button) keeps it
        await pilot.pause(0.2)
        assert isinstance(app.screen, ConfirmScreen) and "renamed" in str(app.screen.query_one("#question").render())
        await pilot.press("n")
        await pilot.pause(0.2)
        assert isinstance(app.screen, ConversationsScreen) and len(Store(paths.history_db()).list()) == 2
        app.screen.query_one("#conversation-list").highlighted = [r.id for r in app.screen.records].index(a)
        await pilot.press("d", "enter")  # enter on the focused button: Keep
        await pilot.pause(0.2)
        assert isinstance(app.screen, ConversationsScreen) and len(Store(paths.history_db()).list()) == 2
        app.screen.query_one("#conversation-list").highlighted = [r.id for r in app.screen.records].index(a)
        await pilot.press("d", "y")
        await pilot.pause(0.2)
        assert isinstance(app.screen, ConversationsScreen)
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert app.record.id == b
    store = Store(paths.history_db())
    assert [r.title for r in store.list()] == ["beta"]
    store.close()


async def test_settings_saved_to_config(fresh_home):
    app = ChatApp(autoload=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await save_settings(app, pilot, tree="0")
        error = app.screen.query_one("#tree-error")
        assert error.display and str(error.render()).startswith("✗ Tree “0”: expected auto")
        assert app.screen.focused.id == "tree"
        app.screen.query_one("#tree").value = "3,2"
        app.screen.query_one("#temperature").value = "0.5"
        app.screen.query_one("#system").value = "You are terse."
        app.screen.query_one("#tree").focus()
        await pilot.press("enter")  # the keyboard saves too
        await pilot.pause()
        assert not isinstance(app.screen, SettingsScreen)
        assert app.record.system == "You are terse."
    config = load_config(paths.config_file())
    assert config.tree == "3,2" and config.temperature == 0.5


@pytest.mark.parametrize("field, typed, line", [
    ("temperature", "", "✗ Temperature is empty: enter a number ≥ 0 (0 = greedy)"),
    ("max_new_tokens", "", "✗ Max new tokens is empty: enter a whole number ≥ 1"),
    ("top_p", "lots", "✗ Top-p “lots”: enter a number above 0, at most 1 (1 = off)"),
    ("merge", "", "✗ Merge is empty: enter union or vote"),
])
async def test_a_bad_settings_field_gets_one_clear_line_next_to_it(fresh_home, field, typed, line):
    app = ChatApp(autoload=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await save_settings(app, pilot, system="typed, not lost", **{field: typed})
        assert isinstance(app.screen, SettingsScreen)  # still open, with what was typed
        assert app.screen.query_one("#system").value == "typed, not lost"
        error = app.screen.query_one(f"#{field}-error")
        text = str(error.render())
        assert error.display and text == line and "\n" not in text and "convert" not in text
        assert app.screen.focused.id == field  # the cursor is on the field to fix
        shown = [e.id for e in app.screen.query(".field-error") if e.display]
        assert shown == [f"{field}-error"]
        app.screen.query_one(f"#{field}").value = {"merge": "vote", "top_p": "0.9"}.get(field, "1")
        await pilot.press("enter")  # fixed: enter in the field saves
        await pilot.pause()
        assert not isinstance(app.screen, SettingsScreen)
        assert app.record.system == "typed, not lost"


async def test_theme_kept_in_config_and_help_lists_keys(fresh_home):
    app = ChatApp(autoload=False)
    async with app.run_test(size=(120, 40)) as pilot:
        assert {"spectui-dark", "spectui-light", "spectui-high-contrast"} <= set(app.available_themes)
        app.theme = "spectui-high-contrast"
        await pilot.pause(0.2)
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        help_text = app.screen.query_one("Markdown").source
        assert "ctrl+q" in help_text and "escape" in help_text
    assert load_config(paths.config_file()).theme == "spectui-high-contrast"
    again = ChatApp(autoload=False)
    async with again.run_test() as pilot:
        await pilot.pause()
        assert again.theme == "spectui-high-contrast"


async def test_escape_enter_from_the_terminal_adds_a_line(fresh_home):
    """What tmux sends for alt+enter (ESC + CR) reaches the message box as alt+enter: a new line."""
    from textual._xterm_parser import XTermParser

    app = ChatApp(autoload=False)
    async with app.run_test() as pilot:
        keys = [event.key for event in XTermParser().feed("one\x1b\rtwo\nthree")]  # alt+enter, then ctrl+j
        assert keys == ["o", "n", "e", "alt+enter", "t", "w", "o", "ctrl+j", "t", "h", "r", "e", "e"]
        await pilot.press(*keys)
        assert app.chat.query_one("#prompt").text == "one\ntwo\nthree" and not app.generating


def test_docs_list_the_keys_f1_shows():
    from pathlib import Path

    from spectui.screens.dialogs import KEYS

    docs = (Path(__file__).parents[2] / "docs" / "tui.md").read_text(encoding="utf-8")
    table = docs[docs.index("## Keys"):docs.index("## Design")]
    rows = [line.strip("|").split(" | ") for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [(key.strip(), what.strip()) for key, what in rows] == [(key, what.replace("this help", "help: every key")) for key, what in KEYS]


@pytest.mark.parametrize(
    "name, needle",
    [("missing.txt", "/file: no such file: {path}"), ("a-folder", "/file: {path} is a folder, not a text file"),
     ("empty.txt", "/file: {path} is empty"), ("", "/file needs a path: /file PATH on a line of its own (ctrl+j starts the next line)")],
    ids=["missing", "folder", "empty", "no-path"],
)
async def test_file_command_with_a_bad_path_says_why_and_keeps_the_message(fresh_home, tmp_path, name, needle):
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "empty.txt").write_text("\n \n", encoding="utf-8")
    path = tmp_path / name if name else ""
    typed = f"Read this:\n/file {path}".rstrip() + "\nand summarise it."
    app = ChatApp(autoload=False)
    async with app.run_test(size=(120, 36)) as pilot:
        prompt = app.chat.query_one("#prompt")
        prompt.insert(typed)
        await pilot.press("enter")
        await pilot.pause(0.2)
        notice = app.chat.query_one("#notice")
        shown = str(notice.render())
        assert notice.display and notice.has_class("error") and shown == needle.format(path=path)
        assert "\n" not in shown
        assert prompt.text == typed  # nothing typed is lost
        assert app.record is None and not list(app.chat.query(UserBlock)) and not app.generating


async def test_palette_lists_app_commands(fresh_home):
    app = ChatApp(autoload=False)
    async with app.run_test() as pilot:
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for wanted in ("New conversation", "Conversations", "Settings", "Step mode", "Token origins",
                       "Copy last answer", "Export to Markdown", "Theme", "Help: key bindings"):
            assert wanted in titles


async def test_copy_and_export(fresh_home):
    save_chat("France", ("user", "What is the capital of France?"), ("assistant", "Paris."))
    app = ChatApp(autoload=False)
    async with app.run_test() as pilot:
        await pilot.pause(0.2)
        await pilot.press("f9")
        assert app.clipboard == "Paris."
        app.action_export()
        exported = list((paths.data_dir() / "exports").glob("*.md"))
        assert len(exported) == 1 and "Paris." in exported[0].read_text()


def test_engine_threads_reach_the_engine_process_request(fresh_home):
    from spectui.engine.worker import engine_threads

    assert ChatApp(autoload=False, engine_threads=2).link.request.threads == 2
    default = ChatApp(autoload=False).link.request.threads
    assert default is None and engine_threads(default) == (os.cpu_count() or 1)  # every core: measured best


async def test_prompt_history_up_down_and_ctrl_r_search(fresh_home):
    """Up in an empty box recalls the prompts sent before (every conversation, newest first), Down goes
    back; an edited recall is a message like any other; ctrl+r finds a prompt by its words."""
    from spectui.screens.prompt_search import PromptSearchScreen

    save_chat("alpha", ("user", "What is the capital of France?"), ("assistant", "Paris."))
    save_chat("beta", ("user", "Write a haiku\nabout the sea"), ("user", "Explain photosynthesis"))
    app = ChatApp(autoload=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause(0.2)
        box = app.chat.query_one("#prompt")
        box.focus()
        await pilot.press("up")
        assert box.text == "Explain photosynthesis"
        await pilot.press("up", "up")
        assert box.text == "What is the capital of France?"
        await pilot.press("up")  # the oldest stays
        assert box.text == "What is the capital of France?"
        await pilot.press("down")
        assert box.text == "Write a haiku\nabout the sea" and box.cursor_location == (1, 13)  # cursor at the end
        await pilot.press("down", "down")
        assert box.text == ""  # past the newest: the empty box again
        await pilot.press("up", "!")  # edited: now an ordinary message, the arrows move the cursor
        await pilot.press("up")
        assert box.text == "Explain photosynthesis!"
        box.clear()
        await pilot.press("ctrl+r")
        await pilot.pause(0.2)
        assert isinstance(app.screen, PromptSearchScreen)
        assert app.screen.shown == ["Explain photosynthesis", "Write a haiku\nabout the sea", "What is the capital of France?"]
        await pilot.press(*"SEA haiku")
        assert app.screen.shown == ["Write a haiku\nabout the sea"]
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, PromptSearchScreen) and box.text == "Write a haiku\nabout the sea"
        box.clear()
        await pilot.press("ctrl+r")
        await pilot.pause(0.2)
        await pilot.press("down", "escape")  # esc keeps the box as it was
        await pilot.pause(0.2)
        assert box.text == "" and not app.generating
