"""Small windows (80x24, 100x30): dialogs whose every control is reachable and visible by keyboard,
a side panel that gives the chat its room (and comes back for step mode or ctrl+t), a step mode
whose tree keeps its rows, and the F4 legend drawn in the origin colours."""

from __future__ import annotations

import pytest
from textual.color import Color
from textual.widgets import Button, Input

from spectui.chat_app import ChatApp
from spectui.replay import read_turns
from spectui.replay_app import ReplayApp
from spectui.screens.dialogs import HelpScreen
from spectui.screens.settings import SettingsScreen
from spectui.themes import DARK, LIGHT

from tui_helpers import TRACE, shown_on_screen

pytestmark = pytest.mark.anyio

SMALL = [(80, 24), (100, 30)]


@pytest.mark.parametrize("size", SMALL)
async def test_settings_every_control_is_reachable_and_saves(fresh_home, size):
    app = ChatApp(autoload=False)
    async with app.run_test(size=size) as pilot:
        await pilot.press("f3")
        screen = app.screen
        assert isinstance(screen, SettingsScreen)
        controls = [w for w in screen.query("Input, Switch, Button")]
        assert {w.id for w in controls} >= {"merge", "speculate", "save", "cancel"}
        seen = []
        for _ in controls:  # tab through the dialog: each control in turn is focused and visible
            await pilot.pause()
            focused = screen.focused
            assert shown_on_screen(app, focused), f"{focused} is focused but not visible at {size}"
            seen.append(focused.id)
            await pilot.press("tab")
        assert seen == [w.id for w in controls]
        screen.query_one("#merge", Input).value = "vote"
        screen.query_one("#save", Button).focus()
        await pilot.pause()
        assert shown_on_screen(app, screen.query_one("#save"))
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, SettingsScreen) and app.config.merge == "vote"


@pytest.mark.parametrize("size", SMALL)
async def test_help_scrolls_to_every_key_and_closes_by_keyboard(fresh_home, size):
    app = ChatApp(autoload=False)
    async with app.run_test(size=size) as pilot:
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        body = app.screen.query_one("#help")
        assert body.region.bottom <= size[1] and body.region.y >= 0  # the dialog fits the window
        close = app.screen.query_one("#close")
        for _ in range(3):  # Tab reaches the Close button, and it is on screen
            if app.screen.focused is close:
                break
            await pilot.press("tab")
            await pilot.pause()
        assert app.screen.focused is close and shown_on_screen(app, close)
        body.focus()
        await pilot.press("home")  # the arrow, page, home and end keys scroll the keys table
        await pilot.wait_for_scheduled_animations()
        assert body.scroll_y == 0 and not shown_on_screen(app, close)
        await pilot.press("end")
        await pilot.wait_for_scheduled_animations()
        assert body.scroll_y == body.max_scroll_y > 0 and shown_on_screen(app, close)
        close.focus()
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)


async def test_side_panel_gives_way_below_100_columns(fresh_home):
    app = ChatApp(autoload=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        chat, right = app.chat, app.chat.query_one("#right")
        conversation = chat.query_one("#conversation")
        assert not right.display and conversation.region.width == 80  # the chat has the whole width
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert right.display and shown_on_screen(app, chat.query_one("#tree-view"))
        assert conversation.region.width >= 36  # half each, not a 44-column chat squeezed by a 36-column panel
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert not right.display
        await pilot.resize_terminal(140, 42)
        await pilot.pause()
        assert right.display  # wide: the layout starts afresh with the panel
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert not right.display and conversation.region.width == 140  # hidden by choice
        await pilot.resize_terminal(150, 42)
        await pilot.pause()
        assert not right.display  # the choice holds while the window stays wide
        await pilot.press("ctrl+t")
        await pilot.pause()
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert not right.display  # shown by choice when wide, but narrow again: the chat comes first


async def test_step_mode_shows_the_panel_in_a_small_window(fresh_home):
    app = ChatApp(autoload=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        right = app.chat.query_one("#right")
        assert not right.display
        await pilot.press("f5")
        await pilot.pause()
        assert right.display  # the tree is step mode's point
        await pilot.press("f5")
        await pilot.pause()
        assert not right.display


@pytest.mark.parametrize("size", SMALL)
async def test_step_mode_tree_keeps_its_rows(fresh_home, size):
    """Replay in step mode, four steps in: the tree, the decision and the step label all show."""
    app = ReplayApp(read_turns(TRACE), replay_name=TRACE.name, autoplay=False)
    async with app.run_test(size=size) as pilot:
        for _ in range(4):
            await pilot.press("n")
        await pilot.pause(0.3)
        chat = app.chat
        tree, decision, label = chat.query_one("#tree"), chat.query_one("#decision"), chat.query_one("#tree-step")
        assert tree.region.height >= 3 and shown_on_screen(app, tree)
        assert decision.display and decision.region.height >= 3 and shown_on_screen(app, decision)
        assert "step 3  (4/4)" in str(label.render()) and label.region.width >= len("step 3  (4/4)")


async def test_origin_legend_is_drawn_in_the_theme_colours(fresh_home):
    app = ReplayApp(read_turns(TRACE), replay_name=TRACE.name, autoplay=False)
    async with app.run_test(size=(140, 42)) as pilot:
        await app.play_to_end()
        await pilot.press("f4")
        await pilot.pause()
        view = app.chat.query_one("#conversation")
        for key in ("ssm1", "ssm2", "ngram", "bonus"):  # markup: each label in its colour
            assert Color.parse(DARK.variables[f"origin-{key}"]).css in view.border_subtitle
        app.theme = "spectui-light"
        await pilot.pause()
        for key in ("ssm1", "ssm2", "ngram", "bonus"):
            assert Color.parse(LIGHT.variables[f"origin-{key}"]).css in view.border_subtitle
        await pilot.press("f4")
        await pilot.pause()
        assert not view.border_subtitle
