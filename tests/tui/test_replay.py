"""Replay of a trace recorded with the real engine: no model, the same screen code path."""

from __future__ import annotations

import pytest

import json

from typer.testing import CliRunner

from spectui import paths
from spectui.cli import app as cli
from spectui.engine.events import TRACE_VERSION, read_trace
from spectui.replay import read_turns
from spectui.replay_app import ReplayApp
from spectui.widgets.acceptance import AcceptanceChart
from spectui.widgets.token_tree import TokenTreeView

from tui_helpers import TRACE, wait_for

pytestmark = pytest.mark.anyio


def test_trace_splits_into_turns(tmp_path):
    info, events = read_trace(TRACE)
    double = tmp_path / "two.jsonl"
    double.write_text(TRACE.read_text() + TRACE.read_text().replace(info.prompt, "again"))
    turns = read_turns(double)
    assert [t[0].prompt for t in turns] == [info.prompt, "again"]
    assert [len(t[1]) for t in turns] == [len(events), len(events)]


async def test_replay_plays_whole_answer(fresh_home):
    info, events = read_trace(TRACE)
    app = ReplayApp(read_turns(TRACE), replay_name=TRACE.name, autoplay=False)
    async with app.run_test(size=(140, 42)) as pilot:
        await pilot.pause()
        assert app.chat.last_answer() in (None, "")
        app.cursor.speed = 64
        await pilot.press("space")  # play
        await wait_for(pilot, lambda: app.cursor.done, 30, "the replay to finish")
        await pilot.pause(0.3)
        assert app.chat.last_answer() == "".join(e.new_text for e in events)
        tree = app.chat.query_one(TokenTreeView)
        assert len(tree.events) == len(events)
        assert tree.index == len(events) - 1
        assert len(app.chat.query_one(AcceptanceChart).rates) == len(events) - 1
        figures = str(app.chat.query_one("#figures").render())
        assert f"{events[-1].tokens_per_s:6.1f}" in figures


async def test_replay_step_and_browse(fresh_home):
    _, events = read_trace(TRACE)
    app = ReplayApp(read_turns(TRACE), replay_name=TRACE.name, autoplay=False)
    async with app.run_test(size=(140, 42)) as pilot:
        for _ in range(3):
            await pilot.press("n")
        await pilot.pause(0.3)
        tree = app.chat.query_one(TokenTreeView)
        assert len(tree.events) == 3
        assert app.chat.last_answer() == "".join(e.new_text for e in events[:3])
        decision = str(app.chat.query_one("#decision-text").render())
        assert "bonus" in decision
        await pilot.press("f7")
        await pilot.pause()
        assert tree.index == 1
        assert f"step {events[1].step}" in str(app.chat.query_one("#tree-step").render())
        await pilot.click("#tree-next")
        await pilot.pause()
        assert tree.index == 2


async def test_replay_keys_and_the_chat_keys_it_has_no_use_for(fresh_home):
    """+ and - change the speed, space plays, Esc pauses, n steps; the chat's own keys open
    nothing in a replay; F4 and F5 change the view of this session only (no config file)."""
    app = ReplayApp(read_turns(TRACE), replay_name=TRACE.name, autoplay=False)
    async with app.run_test(size=(140, 42)) as pilot:
        await pilot.pause()
        bar = app.chat.query_one("#replay-bar")
        await pilot.press("plus", "plus", "minus")
        assert app.cursor.speed == 2 and "speed 2x" in str(bar.render())
        await pilot.press("space")
        assert app.cursor.playing and "playing" in str(bar.render())
        await pilot.press("escape")
        assert not app.cursor.playing and "paused" in str(bar.render())
        played = app.cursor.step
        await pilot.press("n")
        await pilot.pause(0.2)
        assert app.cursor.step == played + 1
        for key in ("f2", "f3", "ctrl+o", "ctrl+n", "ctrl+r", "ctrl+e"):
            await pilot.press(key)
            await pilot.pause()
            assert app.screen is app.chat and len(app.screen_stack) == 1, key
        await pilot.press("f4", "f5", "f5")
        assert app.config.colour_origins and app.chat.query_one("#conversation").colour_origins
        titles = [c.title for c in app.get_system_commands(app.screen)]  # the palette: what a replay has
        assert {"Next step", "Token origins", "Side panel", "Copy last answer", "Help: key bindings"} <= set(titles)
        assert not {"New conversation", "Settings", "Model", "Conversations"} & set(titles)
    assert not paths.config_file().exists()


