"""Helpers shared by the TUI tests (imported as a plain module: the test folders are not packages)."""

from __future__ import annotations

import time
from pathlib import Path

from textual.errors import NoWidget

DATA = Path(__file__).with_name("data")
TRACE = DATA / "france.jsonl"


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
