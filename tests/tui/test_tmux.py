"""A real terminal: `spectui chat` under tmux answers a typed question and quits with ctrl+q."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from spectui.store import Store

from tmux_helpers import SPECTUI, Tmux, needs_tmux


@pytest.mark.slow
@needs_tmux
def test_chat_in_tmux(model_home):
    term = Tmux("test")
    term.start(f"env SPECTUI_HOME={model_home} {SPECTUI} chat --max-new-tokens 16", 140, 42)
    try:
        term.wait_screen(lambda s: "ready" in s, 300, "the model to load")
        term.type("What is the capital of France?")
        term.keys("Enter")
        term.wait_lines(["Paris", "ready", "token tree", "step ", "tokens/s"], 300, "the answer and its figures")
        term.keys("C-q")
        deadline = time.monotonic() + 30
        while term.alive():
            assert time.monotonic() < deadline, "ctrl+q did not quit"
            time.sleep(0.3)
    finally:
        term.close()
    store = Store(model_home / "data" / "history.sqlite3")
    messages = store.messages(store.last().id)
    assert [m.role for m in messages] == ["user", "assistant"] and "Paris" in messages[1].content
    store.close()


def wait_answers(db_path, known: set[int], count: int, term: Tmux, timeout: float = 300) -> None:
    """Until the conversations not in `known` hold `count` saved answers (read while the app writes: WAL)."""
    import sqlite3

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        db = sqlite3.connect(db_path)
        try:
            rows = db.execute("SELECT conversation_id FROM messages WHERE role = 'assistant'").fetchall()
        finally:
            db.close()
        if sum(1 for (conversation,) in rows if conversation not in known) >= count:
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for answer {count}; screen:\n{term.screen()}")


@pytest.mark.slow
@needs_tmux
def test_history_survives_kill_9_of_the_whole_app_mid_answer(model_home):
    """Two answered turns, a third killed mid-answer with SIGKILL (app and engine process alike):
    every committed message is intact, the database passes its integrity check and opens again."""
    import signal
    import sqlite3

    term = Tmux("kill")
    pid_file = model_home / "app.pid"
    command = f"sh -c 'echo $$ > {pid_file}; exec env SPECTUI_HOME={model_home} {SPECTUI} chat --max-new-tokens 24'"
    before = Store(model_home / "data" / "history.sqlite3")
    known = {c.id for c in before.list()}
    before.close()
    term.start(command, 140, 42)
    try:
        term.wait_screen(lambda s: "ready" in s, 300, "the model to load")
        term.keys("C-n")
        for answers, question in enumerate(("Name a colour.", "Name a fruit."), 1):
            term.type(question)
            term.keys("Enter")
            wait_answers(model_home / "data" / "history.sqlite3", known, answers, term)
        term.keys("C-n")  # the 2 turns are saved; a third starts a long answer
        term.type("Write a long story about a lighthouse keeper.")
        term.keys("Enter")
        time.sleep(1.5)  # mid-answer: the user message is committed, the answer streams
        app_pid = int(pid_file.read_text())
        children = subprocess.run(["pgrep", "-P", str(app_pid)], capture_output=True, text=True).stdout.split()
        for pid in [app_pid, *map(int, children)]:
            os.kill(pid, signal.SIGKILL)
    finally:
        term.close()
    db = sqlite3.connect(model_home / "data" / "history.sqlite3")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()
    store = Store(model_home / "data" / "history.sqlite3")
    assert store.notice is None  # not damaged: nothing set aside
    new = [c for c in store.list() if c.id not in known]
    contents = [[(m.role, m.content) for m in store.messages(c.id)] for c in new]
    store.close()
    first = next(c for c in contents if c and c[0] == ("user", "Name a colour."))
    assert [role for role, _ in first] == ["user", "assistant", "user", "assistant"]
    assert first[2] == ("user", "Name a fruit.") and all(text.strip() for _, text in first)
    assert any(c and c[0] == ("user", "Write a long story about a lighthouse keeper.") for c in contents)


def start_without_a_model(home: Path, folder: Path, term: Tmux) -> None:
    """`spectui chat` at 80x24 on a folder that fails to load: the app runs, with its message box."""
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    term.start(f"env SPECTUI_HOME={home} {SPECTUI} chat --model {folder}", 80, 24)
    term.wait_screen(lambda s: "Loading failed" in s, 120, "the load to fail")


@needs_tmux
def test_alt_enter_and_ctrl_j_add_a_line_in_tmux(fresh_home, tmp_path):
    """tmux sends alt+enter as ESC + Enter, which Textual reads as Enter: it must add a line, not send.
    No model needed: a folder that fails to load leaves the app running with its message box."""
    term = Tmux("keys")
    try:
        start_without_a_model(fresh_home, tmp_path / "not-a-model", term)
        time.sleep(0.5)
        term.type("first line")
        term.keys("M-Enter")  # alt+enter, as tmux passes it on: ESC + CR
        term.type("second line")
        term.keys("C-j")
        term.type("third line")
        text = term.wait_screen(lambda s: "third line" in s, 10, "the typed text")
        lines = text.splitlines()
        rows = [next(i for i, line in enumerate(lines) if f"│ {word} line" in line) for word in ("first", "second", "third")]
        assert rows[1] == rows[0] + 1 and rows[2] == rows[1] + 1, text  # three lines in the message box
        assert "you" not in text and "cannot answer yet" not in text  # nothing was sent
        term.keys("Enter")  # Enter still sends (refused here: no model), the text stays
        text = term.wait_screen(lambda s: "cannot answer yet" in s, 10, "the send to be refused")
        assert "third line" in text
    finally:
        term.close()


@needs_tmux
def test_ctrl_o_opens_the_model_picker_in_tmux(fresh_home, tmp_path):
    """ctrl+o reaches the app through a real terminal at 80x24 and opens the model picker; escape closes it."""
    term = Tmux("picker")
    try:
        start_without_a_model(fresh_home, tmp_path / "not-a-model", term)
        term.keys("C-o")
        text = term.wait_screen(lambda s: "Model and speculators" in s, 20, "the model picker")
        assert "not-a-model" in text and "smollm2-135m" in text  # the session's model, then the presets
        term.keys("Escape")
        term.wait_screen(lambda s: "Model and speculators" not in s and "Loading failed" in s, 10, "the picker to close")
    finally:
        term.close()


@needs_tmux
@pytest.mark.parametrize("width, height", [(160, 48), (80, 24)])
def test_step_mode_teaching_in_tmux(fresh_home, width, height):
    """A recorded sampling answer replayed in a real terminal: n steps, F7/F8 browse (the function
    keys pass through tmux), and the tree's marks, the legend and the sampling test's numbers follow
    the step shown. At 80x24 the legend is one line and the decision scrolls under the tree."""
    from spectui.engine.events import read_trace

    trace = Path(__file__).with_name("data") / "sampling.jsonl"
    _, events = read_trace(trace)
    term = Tmux(f"teach-{width}")
    term.start(f"env SPECTUI_HOME={fresh_home} {SPECTUI} replay {trace} --paused", width, height)
    try:
        term.wait_screen(lambda s: "paused" in s, 60, "the replay to open")
        term.keys(*"n" * 10)
        first = events[9].sampling.tests[0]  # ' of' after ' Republic': u 0.658 >= 0.000
        step9 = ["step 9  (10/10)",
                 "✗ ' of'  q 0.37  p 0.00",  # on the tree: the numbers before the (cut) names
                 f"✗ ' of'  {first.draw:.3f} ≥ {first.accept_prob:.3f}",
                 "at ' Republic': u vs min(1, p'/q)"]
        if height >= 32:
            step9 += [f"✗ ' of'  q 0.37  p 0.00  u {first.draw:.2f} ≥ {first.accept_prob:.2f}",
                      "u  uniform draw: kept if u < min(1, p'/q)",
                      "residual: ' is' 0.747 · ' and' 0.253"]
        else:
            step9 += ["q drafter · p verifier probability"]
        term.wait_lines(step9, 30, "step 9 and its decision")
        term.keys("F7")
        test = events[8].sampling.tests[0]
        text = term.wait_lines(["step 8  (9/10)", f"at '{events[8].tree[0].text}': u vs min(1, p'/q)",
                                f"✗ '{events[8].tree[test.node].text}'  {test.draw:.3f} ≥ {test.accept_prob:.3f}"],
                               10, "F7 to show step 8 and its decision")
        assert "at ' Republic'" not in text
        term.keys("F8")
        term.wait_lines(["step 9  (10/10)", "at ' Republic': u vs min(1, p'/q)"], 10, "F8 to show step 9 again")
    finally:
        term.close()


def page(term: Tmux, key: str, line: str) -> str:
    """Press `key` (one page, scrolled smoothly) until `line` shows, as a reader would; -> the screen."""
    for _ in range(6):
        term.keys(key)
        time.sleep(0.6)
        if line in term.screen():
            break
    return term.wait_screen(lambda s: line in s, 5, f"{line!r} after {key}")


@needs_tmux
def test_the_step_decision_scrolls_with_keys_in_tmux_at_80x24(fresh_home):
    """At 80x24 the decision of a sampling step is cut under the tree. The decision is the last
    control of the focus chain: shift+tab from the conversation focuses it, page down brings its
    last line into view, up and page up its first again, and left still browses the steps."""
    trace = Path(__file__).with_name("data") / "sampling.jsonl"
    first, last = "at ' Republic': u vs min(1, p'/q)", "(0/11 drafted"  # its first and last rows
    term = Tmux("decision")
    term.start(f"env SPECTUI_HOME={fresh_home} {SPECTUI} replay {trace} --paused", 80, 24)
    try:
        term.wait_screen(lambda s: "paused" in s, 60, "the replay to open")
        term.keys(*"n" * 10)
        text = term.wait_lines(["step 9  (10/10)", first], 30, "step 9 and its decision")
        assert last not in text
        term.keys("BTab")
        text = page(term, "NPage", last)
        assert first not in text and "step 9  (10/10)" in text
        term.keys("Up")
        text = page(term, "PPage", first)
        assert last not in text
        term.keys("Left")
        term.wait_screen(lambda s: "step 8  (9/10)" in s, 10, "left to show step 8")
    finally:
        term.close()