def test_malformed_trace_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.jsonl"
    lines = TRACE.read_text().splitlines()
    bad.write_text(lines[0] + "\n" + lines[1][:40] + "\n")
    result = CliRunner().invoke(cli, ["replay", str(bad)])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0
    assert "line 2" in result.output


def test_trace_with_unknown_fields_is_rejected(tmp_path):
    bad = tmp_path / "bad.jsonl"
    lines = TRACE.read_text().splitlines()
    step = json.loads(lines[1])
    step["surprise"] = 1
    bad.write_text(lines[0] + "\n" + json.dumps(step) + "\n")
    result = CliRunner().invoke(cli, ["replay", str(bad)])
    assert result.exit_code == 2 and "surprise" in result.output


def test_unknown_model_is_one_line_exit_2():
    result = CliRunner().invoke(cli, ["chat", "--model", "no-such-preset"])
    assert result.exit_code == 2
    assert "unknown model" in result.output and result.output.strip().count("\n") == 0


def mutated_trace(tmp_path, line: int, change) -> str:
    """The recorded trace with line `line` (1-based) changed by `change(dict)`; -> its path."""
    lines = TRACE.read_text().splitlines()
    record = json.loads(lines[line - 1])
    change(record)
    lines[line - 1] = json.dumps(record)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    return str(bad)


def set_field(name, value):
    return lambda record: record.__setitem__(name, value)


def set_node_field(name, value):
    return lambda record: record["tree"][0].__setitem__(name, value)


@pytest.mark.timeout(30)  # the code before the schema opened the screen on these (and never returned here)
@pytest.mark.parametrize(
    "line, change, field",
    [
        pytest.param(3, set_field("new_tokens", "6097"), "field new_tokens: expected a list of integers, got a string", id="string-for-ids"),
        pytest.param(3, lambda record: record.pop("new_text"), "field new_text: missing", id="missing-field"),
        pytest.param(4, set_field("accepted", 3), "field accepted: expected a list of integers", id="number-for-list"),
        pytest.param(5, set_node_field("token_id", "x"), "field tree[0].token_id: expected an integer", id="nested-field"),
        pytest.param(6, set_field("accepted", [9]), "field accepted: node 9 is not a drafted node", id="accepted-not-in-tree"),
        pytest.param(7, set_field("draft_ms", None), "field draft_ms: expected a number, got null", id="null-for-number"),
        pytest.param(1, set_field("version", 99), f"field version: trace format 99 is newer than this spectui reads ({TRACE_VERSION})", id="future-version"),
        pytest.param(1, set_field("version", "1"), "field version: expected a positive integer", id="string-version"),
        pytest.param(1, set_field("prompt", ["a list"]), "field prompt: expected a string, got a list", id="run-line-field"),
        pytest.param(2, set_field("kind", "steps"), "field kind", id="unknown-kind"),
    ],
)
def test_trace_that_does_not_fit_the_schema_is_one_line_exit_2(tmp_path, line, change, field):
    bad = mutated_trace(tmp_path, line, change)
    result = CliRunner().invoke(cli, ["replay", bad])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0].startswith(f"spectui: trace {bad}, line {line}: {field}")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("speed", ["nan", "inf", "0", "-2"])
def test_bad_replay_speed_exits_2(speed):
    result = CliRunner().invoke(cli, ["replay", str(TRACE), "--speed", speed])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == f"spectui: --speed {float(speed)}: must be a finite number > 0"
