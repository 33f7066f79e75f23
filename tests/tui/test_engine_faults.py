"""Fault injection: the real app (Textual pilot) on a real engine process that is killed at random
points in 12 turns. Afterwards every prompt and every streamed text is in the history database,
and after each death the app said so in one notice and came back through ctrl+e.

The engine runs a tiny random LLaMA folder (conftest.py's `tiny_model`) so a restart takes
seconds. Six of the 12 turns, seeded, lose their engine: during a step-mode pause after k steps,
at a random moment of a free-running turn (mid-answer or just after it), or while the app is idle.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from spectui import paths
from spectui.chat_app import ChatApp
from spectui.screens.loading import LoadingScreen
from spectui.store import Store
from spectui.widgets.token_tree import TokenTreeView

from tui_helpers import wait_for

pytestmark = pytest.mark.anyio

SEED = 20240611
TURNS = 12


def kill(app) -> int:
    pid = app.link.worker.process.pid
    os.kill(pid, signal.SIGKILL)
    return pid


def screens_pushed(app) -> list[type]:
    """From now on, the class of every screen the app pushes, in order."""
    pushed, push = [], app.push_screen

    def recording(screen, *args, **kwargs):
        pushed.append(type(screen))
        return push(screen, *args, **kwargs)

    app.push_screen = recording
    return pushed


async def recover(app, pilot, starts: int) -> None:
    """After a death: one notice, no traceback; ctrl+e starts exactly one new engine."""
    await wait_for(pilot, lambda: app.link.state == "dead" and not app.generating, 30, "the death to be noticed")
    await pilot.pause(0.1)
    notice = str(app.chat.query_one("#notice").render())
    assert "engine process exited (killed by SIGKILL)" in notice and "ctrl+e restarts" in notice
    assert "Traceback" not in notice and "\n" not in notice.strip()
    assert app.chat.status.state == "engine stopped" and app.is_running
    shown = screens_pushed(app)
    await pilot.press("ctrl+e")
    assert shown == [LoadingScreen]  # (a restart can be over before the press returns: engines fork ready-imported)
    del app.push_screen  # the class's own again
    app.action_restart_engine()  # Retry pressed again while loading (or once loaded): no second engine
    app.action_restart_engine()
    assert app.link.starts == starts + 1
    # the link turns ready in its thread, then the app leaves the loading screen on ModelsLoaded: wait for both
    await wait_for(pilot, lambda: app.load_error or (app.engine is not None and not isinstance(app.screen, LoadingScreen)),
                   60, "the engine to restart")
    assert app.load_error is None, app.load_error
    assert not isinstance(app.screen, LoadingScreen) and app.chat.status.state == "ready"
    assert not app.chat.query_one("#notice").display


@pytest.mark.slow
async def test_killed_engine_loses_nothing_and_the_app_recovers(fresh_home, tiny_model):
    rng = random.Random(SEED)
    app = ChatApp(model=str(tiny_model), quant="none", device="cpu", seed=1,
                  overrides={"max_new_tokens": 32, "tree": "2,1"}, step_mode=False)
    expected, kills, began = [], 0, time.monotonic()
    async with app.run_test(size=(140, 42)) as pilot:
        await wait_for(pilot, lambda: app.engine is not None or app.load_error, 120, "the model to load")
        assert app.load_error is None, app.load_error
        tree = app.chat.query_one(TokenTreeView)
        kinds = ["step", "step", "timer", "timer", "idle", rng.choice(["step", "timer", "idle"])]
        rng.shuffle(kinds)
        plan = dict(zip(sorted(rng.sample(range(TURNS), len(kinds))), kinds))  # turn -> how its engine dies
        for turn in range(TURNS):
            how = plan.get(turn, "none")
            prompt = f"turn {turn}: tell me about number {rng.randint(0, 999)}"
            if (how == "step") != app.config.step_mode:
                app.action_toggle_step_mode()
            pid = app.engine.process.pid
            await app.send(prompt)
            assert app.generating
            if how == "step":  # kill during the pause after k steps
                k = rng.randint(1, 4)
                while True:
                    await wait_for(pilot, lambda: len(tree.events) >= 1 or not app.generating, 30, "a step")
                    if len(tree.events) >= k or not app.generating:
                        break
                    count = len(tree.events)
                    await pilot.press("f6")
                    await wait_for(pilot, lambda: len(tree.events) > count or not app.generating, 30, "the next step")
                kill(app)
            elif how == "timer":  # mid-answer, or just after it
                await pilot.pause(rng.uniform(0.0, 0.3))
                kill(app)
            await wait_for(pilot, lambda: not app.generating, 60, "the turn to end")
            if how == "idle":
                await pilot.pause(rng.uniform(0.0, 0.5))
                kill(app)
            streamed = "".join(e.new_text for e in tree.events)
            expected.append(("user", prompt))
            if streamed:
                expected.append(("assistant", streamed))
            if how != "none":
                kills += 1
                await recover(app, pilot, app.link.starts)
                assert app.engine.process.pid != pid
        record_id = app.record.id
    store = Store(paths.history_db())
    stored = [(m.role, m.content) for m in store.messages(record_id)]
    store.close()
    assert stored == expected  # every prompt and every streamed text, in order, nothing else
    assert kills == len(kinds) and sum(1 for role, _ in expected if role == "assistant") >= 7  # every turn not killed mid-answer
    assert time.monotonic() - began < 150  # about 45 s on a quiet two-core machine
