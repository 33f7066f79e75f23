"""A real terminal for the TUI tests: spectui in a private tmux server (imported as a plain module).

Each `Tmux` is a server of its own (its own socket), so a test never meets the server of the test
before it still shutting down, nor anybody else's sessions. Keys go in with send-keys; what the
user sees comes back with capture-pane, and what the app copies (OSC 52, as Textual sends it to
the terminal) lands in a tmux paste buffer (`set-clipboard on`).
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

SPECTUI = Path(sys.executable).with_name("spectui")
needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
_servers = itertools.count()


class Tmux:
    def __init__(self, name: str) -> None:
        self.session = f"spectui-{name}-{os.getpid()}"
        self.socket = f"{self.session}-{next(_servers)}"

    def run(self, *args: str) -> subprocess.CompletedProcess:
        # env: Python's view of the environment, less LINES and COLUMNS. The process's own can hold
        # LINES=24 and COLUMNS=80 that readline exported when something imported it, and Python's view
        # holds them in a pytest-xdist worker; the app would read those over the pane's size.
        env = {k: v for k, v in os.environ.items() if k not in ("LINES", "COLUMNS")}
        return subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args], capture_output=True, text=True,
                              env=env)

    def start(self, command: str, width: int, height: int) -> None:
        started = self.run("new-session", "-d", "-s", self.session, "-x", str(width), "-y", str(height), command)
        assert started.returncode == 0, started.stderr
        self.run("set-option", "-g", "set-clipboard", "on")  # the app's OSC 52 copies become paste buffers

    def keys(self, *keys: str) -> None:
        """Keys by tmux's names (Enter, M-Up, C-q, F7) or plain characters, one after another."""
        for key in keys:
            self.run("send-keys", "-t", self.session, key)

    def type(self, text: str) -> None:
        self.run("send-keys", "-t", self.session, "-l", text)

    def screen(self) -> str:
        return self.run("capture-pane", "-t", self.session, "-p").stdout

    def wait_screen(self, condition, timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.screen()
            if condition(text):
                return text
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {what}; screen:\n{self.screen()}")

    def wait_lines(self, lines: list[str], timeout: float, what: str) -> str:
        """Wait until every one of `lines` shows at once -> the screen. A capture can land between two
        of the app's frames (a label updated, the panel under it not yet laid out again), so a test
        waits for the whole state it checks rather than for one marker of it."""
        try:
            return self.wait_screen(lambda s: all(line in s for line in lines), timeout, what)
        except AssertionError as timed_out:
            missing = [line for line in lines if line not in self.screen()]
            raise AssertionError(f"{timed_out}\nmissing: {missing}") from None

    def clipboard(self) -> str | None:
        """The newest paste buffer (the app's last copy), or None when there is none."""
        shown = self.run("show-buffer")
        return shown.stdout if shown.returncode == 0 else None

    def wait_clipboard(self, text: str, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while self.clipboard() != text:
            if time.monotonic() > deadline:
                raise AssertionError(f"the clipboard holds {self.clipboard()!r}, not {text!r}; screen:\n{self.screen()}")
            time.sleep(0.2)

    def alive(self) -> bool:
        return self.run("has-session", "-t", self.session).returncode == 0

    def close(self) -> None:
        self.run("kill-server")
