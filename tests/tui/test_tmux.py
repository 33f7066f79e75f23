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
    return subprocess.run(["tmux", "-L", SOCKET, "-f", "/dev/null", *args], capture_output=True, text=True)


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
