"""Helpers shared by the TUI tests (imported as a plain module: the test folders are not packages)."""

from __future__ import annotations

import time
from pathlib import Path

from textual.errors import NoWidget

from spectui import paths
from spectui.screens.settings import SettingsScreen
from spectui.store import Store

DATA = Path(__file__).with_name("data")
TRACE = DATA / "france.jsonl"


def save_chat(title: str, *messages: tuple[str, str]) -> int:
    """A conversation of (role, content) messages saved in the test's history file, as an earlier
    session would have left it; -> its id."""
    store = Store(paths.history_db())
    try:
        record = store.create(title)
        for role, content in messages:
            store.add_message(record.id, role, content)
        return record.id
    finally:
        store.close()


async def save_settings(app, pilot, **values: str) -> None:
    """F3, these values typed into the settings' fields (by id), then a click on Save."""
    await pilot.press("f3")
    assert isinstance(app.screen, SettingsScreen)
    for field, value in values.items():
        app.screen.query_one(f"#{field}").value = value
    await pilot.click("#save")
    await pilot.pause(0.2)


async def wait_for(pilot, condition, timeout: float = 120.0, what: str = "condition"):
    """Poll `condition` while the app keeps running (generation happens in a worker thread)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        await pilot.pause(0.1)


def shown_on_screen(app, widget) -> bool:
    """The widget is drawn where the user can see it: the cell at its centre belongs to it."""
    region = widget.region
    if region.width == 0 or region.height == 0:
        return False
    try:
        found, _ = app.screen.get_widget_at(region.x + region.width // 2, region.y + region.height // 2)
    except NoWidget:  # off the screen
        return False
    return found is widget or widget in found.ancestors



def text_shown(app, widget) -> str:
    """The text the user sees of a widget: the rows of its content drawn on screen (clipped by what
    scrolls it; its scrollbar left out), joined by single spaces, so a wrapped line reads as one."""
    geometry = app.screen.find_widget(widget)
    shown = widget.scrollable_content_region.intersection(geometry.clip)
    rows = app.screen._compositor.render_strips()[shown.y:shown.bottom]
    return " ".join(" ".join(row.crop(shown.x, shown.right).text for row in rows).split())
