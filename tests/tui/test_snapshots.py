"""Snapshot tests from traces recorded with the real engine (no model): main screen, step mode, replay,
at 140x42 and in a small window (80x24: the chat alone, step mode with its panel, help, settings), and
step mode's teaching (legend, node states, sampling test) at 80x24 and 160x48.

Update them with `pytest tests/tui/test_snapshots.py --snapshot-update` after a deliberate change.
"""

from __future__ import annotations

import pytest

from spectui.chat_app import ChatApp
from spectui.engine.events import read_trace
from spectui.messages import StepArrived
from spectui.replay import read_turns
from spectui.replay_app import ReplayApp

from tui_helpers import DATA, TRACE

pytestmark = pytest.mark.anyio

SIZE = (140, 42)
SMALL = (80, 24)
LARGE = (160, 48)
SAMPLING = DATA / "sampling.jsonl"


@pytest.fixture
def fixed_memory(monkeypatch):
    monkeypatch.setattr("spectui.widgets.status.memory_in_use", lambda engine_pid=0: "RAM 512 MiB")


@pytest.mark.parametrize("size", [SIZE, SMALL], ids=["140x42", "80x24"])
def test_main_screen(snap_compare, fresh_home, fixed_memory, size):
    """The live chat screen after an answer: StepEvents posted exactly as the generation worker does.
    At 80x24 the side panel gives the chat the whole width."""
    info, events = read_trace(TRACE)
    app = ChatApp(model=info.model, autoload=False)

    async def run_before(pilot):
        await pilot.pause()
        app.chat.query_one("#prompt").cursor_blink = False
        await app.chat.begin_turn(info.prompt, info.ssms, True, info.quant)
        for event in events:
            app.post_message(StepArrived(event))
        await pilot.pause(0.5)
        await app.chat.flush()
        app.chat.status.state = "ready"
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", [SIZE, SMALL], ids=["140x42", "80x24"])
def test_step_mode(snap_compare, fresh_home, size):
    """Replay paused after a few verifier steps: the tree and the decision stay on screen."""
    app = ReplayApp(read_turns(TRACE), replay_name=TRACE.name, autoplay=False)
    assert snap_compare(app, terminal_size=size, press=["n", "n", "n", "n", "_"])


@pytest.mark.parametrize(
    "trace, steps, size",
    [(SAMPLING, 10, LARGE), (SAMPLING, 10, SMALL), (TRACE, 20, LARGE)],
    ids=["sampling-160x48", "sampling-80x24", "greedy-160x48"],
)
def test_step_mode_teaching(snap_compare, fresh_home, trace, steps, size):
    """Step mode's legend, node states and decision: a sampling step whose drafts were all rejected
    (u, min(1, p'/q), the residual) and a greedy step with accepted, rejected and unreached nodes."""
    app = ReplayApp(read_turns(trace), replay_name=trace.name, autoplay=False)
    assert snap_compare(app, terminal_size=size, press=["n"] * steps + ["_"])


@pytest.mark.parametrize("key", ["f1", "f3"], ids=["help", "settings"])
def test_dialog_in_a_small_window(snap_compare, fresh_home, fixed_memory, key):
    app = ChatApp(autoload=False)

    async def run_before(pilot):
        await pilot.pause()
        app.chat.query_one("#prompt").cursor_blink = False
        await pilot.press(key)
        await pilot.pause(0.3)
        for cursor in app.screen.query("Input"):
            cursor.cursor_blink = False

    assert snap_compare(app, terminal_size=SMALL, run_before=run_before)


def test_replay_finished_with_origin_colours(snap_compare, fresh_home):
    app = ReplayApp(read_turns(TRACE), replay_name=TRACE.name, autoplay=False)

    async def run_before(pilot):
        await pilot.pause()
        await app.play_to_end()
        await pilot.press("f4")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
