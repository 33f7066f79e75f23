"""A real terminal: `spectui chat` under tmux answers a typed question and quits with ctrl+q."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spectui.store import Store

SPECTUI = Path(sys.executable).with_name("spectui")


SOCKET = f"spectui-test-{os.getpid()}"  # a private tmux server: its own size, nobody else's sessions


def tmux(*args: str) -> subprocess.CompletedProcess:
    # env: Python's view of the environment. The process's own can hold LINES=24 and COLUMNS=80 that
    # readline exported when something imported it; the app would read those over the pane's size.
    return subprocess.run(["tmux", "-L", SOCKET, "-f", "/dev/null", *args], capture_output=True, text=True,
                          env=dict(os.environ))


def screen(session: str) -> str:
    return tmux("capture-pane", "-t", session, "-p").stdout


def wait_screen(session: str, condition, timeout: float, what: str) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = screen(session)
        if condition(text):
            return text
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; screen:\n{screen(session)}")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_chat_in_tmux(model_home):
    session = f"spectui-test-{os.getpid()}"
    command = f"env SPECTUI_HOME={model_home} {SPECTUI} chat --max-new-tokens 16"
    assert tmux("new-session", "-d", "-s", session, "-x", "140", "-y", "42", command).returncode == 0
    try:
        wait_screen(session, lambda s: "ready" in s, 300, "the model to load")
        tmux("send-keys", "-t", session, "-l", "What is the capital of France?")
        tmux("send-keys", "-t", session, "Enter")
        text = wait_screen(session, lambda s: "Paris" in s and "ready" in s, 300, "the answer")
        assert "Paris" in text
        assert "token tree" in text and "step " in text
        assert "tokens/s" in text
        tmux("send-keys", "-t", session, "C-q")
        deadline = time.monotonic() + 30
        while tmux("has-session", "-t", session).returncode == 0:
            assert time.monotonic() < deadline, "ctrl+q did not quit"
            time.sleep(0.3)
    finally:
        tmux("kill-server")
    store = Store(model_home / "data" / "history.sqlite3")
    messages = store.messages(store.last().id)
    assert [m.role for m in messages] == ["user", "assistant"] and "Paris" in messages[1].content
    store.close()


def wait_answers(db_path, known: set[int], count: int, session: str, timeout: float = 300) -> None:
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
    raise AssertionError(f"timed out waiting for answer {count}; screen:\n{screen(session)}")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_history_survives_kill_9_of_the_whole_app_mid_answer(model_home):
    """Two answered turns, a third killed mid-answer with SIGKILL (app and engine process alike):
    every committed message is intact, the database passes its integrity check and opens again."""
    import signal
    import sqlite3

    session = f"spectui-kill-{os.getpid()}"
    pid_file = model_home / "app.pid"
    command = f"sh -c 'echo $$ > {pid_file}; exec env SPECTUI_HOME={model_home} {SPECTUI} chat --max-new-tokens 24'"
    before = Store(model_home / "data" / "history.sqlite3")
    known = {c.id for c in before.list()}
    before.close()
    assert tmux("new-session", "-d", "-s", session, "-x", "140", "-y", "42", command).returncode == 0
    try:
        wait_screen(session, lambda s: "ready" in s, 300, "the model to load")
        tmux("send-keys", "-t", session, "C-n")
        for answers, question in enumerate(("Name a colour.", "Name a fruit."), 1):
            tmux("send-keys", "-t", session, "-l", question)
            tmux("send-keys", "-t", session, "Enter")
            wait_answers(model_home / "data" / "history.sqlite3", known, answers, session)
        tmux("send-keys", "-t", session, "C-n")  # the 2 turns are saved; a third starts a long answer
        tmux("send-keys", "-t", session, "-l", "Write a long story about a lighthouse keeper.")
        tmux("send-keys", "-t", session, "Enter")
        time.sleep(1.5)  # mid-answer: the user message is committed, the answer streams
        app_pid = int(pid_file.read_text())
        children = subprocess.run(["pgrep", "-P", str(app_pid)], capture_output=True, text=True).stdout.split()
        for pid in [app_pid, *map(int, children)]:
            os.kill(pid, signal.SIGKILL)
    finally:
        tmux("kill-server")
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


def start_without_a_model(home: Path, folder: Path, session: str) -> None:
    """`spectui chat` at 80x24 on a folder that fails to load: the app runs, with its message box."""
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    command = f"env SPECTUI_HOME={home} {SPECTUI} chat --model {folder}"
    assert tmux("new-session", "-d", "-s", session, "-x", "80", "-y", "24", command).returncode == 0
    wait_screen(session, lambda s: "Loading failed" in s, 120, "the load to fail")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_alt_enter_and_ctrl_j_add_a_line_in_tmux(fresh_home, tmp_path):
    """tmux sends alt+enter as ESC + Enter, which Textual reads as Enter: it must add a line, not send.
    No model needed: a folder that fails to load leaves the app running with its message box."""
    session = f"spectui-keys-{os.getpid()}"
    try:
        start_without_a_model(fresh_home, tmp_path / "not-a-model", session)
        time.sleep(0.5)
        tmux("send-keys", "-t", session, "-l", "first line")
        tmux("send-keys", "-t", session, "M-Enter")  # alt+enter, as tmux passes it on: ESC + CR
        tmux("send-keys", "-t", session, "-l", "second line")
        tmux("send-keys", "-t", session, "C-j")
        tmux("send-keys", "-t", session, "-l", "third line")
        text = wait_screen(session, lambda s: "third line" in s, 10, "the typed text")
        lines = text.splitlines()
        rows = [next(i for i, line in enumerate(lines) if f"│ {word} line" in line) for word in ("first", "second", "third")]
        assert rows[1] == rows[0] + 1 and rows[2] == rows[1] + 1, text  # three lines in the message box
        assert "you" not in text and "cannot answer yet" not in text  # nothing was sent
        tmux("send-keys", "-t", session, "Enter")  # Enter still sends (refused here: no model), the text stays
        text = wait_screen(session, lambda s: "cannot answer yet" in s, 10, "the send to be refused")
        assert "third line" in text
    finally:
        tmux("kill-server")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_ctrl_o_opens_the_model_picker_in_tmux(fresh_home, tmp_path):
    """ctrl+o reaches the app through a real terminal at 80x24 and opens the model picker; escape closes it."""
    session = f"spectui-picker-{os.getpid()}"
    try:
        start_without_a_model(fresh_home, tmp_path / "not-a-model", session)
        tmux("send-keys", "-t", session, "C-o")
        text = wait_screen(session, lambda s: "Model and speculators" in s, 20, "the model picker")
        assert "not-a-model" in text and "smollm2-135m" in text  # the session's model, then the presets
        tmux("send-keys", "-t", session, "Escape")
        wait_screen(session, lambda s: "Model and speculators" not in s and "Loading failed" in s, 10, "the picker to close")
    finally:
        tmux("kill-server")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
@pytest.mark.parametrize("width, height", [(160, 48), (80, 24)])
def test_step_mode_teaching_in_tmux(fresh_home, width, height):
    """A recorded sampling answer replayed in a real terminal: n steps, F7/F8 browse (the function
    keys pass through tmux), and the tree's marks, the legend and the sampling test's numbers follow
    the step shown. At 80x24 the legend is one line and the decision scrolls under the tree."""
    from spectui.engine.events import read_trace

    trace = Path(__file__).with_name("data") / "sampling.jsonl"
    _, events = read_trace(trace)
    session = f"spectui-teach-{os.getpid()}-{width}"
    command = f"env SPECTUI_HOME={fresh_home} {SPECTUI} replay {trace} --paused"
    assert tmux("new-session", "-d", "-s", session, "-x", str(width), "-y", str(height), command).returncode == 0
    try:
        wait_screen(session, lambda s: "paused" in s, 60, "the replay to open")
        for _ in range(10):
            tmux("send-keys", "-t", session, "n")
        text = wait_screen(session, lambda s: "step 9  (10/10)" in s, 30, "step 9")
        first = events[9].sampling.tests[0]  # ' of' after ' Republic': u 0.658 >= 0.000
        assert "✗ ' of'  q 0.37  p 0.00" in text  # on the tree: the numbers before the (cut) names
        assert f"✗ ' of'  {first.draw:.3f} ≥ {first.accept_prob:.3f}" in text
        assert "at ' Republic': u vs min(1, p'/q)" in text
        if height >= 32:
            assert f"✗ ' of'  q 0.37  p 0.00  u {first.draw:.2f} ≥ {first.accept_prob:.2f}" in text
            assert "u  uniform draw: kept if u < min(1, p'/q)" in text
            assert "residual: ' is' 0.747 · ' and' 0.253" in text
        else:
            assert "q drafter · p verifier probability" in text
        tmux("send-keys", "-t", session, "F7")
        text = wait_screen(session, lambda s: "step 8  (9/10)" in s, 10, "F7 to show step 8")
        test = events[8].sampling.tests[0]
        assert f"at '{events[8].tree[0].text}': u vs min(1, p'/q)" in text and "at ' Republic'" not in text
        assert f"✗ '{events[8].tree[test.node].text}'  {test.draw:.3f} ≥ {test.accept_prob:.3f}" in text
        tmux("send-keys", "-t", session, "F8")
        text = wait_screen(session, lambda s: "step 9  (10/10)" in s, 10, "F8 to show step 9 again")
        assert "at ' Republic': u vs min(1, p'/q)" in text
    finally:
        tmux("kill-server")
