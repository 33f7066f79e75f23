"""`spectui chat` in a real terminal (tmux) with a read-only history folder and a hand-written
config: the app opens with a notice instead of a traceback, quits with 0, and neither file changes
(the command-line flags are for the session only). The model is a folder that fails to load, fast."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spectui.store import Store

SPECTUI = Path(sys.executable).with_name("spectui")
SOCKET = f"spectui-files-test-{os.getpid()}"
CONFIG = '# mine\ntheme = "spectui-light"  # keep\ntree = "2,1"\nunknown_key = 1\n\n[section]\nx = "y"\n'


def tmux(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["tmux", "-L", SOCKET, "-f", "/dev/null", *args], capture_output=True, text=True)


def wait_for(condition, timeout: float, what: str, session: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; screen:\n{screen(session)}")
        time.sleep(0.3)


def screen(session: str) -> str:
    return tmux("capture-pane", "-t", session, "-p").stdout


def flat(text: str) -> str:
    """Screen text with line breaks, padding and toast borders folded to single spaces."""
    return re.sub(r"[\s▌▐│]+", " ", text)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_chat_with_unwritable_history_and_flags(tmp_path):
    home = tmp_path / "home"
    (home / "config").mkdir(parents=True)
    (home / "config" / "config.toml").write_text(CONFIG, encoding="utf-8")
    store = Store(home / "data" / "history.sqlite3")
    store.add_message(store.create("kept").id, "user", "an old question")
    store.close()
    history = (home / "data" / "history.sqlite3").read_bytes()
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}", encoding="utf-8")
    rc = tmp_path / "rc"
    data = home / "data"
    data.chmod(0o555)
    locked = os.geteuid() == 0 and subprocess.run(["chattr", "+i", str(data)], capture_output=True).returncode == 0
    if os.geteuid() == 0 and not locked:
        data.chmod(0o755)
        pytest.skip("running as root and chattr +i is not available: cannot make a read-only folder")
    session = f"spectui-files-{os.getpid()}"
    command = (f"env SPECTUI_HOME={home} {SPECTUI} chat --model {model} --tree 3,1 --temperature 0.5 "
               f"--max-new-tokens 8 --step; echo $? > {rc}; sleep 60")  # the pane stays to show what it printed
    try:
        assert tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "45", command).returncode == 0
        wait_for(lambda: "chat history" in flat(screen(session)) or rc.exists(), 60, "the history notice", session)
        wait_for(lambda: "Loading failed" in screen(session) or rc.exists(), 120, "the model load to fail", session)
        assert not rc.exists(), f"spectui chat ended early:\n{screen(session)}"
        tmux("send-keys", "-t", session, "C-q")
        wait_for(lambda: rc.exists() and rc.read_text().strip(), 30, "ctrl+q to quit", session)
        printed = screen(session)
    finally:
        tmux("kill-server")
        if locked:
            subprocess.run(["chattr", "-i", str(data)], check=True)
        data.chmod(0o755)
    assert rc.read_text().strip() == "0"
    assert "Traceback" not in printed and "Error" not in printed
    assert (home / "config" / "config.toml").read_text(encoding="utf-8") == CONFIG
    assert (home / "data" / "history.sqlite3").read_bytes() == history
    assert not re.search(r"broken-", " ".join(os.listdir(data)))
