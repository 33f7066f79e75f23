"""A focused message's keys in a real terminal (tmux), at 80x24 and 160x48, on a real engine process
(a tiny random model): alt+up selects, c copies the message and b each code block in turn (the
app's OSC 52 copy read back from tmux's paste buffer), e edits and resends, r regenerates, each in
a fork saved in SQLite while the original conversation stays as it was."""

from __future__ import annotations

import sqlite3
import time

import pytest

from spectui import paths

from tmux_helpers import SPECTUI, Tmux, needs_tmux
from tui_helpers import save_chat

QUESTION = "Print hi, two ways"
ANSWER = "Two ways:\n\n```python\nprint('hi')\n```\n\nor in a shell\n\n~~~sh\necho hi\n~~~\n"


def conversations() -> dict[str, list[tuple[str, str]]]:
    """title -> [(role, content)] of every saved conversation, read while the app writes (WAL)."""
    db = sqlite3.connect(paths.history_db())
    try:
        rows = db.execute("SELECT c.title, m.role, m.content FROM conversations c "
                          "LEFT JOIN messages m ON m.conversation_id = c.id ORDER BY c.id, m.id").fetchall()
    finally:
        db.close()
    found: dict[str, list[tuple[str, str]]] = {}
    for title, role, content in rows:
        found.setdefault(title, []).extend([(role, content)] if role else [])
    return found


def wait_saved(term: Tmux, title: str, count: int, timeout: float = 120) -> list[tuple[str, str]]:
    """The conversation `title` once it holds `count` messages, the last a non-empty answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        messages = conversations().get(title, [])
        if len(messages) >= count and messages[-1][0] == "assistant" and messages[-1][1].strip():
            return messages
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for “{title}”: {conversations()}; screen:\n{term.screen()}")


@needs_tmux
@pytest.mark.parametrize("width, height", [(80, 24), (160, 48)])
def test_message_keys_in_tmux(fresh_home, tiny_model, width, height):
    save_chat(QUESTION, ("user", QUESTION), ("assistant", ANSWER))
    original = conversations()[QUESTION]
    term = Tmux(f"messages-{width}")
    term.start(f"env SPECTUI_HOME={fresh_home} {SPECTUI} chat --model {tiny_model} --quant none --device cpu "
               f"--max-new-tokens 6", width, height)
    try:
        term.wait_screen(lambda s: "ready" in s and "Two ways:" in s, 120, "the model and the saved chat")
        assert term.clipboard() is None

        # copy: the answer, then its code blocks in turn, then the question
        term.keys("M-Up", "c")  # from the message box, alt+up selects the last message
        term.wait_clipboard(ANSWER)
        term.keys("b")
        term.wait_clipboard("print('hi')")
        term.keys("b")
        term.wait_clipboard("echo hi")
        term.keys("b")
        term.wait_clipboard("print('hi')")
        term.keys("M-Up", "c")
        term.wait_clipboard(QUESTION)

        # edit and resend the question: a fork holding the edited question and its answer
        term.keys("e")
        term.wait_screen(lambda s: "Editing an earlier message" in s, 10, "the edit notice")
        term.type(" again")
        term.wait_screen(lambda s: f"{QUESTION} again" in s, 10, "the edited text in the message box")
        term.keys("Enter")
        edited = wait_saved(term, f"{QUESTION} · edited", 2)
        assert [role for role, _ in edited] == ["user", "assistant"] and edited[0] == ("user", f"{QUESTION} again")
        term.wait_screen(lambda s: "ready" in s and "Editing an earlier message" not in s, 60, "the edited answer")

        # regenerate the fork's answer: another fork, the question answered again
        term.keys("M-Up", "r")
        regenerated = wait_saved(term, f"{QUESTION} · regenerated", 2)
        assert regenerated[0] == edited[0] and len(regenerated) == 2
        term.wait_screen(lambda s: "ready" in s, 60, "the regenerated answer")
        assert conversations()[f"{QUESTION} · edited"] == edited  # each fork left as it was
        assert conversations()[QUESTION] == original == [("user", QUESTION), ("assistant", ANSWER)]
        assert term.alive()
    finally:
        term.close()
