"""Helpers shared by the TUI tests (imported as a plain module: the test folders are not packages)."""

from __future__ import annotations

import time
from pathlib import Path

DATA = Path(__file__).with_name("data")
TRACE = DATA / "france.jsonl"


async def wait_for(pilot, condition, timeout: float = 120.0, what: str = "condition"):
    """Poll `condition` while the app keeps running (generation happens in a worker thread)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        await pilot.pause(0.1)
